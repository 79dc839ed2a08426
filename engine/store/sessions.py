"""Sessions: import files into the store, export them, replay them through a fresh engine,
and edit a message to see what the edit invalidates. Chat sessions are rendered per
request with the model's chat template (tokenizer only, no weights); replies are kept.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from engine.core.errors import InputError, TraceError
from engine.core.events import EventBus
from engine.core.validation import apply_chat_template
from engine.store.formats import (MOONCAKE_BLOCK_SIZE, SESSION_FILE_FORMAT, Conversation, load_conversations,
                            trace_request_dict)
from engine.core.manager import PrefixCacheManager, Request
from engine.core.replay import ReplayConfig, make_manager, replay
from engine.store.database import SessionInfo, Store
from engine.core.trace import TraceRequest

DEFAULT_CAPACITY_BLOCKS = 4096
_REQUEST_ROLES = ("user", "tool", "function")


# ---------------------------------------------------------------------------- import / export
def import_file(store: Store, path: str | Path, format: str | None = None, *, title: str | None = None,
                model: str | None = None, block_size: int | None = None, capacity_blocks: int | None = None,
                seed: int | None = None, hash: str | None = None) -> list[int]:
    """Import every conversation of `path` as one session each, in ONE transaction.

    The whole file is parsed before anything is written, and a failure while writing
    rolls everything back, so a bad file leaves no half-imported session behind.
    """
    conversations = load_conversations(path, format)
    overrides = {k: v for k, v in (("model", model), ("block_size", block_size), ("capacity_blocks", capacity_blocks),
                                   ("seed", seed), ("hash", hash)) if v is not None}
    with store.atomic():
        return [import_conversation(store, c, str(path), title, overrides) for c in conversations]


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


# ---------------------------------------------------------------------------- chat rendering
@dataclass(slots=True, frozen=True)
class Turn:
    """One request of a chat session: the prompt sent after message `message_position`
    and the recorded reply (messages up to `reply_end`), as token ids."""

    index: int
    message_position: int
    reply_end: int
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    message_starts: tuple[int, ...]  # token index where each message 0..reply_end starts

    def message_at(self, token_index: int | None) -> int | None:
        """The position of the message that holds token `token_index` (None if unknown)."""
        if token_index is None:
            return None
        return max(bisect.bisect_right(self.message_starts, token_index) - 1, 0)


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    text = apply_chat_template(tokenizer, messages, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_turns(messages: Sequence[Any], tokenizer: Any, tools: list[Any] | None = None) -> list[Turn]:
    """Cut a chat into requests: one after every user (or tool) message, as the chat
    template renders it with the generation prompt; the following assistant messages are
    the reply. `messages` are `MessageRow`s or `formats.Message`s (role, content)."""
    chat = [{"role": m.role, "content": m.content} for m in messages]
    shift = 0
    if tools:
        # The template has no tool slot; tool definitions lead the prefix, as hosted APIs order them.
        tool_text = "Tools:\n" + json.dumps(tools, ensure_ascii=False, sort_keys=True)
        if chat and chat[0]["role"] == "system":
            chat[0] = {"role": "system", "content": tool_text + "\n\n" + chat[0]["content"]}
        else:
            chat.insert(0, {"role": "system", "content": tool_text})
            shift = 1
    ends = [len(_render(tokenizer, chat[:i + 1], False)) for i in range(len(chat))]
    starts = [0] + ends[:-1]
    eos = getattr(tokenizer, "eos_token_id", None)
    turns: list[Turn] = []
    for p in range(len(messages)):
        r = p + shift
        if chat[r]["role"] not in _REQUEST_ROLES:
            continue
        if r + 1 < len(chat) and chat[r + 1]["role"] in ("tool", "function"):
            continue  # parallel tool results go out together, after the last one
        prompt = _render(tokenizer, chat[:r + 1], True)
        q = r
        while q + 1 < len(chat) and chat[q + 1]["role"] == "assistant":
            q += 1
        output: list[int] = []
        if q > r:
            full = _render(tokenizer, chat[:q + 1], False)
            if full[:len(prompt)] == prompt:
                output = full[len(prompt):]
            else:
                output = list(tokenizer.encode("\n".join(c["content"] for c in chat[r + 1:q + 1]),
                                               add_special_tokens=False))
                output += [eos] if eos is not None else []
            # The template's newline after end-of-turn belongs to the next prompt, not the reply.
            if eos is not None and eos in output:
                output = output[:len(output) - output[::-1].index(eos)]
        turns.append(Turn(len(turns), p, q - shift, tuple(prompt), tuple(output),
                          tuple(starts[shift:q + 1])))
    return turns


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


def run_requests(requests: Sequence[TraceRequest], config: ReplayConfig, manager: PrefixCacheManager,
                 store: Store | None = None, run_id: int | None = None,
                 turns: Sequence[Turn] | None = None,
                 on_request: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Serve `requests` on `manager` as `engine.core.replay.replay` does; with a store, every
    request is committed with its events in one transaction as soon as it finishes.
    `on_request(row)` is called after each request is served (and committed)."""
    events: list[Any] = []
    unsubscribe = manager.events.subscribe(events.append) if store is not None else None
    rows: list[dict[str, Any]] = []
    by_index = {t.index: t for t in turns or ()}
    by_id = {r.index: r for r in requests} if store is not None else {}

    def persist(batch: list[dict[str, Any]]) -> None:
        for row in batch:
            turn = by_index.get(row["index"])
            if turn is not None:
                row["message_position"] = turn.message_position
                row["miss_message"] = turn.message_at(row["divergence_token"] if row["divergence_token"] is not None
                                                      else row["first_miss_block"] * config.block_size)
        if store is None or run_id is None:
            return
        with store.atomic():
            for row in batch:
                tr = by_id[row["index"]]
                store.record_request(run_id, row["index"], request_id=row["id"], tenant=row["tenant"],
                                     prompt_token_ids=tr.tokens, output_token_ids=tr.output_tokens,
                                     prompt_tokens=row["prompt_tokens"], cached_tokens=row["cached_tokens"],
                                     computed_tokens=row["computed_tokens"], miss_reason=row["miss_reason"],
                                     first_miss_block=row["first_miss_block"],
                                     divergence_token=row["divergence_token"],
                                     message_position=row.get("message_position"), refused=row.get("refused", False))
            store.record_events(run_id, events)
        events.clear()

    try:
        if config.concurrency == 1:
            for tr in requests:
                batch = replay([tr], config, manager=manager)["requests"]
                persist(batch)
                rows.extend(batch)
                for row in batch if on_request is not None else ():
                    on_request(row)
        else:
            rows = replay(requests, config, manager=manager)["requests"]
            persist(rows)
            for row in rows if on_request is not None else ():
                on_request(row)
    finally:
        if unsubscribe is not None:
            unsubscribe()
    return rows


def totals_of(rows: Sequence[dict[str, Any]], manager: PrefixCacheManager) -> dict[str, Any]:
    """The `totals` of the replay contract for `rows` served on `manager`."""
    served = [r for r in rows if not r.get("refused")]
    prompt = sum(r["prompt_tokens"] for r in served)
    cached = sum(r["cached_tokens"] for r in served)
    c = manager.counters
    return {"requests": len(rows), "prompt_tokens": prompt, "cached_tokens": cached, "computed_tokens": prompt - cached,
            "hit_rate": round(cached / prompt, 6) if prompt else 0.0, "stored_blocks": c.num_stored_blocks,
            "evicted_blocks": c.num_evicted_blocks, "refused_requests": len(rows) - len(served)}


def session_requests(store: Store, info: SessionInfo, tokenizer: Any = None) -> tuple[list[TraceRequest], list[Turn]]:
    """What replaying a session sends: its trace lines, or its rendered chat turns."""
    if info.kind == "trace":
        return store.trace_requests(info.id), []
    turns = session_turns(store, info, tokenizer)
    return turn_requests(turns, info.settings.get("salt")), turns


def replay_session(store: Store, session_id: int, *, capacity_blocks: int | None = None, concurrency: int = 1,
                   persist: bool = True, events: EventBus | None = None, tokenizer: Any = None,
                   on_request: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Replay a stored session through a fresh engine seeded from the session, so hashes and
    events repeat exactly. Returns the replay contract ({"config", "totals", "requests"});
    with `persist`, the run, its requests and its events are stored as they happen."""
    info = store.get_session(session_id)
    requests, turns = session_requests(store, info, tokenizer)
    config = session_config(info, capacity_blocks, concurrency)
    manager = make_manager(config, events if events is not None else EventBus())
    run_id = store.create_run(session_id, "replay", _config_dict(config)) if persist else None
    rows = run_requests(requests, config, manager, store if persist else None, run_id, turns, on_request)
    totals = totals_of(rows, manager)
    if run_id is not None:
        store.finish_run(run_id, totals)
    out_config = _config_dict(config)
    out_config.update(session=session_id, run_id=run_id)
    return {"config": out_config, "totals": totals, "requests": sorted(rows, key=lambda r: r["index"])}


def _config_dict(config: ReplayConfig) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(config)


# ---------------------------------------------------------------------------- edit
def edit_and_rerun(store: Store, session_id: int, position: int, content: str, *, persist: bool = True,
                   tokenizer: Any = None, capacity_blocks: int | None = None, generate: bool = False,
                   max_new_tokens: int = 64, loaded: Any = None) -> dict[str, Any]:
    """Store `content` as a new version of message `position` and re-run from there.

    A fresh engine (the session's seed) first serves the conversation as it was: the cache
    a user had before the edit. The baseline ("before") is re-sending those requests, from
    the first one that contains the message, on that cache; the edited requests are then
    served on it ("after"). The result gives the first invalidated block, each request's
    miss reason, and what the edit cost (`edit_cost_tokens`: extra tokens computed).
    With `generate`, the real model (`loaded`, or the session's model) serves the requests
    and writes new replies from the edited message on, stored as new message versions.
    """
    info = store.get_session(session_id)
    if info.kind != "chat":
        raise InputError(f"session {session_id} is a trace; only chat sessions have messages to edit")
    old_messages = store.messages(session_id)
    if not 0 <= position < len(old_messages):
        raise InputError(f"session {session_id} has no message {position}; "
                         f"messages are numbered 0 to {len(old_messages) - 1}, the system message included")
    if old_messages[position].content == content:
        raise InputError(f"message {position} already says that; an edit needs different text")
    from engine.model.loader import load_tokenizer

    tok = tokenizer if tokenizer is not None else load_tokenizer(info.model)
    tools = info.settings.get("tools")
    old_turns = render_turns(old_messages, tok, tools)
    if not old_turns:
        raise InputError(f"session {session_id} has no user message, so there is no request to run")
    with store.atomic():
        edited = store.edit_message(session_id, position, content)
        new_turns = render_turns(store.messages(session_id), tok, tools)
    first = next((t.index for t in new_turns if t.reply_end >= position), None)
    config = session_config(info, capacity_blocks)
    salt = info.settings.get("salt")
    runner = None
    if generate:
        from engine.model.loader import load_model
        from engine.model.runner import ModelRunner

        runner = ModelRunner(loaded if loaded is not None else load_model(info.model), num_blocks=config.capacity_blocks,
                             block_size=config.block_size, seed=config.seed, hash=config.hash, events=EventBus())
        manager = runner.manager
        for t in old_turns:  # teacher-forced: prompt and recorded reply get real KV
            runner.generate(t.prompt_token_ids + t.output_token_ids, max_new_tokens=1, salt=salt,
                            request_id=f"before-{t.index}")
    else:
        manager = make_manager(config, EventBus())
        run_requests(turn_requests(old_turns, salt), config, manager, turns=old_turns)
    # The baseline is re-sending the unedited requests on that same warm cache (a pure lookup).
    before = {t.index: manager.lookup(Request(f"before-{t.index}", t.prompt_token_ids, salt=salt))
              for t in old_turns[first or 0:]}
    result: dict[str, Any] = {"session": session_id, "message": position, "version": edited.version,
                              "invalidated_from_block": None, "divergence_token": None,
                              "cached_tokens_before": 0, "cached_tokens_after": 0, "computed_tokens_before": 0,
                              "computed_tokens_after": 0, "edit_cost_tokens": 0, "run_id": None, "requests": []}
    if first is None:
        return result  # the edited message is after the last request: nothing to re-run
    run_id = store.create_run(session_id, "edit", {**_config_dict(config), "message": position,
                                                   "version": edited.version}) if persist else None
    if runner is not None:
        after = _generate_turns(store, session_id, runner, tok, tools, first, salt, max_new_tokens,
                                run_id, f"edit{edited.version}-turn")
        new_turns = render_turns(store.messages(session_id), tok, tools)
    else:
        new_requests = turn_requests(new_turns[first:], salt, prefix=f"edit{edited.version}-turn")
        after = run_requests(new_requests, config, manager, store if persist else None, run_id, new_turns[first:])
    for row in after:
        if row["index"] in before:
            row["cached_tokens_before"] = before[row["index"]].num_cached_tokens
    old_t, new_t = old_turns[first] if first < len(old_turns) else None, new_turns[first]
    diverge = _first_difference(old_t, new_t, with_reply=runner is None)
    result.update(
        invalidated_from_block=diverge // config.block_size if diverge is not None else None,
        divergence_token=diverge,
        cached_tokens_before=sum(lk.num_cached_tokens for lk in before.values()),
        cached_tokens_after=sum(r["cached_tokens"] for r in after),
        computed_tokens_before=sum(lk.num_computed_tokens for lk in before.values()),
        computed_tokens_after=sum(r["computed_tokens"] for r in after),
        run_id=run_id, requests=after)
    result["edit_cost_tokens"] = result["computed_tokens_after"] - result["computed_tokens_before"]
    if run_id is not None:
        store.finish_run(run_id, {**totals_of(after, manager), "edit_cost_tokens": result["edit_cost_tokens"]})
    return result


def _first_difference(old: Turn | None, new: Turn, with_reply: bool = True) -> int | None:
    """First token index where the edited request (prompt, then reply) differs from the old one."""
    b = new.prompt_token_ids + (new.output_token_ids if with_reply else ())
    if old is None:
        return 0
    a = old.prompt_token_ids + (old.output_token_ids if with_reply else ())
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else None


def _generate_turns(store: Store, session_id: int, runner: Any, tok: Any, tools: Any, first: int, salt: str | None,
                    max_new_tokens: int, run_id: int | None, prefix: str) -> list[dict[str, Any]]:
    """Serve turns `first`.. with the model; each new reply replaces the recorded one (a new
    version) or is appended, so later prompts carry what the model said this time."""
    events: list[Any] = []
    unsubscribe = runner.events.subscribe(events.append)
    rows: list[dict[str, Any]] = []
    try:
        i = first
        while True:
            turns = render_turns(store.messages(session_id), tok, tools)
            if i >= len(turns):
                return rows
            turn = turns[i]
            res = runner.generate(turn.prompt_token_ids, max_new_tokens=max_new_tokens, salt=salt,
                                  request_id=f"{prefix}-{i}")
            miss = res.miss
            row = {"index": i, "id": res.request_id, "tenant": salt, "prompt_tokens": res.num_prompt_tokens,
                   "cached_tokens": res.num_cached_tokens, "computed_tokens": res.num_computed_tokens,
                   "output_tokens": len(res.output_token_ids), "miss_reason": miss.reason if miss else None,
                   "first_miss_block": miss.first_miss_block if miss else None,
                   "divergence_token": miss.divergence_token if miss else None,
                   "message_position": turn.message_position, "output_text": res.output_text,
                   "ttft_ms": res.ttft_ms, "prefill_ms": res.prefill_ms, "decode_ms": res.decode_ms}
            row["miss_message"] = turn.message_at(row["divergence_token"] if row["divergence_token"] is not None
                                                  else (row["first_miss_block"] or 0) * runner.block_size)
            with store.atomic():
                reply, slot = res.output_text.strip(), turn.message_position + 1
                current = store.messages(session_id)
                if turn.reply_end >= slot and current[slot].content != reply:
                    store.edit_message(session_id, slot, reply)
                elif turn.reply_end < slot and slot == len(current):
                    store.add_message(session_id, "assistant", reply)
                if run_id is not None:
                    store.record_request(run_id, i, request_id=row["id"], tenant=salt,
                                         prompt_token_ids=res.prompt_token_ids, output_token_ids=res.output_token_ids,
                                         **{k: row[k] for k in ("prompt_tokens", "cached_tokens", "computed_tokens",
                                                                "miss_reason", "first_miss_block", "divergence_token",
                                                                "message_position", "output_text", "ttft_ms",
                                                                "prefill_ms", "decode_ms")})
                    store.record_events(run_id, events)
            events.clear()
            rows.append(row)
            i += 1
    finally:
        unsubscribe()
