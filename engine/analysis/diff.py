"""Token diff: where two requests stop sharing a prefix, and why (the miss reasons of a lookup, for a pair).

Compares token ids, never rendered text; the text is only decoded to explain the cause.
Loading a request (message file, raw text, trace line, stored request) lives here too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from engine.core.errors import InputError, TraceError, show_path
from engine.core.validation import check_regular_file, read_bytes
from engine.analysis.conversations import load_conversation_file, messages_of
from engine.core.sniff import is_request_trace
from engine.model.chat import default_system_prompt, render_chat

CAUSES = ("identical", "tenant_salt", "default_system_prompt", "whitespace", "timestamp_or_id", "reordered",
          "bos_or_special_token", "new_content")
_ID_PATTERNS = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"  # ISO date/time
    r"|\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp][Mm])?"  # clock time
    r"|\d{1,2}/\d{1,2}/\d{2,4}"  # 5/17/2025
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"  # uuid
    r"|\b[0-9a-fA-F]*\d[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*\b(?<=\w{10})"  # long hex with letters and digits
    r"|\b[A-Za-z]{2,}[-_][A-Za-z0-9]*\d[A-Za-z0-9-_]*"  # req_8f3k2, id-2931
    r"|\d{5,}")  # long numbers: unix times, order ids
_CHUNK_SPLIT = re.compile(r"\n\s*\n|<\|im_start\|>|<\|im_end\|>|\n(?=\S)")


@dataclass(slots=True, frozen=True)
class DiffRequest:
    """One side of a diff: its token ids, tenant salt, and the messages when known."""

    token_ids: tuple[int, ...]
    salt: str | None = None
    label: str = ""
    messages: tuple[dict[str, str], ...] | None = None


@dataclass(slots=True, frozen=True)
class TokenDiff:
    first_divergent_token: int | None
    matching_tokens: int
    matching_blocks: int
    reusable_blocks: int
    block_size: int
    cause: str
    explanation: str
    a: dict[str, Any]
    b: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _side(tokenizer: Any, ids: Sequence[int], d: int, window: int) -> dict[str, Any]:
    start = max(0, d - window)
    piece = list(ids[start:d + window])
    div = {"id": ids[d], "text": _decode(tokenizer, [ids[d]])} if d < len(ids) else None
    return {"tokens": piece, "text": _decode(tokenizer, piece), "window_start": start,
            "token_texts": [_decode(tokenizer, [t]) for t in piece], "num_tokens": len(ids), "divergent": div}


def _no_ws(text: str) -> str:
    return "".join(text.split())


def _chunks(text: str) -> list[str]:
    return [c.strip() for c in _CHUNK_SPLIT.split(text) if c.strip()]


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for tid, tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(tid))
    return ids


def _covers_id(text: str, offset: int) -> str | None:
    for m in _ID_PATTERNS.finditer(text):
        if m.start() <= offset <= m.end() and m.end() > m.start():
            return m.group(0)
    return None


def classify(tokenizer: Any, a: DiffRequest, b: DiffRequest, d: int) -> tuple[str, str]:
    """The cause class of a divergence at token `d` and one sentence explaining it."""
    ta, tb = a.token_ids, b.token_ids
    if a.salt != b.salt:
        return "tenant_salt", (f"the tenants differ ({a.salt!r} vs {b.salt!r}): the salt enters the first block's "
                               f"hash, so no block is shared" + ("" if ta == tb else f"; the tokens also differ at {d}"))
    if ta == tb:
        return "identical", "the token ids are identical: every whole block is shared"
    text_a, text_b = _decode(tokenizer, ta), _decode(tokenizer, tb)
    offset = len(_decode(tokenizer, ta[:d]))
    default = default_system_prompt(tokenizer)
    if default:
        in_a, in_b = default in text_a, default in text_b
        if in_a != in_b:
            side_text = text_a if in_a else text_b
            if offset <= side_text.find(default) + len(default):
                which = "A" if in_a else "B"
                return "default_system_prompt", (f"the chat template inserted its default system prompt "
                                                 f"({default[:60]!r}) in {which}, which has no system message, "
                                                 f"and the other side has one")
    rest_a, rest_b = text_a[offset:], text_b[offset:]
    sa, sb = _no_ws(rest_a), _no_ws(rest_b)
    n = min(len(sa), len(sb), 64)
    first_ws = (rest_a[:1].isspace() or rest_b[:1].isspace())
    if first_ws and (sa == sb or (n > 0 and sa[:n] == sb[:n])):
        return "whitespace", "only whitespace differs here (a space, an indent or a trailing newline)"
    ida, idb = _covers_id(text_a, offset), _covers_id(text_b, offset)
    if ida and idb and ida != idb:
        return "timestamp_or_id", f"a timestamp or id changed ({ida!r} vs {idb!r}); everything after it misses"
    # Segments start at the separator before the divergence, so the chunk holding it is whole.
    start = max((m.end() for m in _CHUNK_SPLIT.finditer(text_a[:offset])), default=0)
    ca, cb = _chunks(text_a[start:]), _chunks(text_b[start:])
    if ca and cb and ca[0] != cb[0] and ca[0] in cb[1:] and cb[0] in ca[1:]:
        return "reordered", "the same segments (tools, documents or chunks) appear in another order"
    sid = _special_ids(tokenizer)
    if (d < len(ta) and ta[d] in sid) or (d < len(tb) and tb[d] in sid):
        return "bos_or_special_token", "a BOS or special token appears on one side only (a doubled BOS or a template marker)"
    if d >= len(ta) or d >= len(tb):
        longer = "B" if d >= len(ta) else "A"
        return "new_content", f"one request is a prefix of the other: {longer} only adds new content"
    return "new_content", "the text itself differs: new or edited content"


def diff_requests(tokenizer: Any, a: DiffRequest, b: DiffRequest, block_size: int = 16, window: int = 8) -> TokenDiff:
    """Compare the token ids of `a` and `b` (b is taken as the later request)."""
    if block_size < 1:
        raise InputError(f"--block-size must be at least 1, not {block_size}")
    ta, tb = a.token_ids, b.token_ids
    n = min(len(ta), len(tb))
    d = 0
    while d < n and ta[d] == tb[d]:
        d += 1
    identical = ta == tb
    cause, why = classify(tokenizer, a, b, d)
    shared = 0 if a.salt != b.salt else d
    return TokenDiff(first_divergent_token=None if identical else d, matching_tokens=d,
                     matching_blocks=shared // block_size,
                     reusable_blocks=min(shared, max(len(tb) - 1, 0)) // block_size, block_size=block_size,
                     cause=cause, explanation=why, a=_side(tokenizer, ta, d, window), b=_side(tokenizer, tb, d, window))


# ---- loading a side ---------------------------------------------------------------------

def render_messages(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    if not messages:
        raise InputError("the request has no messages")
    return render_chat(tokenizer, messages, add_generation_prompt=messages[-1]["role"] != "assistant")


def request_from_text(tokenizer: Any, text: str, salt: str | None = None, label: str = "") -> DiffRequest:
    """Raw text rendered through the chat template as one user message."""
    msgs = ({"role": "user", "content": text},)
    return DiffRequest(tuple(render_messages(tokenizer, msgs)), salt, label, msgs)


def request_from_messages(tokenizer: Any, messages: Sequence[dict[str, str]], salt: str | None = None,
                          label: str = "") -> DiffRequest:
    msgs = tuple(dict(m) for m in messages)
    return DiffRequest(tuple(render_messages(tokenizer, msgs)), salt, label, msgs)


def load_request(spec: str, tokenizer: Any, salt: str | None = None, db: str | None = None) -> DiffRequest:
    """A side from `spec`: a .txt file, a message file, a token-level trace, or session:ID:REQ."""
    m = re.fullmatch(r"session:(\d+):(.+)", spec)
    if m:
        return _stored_request(int(m.group(1)), m.group(2), salt, db)
    path = Path(spec)
    if not os.path.lexists(path):
        raise InputError(f"{show_path(spec)}: no such file (give a .txt or message file, or session:ID:REQ)")
    check_regular_file(path, "request file")
    if path.suffix.lower() in (".txt", ".md", ""):
        try:
            text = read_bytes(path, "text file").decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{show_path(spec)}: not UTF-8 text") from None
        return request_from_text(tokenizer, text, salt, spec)
    if is_request_trace(path):
        from engine.core.trace import read_trace

        tr = next(read_trace(path))  # the first request only: the rest of the file is not read
        if tr.tokens is None:
            raise InputError(f"{spec}: a block-level (Mooncake) trace has no token ids to compare")
        vocab = len(tokenizer)
        for fld, ids in (("tokens", tr.tokens),):
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise TraceError(spec, tr.line, fld, f"token id {bad} is not in the tokenizer's vocabulary of "
                                                     f"{vocab} ids, so it cannot be shown as text")
        return DiffRequest(tr.tokens, salt if salt is not None else tr.tenant, spec)
    convs = load_conversation_file(path)
    if not convs:
        raise InputError(f"{spec}: the file holds no conversation")
    return request_from_messages(tokenizer, messages_of(convs[0]), salt, spec)


def _stored_request(session_id: int, req: str, salt: str | None, db: str | None) -> DiffRequest:
    from engine.store.database import Store

    with Store(db, read_only=True) as store:
        store.get_session(session_id)
        for run in reversed(store.runs(session_id)):
            for r in store.requests(run.id):
                if (r.request_id == req or str(r.idx) == req) and r.prompt_token_ids:
                    return DiffRequest(tuple(r.prompt_token_ids), salt if salt is not None else r.tenant,
                                       f"session:{session_id}:{req}")
    raise InputError(f"session {session_id} has no stored request {req!r} with token ids")

