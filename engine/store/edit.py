"""Editing a stored chat message and re-running what the edit invalidates
(`cachescope sessions edit`). Which requests an edit re-runs is decided by
`engine.model.chat.requests_after_edit`, the same function the app and the demo use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.core.errors import InputError
from engine.core.events import EventBus
from engine.core.manager import Request
from engine.core.replay import make_manager
from engine.core.served import ReplayTotals, ServedRequest
from engine.core.trace import common_prefix_length
from engine.model.chat import Turn, render_turns, requests_after_edit
from engine.store.database import Store
from engine.store.sessions import run_requests, session_config, session_salt, turn_requests


@dataclass(slots=True)
class EditResult:
    """What an edit invalidated and cost. `invalidated_from_block` is None when no request
    changed (the edited message comes after the last request)."""

    session: int
    message: int
    version: int
    invalidated_from_block: int | None = None
    divergence_token: int | None = None
    cached_tokens_before: int = 0
    cached_tokens_after: int = 0
    computed_tokens_before: int = 0
    computed_tokens_after: int = 0
    edit_cost_tokens: int = 0  # extra tokens computed because of the edit
    run_id: int | None = None
    requests: list[ServedRequest] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "requests"}
        out["requests"] = [r.to_dict() for r in self.requests]
        return out


def edit_and_rerun(store: Store, session_id: int, position: int, content: str, *, persist: bool = True,
                   tokenizer: Any = None, capacity_blocks: int | None = None, generate: bool = False,
                   max_new_tokens: int = 64, loaded: Any = None) -> EditResult:
    """Store `content` as a new version of message `position` and re-run from there.

    A fresh engine (the session's seed) first serves the conversation as it was: the cache
    a user had before the edit. The baseline ("before") is re-sending those requests, from
    the first one the edit touches, on that cache; the edited requests are then served on
    it ("after"). With `generate`, the real model (`loaded`, or the session's model) serves
    the requests and writes new replies after the edited message, stored as new versions.
    Everything is one transaction: if any step fails (a request refused for lack of
    blocks, say) the session and its runs are left exactly as they were.
    """
    info = store.get_session(session_id)
    if info.kind != "chat":
        raise InputError(f"session {session_id} is a trace; only chat sessions have messages to edit")
    salt = session_salt(info)
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
    rerun = requests_after_edit([m.role for m in old_messages], position, keep_replies=not generate)
    config = session_config(info, capacity_blocks)
    with store.atomic():
        edited = store.edit_message(session_id, position, content)
        result = EditResult(session_id, position, edited.version)
        new_turns = render_turns(store.messages(session_id), tok, tools)
        first = next((t.index for t in new_turns if rerun and t.message_position == rerun[0]), None)
        if first is None:
            return result  # the edited message is after the last request: nothing to re-run
        runner = None
        if generate:
            from engine.model.loader import load_model
            from engine.model.runner import ModelRunner

            runner = ModelRunner(loaded if loaded is not None else load_model(info.model),
                                 num_blocks=config.capacity_blocks, block_size=config.block_size, seed=config.seed,
                                 hash_name=config.hash, events=EventBus())
            manager = runner.manager
            for t in old_turns:  # teacher-forced: prompt and recorded reply get real KV
                runner.generate(t.prompt_token_ids + t.output_token_ids, max_new_tokens=1, salt=salt,
                                request_id=f"before-{t.index}")
        else:
            manager = make_manager(config, EventBus())
            run_requests(turn_requests(old_turns, salt), config, manager, turns=old_turns)
        # The baseline is re-sending the unedited requests on that same warm cache (a pure lookup).
        before = {t.index: manager.lookup(Request(f"before-{t.index}", t.prompt_token_ids, salt=salt))
                  for t in old_turns[first:]}
        run_id = store.create_run(session_id, "edit", {**asdict(config), "message": position,
                                                       "version": edited.version}) if persist else None
        if runner is not None:
            after = _generate_turns(store, session_id, runner, tok, tools, first, salt, max_new_tokens,
                                    run_id, f"edit{edited.version}-turn")
            new_turns = render_turns(store.messages(session_id), tok, tools)
        else:
            new_requests = turn_requests(new_turns[first:], salt, prefix=f"edit{edited.version}-turn")
            after = run_requests(new_requests, config, manager, store if persist else None, run_id,
                                 new_turns[first:])
        for row in after:
            if row.index in before:
                row.cached_tokens_before = before[row.index].num_cached_tokens
        old_turn = old_turns[first] if first < len(old_turns) else None
        diverge = _first_difference(old_turn, new_turns[first], with_reply=runner is None)
        result.invalidated_from_block = diverge // config.block_size if diverge is not None else None
        result.divergence_token = diverge
        result.cached_tokens_before = sum(lk.num_cached_tokens for lk in before.values())
        result.cached_tokens_after = sum(r.cached_tokens for r in after)
        result.computed_tokens_before = sum(lk.num_computed_tokens for lk in before.values())
        result.computed_tokens_after = sum(r.computed_tokens for r in after)
        result.edit_cost_tokens = result.computed_tokens_after - result.computed_tokens_before
        result.run_id, result.requests = run_id, after
        if run_id is not None:
            store.finish_run(run_id, {**ReplayTotals.of(after, manager.counters).to_dict(),
                                      "edit_cost_tokens": result.edit_cost_tokens})
    return result


def _first_difference(old: Turn | None, new: Turn, with_reply: bool = True) -> int | None:
    """First token index where the edited request (prompt, then reply) differs from the old one."""
    if old is None:
        return 0
    a = old.prompt_token_ids + (old.output_token_ids if with_reply else ())
    b = new.prompt_token_ids + (new.output_token_ids if with_reply else ())
    n = common_prefix_length(a, b)
    return None if n == len(a) == len(b) else n


def _generate_turns(store: Store, session_id: int, runner: Any, tok: Any, tools: Any, first: int, salt: str | None,
                    max_new_tokens: int, run_id: int | None, prefix: str) -> list[ServedRequest]:
    """Serve turns `first`.. with the model; each new reply replaces the recorded one (a new
    version) or is appended, so later prompts carry what the model said this time."""
    events: list[Any] = []
    unsubscribe = runner.events.subscribe(events.append)
    rows: list[ServedRequest] = []
    try:
        i = first
        while True:
            turns = render_turns(store.messages(session_id), tok, tools)
            if i >= len(turns):
                return rows
            turn = turns[i]
            res = runner.generate(turn.prompt_token_ids, max_new_tokens=max_new_tokens, salt=salt,
                                  request_id=f"{prefix}-{i}")
            row = ServedRequest.from_result(i, res, salt)
            row.message_position = turn.message_position
            row.miss_message = turn.message_at(row.divergence_token if row.divergence_token is not None
                                               else (row.first_miss_block or 0) * runner.block_size)
            with store.atomic():
                reply, slot = res.output_text.strip(), turn.message_position + 1
                current = store.messages(session_id)
                if turn.reply_end >= slot and current[slot].content != reply:
                    store.edit_message(session_id, slot, reply)
                elif turn.reply_end < slot and slot == len(current):
                    store.add_message(session_id, "assistant", reply)
                if run_id is not None:
                    store.record_request(run_id, i, request_id=row.id, tenant=salt,
                                         prompt_token_ids=res.prompt_token_ids, output_token_ids=res.output_token_ids,
                                         prompt_tokens=row.prompt_tokens, cached_tokens=row.cached_tokens,
                                         computed_tokens=row.computed_tokens, miss_reason=row.miss_reason,
                                         first_miss_block=row.first_miss_block,
                                         divergence_token=row.divergence_token,
                                         message_position=row.message_position, output_text=row.output_text,
                                         ttft_ms=row.ttft_ms, prefill_ms=row.prefill_ms, decode_ms=row.decode_ms)
                    store.record_events(run_id, events)
            events.clear()
            rows.append(row)
            i += 1
    finally:
        unsubscribe()
