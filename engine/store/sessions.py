"""Sessions: import files into the store, export them, and replay them through a fresh
engine. Chat sessions are rendered per request with the model's chat template (tokenizer
only, no weights); replies are kept. Editing a message lives in `engine.store.edit`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from engine.core.errors import InputError, TraceError
from engine.core.events import EventBus
from engine.core.sniff import SESSION_FILE_FORMAT
from engine.store.formats import Conversation, load_conversations, trace_request_dict
from engine.core.manager import PrefixCacheManager
from engine.core.replay import ReplayConfig, make_manager, replay
from engine.core.served import ReplayResult, ReplayTotals, ServedRequest
from engine.store.bookmarks import import_bookmarks, session_file_bookmarks
from engine.store.database import SessionInfo, Store
from engine.core.trace import MOONCAKE_BLOCK_SIZE, TraceRequest
from engine.model.chat import Turn, render_turns

DEFAULT_CAPACITY_BLOCKS = 4096


# ---------------------------------------------------------------------------- import / export
def import_file(store: Store, path: str | Path, format: str | None = None, *, title: str | None = None,
                model: str | None = None, block_size: int | None = None, capacity_blocks: int | None = None,
                seed: int | None = None, hash_name: str | None = None) -> list[int]:
    """Import every conversation of `path` as one session each, in ONE transaction.

    The whole file is parsed before anything is written, and a failure while writing
    rolls everything back, so a bad file leaves no half-imported session behind.
    """
    conversations = load_conversations(path, format)
    overrides = {k: v for k, v in (("model", model), ("block_size", block_size), ("capacity_blocks", capacity_blocks),
                                   ("seed", seed), ("hash", hash_name)) if v is not None}
    with store.atomic():
        ids = [import_conversation(store, c, str(path), title, overrides) for c in conversations]
        if conversations and conversations[0].format == "cachescope":
            import_bookmarks(store, path, ids)
        return ids


def import_conversation(store: Store, conv: Conversation, source_path: str | None = None, title: str | None = None,
                        overrides: dict[str, Any] | None = None) -> int:
    """Write one parsed conversation as a new session; returns the session id."""
    s = dict(conv.settings)
    if conv.format == "cachescope":
        base = {k: s.pop(k) for k in ("model", "block_size", "capacity_blocks", "seed", "hash", "created",
                                      "source_path", "source_format")}
        settings = s.pop("settings")
    else:
        base = {"model": None, "block_size": s.pop("block_size", 16), "capacity_blocks": DEFAULT_CAPACITY_BLOCKS,
                "seed": 0, "hash": "sha256", "created": None, "source_path": source_path, "source_format": conv.format}
        settings = s
    base.update(overrides or {})
    salt = settings.get("salt") if isinstance(settings, dict) else None
    if salt is not None and not isinstance(salt, str):
        # Refused here, not at the first edit or replay, so nothing half-done is ever stored.
        raise TraceError(source_path or conv.title, None, "settings.salt", f"a salt must be a string, not {salt!r}")
    for tr in conv.trace or ():
        if tr.hash_ids is not None and len(tr.hash_ids) < tr.input_length // base["block_size"]:
            raise TraceError(source_path or conv.title, tr.line, "hash_ids",
                             f"{len(tr.hash_ids)} block ids cannot cover {tr.input_length} tokens in blocks of "
                             f"{base['block_size']}; Mooncake ids stand for {MOONCAKE_BLOCK_SIZE}-token blocks")
    with store.atomic():
        sid = store.create_session(title or conv.title, conv.kind, settings=settings, **base)
        for i, m in enumerate(conv.messages):
            store.add_message(sid, m.role, m.content, m.extra, position=m.position if m.position is not None else i,
                              version=m.version, created=m.created)
        if conv.trace is not None:
            store.add_trace_requests(sid, conv.trace)
    return sid


def session_file(store: Store, session_id: int) -> dict[str, Any]:
    """The `.cachescope.json` document of a session: settings, every message version,
    and the trace lines of a trace session. Importing it gives back the same document."""
    info = store.get_session(session_id)
    session = {"title": info.title, "kind": info.kind, "model": info.model, "block_size": info.block_size,
               "capacity_blocks": info.capacity_blocks, "seed": info.seed, "hash": info.hash, "created": info.created,
               "source_path": info.source_path, "source_format": info.source_format, "settings": info.settings}
    messages = [{"position": m.position, "version": m.version, "role": m.role, "content": m.content,
                 "extra": m.extra, "created": m.created} for m in store.messages(session_id, include_history=True)]
    doc: dict[str, Any] = {"format": SESSION_FILE_FORMAT, "version": 1, "session": session, "messages": messages}
    if info.kind == "trace":
        doc["trace"] = [trace_request_dict(tr) for tr in store.trace_requests(session_id)]
    marks = session_file_bookmarks(store, session_id)
    if marks:  # a walk through the session travels with it (engine.store.bookmarks)
        doc["bookmarks"] = marks
    return doc


def export_openai(store: Store, session_id: int) -> dict[str, Any]:
    """The current messages as an OpenAI-style `{"messages": [...]}` request body."""
    info = store.get_session(session_id)
    if info.kind != "chat":
        raise InputError(f"session {session_id} is a trace, not a chat; export it as a session file or as jsonl")
    messages = []
    for m in store.messages(session_id):
        out: dict[str, Any] = {"role": m.role, "content": m.content}
        for key in ("name", "tool_calls", "tool_call_id"):
            if m.extra and key in m.extra:
                out[key] = m.extra[key]
        messages.append(out)
    doc: dict[str, Any] = {"messages": messages}
    if info.settings.get("tools"):
        doc["tools"] = info.settings["tools"]
    return doc


def export_session(store: Store, session_id: int, path: str | Path | None, format: str = "session") -> str:
    """Write (or, with `path=None`, return) a session as "session", "openai" or "jsonl" text."""
    if format == "session":
        text = json.dumps(session_file(store, session_id), ensure_ascii=False, indent=1) + "\n"
    elif format == "openai":
        text = json.dumps(export_openai(store, session_id), ensure_ascii=False, indent=1) + "\n"
    elif format == "jsonl":
        if store.get_session(session_id).kind == "trace":
            lines = [trace_request_dict(tr) for tr in store.trace_requests(session_id)]
        else:
            lines = [export_openai(store, session_id)]
        text = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines)
    else:
        raise InputError(f"unknown export format {format!r}; choose session, openai or jsonl")
    if path is not None:
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror}") from None
    return text


# ---------------------------------------------------------------------------- chat requests
def turn_requests(turns: Sequence[Turn], salt: str | None = None, prefix: str = "turn") -> list[TraceRequest]:
    """Turns as token-level trace requests (the recorded reply is teacher-forced)."""
    return [TraceRequest(t.index, t.message_position, f"{prefix}-{t.index}", salt, t.prompt_token_ids,
                         t.output_token_ids, None, len(t.prompt_token_ids), len(t.output_token_ids))
            for t in turns]


def session_turns(store: Store, info: SessionInfo, tokenizer: Any = None) -> list[Turn]:
    from engine.model.loader import load_tokenizer

    tok = tokenizer if tokenizer is not None else load_tokenizer(info.model)
    turns = render_turns(store.messages(info.id), tok, info.settings.get("tools"))
    if not turns:
        raise InputError(f"session {info.id} has no user message, so there is no request to run")
    return turns


# ---------------------------------------------------------------------------- replay
def session_config(info: SessionInfo, capacity_blocks: int | None = None, concurrency: int = 1) -> ReplayConfig:
    return ReplayConfig(block_size=info.block_size, capacity_blocks=capacity_blocks or info.capacity_blocks,
                        seed=info.seed, hash=info.hash, concurrency=concurrency,
                        model=info.model if info.kind == "chat" else None)


def session_salt(info: SessionInfo) -> str | None:
    """The salt a chat session's requests are hashed with (None: shared with everyone)."""
    salt = info.settings.get("salt")
    if salt is not None and not isinstance(salt, str):
        raise InputError(f"session {info.id} has a settings.salt that is not a string ({salt!r}); "
                         f"a salt is text that keeps one tenant's blocks apart")
    return salt


def run_requests(requests: Sequence[TraceRequest], config: ReplayConfig, manager: PrefixCacheManager,
                 store: Store | None = None, run_id: int | None = None,
                 turns: Sequence[Turn] | None = None,
                 on_request: Callable[[ServedRequest], None] | None = None) -> list[ServedRequest]:
    """Serve `requests` on `manager` as `engine.core.replay.replay` does; with a store, every
    request is committed with its events in one transaction as soon as it finishes.
    `on_request(served)` is called after each request is served (and committed)."""
    events: list[Any] = []
    unsubscribe = manager.events.subscribe(events.append) if store is not None else None
    rows: list[ServedRequest] = []
    by_index = {t.index: t for t in turns or ()}
    by_id = {r.index: r for r in requests} if store is not None else {}

    def persist(batch: list[ServedRequest]) -> None:
        for row in batch:
            turn = by_index.get(row.index)
            if turn is not None:
                row.message_position = turn.message_position
                row.miss_message = turn.message_at(row.divergence_token if row.divergence_token is not None
                                                   else row.first_miss_block * config.block_size)
        if store is None or run_id is None:
            return
        with store.atomic():
            for row in batch:
                tr = by_id[row.index]
                store.record_request(run_id, row.index, request_id=row.id, tenant=row.tenant,
                                     prompt_token_ids=tr.tokens, output_token_ids=tr.output_tokens,
                                     prompt_tokens=row.prompt_tokens, cached_tokens=row.cached_tokens,
                                     computed_tokens=row.computed_tokens, miss_reason=row.miss_reason,
                                     first_miss_block=row.first_miss_block, divergence_token=row.divergence_token,
                                     message_position=row.message_position, refused=row.refused)
            store.record_events(run_id, events)
        events.clear()

    try:
        if config.concurrency == 1:
            for tr in requests:
                batch = replay([tr], config, manager=manager).requests
                persist(batch)
                rows.extend(batch)
                for row in batch if on_request is not None else ():
                    on_request(row)
        else:
            rows = replay(requests, config, manager=manager).requests
            persist(rows)
            for row in rows if on_request is not None else ():
                on_request(row)
    finally:
        if unsubscribe is not None:
            unsubscribe()
    return rows


def session_requests(store: Store, info: SessionInfo, tokenizer: Any = None) -> tuple[list[TraceRequest], list[Turn]]:
    """What replaying a session sends: its trace lines, or its rendered chat turns."""
    if info.kind == "trace":
        from engine.store.weka import with_models  # an imported kv-cache-tester trace keeps its models

        return with_models(store.trace_requests(info.id), info.settings), []
    salt = session_salt(info)
    turns = session_turns(store, info, tokenizer)
    return turn_requests(turns, salt), turns


def replay_session(store: Store, session_id: int, *, capacity_blocks: int | None = None, concurrency: int = 1,
                   persist: bool = True, events: EventBus | None = None, tokenizer: Any = None,
                   on_request: Callable[[ServedRequest], None] | None = None) -> ReplayResult:
    """Replay a stored session through a fresh engine seeded from the session, so hashes and
    events repeat exactly. With `persist`, the run, its requests and its events are stored
    as they happen (each request in its own transaction, so a killed run loses none)."""
    info = store.get_session(session_id)
    requests, turns = session_requests(store, info, tokenizer)
    config = session_config(info, capacity_blocks, concurrency)
    manager = make_manager(config, events if events is not None else EventBus())
    run_id = store.create_run(session_id, "replay", asdict(config)) if persist else None
    try:
        rows = run_requests(requests, config, manager, store if persist else None, run_id, turns, on_request)
    except BaseException:
        # What was committed stays (each request is its own transaction); the run says it ended early.
        if run_id is not None:
            store.abort_run(run_id)
        raise
    totals = ReplayTotals.of(rows, manager.counters)
    if run_id is not None:
        store.finish_run(run_id, totals.to_dict())
    return ReplayResult({**asdict(config), "session": session_id, "run_id": run_id}, totals,
                        sorted(rows, key=lambda r: r.index))
