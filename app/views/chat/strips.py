"""How a chat maps onto token strips: which tokens each message's strip shows and in which
cache state (`strip_data`, `request_strip`). The painter is `app.ui.token_strip`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.ui.token_strip import StripData
from app.runtime.chat_messages import MISS_TEXT, ChatMessage, chat_dicts
from engine.model.chat import message_ends, render_chat


@dataclass(slots=True)
class _Turn:
    prompt_len: int
    cached: int
    miss: Any
    gen_start: int
    gen_end: int


def _decoder(tokenizer: Any, memo: dict[int, str] | None) -> Any:
    if memo is None:
        return lambda tid: tokenizer.decode([tid])

    def decode(tid: int) -> str:
        text = memo.get(tid)
        if text is None:
            text = memo[tid] = tokenizer.decode([tid])
        return text

    return decode


def request_strip(tokenizer: Any, result: Any, block_size: int, forced: bool = False,
                  memo: dict[int, str] | None = None) -> StripData:
    """The whole request of one turn: its prompt coloured cached / computed / partial tail,
    then what it generated, with the first missed block and the divergence token marked."""
    prompt = list(result.prompt_token_ids)
    output = [] if forced else list(result.output_token_ids)
    n, cached = len(prompt), int(result.num_cached_tokens)
    tail = n // block_size * block_size
    states = ["cached" if p < cached else "partial" if p >= tail else "computed" for p in range(n)]
    ids = prompt + output
    decode = _decoder(tokenizer, memo)
    data = StripData(ids, [decode(i) for i in ids], states + ["generated"] * len(output), 0, block_size)
    miss = result.miss
    if miss is not None and cached < n:
        data.miss_position = cached
        div = getattr(miss, "divergence_token", None)
        data.divergence_position = div if div is not None and div < n else None
        data.miss_text = f"first missed block {cached // block_size}: {MISS_TEXT.get(miss.reason, miss.reason)}"
    return data


def strip_data(tokenizer: Any, messages: list[ChatMessage], block_size: int,
               memo: dict[int, str] | None = None) -> list[StripData]:
    """Token strips of every message. A user message shows its own span of the
    conversation's tokens as the request it triggered served them (so an edit's first miss
    shows where the edit is); a finished reply shows its whole request (so reuse of the
    history shows); anything not run yet is `pending`."""
    if not messages:
        return []
    dicts = chat_dicts(messages)
    full = render_chat(tokenizer, dicts, False)
    ends = message_ends(tokenizer, dicts[:-1]) + [len(full)]
    turns: dict[int, _Turn] = {}
    for j, m in enumerate(messages):
        r = m.result
        if r is not None and not m.stale:
            n = len(r.prompt_token_ids)
            gen = 0 if m.forced else len(r.output_token_ids)
            turns[j] = _Turn(n, int(r.num_cached_tokens), r.miss, n, n + gen)
    ordered = [turns[j] for j in sorted(turns)]
    decode = _decoder(tokenizer, memo)
    out: list[StripData] = []
    start = 0
    for j, end in enumerate(ends):
        end = max(end, start)
        ids = full[start:end]
        states: list[str] = []
        for p in range(start, end):
            t = next((t for t in ordered if t.prompt_len > p), None)
            if t is not None:
                tail = (t.prompt_len // block_size) * block_size
                states.append("cached" if p < t.cached else "partial" if p >= tail else "computed")
            elif j in turns and turns[j].gen_start <= p < turns[j].gen_end:
                states.append("generated")
            else:
                states.append("pending")
        if j in turns and messages[j].role == "assistant":
            out.append(request_strip(tokenizer, messages[j].result, block_size, messages[j].forced, memo))
            start = end
            continue
        data = StripData(ids, [decode(i) for i in ids], states, start, block_size)
        # The first miss of the turn whose prompt ends in (or right after) this message.
        owner = turns.get(j + 1) if j + 1 < len(messages) and messages[j].role == "user" else None
        if owner is not None and owner.miss is not None and start <= owner.cached < end:
            data.miss_position = owner.cached
            div = getattr(owner.miss, "divergence_token", None)
            if div is not None and start <= div < end:
                data.divergence_position = div
            data.miss_text = (f"first missed block {owner.cached // block_size}: "
                              f"{MISS_TEXT.get(owner.miss.reason, owner.miss.reason)}")
        out.append(data)
        start = end
    return out
