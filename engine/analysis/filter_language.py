"""The filter language of the event log and the block table: `kind:evicted and tier:CPU and tenant:b`.

`parse(text)` gives a `Filter` or raises `FilterError` naming the position (0-based, in
characters) of what it could not read, in one sentence. A `Filter` tests event dicts
(`Event.to_dict()`, the store's rows) with `matches`, and whole numpy columns at once with
`mask`, so the columnar log filters a million rows without a Python loop per row.

Grammar (lowest binding first): `or`, `and`, `not`, then a parenthesised expression or a
comparison `FIELD OP VALUE`. Operators: `:` matches (kind: the whole kind or one of its
words, so `kind:evicted` is `block_evicted`; hash: a hex prefix; text: equal, ignoring
case; numbers and blocks: equal), `=` equal (hash: the whole digest), `!=` does not match
(as `not FIELD:VALUE`), and `<`, `<=`, `>`, `>=` on the number fields `rank` and `block`.
An event that lacks a field matches no comparison on it but `!=`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from engine.core.events import EVENT_TYPES

FIELDS = ("kind", "tier", "server", "rank", "tenant", "model", "request", "session", "reason", "block", "hash")
NUMBER_FIELDS = frozenset({"rank", "block"})
OPERATORS = ("<=", ">=", "!=", "=", ":", "<", ">")
KEYWORDS = frozenset({"and", "or", "not"})
KINDS = tuple(EVENT_TYPES)
# What a kind may be called: the whole name or one of its words (block_evicted: "evicted", "block").
KIND_WORDS = frozenset(w for k in KINDS for w in (k, *k.split("_")))
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_BARE = re.compile(r"[^\s()=:!<>\"']+")
_MAX_TEXT = 4096


class FilterError(ValueError):
    """A filter that cannot be read: one sentence and the character position it refers to."""

    def __init__(self, message: str, position: int) -> None:
        self.message = message
        self.position = position
        super().__init__(f"at {position + 1}: {message}")


@dataclass(slots=True, frozen=True)
class Token:
    kind: str  # field | op | value | and | or | not | ( | ) | end
    text: str
    position: int


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c in "()":
            tokens.append(Token(c, c, i))
            i += 1
            continue
        op = next((o for o in OPERATORS if text.startswith(o, i)), None)
        if op is not None:
            tokens.append(Token("op", op, i))
            i += len(op)
            continue
        if c == "!":
            raise FilterError("'!' stands alone; write != or not", i)
        if c in "\"'":
            end = text.find(c, i + 1)
            if end < 0:
                raise FilterError(f"the quoted value has no closing {c}", i)
            tokens.append(Token("value", text[i + 1:end], i))
            i = end + 1
            continue
        m = _BARE.match(text, i)
        assert m is not None  # every other character starts a bare word
        word = m.group(0)
        low = word.lower()
        tokens.append(Token(low if low in KEYWORDS else "word", word, i))
        i = m.end()
    tokens.append(Token("end", "", n))
    return tokens


# ---- the syntax tree ------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class Comparison:
    field: str
    op: str
    value: str | int
    position: int


@dataclass(slots=True, frozen=True)
class Not:
    operand: Node


@dataclass(slots=True, frozen=True)
class BoolOp:
    op: str  # and | or
    operands: tuple[Node, ...]


Node = Comparison | Not | BoolOp


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def parse(self) -> Node:
        node = self.or_expr()
        if self.tok.kind != "end":
            t = self.tok
            what = "')' with no '(' before it" if t.kind == ")" else f"{t.text!r}"
            raise FilterError(f"expected 'and', 'or' or the end, found {what}", t.position)
        return node

    def or_expr(self) -> Node:
        parts = [self.and_expr()]
        while self.tok.kind == "or":
            self.take()
            parts.append(self.and_expr())
        return parts[0] if len(parts) == 1 else BoolOp("or", tuple(parts))

    def and_expr(self) -> Node:
        parts = [self.not_expr()]
        while self.tok.kind == "and":
            self.take()
            parts.append(self.not_expr())
        return parts[0] if len(parts) == 1 else BoolOp("and", tuple(parts))

    def not_expr(self) -> Node:
        if self.tok.kind == "not":
            self.take()
            return Not(self.not_expr())
        return self.atom()

    def atom(self) -> Node:
        t = self.tok
        if t.kind == "(":
            self.take()
            node = self.or_expr()
            if self.tok.kind != ")":
                raise FilterError(f"the '(' at {t.position + 1} is never closed", self.tok.position)
            self.take()
            return node
        if t.kind == "end":
            raise FilterError("the filter ends where a comparison such as kind:evicted should be", t.position)
        if t.kind != "word":
            raise FilterError(f"expected a field ({', '.join(FIELDS)}), found {t.text!r}", t.position)
        name = t.text.lower()
        if name not in FIELDS:
            raise FilterError(f"unknown field {t.text!r}; the fields are {', '.join(FIELDS)}", t.position)
        self.take()
        op = self.tok
        if op.kind != "op":
            raise FilterError(f"expected an operator (: = != < <= > >=) after {t.text!r}", op.position)
        self.take()
        if op.text in ("<", "<=", ">", ">=") and name not in NUMBER_FIELDS:
            raise FilterError(f"{name} is text: it takes :, = or !=, not {op.text}", op.position)
        val = self.tok
        if val.kind not in ("word", "value") and not (val.kind in KEYWORDS and val.kind != "end"):
            raise FilterError(f"expected a value after {t.text}{op.text}", val.position)
        self.take()
        return Comparison(name, op.text, _value(name, val), t.position)


def _value(name: str, tok: Token) -> str | int:
    text = tok.text
    if name in NUMBER_FIELDS:
        try:
            return int(text)
        except ValueError:
            raise FilterError(f"{name} is a number, not {text!r}", tok.position) from None
    if name == "hash":
        h = text[2:] if text.lower().startswith("0x") else text
        if not h or not _HEX.match(h):
            raise FilterError(f"a hash is hexadecimal digits, not {text!r}", tok.position)
        return h.lower()
    if name == "kind" and text.lower() not in KIND_WORDS:
        raise FilterError(f"no event kind is called {text!r}; kinds are {', '.join(KINDS)}", tok.position)
    return text.lower()


# ---- what a field of an event is ----------------------------------------------------

@dataclass(slots=True)
class EventContext:
    """What an event does not say itself: the tenant and model of each request id, learnt
    from the request_started and block_stored events of the same log."""

    tenants: dict[str, str]
    models: dict[str, str]

    @classmethod
    def from_events(cls, events: Iterable[Mapping[str, Any]]) -> EventContext:
        tenants: dict[str, str] = {}
        models: dict[str, str] = {}
        for e in events:
            rid = e.get("request_id")
            if rid is None:
                continue
            if e.get("salt") is not None:
                tenants.setdefault(str(rid), str(e["salt"]))
            if e.get("model") is not None:
                models.setdefault(str(rid), str(e["model"]))
        return cls(tenants, models)


_BLOCK_KINDS = frozenset({"blocks_allocated", "block_stored", "ref_counts_changed", "blocks_freed", "block_evicted",
                          "cache_reset"})


def _remote(e: Mapping[str, Any]) -> Mapping[str, Any]:
    r = e.get("remote")
    return r if isinstance(r, Mapping) else {}


def _request_of(e: Mapping[str, Any]) -> str | None:
    rid = e.get("request_id", e.get("by_request_id"))
    return None if rid is None else str(rid)


def field_values(e: Mapping[str, Any], name: str, ctx: EventContext | None = None) -> list[Any]:
    """The values an event has for a field (several for `block` and `hash` of a lookup or
    an allocation; none when it lacks the field). Text is lower-cased."""
    r = _remote(e)
    if name == "kind":
        return [str(e.get("kind", "")).lower()]
    if name == "tier":
        medium = r.get("medium", e.get("medium", e.get("tier")))
        if medium is None:
            return ["gpu"] if e.get("kind") in _BLOCK_KINDS else []
        return [str(medium).lower()]
    if name == "server":
        v = r.get("source", e.get("server"))
    elif name == "rank":
        v = r.get("rank", e.get("rank"))
        if v is None and r:
            v = 0
        return [] if v is None else [int(v)]
    elif name == "tenant":
        v = e.get("salt", e.get("tenant"))
        if v is None and ctx is not None:
            rid = _request_of(e)
            v = ctx.tenants.get(rid) if rid is not None else None
    elif name == "model":
        v = e.get("model", r.get("model", r.get("lora_name")))
        if v is None and ctx is not None:
            rid = _request_of(e)
            v = ctx.models.get(rid) if rid is not None else None
    elif name == "request":
        v = _request_of(e)
    elif name == "session":
        v = e.get("session", e.get("session_id", r.get("session_id")))
    elif name == "reason":
        miss = e.get("miss")
        v = miss.get("reason") if isinstance(miss, Mapping) else e.get("reason", e.get("miss_reason"))
    elif name == "block":
        # A remote (vLLM) block has no id: its events carry -1, which is no block.
        ids = e.get("block_ids")
        if ids is not None:
            return [int(b) for b in ids if b >= 0]
        v = e.get("block_id")
        return [] if v is None or v < 0 else [int(v)]
    elif name == "hash":
        hashes = e.get("block_hashes")
        if hashes is not None:
            return [_hex(h) for h in hashes]
        v = e.get("block_hash")
        return [] if v is None else [_hex(v)]
    else:
        raise KeyError(name)
    return [] if v is None else [str(v).lower()]


def _hex(h: Any) -> str:
    if isinstance(h, (bytes, bytearray)):
        return h.hex()
    if isinstance(h, int):
        return f"{h:x}"
    return str(h).lower()


def _kind_matches(kind: str, word: str) -> bool:
    return kind == word or word in kind.split("_")


def _compare_one(name: str, op: str, have: Any, want: Any) -> bool:
    if op == ":":
        if name == "kind":
            return _kind_matches(have, want)
        if name == "hash":
            return have.startswith(want)
        return have == want
    if op == "=":
        return have == want
    return {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want}[op]


# ---- the compiled filter --------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class Filter:
    """A parsed filter; `text` is what was typed (the empty filter matches everything)."""

    text: str
    root: Node | None

    def matches(self, event: Mapping[str, Any], ctx: EventContext | None = None) -> bool:
        return True if self.root is None else _eval(self.root, event, ctx)

    def predicate(self, ctx: EventContext | None = None) -> Callable[[Mapping[str, Any]], bool]:
        return lambda e: self.matches(e, ctx)

    def select(self, events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The matching events, tenants and models learnt from `events` themselves."""
        ctx = EventContext.from_events(events)
        return [e for e in events if self.matches(e, ctx)]

    def mask(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """A boolean array over rows given as columns, one per field name (`event_columns`
        builds them). Text columns hold lower-case strings, '' where absent; `rank` and
        `block` hold integers, -1 where absent; `kind` must be present."""
        n = len(columns["kind"])
        if self.root is None:
            return np.ones(n, dtype=bool)
        return _mask(self.root, columns, n)

    @property
    def fields(self) -> frozenset[str]:
        out: set[str] = set()

        def walk(node: Node) -> None:
            if isinstance(node, Comparison):
                out.add(node.field)
            elif isinstance(node, Not):
                walk(node.operand)
            else:
                for o in node.operands:
                    walk(o)

        if self.root is not None:
            walk(self.root)
        return frozenset(out)


def parse(text: str) -> Filter:
    """`text` as a `Filter`; raises `FilterError` with the position of the first problem."""
    if len(text) > _MAX_TEXT:
        raise FilterError(f"a filter is at most {_MAX_TEXT} characters", _MAX_TEXT)
    if not text.strip():
        return Filter(text, None)
    return Filter(text, _Parser(text).parse())


def check(text: str) -> str | None:
    """None if `text` parses, else its one-line error (what the filter bar shows)."""
    try:
        parse(text)
    except FilterError as exc:
        return str(exc)
    return None


def _eval(node: Node, e: Mapping[str, Any], ctx: EventContext | None) -> bool:
    if isinstance(node, Comparison):
        values = field_values(e, node.field, ctx)
        if node.op == "!=":
            return not any(_compare_one(node.field, ":", v, node.value) for v in values)
        return any(_compare_one(node.field, node.op, v, node.value) for v in values)
    if isinstance(node, Not):
        return not _eval(node.operand, e, ctx)
    if node.op == "and":
        return all(_eval(o, e, ctx) for o in node.operands)
    return any(_eval(o, e, ctx) for o in node.operands)


def _mask(node: Node, cols: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    if isinstance(node, Not):
        return ~_mask(node.operand, cols, n)
    if isinstance(node, BoolOp):
        masks = [_mask(o, cols, n) for o in node.operands]
        out = masks[0].copy()
        for m in masks[1:]:
            if node.op == "and":
                out &= m
            else:
                out |= m
        return out
    col = cols.get(node.field)
    if col is None:
        hit = np.zeros(n, dtype=bool)
        return ~hit if node.op == "!=" else hit
    op = ":" if node.op == "!=" else node.op
    if node.field in NUMBER_FIELDS:
        col = np.asarray(col)
        present = col >= 0
        v = node.value
        hit = {":": col == v, "=": col == v, "<": col < v, "<=": col <= v, ">": col > v, ">=": col >= v}[op] & present
    else:
        col = np.asarray(col).astype(str)
        v = str(node.value)
        if node.field == "kind" and op == ":":
            hit = np.isin(col, [k for k in KINDS if _kind_matches(k, v)])
        elif node.field == "hash" and op == ":":
            hit = np.char.startswith(col, v) & (col != "")
        else:
            hit = col == v
    return ~hit if node.op == "!=" else hit


def event_columns(events: Sequence[Mapping[str, Any]], ctx: EventContext | None = None) -> dict[str, np.ndarray]:
    """Columns for `Filter.mask` from event dicts: each field's first value per event (the
    columnar log keeps one block per row). Built here for tests and small logs."""
    if ctx is None:
        ctx = EventContext.from_events(events)
    cols: dict[str, np.ndarray] = {}
    for name in FIELDS:
        firsts = [(field_values(e, name, ctx) or [None])[0] for e in events]
        if name in NUMBER_FIELDS:
            cols[name] = np.array([-1 if v is None else v for v in firsts], dtype=np.int64)
        else:
            cols[name] = np.array(["" if v is None else v for v in firsts], dtype=str)
    return cols
