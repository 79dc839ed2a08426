"""Token diff: where two requests stop sharing a prefix, and why (the miss reasons of a lookup, for a pair).

Compares token ids, never rendered text; the text is only decoded to explain the cause.
Loading a request (message file, raw text, trace line, stored request) lives here too.
"""

from __future__ import annotations

import json
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
    moved: tuple[str, ...] = ()  # "reordered": the units that changed place, in A's order

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


def _special_texts(tokenizer: Any) -> list[str]:
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values():
        if getattr(tok, "special", False):
            texts.add(str(tok))
    return [t for t in texts if t]


def _covers_id(text: str, offset: int) -> str | None:
    for m in _ID_PATTERNS.finditer(text):
        if m.start() <= offset <= m.end() and m.end() > m.start():
            return m.group(0)
    return None


# ---- reordered units ---------------------------------------------------------------------
_MAX_ARRAY_STARTS = 32  # '[' positions tried before the divergence when looking for an enclosing JSON list
_MAX_UNITS = 256  # units compared from the divergence on


def _unit_name(item: Any, text: str) -> str:
    """How a moved unit is named: a tool's function name, else an item's name/id/title, else its text."""
    if isinstance(item, dict):
        fn = item.get("function")
        for holder in (fn if isinstance(fn, dict) else None, item):
            if holder is not None:
                for key in ("name", "id", "title"):
                    if isinstance(holder.get(key), str) and holder[key]:
                        return holder[key]
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _is_tool(item: Any) -> bool:
    return isinstance(item, dict) and (isinstance(item.get("function"), dict) or
                                       ("name" in item and ("parameters" in item or "input_schema" in item)))


def _permuted_window(tokenizer: Any, ua: Sequence[str], ub: Sequence[str]) -> int:
    """The length k of the shortest leading window where `ua[:k]` and `ub[:k]` hold the same
    units (compared as token ids) in another order; 0 if there is none."""
    enc: dict[str, tuple[int, ...]] = {}

    def ids(u: str) -> tuple[int, ...]:
        if u not in enc:
            enc[u] = tuple(tokenizer.encode(u, add_special_tokens=False))
        return enc[u]

    balance: dict[tuple[int, ...], int] = {}  # units of A's window minus those of B's
    for k in range(min(len(ua), len(ub), _MAX_UNITS)):
        x, y = ids(ua[k]), ids(ub[k])
        if k == 0 and x == y:
            return 0  # the first unit is unchanged: the divergence is inside it, not a move
        for unit, step in ((x, 1), (y, -1)):
            balance[unit] = balance.get(unit, 0) + step
            if not balance[unit]:
                del balance[unit]
        if not balance:
            return k + 1 if k >= 1 else 0
    return 0


def _json_units(text_a: str, text_b: str, offset: int) -> tuple[list[Any], list[Any], list[str], list[str]] | None:
    """The items of the innermost JSON list that holds character `offset` in both texts
    (the prefix before `offset` is the same in both), each with its canonical text."""
    decoder = json.JSONDecoder()
    tried = 0
    p = text_a.rfind("[", 0, offset)
    while p >= 0 and tried < _MAX_ARRAY_STARTS:
        tried += 1
        try:
            la, end_a = decoder.raw_decode(text_a, p)
            lb, end_b = decoder.raw_decode(text_b, p)
        except ValueError:
            la = lb = None
            end_a = end_b = -1
        if isinstance(la, list) and isinstance(lb, list) and end_a > offset and end_b > offset:
            dump = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731 - keeps the parsed key order
            return la, lb, [dump(v) for v in la], [dump(v) for v in lb]
        p = text_a.rfind("[", 0, p)
    return None


def find_reorder(tokenizer: Any, text_a: str, text_b: str, offset: int) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
    """Whether the texts diverge at character `offset` because the same units moved.

    Units are the items of a JSON list holding the divergence (tool definitions rendered
    as JSON), else the lines from the one holding it. From the divergence on, the shortest
    window of units where A and B hold the same units, compared after tokenization, in
    another order is a reorder. Returns (what the units are, A's moved units in A's order,
    the same in B's order), or None."""
    units = _json_units(text_a, text_b, offset)
    if units is not None:
        la, lb, ta, tb = units
        i = 0
        while i < min(len(ta), len(tb)) and ta[i] == tb[i]:
            i += 1
        k = _permuted_window(tokenizer, ta[i:], tb[i:])
        if k:
            window_a, window_b = la[i:i + k], lb[i:i + k]
            moved = [j for j in range(k) if ta[i + j] != tb[i + j]]
            kind = "tool definitions" if all(_is_tool(v) for v in window_a) else "JSON items"
            return (kind, tuple(_unit_name(window_a[j], ta[i + j]) for j in moved),
                    tuple(_unit_name(window_b[j], tb[i + j]) for j in moved))
    # Lines, cut at the template's special tokens too (a message's last line ends at its end marker).
    cut = re.compile("\n|" + "|".join(re.escape(t) for t in sorted(_special_texts(tokenizer), key=len, reverse=True))
                     if _special_texts(tokenizer) else "\n")
    start = max((m.end() for m in cut.finditer(text_a, 0, offset)), default=0)
    # Empty units (adjacent separators) are no content: one more of them is an insertion, not a move.
    lines_a = [u for u in cut.split(text_a[start:]) if u.strip()]
    lines_b = [u for u in cut.split(text_b[start:]) if u.strip()]
    k = _permuted_window(tokenizer, lines_a, lines_b)
    if k:
        moved = [j for j in range(k) if lines_a[j] != lines_b[j]]
        items_a, items_b = [_json_or_none(u) for u in lines_a[:k]], [_json_or_none(u) for u in lines_b[:k]]
        # One JSON object a line (a template's <tools> block) names each unit by its tool name.
        kind = "tool definitions" if all(_is_tool(v) for v in items_a) else "lines"
        return (kind, tuple(_unit_name(items_a[j], lines_a[j]) for j in moved),
                tuple(_unit_name(items_b[j], lines_b[j]) for j in moved))
    return None


def _reorder_sentence(kind: str, in_a: Sequence[str], in_b: Sequence[str], d: int) -> str:
    order_a, order_b = ", ".join(in_a), ", ".join(in_b)
    return (f"the same {kind} appear in another order ({order_a} in A, {order_b} in B): the content is "
            f"unchanged, but the tokens differ from token {d} on, so every block after it misses")


def classify(tokenizer: Any, a: DiffRequest, b: DiffRequest, d: int) -> tuple[str, str]:
    """The cause class of a divergence at token `d` and one sentence explaining it."""
    return _classify(tokenizer, a, b, d)[:2]


def _classify(tokenizer: Any, a: DiffRequest, b: DiffRequest, d: int) -> tuple[str, str, tuple[str, ...]]:
    ta, tb = a.token_ids, b.token_ids
    if a.salt != b.salt:
        return "tenant_salt", (f"the tenants differ ({a.salt!r} vs {b.salt!r}): the salt enters the first block's "
                               f"hash, so no block is shared" + ("" if ta == tb else f"; the tokens also differ at {d}")), ()
    if ta == tb:
        return "identical", "the token ids are identical: every whole block is shared", ()
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
                                                 f"and the other side has one"), ()
    rest_a, rest_b = text_a[offset:], text_b[offset:]
    sa, sb = _no_ws(rest_a), _no_ws(rest_b)
    n = min(len(sa), len(sb), 64)
    first_ws = (rest_a[:1].isspace() or rest_b[:1].isspace())
    if first_ws and (sa == sb or (n > 0 and sa[:n] == sb[:n])):
        return "whitespace", "only whitespace differs here (a space, an indent or a trailing newline)", ()
    ida, idb = _covers_id(text_a, offset), _covers_id(text_b, offset)
    if ida and idb and ida != idb:
        return "timestamp_or_id", f"a timestamp or id changed ({ida!r} vs {idb!r}); everything after it misses", ()
    moved = find_reorder(tokenizer, text_a, text_b, offset)
    if moved is not None:
        kind, in_a, in_b = moved
        return "reordered", _reorder_sentence(kind, in_a, in_b, d), in_a
    # Segments start at the separator before the divergence, so the chunk holding it is whole.
    start = max((m.end() for m in _CHUNK_SPLIT.finditer(text_a[:offset])), default=0)
    ca, cb = _chunks(text_a[start:]), _chunks(text_b[start:])
    if ca and cb and ca[0] != cb[0] and ca[0] in cb[1:] and cb[0] in ca[1:]:
        return "reordered", "the same segments (tools, documents or chunks) appear in another order", ()
    sid = _special_ids(tokenizer)
    if (d < len(ta) and ta[d] in sid) or (d < len(tb) and tb[d] in sid):
        return "bos_or_special_token", "a BOS or special token appears on one side only (a doubled BOS or a template marker)", ()
    if d >= len(ta) or d >= len(tb):
        longer = "B" if d >= len(ta) else "A"
        return "new_content", f"one request is a prefix of the other: {longer} only adds new content", ()
    return "new_content", "the text itself differs: new or edited content", ()


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
    cause, why, moved = _classify(tokenizer, a, b, d)
    shared = 0 if a.salt != b.salt else d
    return TokenDiff(first_divergent_token=None if identical else d, matching_tokens=d,
                     matching_blocks=shared // block_size,
                     reusable_blocks=min(shared, max(len(tb) - 1, 0)) // block_size, block_size=block_size,
                     cause=cause, explanation=why, a=_side(tokenizer, ta, d, window), b=_side(tokenizer, tb, d, window),
                     moved=moved)


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

