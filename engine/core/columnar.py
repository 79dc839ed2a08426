"""The event log as columns: one row per block an event names, numpy arrays throughout.

`ColumnarLog` holds what the Python engine's events say (engine.core.events) without an
object per event: `kind`, `seq`, `request`, `block`, `hash` (a dense chain id; the digest
is computed once per id, on demand) and two values `a`, `b` plus a `flag` (the kernel's
`tier` column, always zero, is not kept). The
replay kernel fills it directly (`from_columns`); live sources append `Event`s
(`append_events`). `events()` gives the very `Event` objects the Python engine emitted, and
`state_at(seq)` the pool at any event from checkpoints and vectorised code; both are held
equal to `engine.core.projection` by tests/test_columnar.py.

Row layout per kind (unlisted columns are -1 or 0):
  started: request | lookup: request, block=first miss block, a=hit blocks, b=divergence
  token, evicting seq or other salt (per flag=miss reason) | allocated: request, block,
  a=hit blocks | stored: request, block, hash | ref: request, block, a=ref count | freed:
  request, block, flag=1 when it went to the tail (it has a hash) | evicted: request,
  block, hash | refused: request, a=needed, b=available | finished: request,
  a=tokens with KV, flag=aborted | cache reset (live sources): one row per block that
  held a hash, block, hash, a=blocks cleared (a single row with block -1 when none did) |
  other (live sources: an event the pool does not read, such as a semantic lookup): the
  event itself is kept beside the columns. A live source's empty block list (an
  allocation, ref change or free naming no block) is one row with block -1.

A live pool may grow (a replay without a capacity names blocks as it goes): a block
that appears joins the free queue's tail, as `PoolProjection._grow` puts it there.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from engine.core.events import (
    BlockEvicted, BlocksAllocated, BlocksFreed, BlockStored, CacheReset, Event, LookupDone, MissInfo, RefCountsChanged,
    RequestFinished, RequestRefused, RequestStarted,
)
from engine.core.growth import regrow
from engine.core.live_slots import RemoteSlots, info_columns
from engine.core.pool_state import Counters

STARTED, LOOKUP, ALLOCATED, STORED, REF, FREED, EVICTED, REFUSED, FINISHED = 1, 2, 3, 4, 5, 6, 7, 8, 9
RESET, OTHER = 10, 11  # rows only live sources append
KIND_NAMES = {STARTED: "request_started", LOOKUP: "lookup", ALLOCATED: "blocks_allocated",
              STORED: "block_stored", REF: "ref_counts_changed", FREED: "blocks_freed",
              EVICTED: "block_evicted", REFUSED: "request_refused", FINISHED: "request_finished",
              RESET: "cache_reset", OTHER: "event"}
MISS_REASONS = ("new_content", "evicted", "salt", "model", "partial_block", "last_token")  # the manager's
_MISS_CODE = {name: i for i, name in enumerate(MISS_REASONS)}
COLUMNS = (("kind", np.uint8), ("tier", np.uint8), ("seq", np.int64), ("request", np.int32),
           ("block", np.int32), ("hash", np.int32), ("a", np.int64), ("b", np.int64), ("flag", np.uint8))
# the int64 columns above (the values' type: seqs number events, `a` and `b` are counts and
# ordinals, none bounded by the format) are stored int32 while every value fits (a row 27
# bytes, not 39), each widened once to int64 before a value would not (`_write_table`,
# `from_columns`)
WIDENING = frozenset({"seq", "a", "b"})
# the columns a log keeps: `tier` is not among them (no source writes it: the kernel's
# column stays zero and `_ROW_ORDER` has none), a byte a row for nothing
KEPT_COLUMNS = tuple((name, dtype) for name, dtype in COLUMNS if name != "tier")
# columns a finished log (`from_columns`) keeps as the rows and values that differ from the
# column's fill when those take fewer bytes than the column: `b` (only lookups and refusals
# set it), `hash` (only stores and evictions: 8 bytes on 24% of the Mooncake trace's rows
# against 4 on every row, 3.4 MB less) and `a` (0 on frees, stores, evictions, and refs that
# drop to 0: 8 bytes on 38% of the rows, 1.5 MB less). Readers take the part they need (`values_at`,
# `rows_window`): nothing on a scrub or a series pass makes one whole. name -> the value
# every other row holds
SPARSE_COLUMNS = {"b": 0, "hash": -1, "a": 0, "flag": 0}
# sparse columns of flags whose base is a bit a row, not a byte (`_make_sparse`): `flag` is 1
# on a free to the queue's tail, a lookup's miss reason (up to 5) on a few rows
BIT_BASE_COLUMNS = frozenset({"flag"})
# sparse columns whose rows a finished log keeps as the events they begin (`EventRows`) when
# each is the first row of an event of these kinds: the hash, set on the stores' and the
# evictions' rows (one row an event in a replay). name -> the kinds
EVENT_ROW_COLUMNS = {"hash": (STORED, EVICTED)}
# sparse columns whose values a finished log keeps as `FirstSeen` where that is smaller: the
# hash, a chain id the kernel numbers as it first meets one (0, 1, 2, ...), so a store of a
# new chain is a bit, not 4 bytes
COUNTED_VALUES = ("hash",)
# columns a finished log keeps as one value per event (every row of an event has its seq, its
# request and its kind): 14.4 MB of rows over the Mooncake trace become its 481,145 events'
# seqs, requests and kinds, and the events' first rows (`ColumnarEventLog` shares them but
# the requests); read as rows with `values_at`, or made whole by `col`
PER_EVENT_COLUMNS = ("seq", "request", "kind")
# per-event columns `ColumnarEventLog` shares as arrays (its seqs and kinds; seqs that count up
# by one, as a replay numbers its events, kept as a `Consecutive`); the others may be kept as
# runs (`_EventRuns`)
_SHARED_PER_EVENT = frozenset({"seq", "kind"})
# sparse columns a finished log keeps as a value per event instead when every row of an event
# agrees and that takes fewer bytes: `a` (an allocation's hit count is on each of its rows, a
# ref event's count on each of its blocks' when all are alike): the Mooncake trace's 1.6 MB
# byte a row become its 56,409 events that are not 0 and their values (`_EventSparse`, 0.45 MB)
PER_EVENT_WHEN_ALIKE = ("a",)
# columns a finished log stores in a narrower type while every value fits, read in their own
# (`col`, `values_at`, `rows_window` widen what they return): block ids, int16 for a pool of up
# to 32,767 blocks (the Mooncake trace's 16,384: 3.2 MB less). A write widens them first.
NARROW_COLUMNS = {"block": (np.int16, np.int32)}  # name -> (kept, read)
# columns a journal-fed live log (`journal_fed`: engine.core.live_journal's rows) keeps as
# `ArithmeticRuns` while that is smaller: a vLLM batch's rows share one request and one
# `RemoteInfo` (`b`), stores' ordinals (`a`) count up by one and so do the chain ids a pool
# numbers as it meets them (`hash`), and seqs count up a row each (a clear's rows share one).
# 20 of a row's 26 bytes, a run or a few a batch. The seqs are read as runs too
# (`seq_runs`: searched and cut from the runs, never made whole a tick).
RUN_COLUMNS = ("seq", "request", "hash", "a", "b")
# a column's runs stop paying at more than one run every RUN_MOST_ROWS rows (9 bytes a run
# of int32 values against 4 a row: 56% of them, kept whole from then on), counted from
# RUN_MIN_ROWS rows on (a log's first batches say little of its later ones)
RUN_MOST_ROWS = 4
RUN_MIN_ROWS = 4096
_NO_STEP = 2  # `ArithmeticRuns`' difference into a first row: not a step (0 or 1)
_I32 = np.iinfo(np.int32)
_EXT_MASK = (1 << 64) - 1
_ROW_ORDER = (("kind", 0), ("seq", 1), ("request", 2), ("block", 3), ("hash", 4), ("a", 5), ("b", 6), ("flag", 7))
_GROWING_KINDS = frozenset({BlocksAllocated, RefCountsChanged, BlockStored})
_COLUMN_KINDS = frozenset({RequestStarted, RequestRefused, LookupDone, BlocksAllocated, RefCountsChanged, BlockStored,
                           BlocksFreed, BlockEvicted, RequestFinished})


class KeyTable:
    """Chain ids and what each stands for: parent id, content (a hash id or token ids), salt.

    The kernel's ids come with (parent, item, tag) arrays and their digests are computed
    with the run's `BlockHasher` when first asked for; live sources add ids whose digest
    and content their events carry.
    """

    def __init__(self, parent: np.ndarray, item: np.ndarray, tag: np.ndarray, content: np.ndarray,
                 salts: Sequence[str | None], hasher: Any, block_size: int, models: Sequence[str] = ()) -> None:
        # each as the runs it counts up by one in where that is smaller (`CountingRuns`): the
        # kernel interns a prompt's blocks in order, each one's parent the id before it and
        # its hash id, in a trace that numbers them as it goes, one more than the one before
        self.parent = CountingRuns.of(parent)
        # int32 where every value fits (a hash id or tag of a trace without models usually
        # does): read one at a time as Python ints, or widened to int64 where computed on
        self.item = CountingRuns.of(item.astype(np.int32) if fits(item, np.int32) else item)
        # a tag (salt, model, content kind) takes a handful of values in a trace: one byte a
        # block where they fit, else int32, else as given
        self.tag = next((tag.astype(t) for t in (np.uint8, np.int32) if fits(tag, t)), tag)
        self.content = content
        self.salts = list(salts)
        self.hasher = hasher
        self.block_size = block_size
        self.models = list(models)
        self._hashers: dict[int, Any] = {}
        # digests: a kernel id's made when first asked for (a view shows a few thousand of a
        # trace's blocks: a list of one slot per id cost 8 B a block for them), a live id's
        # as its event carried it (every one has one: in order, after the kernel's)
        self._num_kernel = len(parent)
        self._kernel_digests: dict[int, bytes] = {}
        self._live_digests: list[bytes] = []
        # live ids: digest -> id, and their stored attributes
        self._by_digest: dict[bytes, int] = {}
        self._live: dict[int, tuple[bytes | None, tuple[int, ...], str | None, int | None]] = {}
        self._live_parent: dict[int, int] = {}  # live id -> its parent's id (none: a root)

    @classmethod
    def empty(cls) -> KeyTable:
        z = np.zeros(0, np.int64)
        return cls(z.astype(np.int32), z, z, np.zeros((1, 1), np.uint32), [], None, 1)

    def __len__(self) -> int:
        return self._num_kernel + len(self._live_digests)

    def _digest_made(self, key: int) -> bytes | None:
        """The digest of `key` if it has been made (a live id's always has)."""
        if key < self._num_kernel:
            return self._kernel_digests.get(key)
        return self._live_digests[key - self._num_kernel]

    @property
    def num_digests_made(self) -> int:
        """How many kernel ids' digests have been made (and are kept)."""
        return len(self._kernel_digests)

    def parent_of(self, key: int) -> int:
        """The parent chain id of `key`, -1 for a root (or a live id stored without one)."""
        if key < len(self.parent):
            return int(self.parent[key])
        return self._live_parent.get(key, -1)

    def live_ids(self) -> np.ndarray:
        """The ids whose attributes a live event carried (int64)."""
        return np.fromiter(self._live, np.int64, len(self._live)) if self._live else np.zeros(0, np.int64)

    def root_salt_ids(self, ids: np.ndarray) -> np.ndarray:
        """Per kernel id (below `len(parent)`): the salt id (into `salts`) of a root block, -1
        for a block with a parent or a root without a salt."""
        ids = np.asarray(ids, np.int64)
        root = self.parent[ids] < 0
        return np.where(root, ((np.asarray(self.tag, np.int64)[ids] >> 1) & 0xFFFFFFFF) - 2, -1)

    def carries_tokens(self, ids: np.ndarray) -> np.ndarray:
        """Per kernel id (below `len(parent)`): True where its content is token ids, False
        where it is an external hash id."""
        return np.asarray(self.tag, np.int64)[np.asarray(ids, np.int64)] % 2 == 1

    def is_root(self, key: int) -> bool:
        return key < len(self.parent) and int(self.parent[key]) < 0

    def _salt_of_root(self, key: int) -> str | None:
        sid = ((int(self.tag[key]) >> 1) & 0xFFFFFFFF) - 2
        return None if sid < 0 else self.salts[sid]

    def _hasher_of_root(self, key: int) -> Any:
        mid = (int(self.tag[key]) >> 33) - 1
        if mid < 0:
            return self.hasher
        h = self._hashers.get(mid)
        if h is None:
            h = self._hashers[mid] = self.hasher.for_model(self.models[mid])
        return h

    def attributes(self, key: int) -> tuple[bytes | None, tuple[int, ...], str | None, int | None]:
        """(parent digest, token ids, salt, external id) as a `BlockStored` carries them."""
        live = self._live.get(key)
        if live is not None:
            return live
        p = int(self.parent[key])
        parent = self.digest(p) if p >= 0 else None
        salt = self._salt_of_root(key) if p < 0 else None
        tag = int(self.tag[key])
        if tag % 2 == 1:
            return parent, tuple(self.content[int(self.item[key])].tolist()), salt, None
        return parent, (), salt, int(self.item[key]) & _EXT_MASK

    def digest(self, key: int) -> bytes:
        d = self._digest_made(key)
        if d is not None:
            return d
        # a kernel id (a live one's is always made), and the chain above it not made yet:
        # made from the root down (a kernel id's parents are kernel ids)
        made = self._kernel_digests
        chain = []
        k = key
        while k >= 0 and k not in made:
            chain.append(k)
            k = int(self.parent[k])
        hasher = self._hasher_of_root(k) if k >= 0 else None
        for k in reversed(chain):
            p = int(self.parent[k])
            parent = made[p] if p >= 0 else None
            tag = int(self.tag[k])
            salt = None
            if p < 0:
                salt = self._salt_of_root(k)
                hasher = self._hasher_of_root(k)
            if tag % 2 == 1:
                made[k] = hasher.hash_block(parent, self.content[int(self.item[k])].tolist(), salt)
            else:
                made[k] = hasher.hash_external(parent, int(self.item[k]) & _EXT_MASK, salt)
        return made[key]

    def key_of(self, digest: bytes, attributes: tuple | None = None) -> int:
        """The id of a digest a live event carries (a new id the first time)."""
        k = self._by_digest.get(digest)
        if k is None:
            k = len(self)
            self._live_digests.append(digest)
            self._by_digest[digest] = k
        if attributes is not None:
            self._live[k] = attributes
            if attributes[0] is not None and k >= len(self.parent):
                self._live_parent[k] = self.key_of(attributes[0])
        return k


class RequestIds(Sequence[str]):
    """Request ids by occurrence: the trace's without a str each (~60 B apiece: 0.73 MB over
    the Mooncake trace's 12,031), those a live source adds after them as a list. The trace's
    are kept as their count when each is its occurrence's number (`str(r)`, what a trace
    without ids gets), else as one UTF-8 blob and each id's end in it; read back one at a time."""

    __slots__ = ("_num_fixed", "_blob", "_ends", "_added")

    def __init__(self, ids: Sequence[str] = ()) -> None:
        self._blob: bytes | None = None
        self._ends: np.ndarray | None = None
        self._added: list[str] = []
        if not all(type(rid) is str for rid in ids):  # not what a trace or an event gives: kept as they are
            self._num_fixed = 0
            self._added = list(ids)
            return
        self._num_fixed = len(ids)
        if any(rid != str(r) for r, rid in enumerate(ids)):
            encoded = [rid.encode() for rid in ids]
            ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
            self._blob = b"".join(encoded)
            self._ends = ends.astype(np.int32) if fits(ends, np.int32) else ends

    def __len__(self) -> int:
        return self._num_fixed + len(self._added)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # a negative one counted from the end; IndexError past it
        if i >= self._num_fixed:
            return self._added[i - self._num_fixed]
        if self._blob is None:
            return str(i)
        return self._blob[int(self._ends[i - 1]) if i else 0:int(self._ends[i])].decode()

    def __iter__(self) -> Iterator[str]:
        for i in range(self._num_fixed):
            yield self[i]
        yield from self._added

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and len(other) == len(self) \
            and list(other) == list(self)

    __hash__ = None  # type: ignore[assignment]

    def append(self, request_id: str) -> None:
        self._added.append(request_id)

    def extend(self, request_ids: Iterable[str]) -> None:
        self._added.extend(request_ids)

    @property
    def nbytes(self) -> int:
        """The fixed ids' bytes (the added ones are str objects of their own)."""
        return (len(self._blob) if self._blob is not None else 0) + (self._ends.nbytes if self._ends is not None else 0)


class RequestTable:
    """Per request occurrence (a row of the trace, or a live RequestStarted/Refused): its id,
    salt, prompt size and full-block chain ids."""

    def __init__(self, ids: list[str], salts: Sequence[str | None], salt_ids: np.ndarray, nprompt: np.ndarray,
                 keys: np.ndarray, koff: np.ndarray, nfull: np.ndarray) -> None:
        self.ids = RequestIds(ids)
        self._salts = list(salts)
        self._salt_ids = salt_ids
        self._nprompt = nprompt
        # every row's full-block chain ids, `_keys[_koff[r]:][:_nfull[r]]`, until `keep_last_keys`
        # keeps only each row's last (its parent chain in the key table holds the rest)
        self._keys: np.ndarray | None = keys
        self._koff: np.ndarray | None = koff
        self._nfull = nfull
        self._last: np.ndarray | None = None
        self._chains: KeyTable | None = None
        self._n_fixed = len(ids)
        self._live: list[tuple[str | None, int, tuple[int, ...]]] = []
        self._live_sizes = np.zeros(0, np.int64)  # num_prompt_tokens of the live ones, grown by doubling

    @classmethod
    def empty(cls) -> RequestTable:
        z = np.zeros(0, np.int64)
        return cls([], [], z.astype(np.int32), z, z.astype(np.int32), np.zeros(1, np.int64), z.astype(np.int32))

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_fixed(self) -> int:
        """Rows that came with the trace (the kernel's); the rest were added by live events."""
        return self._n_fixed

    @property
    def salts(self) -> Sequence[str | None]:
        """The salt names the fixed rows' salt ids index (read-only)."""
        return tuple(self._salts)

    def fixed_salt_ids(self) -> np.ndarray:
        """Per fixed row, its salt id into `salts` (-1: no salt), as int64."""
        return np.asarray(self._salt_ids, np.int64)

    def salt(self, r: int) -> str | None:
        if r >= self._n_fixed:
            return self._live[r - self._n_fixed][0]
        sid = int(self._salt_ids[r])
        return None if sid < 0 else self._salts[sid]

    def num_prompt_tokens(self, r: int) -> int:
        if r >= self._n_fixed:
            return self._live[r - self._n_fixed][1]
        return int(self._nprompt[r])

    def hash_keys(self, r: int) -> Sequence[int]:
        if r >= self._n_fixed:
            return self._live[r - self._n_fixed][2]
        n = int(self._nfull[r])
        if self._last is None:
            a = int(self._koff[r])
            return self._keys[a:a + n].tolist()
        out = [0] * n
        up, k = self._chains.parent_of, self._last.item(r)
        for i in range(n - 1, -1, -1):
            out[i] = k
            k = up(k)
        return out

    def keep_last_keys(self, chains: KeyTable) -> None:
        """Keep each fixed row's last chain id and drop the rest, read back by walking
        `chains.parent` from it. The kernel interns a row's blocks in order, each one's
        parent the one before it and the first a root (`_intern_into`, every trace format,
        salted or not), so a row's ids are its last one's parent chain: ~4 B a block kept
        per row, not per block of every prompt."""
        if self._last is not None:
            return
        n = self._n_fixed
        nfull = np.asarray(self._nfull[:n])
        last = np.full(n, -1, np.int32)
        has = nfull > 0
        last[has] = self._keys[np.asarray(self._koff[:n], np.int64)[has] + nfull[has] - 1]
        self._last, self._chains, self._keys, self._koff = last, chains, None, None
        self._nfull = nfull.astype(np.uint16) if fits(nfull, np.uint16) else nfull

    def fixed_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """The fixed rows' chain ids back to back (int64), and each row's start in them
        (n + 1 entries)."""
        n = self._n_fixed
        nfull = np.asarray(self._nfull[:n], np.int64)
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(nfull, out=starts[1:])
        total = int(starts[-1])
        if self._last is None:
            at = np.repeat(np.asarray(self._koff[:n], np.int64) - starts[:-1], nfull) + np.arange(total)
            return np.asarray(self._keys)[at].astype(np.int64), starts
        # every row's chain walked at once, from its last id back: one step a block of the
        # longest row, each over the rows still that long
        flat = np.empty(total, np.int64)
        parent = self._chains.parent
        rows = np.flatnonzero(nfull)
        key, pos, left = self._last[rows].astype(np.int64), starts[rows + 1] - 1, nfull[rows]
        while len(key):
            flat[pos] = key
            left -= 1
            more = left > 0
            if not more.all():
                key, pos, left = key[more], pos[more], left[more]
            key = parent[key].astype(np.int64)
            pos -= 1
        return flat, starts

    def add(self, request_id: str, salt: str | None, num_prompt_tokens: int) -> int:
        self.ids.append(request_id)
        self._live.append((salt, num_prompt_tokens, ()))
        i = len(self._live) - 1
        if i >= len(self._live_sizes):
            self._live_sizes = np.concatenate([self._live_sizes, np.zeros(max(1024, i), np.int64)])
        self._live_sizes[i] = num_prompt_tokens
        return len(self.ids) - 1

    def add_many(self, request_ids: list[str]) -> range:
        """`add` of many requests without a salt or prompt (an attached server's batches)."""
        first = len(self.ids)
        self.ids.extend(request_ids)
        self._live.extend([(None, 0, ())] * len(request_ids))
        while len(self._live) > len(self._live_sizes):  # the sizes stay 0, as zeros() made them
            self._live_sizes = np.concatenate([self._live_sizes, np.zeros(max(1024, len(self._live_sizes)), np.int64)])
        return range(first, len(self.ids))

    def set_live(self, r: int, salt: str | None, num_prompt_tokens: int, keys: tuple[int, ...]) -> None:
        self._live[r - self._n_fixed] = (salt, num_prompt_tokens, keys)
        self._live_sizes[r - self._n_fixed] = num_prompt_tokens

    def prompt_sizes(self) -> np.ndarray:
        """num_prompt_tokens of every request, as an array (to read, not to write: a live
        table's own is a view, not a copy of every request's at each of a live log's ticks)."""
        if not self._live:
            return np.asarray(self._nprompt, np.int64)
        live = self._live_sizes[:len(self._live)]
        if not self._n_fixed:
            return live
        return np.concatenate([np.asarray(self._nprompt, np.int64), live])


@dataclass(slots=True)
class PoolArrays:
    """The pool after some event, as arrays: what `PoolProjection` keeps per block."""

    seq: int
    num_rows: int
    ref_counts: np.ndarray  # int32 per block
    hash_keys: np.ndarray  # int32 chain id per block, -1 when it holds no hash
    free_pos: np.ndarray  # int64 per block: its place in the free queue, FREE_ABSENT when not in it
    counters: Counters

    def free_order(self) -> np.ndarray:
        """Block ids in the free queue, head (taken next) first."""
        queued = np.flatnonzero(self.free_pos != FREE_ABSENT)
        return queued[np.argsort(self.free_pos[queued], kind="stable")]

    @property
    def num_in_use(self) -> int:
        return int(np.count_nonzero(self.ref_counts > 0))

    @property
    def num_cached_free(self) -> int:
        return int(np.count_nonzero((self.ref_counts == 0) & (self.hash_keys >= 0)))


class PackedInts:
    """An integer array kept in as few bytes a value as its spread needs (`width`, 0 to 8:
    each value less the smallest, little-endian), or, where one value fills nearly all of it,
    as that value and the others (their places and their packed values). What a finished
    log's checkpoints keep (`PackedPool`): read back whole on a scrub, never in place."""

    __slots__ = ("n", "dtype", "base", "width", "data", "fill", "at", "others")

    def __init__(self, values: np.ndarray) -> None:
        values = np.asarray(values)
        self.n, self.dtype = len(values), values.dtype
        self.fill, self.at, self.others = None, None, None
        if self.n:
            top = np.bincount(values - values.min()).argmax() + values.min() if values.dtype.itemsize <= 4 and \
                int(values.max()) - int(values.min()) < 1 << 16 else None
            if top is not None:
                at = np.flatnonzero(values != top)
                if len(at) * 8 < self.n:  # the others' places and values in under a byte a value
                    self.fill, self.at = top, at.astype(np.int32 if self.n <= _I32.max else np.int64)
                    self.others = PackedInts(values[at])
                    self.base, self.width, self.data = 0, 0, np.zeros(0, np.uint8)
                    return
        self.base = int(values.min()) if self.n else 0
        span = int(values.max()) - self.base if self.n else 0
        self.width = (span.bit_length() + 7) // 8
        shifted = (values.astype(np.int64) - self.base).astype("<u8")
        self.data = np.ascontiguousarray(shifted.view(np.uint8).reshape(-1, 8)[:, :self.width]).reshape(-1)

    def whole(self) -> np.ndarray:
        if self.fill is not None:
            out = np.full(self.n, self.fill, self.dtype)
            out[self.at] = self.others.whole()
            return out
        if self.width == 0:
            return np.full(self.n, self.base, self.dtype)
        if self.width in (1, 2, 4, 8):
            out = self.data.view(f"<u{self.width}").astype(self.dtype)
        else:  # 3, 5, 6 or 7 bytes: laid into 8-byte words first
            words = np.zeros((self.n, 8), np.uint8)
            words[:, :self.width] = self.data.reshape(-1, self.width)
            out = words.reshape(-1).view("<u8").astype(self.dtype)
        out += self.dtype.type(self.base)
        return out

    def fresh(self) -> PackedInts:
        """A copy in new allocations (`ColumnarLog.settle`)."""
        out = PackedInts.__new__(PackedInts)
        for name in PackedInts.__slots__:
            setattr(out, name, getattr(self, name))
        out.data = _fresh(self.data)
        if self.fill is not None:
            out.at, out.others = _fresh(self.at), self.others.fresh()
        return out

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.fill is None else self.at.nbytes + self.others.nbytes)


class PackedPool:
    """A finished log's checkpoint, `PoolArrays`' fields in as few bytes as they need: ref
    counts mostly 0, chain ids below the table's size, free-queue places remapped to a dense
    range first (`_pack_places`). The Mooncake trace's seven snapshots of its 16,384-block pool
    were 16 bytes a block each (10.7 B per distinct block of the open); packed, ~6 (initial: 2)."""

    __slots__ = ("seq", "num_rows", "counters", "_ref", "_hash", "_places")

    def __init__(self, state: PoolArrays) -> None:
        self.seq, self.num_rows, self.counters = state.seq, state.num_rows, state.counters
        self._ref, self._hash = PackedInts(state.ref_counts), PackedInts(state.hash_keys)
        self._places = _pack_places(state.free_pos)

    def whole(self) -> PoolArrays:
        return PoolArrays(self.seq, self.num_rows, self.ref_counts, self.hash_keys, self.free_pos, self.counters)

    @property
    def ref_counts(self) -> np.ndarray:
        return self._ref.whole()

    @property
    def hash_keys(self) -> np.ndarray:
        return self._hash.whole()

    @property
    def free_pos(self) -> np.ndarray:
        codes, top, first_tail, absent = self._places
        pos = codes.whole()
        tail = pos > top
        pos[tail] += first_tail - top - 1
        pos[pos == first_tail - top - 1 + absent] = FREE_ABSENT
        return pos

    def fresh(self) -> PackedPool:
        out = PackedPool.__new__(PackedPool)
        out.seq, out.num_rows, out.counters = self.seq, self.num_rows, self.counters
        out._ref, out._hash = self._ref.fresh(), self._hash.fresh()
        out._places = (self._places[0].fresh(), *self._places[1:])
        return out

    @property
    def nbytes(self) -> int:
        return self._ref.nbytes + self._hash.nbytes + self._places[0].nbytes


def _pack_places(free_pos: np.ndarray) -> tuple[PackedInts, int, int, int]:
    """Free-queue places as dense codes: the places below TAIL_BASE / 2 (initial places,
    head prepends' negative ones) as they are, up to `top`; a tail place t (TAIL_BASE + 2r,
    or 2r - 1 for a block a pool grew) as top + 1 + t - first_tail; FREE_ABSENT as the code
    after the last tail's (`absent`). Tail places span twice the log's rows, not 2**40."""
    absent_at = free_pos == FREE_ABSENT
    is_tail = (free_pos >= TAIL_BASE // 2) & ~absent_at
    low = free_pos[~is_tail & ~absent_at]
    top = int(low.max()) if len(low) else -1
    first_tail = int(free_pos[is_tail].min()) if is_tail.any() else TAIL_BASE
    codes = free_pos.copy()
    codes[is_tail] += top + 1 - first_tail
    absent = int(codes[is_tail].max()) + 1 if is_tail.any() else top + 1
    codes[absent_at] = absent
    return PackedInts(codes), top, first_tail, absent


FREE_ABSENT = np.iinfo(np.int64).max
# A block freed to the tail at row r gets place TAIL_BASE + 2r (one grown at row r: 2r - 1),
# above every initial place (0..num_blocks-1): places follow the order of the rows.
TAIL_BASE = 1 << 40
CHECKPOINT_BYTES = 512 << 20  # all of a log's pool snapshots together
# Rows between two snapshots at the least: a snapshot (16 bytes a block unpacked) every
# 65,536 rows was a sixth of the Mooncake trace's open in the app (25 snapshots of its
# 16K-block pool). Every 1M rows, packed: 0.8 B per distinct block of the open (every
# 262,144: 3.5); scrubbing the trace three times over (4.8M rows, 20K blocks, 47 targets)
# takes 11 ms at the median, 32 at worst (3.6 and 13 every 262,144), under the 100 ms bar.
CHECKPOINT_MIN_ROWS = 1 << 20


class ColumnarLog:
    """Columns of rows in seq order, with their key and request tables and checkpoints."""

    def __init__(self, num_blocks: int, block_size: int, keys: KeyTable | None = None,
                 requests: RequestTable | None = None, checkpoint_rows: int | None = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.keys = keys if keys is not None else KeyTable.empty()
        self.requests = requests if requests is not None else RequestTable.empty()
        self._cols = {name: np.zeros(1024, np.int32 if name in WIDENING else dtype) for name, dtype in KEPT_COLUMNS}
        self._sparse: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # name -> (rows, values): `values_at`
        # name -> a byte a row under a sparse column whose fill is 0: the rows of `_sparse`
        # are then only those whose value a byte does not hold (`_make_sparse`)
        self._sparse_base: dict[str, np.ndarray] = {}
        self._bit_base: set[str] = set()  # names whose `_sparse_base` is a bit a row (`_make_sparse`)
        self._per_event: dict[str, np.ndarray] = {}  # name -> a value per event (PER_EVENT_COLUMNS)
        self.event_bounds: EventBounds | None = None  # with `_per_event`: each event's first row, then num_rows
        self.num_rows = 0
        self.num_seq = 0  # events numbered so far (the next seq)
        self.final_counters = Counters()
        self.checkpoint_rows = checkpoint_rows
        self._cp_rows: list[int] = []
        self._cp_states: list[PoolArrays | PackedPool] = []  # a finished log's packed (`build_checkpoints`)
        # head prepends of the free queue before some rows (row -> count), so that moving
        # a state on from a row does not count them over from the first row again
        self._head_marks: dict[int, int] = {0: 0}
        self._heads_after: tuple[int, int] | None = None  # (row, head prepends before it) the last pass counted
        # live appends: the current hash of each block and request id -> its latest row
        self._live_keys: np.ndarray | None = None
        self._live_request: dict[str, int] = {}
        self._req_index: tuple | None = None
        self._alloc_by_event = False  # `_req_index` groups allocation events, not rows (`_request_spans`)
        self._others: dict[int, Event] = {}  # seq -> a live event the columns do not describe
        # rows made, not yet written (`_flush`): `num_rows` counts written rows only, so rows
        # made on an engine thread (`prepare_events`) are invisible until the GUI thread writes them
        self._pending: list[int] = []  # eight values a row, flat (one numpy conversion, no tuple each)
        # False once `prepare_events` met an event it cannot make rows for off the writing thread
        self.preparable = True
        self._pending_seq = -1  # the seq of the last event whose rows were made
        self.num_made = 0  # rows made so far, written or (`prepare_events`) not yet
        self._spare: tuple[int, dict[str, np.ndarray]] | None = None  # `reserve`: (rows copied, columns)
        self._no_request = -1  # the occurrence "" that cache resets and other events name
        # a live pool that grew: the first row that saw each block (-1: there from the start)
        # and the free-queue place it joined at; blocks appear in id order
        self.initial_blocks = num_blocks
        # as runs while they pay; the place a block joined at is TAIL_BASE + 2 * row - 1
        # (`_grow`), computed when asked for, not kept
        self._born_row = BornRows(num_blocks)
        self._slots: RemoteSlots | None = None  # a remote pool's slots, from its first remote event
        # a remote pool's stores, by ordinal (a stored row's `a`): parent, tokens, salt, external
        # id and tenant as each store gave them (copies of one hash may carry different ones)
        self.store_attributes: list[tuple] | None = None
        self.journal_fed = False  # rows written from a columnar pool's journal (engine.core.live_journal)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_columns(cls, num_blocks: int, block_size: int, columns: Sequence[np.ndarray], keys: KeyTable,
                     requests: RequestTable, counters: Counters, num_seq: int) -> ColumnarLog:
        log = cls(num_blocks, block_size, keys, requests)
        log._cols = {name: _owned(col, np.int32 if name in WIDENING and _fits32(col) else dtype)
                     for (name, dtype), col in zip(COLUMNS, columns) if name in log._cols}
        log.num_rows = len(columns[0])
        for name in SPARSE_COLUMNS:
            log._make_sparse(name)
        log._make_per_event()
        log._make_event_rows()
        for name in COUNTED_VALUES:
            if name in log._sparse and name not in log._sparse_base:
                rows, values = log._sparse[name]
                log._sparse[name] = (rows, FirstSeen.of(values))
        for name, (narrow, _) in NARROW_COLUMNS.items():
            if name in log._cols and fits(log._cols[name], narrow):
                log._cols[name] = log._cols[name].astype(narrow)
        log.num_seq = num_seq
        log.final_counters = counters
        log.build_checkpoints()
        requests.keep_last_keys(keys)  # the replay, which read every row's ids, is over
        return log

    def col(self, name: str) -> np.ndarray:
        try:
            return _widened(name, self._cols[name][:self.num_rows])
        except KeyError:
            per_event = self._per_event.get(name)
            if per_event is not None:  # made whole for the caller: `values_at` reads a part
                return np.repeat(per_event, self.event_bounds.counts())
            if name in self._sparse:  # made whole for the caller: `values_at` reads a part
                rows, values = self._sparse[name]
                out = self._filled(name, slice(None), values.dtype)
                out[np.asarray(rows)] = np.asarray(values)
                return out
            if name == "tier":  # not kept: every row's is 0
                return np.zeros(self.num_rows, np.uint8)
            raise

    def values_at(self, name: str, index: slice | np.ndarray | int) -> np.ndarray:
        """`col(name)[index]` for a slice (step 1) or row numbers, without making a sparse
        column whole."""
        per_event = self._per_event.get(name)
        if per_event is not None:
            return self._event_values(per_event, index)
        sparse = self._sparse.get(name)
        if sparse is None:
            kept = self._cols.get(name)
            if kept is None:
                return self.col(name)[index]
            if isinstance(kept, ArithmeticRuns):  # only the rows asked for made
                return kept.head(self.num_rows)[index]
            return _widened(name, kept[:self.num_rows][index])
        rows, values = sparse
        if isinstance(index, slice):
            start, stop, _ = index.indices(self.num_rows)
            out = self._filled(name, slice(start, max(start, stop)), values.dtype)
            lo, hi = np.searchsorted(rows, (start, stop))
            out[rows[lo:hi] - start] = values[lo:hi]
            return out
        index = np.asarray(index)
        fill = self._filled(name, index, values.dtype)
        if not len(rows):
            return fill
        at = np.minimum(np.searchsorted(rows, index), len(rows) - 1)
        return np.where(rows[at] == index, values[at], fill).astype(values.dtype)

    def rows_window(self, name: str, start: int, stop: int) -> np.ndarray:
        """An array that holds column `name`'s values at rows [start, stop) (what a compiled
        pass over those rows reads): the column itself when whole; for a sparse one, `stop`
        long with only [start, stop) written (the rows before are never read, nor their
        pages touched), so a pass over one checkpoint's interval does not make it whole."""
        kept = self._cols.get(name)
        if isinstance(kept, np.ndarray) and _widened(name, kept[:0]).dtype == kept.dtype:
            return self.col(name)
        part = self.values_at(name, slice(start, stop))
        out = np.empty(stop, part.dtype)
        out[start:stop] = part
        return out

    def _event_values(self, per_event: np.ndarray, index: slice | np.ndarray | int) -> np.ndarray:
        """A per-event column's values at rows `index` (a slice of step 1, or row numbers)."""
        bounds = self.event_bounds
        if isinstance(index, slice):
            start, stop, _ = index.indices(self.num_rows)
            if stop <= start:
                return per_event[:0].copy()
            first = int(bounds.searchsorted(as_key(start, bounds), side="right")) - 1
            last = int(bounds.searchsorted(as_key(stop, bounds), side="left"))
            # the first and last events' cut to [start, stop)
            counts = bounds.counts(first, last) if isinstance(bounds, EventBounds) else \
                np.diff(bounds[first:last + 1].astype(np.int64))
            counts[0] -= start - int(bounds[first])
            counts[-1] -= int(bounds[last]) - stop
            return np.repeat(per_event[first:last], counts)
        if np.ndim(index) == 0:
            return per_event[int(bounds.searchsorted(as_key(int(index), bounds), side="right")) - 1]
        return per_event[bounds.searchsorted(np.asarray(index), side="right") - 1]

    def kept(self, name: str) -> np.ndarray:
        """A whole column as kept (`NARROW_COLUMNS` in their narrow type), for a reader that
        only picks values out of it as Python ints; a column kept another way made whole."""
        kept = self._cols.get(name)
        return kept[:self.num_rows] if kept is not None else self.col(name)

    def _has_narrow(self) -> bool:
        return any(name in self._cols and self._cols[name].dtype == narrow
                   for name, (narrow, _) in NARROW_COLUMNS.items())

    def _make_per_event(self) -> None:
        """Keep `PER_EVENT_COLUMNS` as a value per event where every row of an event agrees."""
        n = self.num_rows
        if not n:
            return
        seq = self._cols["seq"][:n]
        same = seq[1:] == seq[:-1]  # a row of the same event as the row before
        starts = np.flatnonzero(np.concatenate(([True], ~same)))
        bounds = np.append(starts, n)
        self.event_bounds = EventBounds.of(bounds.astype(np.int32) if n <= _I32.max else bounds)
        for name in PER_EVENT_COLUMNS:
            col = self._cols[name][:n]
            if name != "seq" and not np.array_equal(col[1:][same], col[:-1][same]):
                continue  # rows of one event that differ (no source makes them): kept whole
            values = col[starts]
            self._per_event[name] = (Consecutive.of(values) if name == "seq" else values) \
                if name in _SHARED_PER_EVENT else _EventRuns.of(values)
            del self._cols[name]
        if not self._per_event:
            self.event_bounds = None
            return
        for name in PER_EVENT_WHEN_ALIKE:
            col = self.col(name)
            if not np.array_equal(col[1:][same], col[:-1][same]):
                continue
            values = col[starts]
            del col
            kept = min((_EventRuns.of(values), _EventSparse.of(values, SPARSE_COLUMNS.get(name, 0))),
                       key=lambda v: v.nbytes)
            if kept.nbytes >= self._column_nbytes(name):
                continue
            self._per_event[name] = kept
            self._cols.pop(name, None)
            self._sparse.pop(name, None)
            self._sparse_base.pop(name, None)
            self._bit_base.discard(name)

    def _column_nbytes(self, name: str) -> int:
        """The bytes column `name` is kept in: whole, or its sparse rows, values and base."""
        if name in self._cols:
            return _used_nbytes(self._cols[name], self.num_rows)
        rows, values = self._sparse[name]
        base = self._sparse_base.get(name)
        return rows.nbytes + values.nbytes + (base.nbytes if base is not None else 0)

    def _make_event_rows(self) -> None:
        """Keep the rows of a sparse column of `EVENT_ROW_COLUMNS` as the events they begin
        (`EventRows`) when they are the first rows of its events of those kinds."""
        kinds = self._per_event.get("kind")
        if self.event_bounds is None or not isinstance(kinds, np.ndarray):
            return
        for name, codes in EVENT_ROW_COLUMNS.items():
            sparse = self._sparse.get(name)
            if sparse is not None and name not in self._sparse_base:
                rows, values = sparse
                self._sparse[name] = (EventRows.of(rows, self.event_bounds, np.isin(kinds, codes)), values)

    def _make_sparse(self, name: str) -> None:
        """Keep column `name` the smallest of four ways: whole; as the rows whose value is not
        its fill and their values; or (a fill of 0) a byte a row and, as those rows, the ones
        whose value a byte does not hold (the Mooncake trace's `a`: ref counts of 1 and
        lookups' hit counts of a few hundred at most, but finishes' token counts); or (a fill
        of 0) a bit a row and the rows whose value is not 0 or 1 (its `flag`: a free to the
        queue's tail is 1, a lookup's miss reason up to 5 on a few rows: 1.6 MB -> 0.21 MB)."""
        col = self.col(name)
        fill = SPARSE_COLUMNS[name]
        wide = np.int32 if self.num_rows <= _I32.max else np.int64
        rows = np.flatnonzero(col != fill).astype(wide)
        per_row = rows.itemsize + col.itemsize
        best = min(col.nbytes, len(rows) * per_row)
        base = None
        bits = name in BIT_BASE_COLUMNS
        if fill == 0 and (bits or col.itemsize > 1):
            top = 1 if bits else 255
            small = (col >= 0) & (col <= top)
            over = np.flatnonzero(~small).astype(wide)
            size = (self.num_rows + 7) // 8 if bits else self.num_rows
            if size + len(over) * per_row < best:
                low = np.where(small, col, 0).astype(np.uint8)
                rows, base = over, np.packbits(low, bitorder="little") if bits else low
                best = size + len(over) * per_row
        if best >= col.nbytes:
            return
        self._sparse[name] = (rows, col[rows])
        if base is not None:
            self._sparse_base[name] = base
            if bits:
                self._bit_base.add(name)
        del self._cols[name]

    def _filled(self, name: str, index: Any, dtype: Any) -> np.ndarray:
        """A sparse column's value at `index` (a slice, rows, a row) before its rows are laid
        over it: its fill, or its byte a row (`_sparse_base`)."""
        base = self._sparse_base.get(name)
        if base is not None and name in self._bit_base:  # a bit a row, 8 a byte, row r at bit r % 8
            if isinstance(index, slice):
                start, stop, _ = index.indices(self.num_rows)
                stop = max(start, stop)
                bits = np.unpackbits(base[start >> 3:(stop + 7) >> 3], bitorder="little")
                return bits[start & 7:(start & 7) + stop - start].astype(dtype)
            at = np.asarray(index, np.int64) % max(1, self.num_rows)  # a negative row counts from the end
            return bits_at(base, at).astype(dtype)
        if base is not None:
            return base[:self.num_rows][index].astype(dtype)
        if isinstance(index, slice):
            start, stop, _ = index.indices(self.num_rows)
            return np.full(max(0, stop - start), SPARSE_COLUMNS[name], dtype)
        return np.full(np.shape(index), SPARSE_COLUMNS[name], dtype)

    def _densify(self) -> None:
        """The sparse, per-event and narrow columns whole again, before rows are written (a
        finished log appended to); nothing to do for a log whose columns all are."""
        if not (self._sparse or self._per_event or self._has_narrow()):
            return
        cap = len(self._cols["block"])  # every column kept whole has the same room
        for name, (narrow, read) in NARROW_COLUMNS.items():
            if name in self._cols and self._cols[name].dtype == narrow:
                self._cols[name] = self._cols[name].astype(read)
        for name in list(self._per_event):
            rows = self.col(name)
            col = self._cols[name] = np.zeros(cap, rows.dtype)
            col[:self.num_rows] = rows
            del self._per_event[name]
        self.event_bounds = None
        for name, (rows, values) in self._sparse.items():
            col = self._cols[name] = np.full(cap, SPARSE_COLUMNS[name], values.dtype)
            col[:self.num_rows] = self._filled(name, slice(None), values.dtype)
            col[np.asarray(rows)] = np.asarray(values)
        self._sparse, self._sparse_base = {}, {}
        self._bit_base = set()

    def settle(self) -> None:
        """Copy the arrays a finished log keeps (rows, chain and request tables, request
        index, checkpoints) into fresh allocations, one at a time. Made while the replay's
        temporaries were all alive, they sit among them at the top of the heap and keep
        its freed pages resident; made again once those are gone, they fill the freed
        space and the rest can go back to the system."""
        self._cols = {name: arr.fresh() if isinstance(arr, ArithmeticRuns) else _fresh(arr[:self.num_rows])
                      for name, arr in self._cols.items()}
        if self.event_bounds is not None:  # before the rows kept as events, which read it
            self.event_bounds = self.event_bounds.fresh()
        self._sparse = {name: (rows.fresh(self.event_bounds) if isinstance(rows, EventRows) else _fresh(rows),
                               values.fresh() if isinstance(values, FirstSeen) else _fresh(values))
                        for name, (rows, values) in self._sparse.items()}
        self._sparse_base = {name: _fresh(base) for name, base in self._sparse_base.items()}
        self._per_event = {name: values.fresh() if isinstance(values, (_EventRuns, _EventSparse)) else
                           values if isinstance(values, Consecutive) else _fresh(values)
                           for name, values in self._per_event.items()}
        keys = self.keys
        keys.parent, keys.item, keys.tag, keys.content = (
            *(a.fresh() if isinstance(a, CountingRuns) else _fresh(a) for a in (keys.parent, keys.item)),
            _fresh(keys.tag), _fresh(keys.content))
        req = self.requests
        if req._last is None:
            req._keys, req._koff = _fresh(req._keys), _fresh(req._koff)
        else:
            req._last = _fresh(req._last)
        req._nfull = _fresh(req._nfull)
        req._salt_ids, req._nprompt = _fresh(req._salt_ids), _fresh(req._nprompt)
        if self._req_index is not None:
            rows, value = self._req_index
            self._req_index = (rows, tuple(_fresh(a) for a in value))
        for i, state in enumerate(self._cp_states):
            if isinstance(state, PackedPool):
                self._cp_states[i] = state.fresh()
            else:
                state.ref_counts, state.hash_keys, state.free_pos = (
                    _fresh(state.ref_counts), _fresh(state.hash_keys), _fresh(state.free_pos))

    def __len__(self) -> int:
        """Events in the log (rows are per block; several rows may share one seq)."""
        return self.num_seq

    def nbytes(self) -> int:
        return sum(_used_nbytes(a, self.num_rows) for a in self._cols.values()) + sum(
            rows.nbytes + values.nbytes for rows, values in self._sparse.values()) + sum(
            base.nbytes for base in self._sparse_base.values()) + sum(
            values.nbytes for values in self._per_event.values()) + (
            self.event_bounds.nbytes if self.event_bounds is not None else 0)

    def _row(self, kind: int, seq: int, request: int, block: int = -1, key: int = -1, a: int = 0, b: int = 0,
             flag: int = 0) -> None:
        # a row is a tuple until `_flush` writes a batch of them into the columns at once
        self._pending.extend((kind, seq, request, block, key, a, b, flag))

    def _flush(self) -> None:
        """Write the rows `_row` queued into the columns (one numpy assignment per column)."""
        rows = self._pending
        if not rows:
            return
        self.write_rows(np.fromiter(rows, np.int64, len(rows)).reshape(-1, 8))
        rows.clear()

    def write_rows(self, table: np.ndarray, fit32: bool = False) -> None:
        """Append rows given as an int64 table, one row per line in the column order
        (kind, seq, request, block, hash, a, b, flag), for a source that makes its rows
        without `Event`s (engine.core.live_journal). `fit32`: the caller knows every value
        of the columns kept int32 while they fit (`WIDENING`) fits int32, so they are not
        looked over first (a min and a max of three columns, ~11 us a journal tick)."""
        self._write_table(self.num_rows, table, fit32)
        self.num_rows += len(table)

    def reserve(self, rows: int) -> None:
        """Make room for `rows` rows past those made so far, on the thread that makes them
        (an engine thread, after `prepare_events`): the larger columns are allocated and
        the rows written by now copied there, so the writing thread, when its columns fill,
        copies only the rows it wrote since (`_write_table`) instead of the whole log."""
        self._densify()
        cap = len(self._cols["kind"])
        need = max(self.num_made, self.num_rows) + rows
        spare = self._spare
        if need <= cap or (spare is not None and len(spare[1]["kind"]) >= need):
            return
        n0 = self.num_rows  # written rows never change: copying them races with nothing
        new_cap = max(need, cap + cap // 2)
        cols = {}
        for name, arr in self._whole_columns():
            grown = np.zeros(new_cap, arr.dtype)
            grown[:n0] = arr[:n0]
            cols[name] = grown
        self._spare = (n0, cols)

    def _write_table(self, start: int, table: np.ndarray, fit32: bool = False) -> None:
        """Write `table` (int64, `_ROW_ORDER`) at row `start`, a column in `WIDENING` made
        int64 first if a value would not fit int32 (a spare `reserve` made narrow is dropped).
        A journal-fed log's first rows begin its `RUN_COLUMNS` as runs (`ArithmeticRuns`),
        each kept whole from the batch after which its runs stopped paying."""
        stop = start + len(table)
        self._densify()
        if self.journal_fed and not start:
            for name in RUN_COLUMNS:
                if isinstance(self._cols.get(name), np.ndarray):
                    self._cols[name] = ArithmeticRuns(self._cols[name].dtype)
        cap = len(self._cols["kind"])  # every column kept whole has the same room
        if stop > cap:
            spare, self._spare = self._spare, None
            # names, not the arrays: a reference held here made every `regrow` copy its column
            whole = [name for name, _ in self._whole_columns()]
            if spare is not None and len(spare[1]["kind"]) >= stop and all(
                    name in spare[1] and spare[1][name].dtype == self._cols[name].dtype for name in whole):
                n0, cols = spare
                for name in whole:
                    grown = cols[name]
                    grown[n0:start] = self._cols[name][n0:start]
                    self._cols[name] = grown
            else:
                # grown where they lie (`regrow`), so by an eighth: grown by half, a column was
                # up to a third unused; every reader stops at `num_rows`
                new_cap = max(stop, cap + cap // 8)
                for name in whole:
                    regrow(self._cols, name, new_cap, start)
        for name, j in _ROW_ORDER:
            values = table[:, j]
            col = self._cols[name]
            if name in WIDENING and col.dtype == np.int32 and not fit32 and not _fits32(values):
                if isinstance(col, ArithmeticRuns):
                    col.widen()
                else:
                    col = self._cols[name] = col.astype(np.int64)  # the rows written so far too
            if not isinstance(col, ArithmeticRuns):
                col[start:stop] = values
                continue
            if col.n != start:
                raise ValueError(f"rows written at row {start} cannot follow the {col.n} kept as runs")
            col.extend(values)
            if not col.paying:  # whole from now on, with the room the other columns have
                arr = self._cols[name] = np.zeros(len(self._cols["kind"]), col.dtype)
                arr[:stop] = col[:stop]

    def _whole_columns(self) -> list[tuple[str, np.ndarray]]:
        """(name, array) of the columns kept as arrays, not as runs."""
        return [(name, arr) for name, arr in self._cols.items() if isinstance(arr, np.ndarray)]

    def frozen_columns(self) -> dict[str, Any]:
        """The columns as they are now, for a read-only copy of the log (`LiveColumnarLog.snapshot`)
        read while rows are appended here: arrays shared (rows written never change), runs
        cut to the rows written (`ArithmeticRuns.head`: a later batch extends these)."""
        return {name: arr.head(self.num_rows) if isinstance(arr, ArithmeticRuns) else arr
                for name, arr in self._cols.items()}

    def _grow(self, top: int, born: np.ndarray | None = None) -> None:
        """Blocks up to `top` exist from the next row on (each joins the free queue's tail),
        born at `born` (a journal's: the row that first stored each), else at the row the
        growing event makes next; the hash each holds grows by half again when full."""
        n = self.num_blocks
        if top < n:
            return
        if born is None:
            row = self.num_rows + len(self._pending) // 8  # the row the growing event makes next
            born = np.full(top + 1 - n, row, np.int64)
        self._born_row.extend(born)
        keys = self._live_keys
        if keys is not None and top >= len(keys):
            have = len(keys)
            regrow(self, "_live_keys", max(top + 1, have * 3 // 2, 1024), have)
            self._live_keys[have:] = -1
        self.num_blocks = top + 1
        if self._slots is not None and not self.journal_fed:  # a journal's log places slots itself
            self._slots.grow(self.num_blocks)

    def blocks_at(self, rows: int | np.ndarray) -> Any:
        """How many blocks the pool has after `rows` rows (a live pool may have grown)."""
        if self.num_blocks == self.initial_blocks:
            return self.num_blocks if np.ndim(rows) == 0 else np.full(np.shape(rows), self.num_blocks, np.int64)
        if np.ndim(rows) == 0:
            return int(self._born_row.searchsorted(rows))
        return np.asarray(self._born_row.searchsorted(np.asarray(rows)), np.int64)

    def remote_info(self, number: int) -> Any:
        """The `RemoteInfo` a row's `b` names (1 + its number), None for 0."""
        return self._slots.info(number) if number > 0 and self._slots is not None else None

    def info_numbers(self, index: slice | np.ndarray) -> np.ndarray:
        """Per row of `index` (a slice or row numbers) the number of its `RemoteInfo` (0:
        none): a stored, removed or reset row's `b` names it (other rows' `b` is theirs)."""
        if not self.has_remote_rows:
            n = len(range(*index.indices(self.num_rows))) if isinstance(index, slice) else len(index)
            return np.zeros(n, np.int64)
        kind = self.col("kind")[index]
        return np.where(np.isin(kind, (STORED, EVICTED, RESET)), self.values_at("b", index), 0).astype(np.int64)

    def remote_batch_times(self, numbers: np.ndarray) -> np.ndarray:
        """`remote_info(n).batch_time` of each of `numbers` (0.0 for 0, no info)."""
        times = np.zeros(1 + (0 if self._slots is None else len(self._slots.infos)), np.float64)
        if len(times) > 1:
            times[1:] = self._slots.batch_times()
        return times[np.asarray(numbers, np.int64)]

    def remote_info_columns(self, numbers: Any = None) -> dict[str, list[Any]]:
        """`RemoteSlots.info_columns` (empty lists without remote rows)."""
        if self._slots is None:
            return info_columns([])
        return self._slots.info_columns(None if numbers is None else np.asarray(numbers, np.int64).tolist())

    def store_salt_codes(self, stores: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """The salt of remote stores `stores` (their rows' `a`) as codes into a list of
        names (0: none, else names[code - 1])."""
        attrs = self.store_attributes
        if hasattr(attrs, "salt_codes"):  # a journal's (engine.core.live_journal.JournalStores)
            return attrs.salt_codes(stores)
        names: dict[str, int] = {}
        codes = [0 if (salt := attrs[s][2]) is None else names.setdefault(salt, len(names) + 1)
                 for s in np.asarray(stores, np.int64).tolist()]
        return np.asarray(codes, np.int64), list(names)

    @property
    def has_remote_rows(self) -> bool:
        return self._slots is not None and bool(self._slots.infos)

    def _remote_slots(self) -> RemoteSlots:
        if self._slots is None:
            cur = self._live_keys  # None on a journal's log (its placer places the copies): all vacant
            vacant = [b for b in range(self.num_blocks - 1, -1, -1) if cur is None or cur[b] < 0]
            self._slots = RemoteSlots(vacant)
            self._slots.grow(self.num_blocks)
        return self._slots

    def _append_remote_store(self, e: BlockStored, r: int) -> None:
        slots = self._remote_slots()
        b = slots.take(self._live_keys, self.num_blocks)
        if b >= self.num_blocks:
            self._grow(b)
        cur = self._live_keys
        if cur[b] >= 0:
            slots.uncached(b, self.keys.digest(int(cur[b])))
        k = self.keys.key_of(e.block_hash)
        # the tenant as PoolProjection sets it when the block is stored: its salt at a root
        # or under a parent no slot holds, else the parent's holder's tenant
        holders = slots.holders.get(e.parent_hash) if e.parent_hash is not None else None
        tenant = e.salt if not holders else slots.tenants[holders[0]]
        if self.store_attributes is None:
            self.store_attributes = []
        tokens = e.token_ids if type(e.token_ids) is tuple else tuple(e.token_ids)
        self.store_attributes.append((e.parent_hash, tokens, e.salt, e.external_id, tenant))
        cur[b] = k
        slots.stored(b, e.block_hash, e.remote, tenant)
        # flag 1: a store into a free slot moves it to the free queue's tail, as PoolProjection does
        self._row(STORED, e.seq, r, b, k, a=len(self.store_attributes) - 1, b=slots.info_id(e.remote), flag=1)

    def _append_remote_removal(self, e: BlockEvicted, r: int) -> None:
        slots = self._remote_slots()
        cur = self._live_keys
        b = e.block_id
        if b is None or not 0 <= b < self.num_blocks or cur[b] < 0 or self.keys.digest(int(cur[b])) != e.block_hash:
            b = slots.copy_of(e)
        k = self.keys.key_of(e.block_hash)
        if b is None:  # a hash no slot holds: an event, and nothing changes
            self._row(EVICTED, e.seq, r, -1, k, b=slots.info_id(e.remote))
            return
        slots.uncached(b, e.block_hash)
        cur[b] = -1
        self._row(EVICTED, e.seq, r, b, k, b=slots.info_id(e.remote))

    def _append_reset(self, e: CacheReset) -> None:
        cur = self._live_keys
        held = np.flatnonzero(cur[:self.num_blocks] >= 0).tolist()
        info = 0
        slots = self._slots
        if slots is not None or e.remote is not None:
            slots = self._remote_slots()
            held, whole = slots.cleared_by(e.remote, held)
            for blk in held:
                slots.uncached(blk, self.keys.digest(int(cur[blk])))
            if whole:
                slots.holders.clear()
            info = slots.info_id(e.remote) if e.remote is not None else 0
        r = self.no_request()
        if not held:
            self._row(RESET, e.seq, r, a=e.num_blocks_cleared, b=info)
        for blk in held:
            self._row(RESET, e.seq, r, blk, int(cur[blk]), a=e.num_blocks_cleared, b=info)
        cur[held] = -1

    def no_request(self) -> int:
        """The occurrence that rows naming no request (cache resets, other events) carry."""
        if self._no_request < 0:
            self._no_request = self.requests.add("", None, 0)
        return self._no_request

    def append_events(self, events: Iterable[Event]) -> None:
        """Append a live source's events (the local engine's kinds, cache resets and, kept
        whole, events the pool does not read), in seq order."""
        try:
            self._append_all(events if isinstance(events, list) else list(events), False)
        finally:  # the rows made before a bad event are kept whole, as its earlier events are
            self._flush()
            self.num_seq = max(self.num_seq, self._pending_seq + 1)
            self.num_made = self.num_rows

    def write_prepared(self, table: np.ndarray, row0: int, last_seq: int) -> None:
        """Write rows `prepare_events` made from row `row0` on (events up to seq `last_seq`):
        one copy per column."""
        if row0 != self.num_rows:
            raise ValueError(f"prepared rows from row {row0} cannot follow row {self.num_rows}: "
                             "they must be written to the log that made them, in the order made")
        self.write_rows(table)
        self.num_seq = max(self.num_seq, last_seq + 1)

    def prepare_events(self, events: list[Event]) -> tuple[np.ndarray, int, int]:
        """Make the rows of `events` (in seq order, after every event made before) without
        writing them: (an int64 row table for `write_prepared`, how many of the events it
        covers, the row it starts at). Another thread than the one reading the log may call it (an engine
        thread, while the GUI thread reads): the key and request tables it adds to only
        grow, and the rows count for nothing until written. It stops before the first
        event that needs what only the writing thread may change (a pool that grows, a
        remote server's slots, a seq not after the one before, an event it refuses), and
        from then on `preparable` is False: that event and every later one go to
        `append_events`, on the thread that writes."""
        row0 = max(self.num_made, self.num_rows)
        if not self.preparable:
            return np.zeros((0, 8), np.int64), 0, row0
        rows = self._pending = []
        try:
            done = self._append_all(events, True)
        except Exception:  # refused again, with its sentence, by `append_events` on the writing thread
            last = self._pending_seq  # the last event made whole
            done = bisect.bisect_right([e.seq for e in events], last)
            while rows and rows[-7] > last:  # a row's seq is its second value
                del rows[-8:]
        finally:
            self._pending = []
        if done < len(events):
            self.preparable = False
        self.num_made = row0 + len(rows) // 8
        return np.fromiter(rows, np.int64, len(rows)).reshape(-1, 8), done, row0

    def _append_all(self, events: list[Event], partial: bool) -> int:
        """Queue the rows of `events`; with `partial`, stop before the first event that
        `prepare_events` leaves to the writing thread. Returns how many events were made."""
        if self._live_keys is None:
            self._live_keys = np.full(self.num_blocks, -1, np.int32)
        reqs = self.requests
        pending = self._pending
        put = pending.extend
        by_digest = self.keys._by_digest
        key_of = self.keys.key_of
        live_request = self._live_request
        last = self._pending_seq
        for i, e in enumerate(events):
            t = type(e)
            s = e.seq
            if partial and s <= last:
                return i
            last = s
            if t in _GROWING_KINDS:  # a block past the pool's end: it grows, as PoolProjection does
                top = max(e.block_ids, default=-1) if t is not BlockStored else e.block_id
                if top is not None and top >= self.num_blocks:
                    if partial:
                        return i
                    self._grow(top)
            cur = self._live_keys
            if t is BlocksAllocated:
                rid = e.request_id
                r = live_request.get(rid) if rid else None
                if r is None:
                    r = self._request_row(e)
                ids, hit = e.block_ids, e.num_hit_blocks
                if ids:  # one row per block, queued as `_row` would (without a call per block)
                    for blk in ids:
                        put((ALLOCATED, s, r, blk, -1, hit, 0, 0))
                else:
                    put((ALLOCATED, s, r, -1, -1, hit, 0, 0))
            elif t is RefCountsChanged:
                rid = e.request_id
                r = live_request.get(rid) if rid else None
                if r is None:
                    r = self._request_row(e)
                ids = e.block_ids
                if ids:
                    for blk, ref in zip(ids, e.ref_counts):
                        put((REF, s, r, blk, -1, ref, 0, 0))
                else:
                    put((REF, s, r, -1, -1, 0, 0, 0))
            elif t is BlockStored and e.remote is None:
                rid = e.request_id
                r = live_request.get(rid) if rid else None
                if r is None:
                    r = self._request_row(e)
                k = key_of(e.block_hash, (e.parent_hash, e.token_ids if type(e.token_ids) is tuple
                                          else tuple(e.token_ids), e.salt, e.external_id))
                cur[e.block_id] = k
                put((STORED, s, r, e.block_id, k, 0, 0, 0))
            elif t is BlockEvicted and e.remote is None:
                rid = e.by_request_id
                r = live_request.get(rid) if rid else None
                if r is None:
                    r = self._request_row(e)
                k = by_digest.get(e.block_hash)
                if k is None:
                    k = key_of(e.block_hash)
                cur[e.block_id] = -1
                put((EVICTED, s, r, e.block_id, k, 0, 0, 0))
            elif t is RequestStarted or t is RequestRefused:
                r = reqs.add(e.request_id, getattr(e, "salt", None), getattr(e, "num_prompt_tokens", 0))
                live_request[e.request_id] = r
                if t is RequestStarted:
                    put((STARTED, s, r, -1, -1, 0, 0, 0))
                else:
                    put((REFUSED, s, r, -1, -1, e.num_blocks_needed, e.num_blocks_available, 0))
            elif t is LookupDone:
                r = self._request_row(e)
                got = [by_digest.get(h) for h in e.block_hashes]
                keys = tuple(got) if None not in got else tuple(key_of(h) for h in e.block_hashes)
                reqs.set_live(r, reqs.salt(r), e.num_prompt_tokens, keys)
                m = e.miss
                code = _MISS_CODE[m.reason]
                if m.reason == "evicted":
                    b = -1 if m.evicted_by_seq is None else m.evicted_by_seq
                elif m.reason == "salt":
                    b = self._salt_id(m.other_salt or "")
                else:
                    b = -1 if m.divergence_token is None else m.divergence_token
                put((LOOKUP, s, r, m.first_miss_block, -1, e.num_hit_blocks, b, code))
            elif t is BlocksFreed:
                r = self._request_row(e)
                ids = e.block_ids
                if ids:
                    # a block the pool does not have is skipped when freed, as PoolProjection does
                    nb = self.num_blocks
                    for blk in ids:
                        put((FREED, s, r, blk, -1, 0, 0, 1 if cur[blk] >= 0 else 0) if 0 <= blk < nb
                            else (FREED, s, r, -1, -1, 0, 0, 0))
                else:
                    put((FREED, s, r, -1, -1, 0, 0, 0))
            elif t is RequestFinished:
                r = self._request_row(e)
                put((FINISHED, s, r, -1, -1, e.num_tokens_with_kv, 0, int(e.aborted)))
            elif t is BlockStored or t is BlockEvicted:  # a remote server's: its slots
                if partial:
                    return i
                r = self._request_row(e)
                if t is BlockStored:
                    self._append_remote_store(e, r)
                else:
                    self._append_remote_removal(e, r)
            elif t is CacheReset:
                if partial and (self._slots is not None or e.remote is not None):
                    return i
                self._append_reset(e)
            elif t not in _COLUMN_KINDS:
                self._others[s] = e
                self._row(OTHER, s, self.no_request())
            else:
                raise ValueError(f"the columnar log does not hold {e.kind} events")
            self._pending_seq = s
        return len(events)

    def _request_row(self, e: Event) -> int:
        rid = getattr(e, "request_id", None) or getattr(e, "by_request_id", None)
        r = self._live_request.get(rid)
        if r is None:
            r = self.requests.add(rid, None, 0)
            self._live_request[rid] = r
        return r

    def _salt_id(self, salt: str) -> int:
        salts = self.keys.salts
        if salt not in salts:
            salts.append(salt)
        return salts.index(salt)

    # ------------------------------------------------------------------ events
    def events(self, time: float = 0.0, start_row: int = 0, stop_row: int | None = None) -> Iterator[Event]:
        """The rows as the Python engine's `Event` objects (with `time` for every event)."""
        stop = self.num_rows if stop_row is None else min(stop_row, self.num_rows)
        # only the rows asked for become Python values (a view builds one event at a time)
        c = {name: self.values_at(name, slice(start_row, stop)) for name, _ in KEPT_COLUMNS}
        kind, seq, req, block = c["kind"].tolist(), c["seq"].tolist(), c["request"].tolist(), c["block"].tolist()
        key, a, b, flag = c["hash"].tolist(), c["a"].tolist(), c["b"].tolist(), c["flag"].tolist()
        reqs, keys, bs = self.requests, self.keys, self.block_size
        n = len(kind)
        attrs_of, digest_of = self._bulk_attributes(c)
        i = 0
        while i < n:
            k, s, r = kind[i], seq[i], req[i]
            j = i + 1
            while j < n and seq[j] == s:
                j += 1
            rid = reqs.ids[r]
            if block[i] < 0 and k in (ALLOCATED, REF, FREED):  # a live event naming no block
                yield (BlocksAllocated(seq=s, time=time, request_id=rid, block_ids=(), num_hit_blocks=a[i])
                       if k == ALLOCATED else RefCountsChanged(seq=s, time=time, request_id=rid, block_ids=(),
                                                               ref_counts=()) if k == REF else
                       BlocksFreed(seq=s, time=time, request_id=rid, block_ids=()))
                i = j
                continue
            if k == STARTED:
                yield RequestStarted(seq=s, time=time, request_id=rid, num_prompt_tokens=reqs.num_prompt_tokens(r),
                                     salt=reqs.salt(r))
            elif k == LOOKUP:
                reason = MISS_REASONS[flag[i]]
                extra = b[i]
                miss = MissInfo(reason=reason, first_miss_block=block[i],
                                divergence_token=extra if reason == "new_content" else None,
                                evicted_by_seq=(None if extra < 0 else extra) if reason == "evicted" else None,
                                other_salt=(("" if extra < 0 else keys.salts[extra] or "")
                                            if reason == "salt" else None))
                hk = reqs.hash_keys(r)
                yield LookupDone(seq=s, time=time, request_id=rid, block_hashes=tuple(keys.digest(x) for x in hk),
                                 num_hit_blocks=a[i], num_cached_tokens=a[i] * bs,
                                 num_prompt_tokens=reqs.num_prompt_tokens(r), miss=miss)
            elif k == ALLOCATED:
                yield BlocksAllocated(seq=s, time=time, request_id=rid, block_ids=tuple(block[i:j]),
                                      num_hit_blocks=a[i])
            elif k == REF:
                yield RefCountsChanged(seq=s, time=time, request_id=rid, block_ids=tuple(block[i:j]),
                                       ref_counts=tuple(a[i:j]))
            elif k == STORED:
                info = self.remote_info(b[i])
                parent, tokens, salt, ext = keys.attributes(key[i]) if info is None else \
                    attrs_of[i] if i in attrs_of else self.store_attributes[a[i]][:4]
                yield BlockStored(seq=s, time=time, request_id=rid, block_id=block[i] if info is None else -1,
                                  block_hash=digest_of[i] if i in digest_of else keys.digest(key[i]),
                                  parent_hash=parent, token_ids=tokens, salt=salt, external_id=ext, remote=info)
            elif k == FREED:
                yield BlocksFreed(seq=s, time=time, request_id=rid, block_ids=tuple(block[i:j]))
            elif k == EVICTED:
                info = self.remote_info(b[i])
                yield BlockEvicted(seq=s, time=time, block_id=block[i] if info is None else -1,
                                   block_hash=digest_of[i] if i in digest_of else keys.digest(key[i]),
                                   by_request_id=rid, remote=info)
            elif k == REFUSED:
                yield RequestRefused(seq=s, time=time, request_id=rid, num_blocks_needed=a[i],
                                     num_blocks_available=b[i])
            elif k == FINISHED:
                yield RequestFinished(seq=s, time=time, request_id=rid, num_tokens_with_kv=a[i],
                                      aborted=bool(flag[i]))
            elif k == RESET:
                yield CacheReset(seq=s, time=time, num_blocks_cleared=a[i], remote=self.remote_info(b[i]))
            elif k == OTHER:
                yield self._others[s]
            i = j

    def _bulk_attributes(self, c: dict[str, np.ndarray]) -> tuple[dict[int, tuple], dict[int, bytes]]:
        """For the rows `c` (columns of a span, as `events` reads them) of a journal-fed log:
        the (parent, token ids, salt, external id) of each remote stored row and the digest
        of each stored and removed row, read for all of them at once (one at a time, a row's
        store and digest were ~180 us: an event log search of 91,505 events took 13 s)."""
        stores, keys = self.store_attributes, self.keys
        if not (hasattr(stores, "parents") and hasattr(keys, "digests")) or self._slots is None:
            return {}, {}
        kind, b, key = c["kind"], c["b"], c["hash"]
        rows = np.flatnonzero((kind == STORED) & (b > 0))
        at = np.asarray(c["a"][rows], np.int64)
        attrs = dict(zip(rows.tolist(), zip(stores.parents(at), stores.tokens(at), stores.salts(at),
                                           [None] * len(rows))))
        named = np.flatnonzero(np.isin(kind, (STORED, EVICTED)) & (key >= 0))
        return attrs, dict(zip(named.tolist(), keys.digests(np.asarray(key[named], np.int64))))

    def rows_upto(self, seq: int | None) -> int:
        """How many rows belong to events with seq <= `seq` (all for None)."""
        if seq is None:
            return self.num_rows
        per_event = self._per_event.get("seq")
        if per_event is not None:  # the first row of the first event after `seq`
            return int(self.event_bounds[np.searchsorted(per_event, as_key(seq, per_event), side="right")])
        seqs = self.seq_runs()
        return int(np.searchsorted(seqs, as_key(seq, seqs), side="right"))

    def seq_runs(self, n: int | None = None) -> np.ndarray | ArithmeticRuns | Consecutive:
        """The seq column's first `n` rows (all for None) as kept: a journal-fed log's runs
        (`ArithmeticRuns`, or a `Consecutive` for one run counting up; indexed, cut and
        searched as the array without making it whole: a live log's `seqs` are read several
        times a tick), else the array."""
        n = self.num_rows if n is None else n
        kept = self._cols.get("seq")
        if not isinstance(kept, ArithmeticRuns):
            return self.col("seq")[:n]
        runs = kept.view(n)
        if runs.num_runs == 1 and (n == 1 or runs.step[0] == 1):
            # a row an event, numbered without a gap (a journal's, until a clear): what the
            # timeline's series and a finished log's readers take as it is, never made whole
            return Consecutive(int(runs.first[0]), n, runs.dtype)
        return runs

    # ------------------------------------------------------------------ projection
    def initial_state(self) -> PoolArrays:
        n = self.initial_blocks
        return PoolArrays(-1, 0, np.zeros(n, np.int32), np.full(n, -1, np.int32), np.arange(n, dtype=np.int64),
                          Counters())

    def build_checkpoints(self, every: int | None = None) -> None:
        """A snapshot about every `every` rows (default: at most 64 snapshots, no more than
        CHECKPOINT_BYTES of them in all, and none closer than CHECKPOINT_MIN_ROWS), so `state_at`
        applies at most one interval. A snapshot is 16 bytes a block unpacked: 64 of a
        9.3M-block pool were 9.5 GB, so a large pool gets fewer, farther apart; each is kept
        packed (`PackedPool`). Each falls on the first row of an event: a pass from a row
        inside one numbers a free to the queue's head among that event's rows in the pass
        only, and put a multi-block free's blocks in the wrong order."""
        per_snapshot = 16 * max(1, self.num_blocks)
        most = max(1, min(64, CHECKPOINT_BYTES // per_snapshot))
        every = every or self.checkpoint_rows or max(CHECKPOINT_MIN_ROWS, self.num_rows // most + 1)
        self._request_spans()
        self.checkpoint_rows = every
        state = self.initial_state()
        self._cp_rows = [0]
        self._cp_states = [PackedPool(state)]
        pos = 0
        for target in range(every, self.num_rows + 1, every):
            row = self._event_start(target)
            if row <= pos:  # an event longer than `every` rows
                continue
            state = self._advance(state, pos, row)
            pos = row
            self._cp_rows.append(pos)
            self._cp_states.append(PackedPool(state))
            self._head_marks[pos] = self._head_count(pos)

    def _event_start(self, row: int) -> int:
        """The first row of the event that row `row` belongs to (num_rows for num_rows)."""
        if row >= self.num_rows:
            return self.num_rows
        bounds = self.event_bounds
        if bounds is not None:
            return int(bounds[np.searchsorted(bounds, as_key(row, bounds), side="right") - 1])
        seq = self.seq_runs()
        return int(np.searchsorted(seq, seq[row], side="left"))

    def _event_end(self, row: int) -> int:
        """The first row after the event that row `row` belongs to (num_rows for num_rows)."""
        if row >= self.num_rows:
            return self.num_rows
        bounds = self.event_bounds
        if bounds is not None:
            return int(bounds[np.searchsorted(bounds, as_key(row, bounds), side="right")])
        seq = self.seq_runs()
        return int(np.searchsorted(seq, seq[row], side="right"))

    def state_at(self, seq: int | None) -> PoolArrays:
        """The pool after every event with seq <= `seq` (after the last event for None)."""
        n = self.rows_upto(seq)
        i = bisect.bisect_right(self._cp_rows, n) - 1 if self._cp_rows else -1
        if i < 0:
            state, start = self.initial_state(), 0
        else:
            state, start = self._cp_states[i], self._cp_rows[i]
            if isinstance(state, PackedPool):
                state = state.whole()
        out = self._advance(state, start, n)
        if seq is not None:
            out.seq = seq
        return out

    def _head_count(self, stop: int) -> int:
        """Head prepends of the free queue in rows [0, stop), counted on from the nearest
        row counted before (a checkpoint's, the live state's)."""
        marks = self._head_marks
        got = marks.get(stop)
        if got is not None:
            return got
        last = self._heads_after
        if last is not None and last[0] == stop:  # counted by the compiled pass that moved a state there
            return last[1]
        start = max((r for r in marks if r <= stop), default=0)
        kind, flag, block = (self.values_at(name, slice(start, stop)) for name in ("kind", "flag", "block"))
        return marks.get(start, 0) + int(np.count_nonzero((kind == FREED) & (flag == 0) & (block >= 0)))

    def _grown_to(self, state: PoolArrays, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of `state`'s arrays with the blocks a live pool gained by row `stop`."""
        n = self.blocks_at(stop)
        have = len(state.ref_counts)
        if n <= have:
            return state.ref_counts.copy(), state.hash_keys.copy(), state.free_pos.copy()
        m = n - have
        return (np.concatenate([state.ref_counts, np.zeros(m, np.int32)]),
                np.concatenate([state.hash_keys, np.full(m, -1, np.int32)]),
                np.concatenate([state.free_pos, self._born_free_pos(have, n)]))

    def _born_free_pos(self, have: int, n: int) -> np.ndarray:
        """The free-queue positions of blocks have..n-1 as a live pool gains them: each at the
        queue's tail from the row it was born at."""
        return TAIL_BASE + 2 * self._born_row.span(have, n) - 1

    def _advance(self, state: PoolArrays, start: int, stop: int) -> PoolArrays:
        """`state` (after row `start`) moved on to after row `stop`; vectorised, a new value."""
        ref, hk, pos = self._grown_to(state, stop)
        c = state.counters
        counters = Counters(c.num_requests, c.num_prompt_tokens, c.num_cached_tokens, c.num_stored_blocks,
                            c.num_evicted_blocks, c.num_refused_requests, c.num_finished_requests,
                            c.num_hash_collisions)
        if stop <= start:
            return PoolArrays(state.seq, stop, ref, hk, pos, counters)
        loop = _compiled_advance()
        if loop is not None:  # one pass over the rows, each applied in order (the same values)
            got = np.zeros(8, np.int64)
            heads0 = self._head_count(start)
            loop(self.rows_window("kind", start, stop), self.rows_window("block", start, stop),
                 self.rows_window("a", start, stop),
                 self.rows_window("hash", start, stop),
                 self.rows_window("flag", start, stop), self.rows_window("seq", start, stop),
                 self.rows_window("request", start, stop),
                 self.requests.prompt_sizes(), start, stop,
                 heads0, ref, hk, pos, got)
            self._heads_after = (stop, heads0 + int(got[7]))
            counters.num_requests += int(got[0])
            counters.num_prompt_tokens += int(got[1])
            counters.num_cached_tokens += int(got[2]) * self.block_size
            counters.num_stored_blocks += int(got[3])
            counters.num_evicted_blocks += int(got[4])
            counters.num_refused_requests += int(got[5])
            counters.num_finished_requests += int(got[6])
            return PoolArrays(int(self.values_at("seq", stop - 1)), stop, ref, hk, pos, counters)
        kind = self.values_at("kind", slice(start, stop))
        block = self.values_at("block", slice(start, stop))
        a = self.values_at("a", slice(start, stop))
        seqs = self.values_at("seq", slice(start, stop))
        named = block >= 0  # a live event naming no block has one row with block -1
        # ref counts: the last ref row of each block wins
        m = (kind == REF) & named
        _last_write(ref, block[m], a[m])
        # hashes: stored sets, evicted (or a cache reset) clears; the last of any wins
        m = ((kind == STORED) | (kind == EVICTED) | (kind == RESET)) & named
        _last_write(hk, block[m], np.where(kind[m] == STORED, self.values_at("hash", slice(start, stop))[m], -1))
        # free queue places: a block leaves when a request takes it (ref > 0) and joins
        # at the tail (cached, LRU order) or the head (hashless, reused first) when freed
        heads0 = self._head_count(start)
        flag = self.values_at("flag", slice(start, stop))
        freed = (kind == FREED) & named
        is_tail = (freed | (kind == STORED)) & named & (flag == 1)  # a remote store moves its slot there too
        is_head = freed & ~is_tail
        place = np.full(stop - start, FREE_ABSENT, np.int64)
        place[is_tail] = TAIL_BASE + 2 * (start + np.flatnonzero(is_tail).astype(np.int64))
        if is_head.any():
            hs = seqs[is_head]
            g = heads0 + np.arange(len(hs), dtype=np.int64)  # global index among head rows
            _, first, counts = np.unique(hs, return_index=True, return_counts=True)
            g0 = np.repeat(g[first], counts)
            m_ = np.repeat(counts, counts)
            # prepend_n puts the event's first block at the head: it gets the lowest place
            place[is_head] = -(2 * g0 + m_ - g)
        taken = (kind == REF) & (a > 0) & named
        m = taken | freed | is_tail
        _last_write(pos, block[m], place[m])
        # counters: cumulative, from the rows themselves
        look = kind == LOOKUP
        sizes = self.requests.prompt_sizes()
        counters.num_requests += int(np.count_nonzero(look))
        counters.num_prompt_tokens += int(sizes[self.values_at("request", slice(start, stop))[look]].sum()) \
            if look.any() else 0
        counters.num_cached_tokens += int(a[look].sum()) * self.block_size
        counters.num_stored_blocks += int(np.count_nonzero(kind == STORED))
        counters.num_evicted_blocks += int(np.count_nonzero((kind == EVICTED) & named))
        counters.num_refused_requests += int(np.count_nonzero(kind == REFUSED))
        counters.num_finished_requests += int(np.count_nonzero(kind == FINISHED))
        return PoolArrays(int(seqs[-1]), stop, ref, hk, pos, counters)

    def _request_spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per request: the row that started it, the row that finished it (num_rows when
        none yet); and its allocations grouped by request (group starts): as the allocation
        events of a finished log that keeps a request and a kind per event
        (`_alloc_by_event`: 20,318 events over the Mooncake trace, not its 296,787 rows,
        1.1 MB less), else as the allocation rows naming a block."""
        cached = getattr(self, "_req_index", None)
        if cached is not None and cached[0] == self.num_rows:
            return cached[1]
        kind, req = self.col("kind"), self.col("request")
        n_req = len(self.requests)
        # row numbers, num_rows for none: int32 while they fit (kept for as long as the log)
        wide = np.int32 if self.num_rows <= _I32.max else np.int64
        start = np.full(n_req, self.num_rows, wide)
        at = np.flatnonzero(kind == STARTED)
        start[req[at]] = at
        finish = np.full(n_req, self.num_rows, wide)
        at = np.flatnonzero(kind == FINISHED)
        finish[req[at]] = at
        kinds, event_req = self._per_event.get("kind"), self._per_event.get("request")
        self._alloc_by_event = self.event_bounds is not None and kinds is not None and event_req is not None
        if self._alloc_by_event:
            alloc = np.flatnonzero(kinds == ALLOCATED)
            of = np.asarray(event_req[alloc])
        else:
            alloc = np.flatnonzero((kind == ALLOCATED) & (self.col("block") >= 0))
            of = req[alloc]
        order = np.argsort(of, kind="stable")
        alloc, of = alloc[order], of[order]
        alloc = alloc.astype(wide)  # row or event numbers
        bounds = np.searchsorted(of, np.arange(n_req + 1)).astype(wide)
        value = (start, finish, alloc, bounds)
        self._req_index = (self.num_rows, value)
        return value

    def _request_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`_request_spans` with the allocations as rows naming a block (row numbers, group
        starts), made from the events when the log keeps those."""
        start, finish, alloc, bounds = self._request_spans()
        if not self._alloc_by_event:
            return start, finish, alloc, bounds
        heads = self.event_bounds
        lo, hi = heads[alloc].astype(np.int64), heads[alloc.astype(np.int64) + 1].astype(np.int64)
        size = hi - lo
        rows = np.repeat(lo - np.cumsum(size) + size, size) + np.arange(int(size.sum()))
        group = np.repeat(np.repeat(np.arange(len(bounds) - 1), np.diff(bounds)), size)
        named = self.kept("block")[rows] >= 0
        rows, group = rows[named], group[named]
        rows = rows.astype(np.int32) if self.num_rows <= _I32.max else rows
        return start, finish, rows, np.searchsorted(group, np.arange(len(bounds)))

    def block_tables(self, reqs: Sequence[int], n: int) -> list[tuple[int, ...]]:
        """The block table of each of requests `reqs` after the rows before `n`: the blocks
        its allocations named, in row order."""
        _, _, alloc, bounds = self._request_spans()
        block = self.kept("block")
        out = []
        if not self._alloc_by_event:
            for r in reqs:
                rows = alloc[bounds[r]:bounds[r + 1]]
                out.append(tuple(block[rows[rows < n]].tolist()))
            return out
        # the events' first rows and ends read at once (a lookup each is a block's sum)
        groups = [alloc[bounds[r]:bounds[r + 1]] for r in reqs]
        events = np.concatenate(groups).astype(np.int64) if groups else np.zeros(0, np.int64)
        los = self.event_bounds[events].tolist()
        his = self.event_bounds[events + 1].tolist()
        at = 0
        for group in groups:
            table: list[int] = []
            for lo, hi in zip(los[at:at + len(group)], his[at:at + len(group)]):  # in row order
                if lo >= n:
                    break
                part = block[lo:min(hi, n)]
                table += part[part >= 0].tolist()
            at += len(group)
            out.append(tuple(table))
        return out

    def running_at(self, seq: int | None) -> dict[str, tuple[int, ...]]:
        """Request id -> block table of the requests running after `seq`."""
        n = self.rows_upto(seq)
        start, finish, _, _ = self._request_spans()
        live = np.flatnonzero((start < n) & (finish >= n)).tolist()
        ids = self.requests.ids
        return {ids[r]: table for r, table in zip(live, self.block_tables(live, n))}


def bits_at(bits: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Bits `at` of a bit array kept 8 a byte (bit i: bit i & 7 of byte i >> 3, as
    np.packbits' little bit order writes them), each as a uint8 0 or 1."""
    return (bits[at >> 3] >> (at & 7).astype(np.uint8)) & 1


def set_bits(bits: np.ndarray, at: np.ndarray) -> None:
    """Bits `at` of such a bit array set (`bits_at`), in place; `at` may repeat."""
    np.bitwise_or.at(bits, at >> 3, np.left_shift(1, at & 7).astype(np.uint8))


def fits(values: np.ndarray, dtype: Any, margin: int = 0) -> bool:
    """True if every value of `values` fits the integer type `dtype` with `margin` to spare
    at both ends (`values`' own type tells, without a pass over them, when it is narrower)."""
    if not len(values) or not margin and np.can_cast(values.dtype, dtype, "safe"):
        return True
    info = np.iinfo(dtype)
    return info.min + margin <= int(values.min()) and int(values.max()) <= info.max - margin


def as_key(value: int, values: np.ndarray) -> Any:
    """`value` as a scalar of `values`' integer type, clipped to its range, for
    `np.searchsorted(values, ...)`: a Python int beside an int32 array makes numpy convert
    the whole array to int64 first (3.6 ms over a 4.8M-row seq column, on every scrub).
    Clipping keeps the answer for sorted values inside the type's range."""
    info = np.iinfo(values.dtype)
    return values.dtype.type(min(max(int(value), info.min), info.max))


def _widened(name: str, values: np.ndarray) -> np.ndarray:
    """Values of column `name` in the type it is read in (a `NARROW_COLUMNS` one widened)."""
    narrow = NARROW_COLUMNS.get(name)
    return values.astype(narrow[1]) if narrow is not None and values.dtype == narrow[0] else values


def _used_nbytes(kept: Any, num_rows: int) -> int:
    """The bytes a kept column's `num_rows` rows take (an array's part, a run column's runs)."""
    return kept.nbytes if isinstance(kept, ArithmeticRuns) else kept[:num_rows].nbytes


def _fits32(values: np.ndarray) -> bool:
    """True if every value of `values` fits int32 (a column in `WIDENING` stays int32)."""
    return fits(values, np.int32)


def _owned(col: np.ndarray, dtype: Any) -> np.ndarray:
    """`col` as a contiguous array of `dtype` holding only its own rows: a slice of a
    larger buffer (the kernel grows its columns by doubling) is copied, so the log does
    not keep the unused part alive."""
    arr = np.ascontiguousarray(col, dtype)
    base = arr.base
    if base is not None and getattr(base, "nbytes", 0) > arr.nbytes:
        arr = arr.copy()
    return arr


class _AsArray:
    """What `_EventRuns`, `Consecutive`, `_Runs`, `EventRows`, `EventBounds` and its views share:
    indexed as the array of `n` values they stand for (`len` is `n`). A slice of step 1 is
    `_span(start, stop)` (start < stop), one index `_at(i)` (0 <= i < n, a negative one counted
    from the end, one out of range an IndexError as numpy's), anything else (index arrays,
    masks, other steps) `_take`, by default on the whole array."""

    __slots__ = ()
    _unit = "event"  # what an index counts, for the IndexError

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.n)
            if step != 1:
                return np.asarray(self)[index]
            return self._span(start, stop) if start < stop else np.zeros(0, self.dtype)
        if np.ndim(index) == 0:
            i = int(index)
            if not -self.n <= i < self.n:
                raise IndexError(f"{self._unit} {i} is not among {self.n}")
            return self._at(i % self.n)
        return self._take(np.asarray(index))

    def _take(self, index: np.ndarray) -> np.ndarray:
        return np.asarray(self)[index]


class _AtValues(_AsArray):
    """An `_AsArray` kept as the events `at` which it holds its own `values` (`_EventRuns`:
    where each run starts; `_EventSparse`: where it is not its fill): their type and bytes."""

    __slots__ = ()

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nbytes(self) -> int:
        return self.at.nbytes + self.values.nbytes


class _EventRuns(_AtValues):
    """A per-event column kept as runs of equal values (the event where each run starts, and
    its value) where that is under half its bytes: a trace's events come request by request,
    so the Mooncake trace's 481,145 request numbers are 12,031 runs (1.9 MB -> 96 KB).
    Indexed as the array it stands for (a slice of step 1, an event, event numbers);
    `np.asarray` makes it whole."""

    __slots__ = ("at", "values", "n")

    def __init__(self, at: np.ndarray, values: np.ndarray, n: int) -> None:
        self.at, self.values, self.n = at, values, n

    @staticmethod
    def of(values: np.ndarray) -> np.ndarray | _EventRuns:
        """`values` as runs if they take less than half the bytes so, else as they are."""
        if len(values) < 2:
            return values
        at = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
        at = at.astype(np.int32) if len(values) <= _I32.max else at
        if 2 * len(at) * (at.itemsize + values.itemsize) >= values.nbytes:
            return values
        return _EventRuns(at, values[at], len(values))

    def fresh(self) -> _EventRuns:
        return _EventRuns(_fresh(self.at), _fresh(self.values), self.n)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.repeat(self.values, np.diff(np.append(self.at, self.n)))
        return whole if dtype is None else whole.astype(dtype)

    def _span(self, start: int, stop: int) -> np.ndarray:
        at = self.at
        first = int(np.searchsorted(at, as_key(start, at), side="right")) - 1
        last = int(np.searchsorted(at, as_key(stop - 1, at), side="right"))
        bounds = np.clip(at[first:last], start, stop) - start
        return np.repeat(self.values[first:last], np.diff(np.append(bounds, stop - start)))

    def _at(self, i: int) -> Any:
        return self.values[int(np.searchsorted(self.at, as_key(i, self.at), side="right")) - 1]

    def _take(self, index: np.ndarray) -> np.ndarray:
        return self.values[np.searchsorted(self.at, index, side="right") - 1]


class _EventSparse(_AtValues):
    """A per-event column that holds its fill at most events, kept as the events where it
    does not and their values (`PER_EVENT_WHEN_ALIKE`). Indexed as the array it stands for
    (a slice of step 1, an event, event numbers, a mask); `np.asarray` makes it whole."""

    __slots__ = ("at", "values", "n", "fill")

    def __init__(self, at: np.ndarray, values: np.ndarray, n: int, fill: int) -> None:
        self.at, self.values, self.n, self.fill = at, values, n, fill

    @staticmethod
    def of(values: np.ndarray, fill: int) -> _EventSparse:
        at = np.flatnonzero(values != fill)
        at = at.astype(np.int32) if len(values) <= _I32.max else at
        return _EventSparse(at, values[at], len(values), fill)

    def fresh(self) -> _EventSparse:
        return _EventSparse(_fresh(self.at), _fresh(self.values), self.n, self.fill)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.full(self.n, self.fill, self.values.dtype)
        whole[self.at] = self.values
        return whole if dtype is None else whole.astype(dtype)

    def _span(self, start: int, stop: int) -> np.ndarray:
        out = np.full(stop - start, self.fill, self.values.dtype)
        lo, hi = np.searchsorted(self.at, (as_key(start, self.at), as_key(stop, self.at)))
        out[self.at[lo:hi] - start] = self.values[lo:hi]
        return out

    def _at(self, i: int) -> Any:
        j = int(np.searchsorted(self.at, as_key(i, self.at)))
        return self.values[j] if j < len(self.at) and self.at[j] == i else self.values.dtype.type(self.fill)

    def _take(self, index: np.ndarray) -> np.ndarray:
        if index.dtype == bool or not len(self.at):
            return np.asarray(self)[index]
        index = np.where(index < 0, index + self.n, index)
        j = np.minimum(np.searchsorted(self.at, index), len(self.at) - 1)
        return np.where(self.at[j] == index, self.values[j], self.fill).astype(self.values.dtype)


class Consecutive(_AsArray):
    """A per-event column whose values count up by one from the first (a replayed trace's
    seqs, 0, 1, 2, ...: 1.9 MB over the Mooncake trace's 481,145 events), kept as its first
    value and length. Read as the array it stands for: indexed (an event, a slice, event
    numbers, a mask), searched (`np.searchsorted` calls `searchsorted`), iterated;
    `np.asarray` makes it whole."""

    __slots__ = ("first", "n", "dtype")

    def __init__(self, first: int, n: int, dtype: Any) -> None:
        self.first, self.n, self.dtype = first, n, np.dtype(dtype)

    @staticmethod
    def of(values: np.ndarray) -> np.ndarray | Consecutive:
        """`values` as a `Consecutive` when each is one more than the one before, else as they are."""
        n = len(values)
        if n < 2 or int(values[-1]) - int(values[0]) != n - 1 or not np.all(np.diff(values) == 1):
            return values
        return Consecutive(int(values[0]), n, values.dtype)

    ndim = 1
    nbytes = 0  # no array kept

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.arange(self.first, self.first + self.n, dtype=self.dtype if dtype is None else dtype)

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        return self.__array__(dtype)

    def copy(self) -> Consecutive:
        return self  # nothing to copy: it never changes

    def tolist(self) -> list[int]:
        return list(range(self.first, self.first + self.n))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.__array__())

    def min(self) -> Any:
        return self[0]

    def max(self) -> Any:
        return self[-1]

    def _span(self, start: int, stop: int) -> np.ndarray:
        return np.arange(self.first + start, self.first + stop, dtype=self.dtype)

    def _at(self, i: int) -> Any:
        return self.dtype.type(self.first + i)

    def _take(self, index: np.ndarray) -> np.ndarray:
        if index.dtype == bool:
            if index.shape != (self.n,):
                raise IndexError(f"a mask of {index.shape} over {self.n} events")
            return (np.flatnonzero(index) + self.first).astype(self.dtype)
        at = index.astype(np.int64)
        if len(at) and (int(at.min()) < -self.n or int(at.max()) >= self.n):
            raise IndexError(f"event numbers out of {self.n} events")
        return (np.where(at < 0, at + self.n, at) + self.first).astype(self.dtype)

    def searchsorted(self, v: Any, side: str = "left", sorter: Any = None) -> Any:
        """Where `v` would go in the values (as `np.searchsorted` on the array)."""
        v = np.asarray(v)
        off = v.astype(np.int64) - self.first if v.dtype.kind in "iub" else v - self.first
        got = np.ceil(off) if side == "left" else np.floor(off) + 1
        out = np.clip(got, 0, self.n).astype(np.intp)
        return out if out.ndim else np.intp(out)


class _Runs(_AsArray):
    """What `CountingRuns` and `ArithmeticRuns` share: an integer array kept as runs in which
    each value is the one before plus the run's step, as each run's first place (`at`), first
    value (`first`) and step (`_steps`). Read as the array it stands for: a slice (each run's
    part repeated, not a search a place), a place, places, a mask; `np.asarray` makes it whole."""

    __slots__ = ()
    ndim = 1

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        return np.asarray(self).astype(dtype)

    def _steps(self, runs: Any) -> Any:
        """The step of runs `runs` (an index): 1 for `CountingRuns`."""
        return 1

    def _values(self, places: np.ndarray) -> np.ndarray:
        run = np.searchsorted(self.at, places, side="right") - 1
        return (self.first[run].astype(np.int64) + self._steps(run) * (places - self.at[run])).astype(self.dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self._span(0, self.n) if self.n else np.zeros(0, self.dtype)
        return whole if dtype is None else whole.astype(dtype)

    def _span(self, start: int, stop: int) -> np.ndarray:
        at = self.at
        key = at.dtype.type  # places up to n fit the places' type (int64 once n passes int32)
        lo = int(np.searchsorted(at, key(start), side="right")) - 1
        hi = int(np.searchsorted(at, key(stop - 1), side="right"))
        if hi - lo == 1:  # within one run (a journal tick's seqs): no repeat of the runs
            step = int(self._steps(lo))
            value = int(self.first[lo]) + step * (start - int(at[lo]))
            return (np.arange(value, value + stop - start, dtype=self.dtype) if step
                    else np.full(stop - start, value, self.dtype))
        starts = at[lo:hi].astype(np.int64)
        cut = starts.copy()
        cut[0] = start  # the first run's part from `start` on
        lengths = np.diff(cut, append=stop)
        step = self._steps(slice(lo, hi))
        counting = isinstance(step, int)  # `CountingRuns`: a step of 1 each
        if not counting and not step.any():  # runs of equal values only
            return np.repeat(self.first[lo:hi], lengths).astype(self.dtype, copy=False)
        out = np.repeat(self.first[lo:hi].astype(np.int64) - step * starts, lengths)
        places = np.arange(start, stop, dtype=np.int64)
        out += places if counting or step.all() else np.repeat(step, lengths) * places
        return out.astype(self.dtype, copy=False)

    def _take(self, index: np.ndarray) -> np.ndarray:
        if index.dtype == bool:
            return np.asarray(self)[index]
        places = np.asarray(index, np.int64)
        places = np.where(places < 0, places + self.n, places)
        if places.size and (places.min() < 0 or places.max() >= self.n):
            raise IndexError(f"a place is not among {self.n}")
        return self._values(places)


class CountingRuns(_Runs):
    """An integer array that mostly counts up by one from each value to the next, kept as the
    runs it does so in: each run's first place and first value (`KeyTable.parent` and
    `item`: 94% of the Mooncake trace's 170,899 chain ids are the next block of the chain
    before, 0.68 MB each as int32, 77 KB so). Read as the array it stands for: a slice, a
    place, places, a mask; `np.asarray` makes it whole."""

    __slots__ = ("at", "first", "n", "dtype", "_run")

    def __init__(self, at: np.ndarray, first: np.ndarray, n: int, dtype: Any) -> None:
        self.at, self.first, self.n, self.dtype = at, first, n, np.dtype(dtype)
        # the run the last single place fell in (its start, its end, its first value): a
        # chain walked to its root (a digest, a request's chain) steps down one place at a
        # time within one run, read without a search
        self._run = (0, 0, 0)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            i = int(index)
            lo, hi, value = self._run
            if lo <= i < hi:
                return self.dtype.type(value + i - lo)
        return super().__getitem__(index)

    @staticmethod
    def of(values: np.ndarray) -> np.ndarray | CountingRuns:
        """`values` so when that takes under half their bytes, else as they are."""
        n = len(values)
        if n < 2 or values.dtype.kind not in "iu" or n > _I32.max:
            return values
        at = np.flatnonzero(np.concatenate(([True], np.diff(values.astype(np.int64)) != 1))).astype(np.int32)
        first = values[at]
        if 2 * (at.nbytes + first.nbytes) >= values.nbytes:
            return values
        return CountingRuns(at, first, n, values.dtype)

    def fresh(self) -> CountingRuns:
        return CountingRuns(_fresh(self.at), _fresh(self.first), self.n, self.dtype)

    def copy(self) -> CountingRuns:
        return self.fresh()

    @property
    def nbytes(self) -> int:
        return self.at.nbytes + self.first.nbytes

    def _at(self, i: int) -> Any:
        run = int(np.searchsorted(self.at, np.int32(i), side="right")) - 1  # i < n fits int32
        lo, value = int(self.at[run]), int(self.first[run])
        self._run = (lo, int(self.at[run + 1]) if run + 1 < len(self.at) else self.n, value)
        return self.dtype.type(value + i - lo)


class ArithmeticRuns(_Runs):
    """A log column written a batch at a time (`ColumnarLog._write_table`, `RUN_COLUMNS`) kept
    as runs in which each value is the one before (step 0) or one more (step 1): each run's
    first row, first value and step, 9 bytes a run (int32 values), not 4 a row. A journal's
    rows (engine.core.live_journal) give one request and one `RemoteInfo` (`b`) to a vLLM
    batch's rows, store ordinals (`a`) and new chain ids (`hash`) that count up by one: a
    run or two a batch. `extend` appends a batch's values, continuing the last run where
    they do; `paying` says when the runs stopped being the smaller (the log keeps the
    column whole from then on). Only the `num_runs` first entries of the arrays are runs,
    the rest room for the next; a run of one row so far has step 0 until its second comes."""

    __slots__ = ("_run_at", "_run_first", "_run_step", "num_runs", "n", "dtype", "_last", "_diff")

    def __init__(self, dtype: Any, at: np.ndarray | None = None, first: np.ndarray | None = None,
                 step: np.ndarray | None = None, n: int = 0, last: int = 0, diff: int = _NO_STEP) -> None:
        self.dtype = np.dtype(dtype)
        self._run_at = at if at is not None else np.zeros(0, np.int32)
        self._run_first = first if first is not None else np.zeros(0, self.dtype)
        self._run_step = step if step is not None else np.zeros(0, np.uint8)
        self.num_runs = len(self._run_at) if at is not None else 0
        self.n = n
        # the last value and the difference into it (`_NO_STEP` for a first row): where the
        # next batch's first value continues the last run or starts one
        self._last, self._diff = last, diff

    @property
    def at(self) -> np.ndarray:
        return self._run_at[:self.num_runs]

    @property
    def first(self) -> np.ndarray:
        return self._run_first[:self.num_runs]

    @property
    def step(self) -> np.ndarray:
        return self._run_step[:self.num_runs]

    @property
    def last(self) -> int:
        """The value of its last row (0 while it has none)."""
        return self._last

    @property
    def nbytes(self) -> int:
        return self.num_runs * (self._run_at.itemsize + self._run_first.itemsize + self._run_step.itemsize)

    @property
    def paying(self) -> bool:
        """False once there is more than one run per RUN_MOST_ROWS rows (from RUN_MIN_ROWS rows
        on): 9 bytes a run (int32 values) are then over half the 4 a row whole, and a column
        whose values stopped running (a busy pool's evictions each name an old hash) is
        kept whole before its runs cost more than it would."""
        return self.n < RUN_MIN_ROWS or RUN_MOST_ROWS * self.num_runs <= self.n

    def _steps(self, runs: Any) -> np.ndarray:
        return self._run_step[:self.num_runs][runs]

    def head(self, n: int) -> ArithmeticRuns:
        """Its first `n` rows, the arrays shared (itself for all of them): what a frozen copy
        of the log reads while batches are appended here. A later batch writes past the
        runs it holds, or the step of a run of one row, which reads the same either way."""
        if n >= self.n:
            if n > self.n:
                raise ValueError(f"{n} rows asked of a column of {self.n}")
            return self
        k = int(np.searchsorted(self.at, as_key(n - 1, self.at), side="right")) if n else 0
        out = ArithmeticRuns(self.dtype, self._run_at[:k], self._run_first[:k], self._run_step[:k], n)
        out._last = int(out._at_row(n - 1)) if n else 0
        out._diff = int(out._last - out._at_row(n - 2)) if n > 1 else _NO_STEP
        return out

    def view(self, n: int) -> ArithmeticRuns:
        """`head(n)`, but never itself: a reader holding it reads `n` rows while batches are
        appended here (the arrays shared, cut to the runs written)."""
        if n != self.n:
            return self.head(n)
        k = self.num_runs
        return ArithmeticRuns(self.dtype, self._run_at[:k], self._run_first[:k], self._run_step[:k], n,
                              self._last, self._diff)

    def searchsorted(self, v: Any, side: str = "left", sorter: Any = None) -> Any:
        """Where `v` would go in the values (as `np.searchsorted` on the array) for values that
        never go down (a log's seqs), from the runs: every run before the last one to start
        below `v` (at or below, side right) lies below it, no run after it does."""
        if sorter is not None:
            raise ValueError("runs are searched as they are sorted, without a sorter")
        v = np.asarray(v)
        k = self.num_runs
        if not k:
            out = np.zeros(v.shape, np.intp)
            return out if out.ndim else np.intp(0)
        first = self._run_first[:k]
        if v.dtype.kind in "iub":  # in the runs' type (as `as_key`: the runs not converted)
            info = np.iinfo(first.dtype)
            key = np.clip(v.astype(np.int64), info.min, info.max).astype(first.dtype)
        else:
            key = v
        run = np.searchsorted(first, key, side=side) - 1
        r = np.maximum(run, 0)
        start = self._run_at[r].astype(np.int64)
        end = np.where(r + 1 < k, self._run_at[np.minimum(r + 1, k - 1)].astype(np.int64), self.n)
        if v.dtype.kind in "iub":
            off = v.astype(np.int64) - self._run_first[r].astype(np.int64) + (side == "right")
        else:
            off = v - self._run_first[r]
            off = np.ceil(off) if side == "left" else np.floor(off) + 1
        length = end - start
        inside = np.where(self._run_step[r] == 0, length, np.clip(off, 0, length))
        out = np.where(run < 0, 0, start + inside).astype(np.intp)
        return out if out.ndim else np.intp(out)

    def _at_row(self, i: int) -> int:
        at = self.at
        run = int(np.searchsorted(at, at.dtype.type(i), side="right")) - 1  # i < n fits
        return int(self._run_first[run]) + int(self._run_step[run]) * (i - int(self._run_at[run]))

    def _at(self, i: int) -> Any:
        return self.dtype.type(self._at_row(i))

    def fresh(self) -> ArithmeticRuns:
        """A copy with no room past its runs."""
        return ArithmeticRuns(self.dtype, _fresh(self.at), _fresh(self.first), _fresh(self.step), self.n,
                              self._last, self._diff)

    def copy(self) -> ArithmeticRuns:
        return self.fresh()

    def widen(self) -> None:
        """Values int64 from now on (a `WIDENING` column whose next value would not fit int32)."""
        self._run_first = self._run_first.astype(np.int64)
        self.dtype = np.dtype(np.int64)

    def extend(self, values: np.ndarray) -> None:
        """Append `values` (one per row, in row order), each run as long as it can be: a run
        goes on while the difference into its rows is its step (0 or 1: the difference into
        its second row). One compiled pass (`_runs_extend_loop`: 50 times faster than the
        numpy passes on a batch of 100 rows, 6 on 1,500), else `_extend_vectorised`, the
        same runs."""
        m = len(values)
        if not m:
            return
        v = np.ascontiguousarray(values, np.int64)
        loop = _compiled_runs_extend()
        if loop is None:
            self._extend_vectorised(v)
            return
        if self.n + m > _I32.max and self._run_at.dtype == np.int32:
            self._room(self.num_runs, self.n + m)
        while True:  # out of room: grown by half again, the batch passed again
            k = loop(v, self.n, self._last, self._run_at, self._run_first, self._run_step, self.num_runs)
            if k >= 0:
                break
            self._room(len(self._run_at) + 1, self.n + m)
        self._diff = int(v[-1] - v[-2]) if m > 1 else int(v[0]) - self._last if self.n else _NO_STEP
        self.num_runs = k
        self.n += m
        self._last = int(v[-1])

    def _extend_vectorised(self, v: np.ndarray) -> None:
        """`extend` in numpy passes over the batch: a row starts a run where the difference
        into it is neither 0 nor 1, or (a candidate) differs from the one into the row before,
        which was 0 or 1, and that row did not start a run. Candidates in a row alternate from
        the first (a row before a chain of them is not one, nor did it start a run, but at the
        batch's first row: the last row written may have)."""
        m = len(v)
        d = np.empty(m, np.int64)  # the difference into each row
        np.subtract(v[1:], v[:-1], out=d[1:])
        d[0] = v[0] - self._last if self.n else _NO_STEP
        before = np.empty(m, np.int64)  # the difference into the row before
        before[1:] = d[:-1]
        before[0] = self._diff
        stepped = d.view(np.uint64) < 2  # 0 or 1: the row may go on with a run
        candidate = stepped & (before.view(np.uint64) < 2) & (d != before)
        first = candidate.copy()  # the first candidate of each chain of them
        first[1:] &= ~candidate[:-1]
        rows = np.arange(m)
        chain_start = np.maximum.accumulate(np.where(first, rows, 0))
        after_start = bool(candidate[0]) and self.num_runs > 0 and int(self._run_at[self.num_runs - 1]) == self.n - 1
        starts = ((rows - chain_start) & 1) == (chain_start == 0) * after_start  # even places of a chain, or odd
        new = ~stepped | (candidate & starts)
        s = np.flatnonzero(new)
        k0 = self.num_runs
        k = k0 + len(s)
        if k > len(self._run_at) or (self.n + m > _I32.max and self._run_at.dtype == np.int32):
            self._room(k, self.n + m)
        self._run_at[k0:k] = self.n + s
        self._run_first[k0:k] = v[s]
        nxt = s + 1
        second = np.zeros(len(s), bool)  # the run's second row is in this batch
        inside = nxt < m
        second[inside] = ~new[nxt[inside]]
        self._run_step[k0:k] = np.where(second, d[np.minimum(nxt, m - 1)], 0)
        if k0 and not new[0] and self.n - int(self._run_at[k0 - 1]) == 1:  # the last run's second row
            self._run_step[k0 - 1] = d[0]
        self.num_runs = k
        self.n += m
        self._last, self._diff = int(v[-1]), int(d[-1])

    def _room(self, k: int, rows: int) -> None:
        """Room for `k` runs (grown by half again), the rows int64 once `rows` passes int32."""
        if rows > _I32.max and self._run_at.dtype == np.int32:
            self._run_at = self._run_at.astype(np.int64)
        have = len(self._run_at)
        if k > have:
            cap = max(k, have + have // 2, 64)
            for name in ("_run_at", "_run_first", "_run_step"):
                regrow(self, name, cap, self.num_runs)


class FirstSeen(_AsArray):
    """A sparse column's values (`COUNTED_VALUES`) where each value larger than all before it
    is one more than the largest, as the kernel numbers chain ids as it first meets them: each
    such value is a bit (set) and the count of set bits before it, the others are kept
    (`others`, in order). The
    Mooncake trace's 380,354 hashes of stores and evictions name 170,899 ids first: 1.52 MB
    as int32, 0.91 MB so. Read as the values it stands for: a slice, a position, positions;
    `np.asarray` makes it whole."""

    __slots__ = ("words", "before", "others", "first", "n", "dtype")

    def __init__(self, words: np.ndarray, before: np.ndarray, others: np.ndarray, first: int, n: int,
                 dtype: Any) -> None:
        # words: the bits, 64 a word (position i at bit i % 64 of word i // 64), one word to
        # spare; before: the set bits before each word; first: the value of the first one
        self.words, self.before, self.others, self.first, self.n = words, before, others, first, n
        self.dtype = np.dtype(dtype)

    @staticmethod
    def of(values: np.ndarray) -> np.ndarray | FirstSeen:
        """`values` so when that takes fewer bytes, else as they are."""
        n = len(values)
        if n < 2 or values.dtype.kind not in "iu" or n > _I32.max:
            return values
        v = values.astype(np.int64)
        seen = np.empty(n, np.int64)  # the largest value before each position (the first's less one)
        seen[0] = v[0] - 1
        np.maximum.accumulate(v[:-1], out=seen[1:])
        new = v > seen  # a new largest value: each must be one more than the last, else as they are
        if not np.array_equal(v[new], seen[new] + 1):
            return values
        bits = np.packbits(np.concatenate([new, np.zeros(64 - n % 64 + 64, bool)]), bitorder="little")
        words = bits.view("<u8").astype(np.uint64)
        before = np.zeros(len(words), np.int64)
        np.cumsum(np.bitwise_count(words[:-1]), out=before[1:])
        got = FirstSeen(words, before.astype(np.int32), values[~new], int(v[0]), n, values.dtype)
        return got if got.nbytes < values.nbytes else values

    def fresh(self) -> FirstSeen:
        return FirstSeen(_fresh(self.words), _fresh(self.before), _fresh(self.others), self.first, self.n,
                         self.dtype)

    def copy(self) -> FirstSeen:
        return self.fresh()

    @property
    def nbytes(self) -> int:
        return self.words.nbytes + self.before.nbytes + self.others.nbytes

    def _rank(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each position's bit, and the set bits before it."""
        w = at >> 6
        bit = np.uint64(1) << (at & 63).astype(np.uint64)
        word = self.words[w]
        return (word & bit) != 0, self.before[w].astype(np.int64) + np.bitwise_count(word & (bit - np.uint64(1)))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self._span(0, self.n) if self.n else np.zeros(0, self.dtype)
        return whole if dtype is None else whole.astype(dtype)

    def _span(self, start: int, stop: int) -> np.ndarray:
        w0 = start >> 6
        new = np.unpackbits(self.words[w0:(stop + 63) >> 6].view(np.uint8),
                            bitorder="little")[start - (w0 << 6):stop - (w0 << 6)].view(bool)
        _, r0 = self._rank(np.array([start], np.int64))
        r0 = int(r0[0])
        out = np.empty(stop - start, self.dtype)
        num_new = int(np.count_nonzero(new))
        out[new] = np.arange(self.first + r0, self.first + r0 + num_new)
        k = start - r0  # the others' place of the first position that is not new
        out[~new] = self.others[k:k + (stop - start - num_new)]
        return out

    def _at(self, i: int) -> Any:
        new, rank = self._rank(np.array([i], np.int64))
        r = int(rank[0])
        return self.dtype.type(self.first + r) if new[0] else self.others[i - r]

    def _take(self, index: np.ndarray) -> np.ndarray:
        if index.dtype == bool:
            return np.asarray(self)[index]
        at = np.asarray(index, np.int64)
        at = np.where(at < 0, at + self.n, at)
        if len(at) and (at.min() < 0 or at.max() >= self.n):
            raise IndexError(f"a position is not among {self.n}")
        new, rank = self._rank(at)
        out = np.empty(at.shape, self.dtype)
        out[new] = self.first + rank[new]
        out[~new] = self.others[(at - rank)[~new]]
        return out


class EventRows(_AsArray):
    """The rows of a sparse column kept as the events they begin (`ColumnarLog.event_bounds`):
    a bit an event and a count of the set bits before every 64 (~0.3 bytes an event) instead
    of a row number each. The Mooncake trace's hashes are set on its stores' and evictions'
    rows, each the one row of its event: 380,354 rows, 1.5 MB as int32, 76 KB so. Read as the
    sorted row numbers it stands for: a slice, an ordinal, ordinals; `np.searchsorted` calls
    `searchsorted`; `np.asarray` makes it whole."""

    __slots__ = ("bounds", "words", "before", "n")

    def __init__(self, bounds: np.ndarray, words: np.ndarray, before: np.ndarray, n: int) -> None:
        # bounds: each event's first row, then num_rows (shared with the log); words: the
        # events' bits, 64 a word (event e at bit e % 64 of word e // 64), one word to spare;
        # before: the set bits before each word
        self.bounds, self.words, self.before, self.n = bounds, words, before, n

    @staticmethod
    def of(rows: np.ndarray, bounds: np.ndarray, events: np.ndarray) -> np.ndarray | EventRows:
        """`rows` as the events (a bool per event) whose first rows they are, when they are."""
        if not np.array_equal(bounds[:-1][events], rows):
            return rows
        bits = np.packbits(np.concatenate([events, np.zeros(64 - len(events) % 64 + 64, bool)]), bitorder="little")
        words = bits.view("<u8").astype(np.uint64)
        before = np.zeros(len(words), np.int64)
        np.cumsum(np.bitwise_count(words[:-1]), out=before[1:])
        got = EventRows(bounds, words, before.astype(rows.dtype), len(rows))
        return got if got.nbytes < rows.nbytes else rows

    def fresh(self, bounds: np.ndarray) -> EventRows:
        return EventRows(bounds, _fresh(self.words), _fresh(self.before), self.n)

    def copy(self) -> EventRows:
        return self.fresh(self.bounds)

    @property
    def dtype(self) -> np.dtype:
        return self.bounds.dtype

    @property
    def nbytes(self) -> int:
        return self.words.nbytes + self.before.nbytes

    def events(self) -> np.ndarray:
        """A bool per event: whether its first row is one of the rows."""
        return np.unpackbits(self.words.view(np.uint8), bitorder="little")[:len(self.bounds) - 1].view(bool)

    def _events_in(self, first: int, stop: int) -> np.ndarray:
        """The set events among events [first, stop)."""
        if stop <= first:
            return np.zeros(0, np.int64)
        w0, w1 = first >> 6, (stop + 63) >> 6
        bits = np.unpackbits(self.words[w0:w1].view(np.uint8), bitorder="little")
        got = np.flatnonzero(bits[first - (w0 << 6):stop - (w0 << 6)])
        return got + first

    def _event_of(self, k: int) -> int:
        """The event of the k-th set bit."""
        w = int(np.searchsorted(self.before, as_key(k, self.before), side="right")) - 1
        return int(self._events_in(w << 6, (w + 1) << 6)[k - int(self.before[w])])

    def _rank(self, events: np.ndarray) -> np.ndarray:
        """How many set events come before each of `events` (0 to the number of events)."""
        e = np.asarray(events, np.int64)
        w = e >> 6
        below = (np.uint64(1) << (e & 63).astype(np.uint64)) - np.uint64(1)
        return self.before[w].astype(np.int64) + np.bitwise_count(self.words[w] & below)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.bounds[self._events_in(0, len(self.bounds) - 1)]
        return whole if dtype is None else whole.astype(dtype)

    _unit = "row"

    def _span(self, start: int, stop: int) -> np.ndarray:
        return self.bounds[self._events_in(self._event_of(start), self._event_of(stop - 1) + 1)]

    def _at(self, k: int) -> Any:
        return self.bounds[self._event_of(k)]

    def searchsorted(self, v: Any, side: str = "left", sorter: Any = None) -> Any:
        """How many of the rows come before `v` (`side` "left") or up to it ("right")."""
        v = np.asarray(v)
        if isinstance(self.bounds, EventBounds):  # no event starts at the last bound
            events = np.minimum(self.bounds.searchsorted(v, side=side), len(self.bounds) - 1)
            out = self._rank(events).astype(np.intp)
            return out if out.ndim else np.intp(out)
        heads = self.bounds[:-1]
        if v.dtype.kind in "iub":  # in the rows' type (clipped): numpy would widen the whole array
            info = np.iinfo(heads.dtype)
            v = np.clip(v.astype(np.int64), info.min, info.max).astype(heads.dtype)
        events = np.searchsorted(heads, v, side=side)
        out = self._rank(events).astype(np.intp)
        return out if out.ndim else np.intp(out)


_BOUNDS_BLOCK = 256  # events a full offset covers (`EventBounds`)


class EventBounds(_AsArray):
    """Each event's first row, then the row count (`ColumnarLog.event_bounds` of a finished
    log), kept as a byte an event (its row count; 0, an escape, for an event of 256 rows or
    more, whose count a side table keeps) and the full bound of every 256th event: ~1 byte
    an event instead of 4 (the Mooncake trace's 481,145 events: 1,924,584 -> 488,800 B). A bound
    is its block's offset plus the counts before it in the block; indexed and searched as
    the sorted array it stands for (`np.searchsorted` calls `searchsorted`), `np.asarray`
    makes it whole (~1 ms over the Mooncake trace)."""

    __slots__ = ("sizes", "offsets", "big", "big_sizes", "n", "dtype")
    _unit = "bound"

    def __init__(self, sizes: np.ndarray, offsets: np.ndarray, big: np.ndarray, big_sizes: np.ndarray,
                 n: int, dtype: Any) -> None:
        # sizes: uint8 an event, padded with 0 to whole blocks; offsets: the bound of every
        # 256th event; big: the escaped events (sorted), big_sizes: their row counts
        self.sizes, self.offsets, self.big, self.big_sizes = sizes, offsets, big, big_sizes
        self.n, self.dtype = n, np.dtype(dtype)

    @staticmethod
    def of(bounds: np.ndarray) -> EventBounds:
        """`bounds` (sorted, strictly increasing: every event has a row) packed."""
        bounds = np.asarray(bounds)
        n = len(bounds)
        if n < 1:
            raise ValueError("event bounds need at least the row count")
        count = np.diff(bounds.astype(np.int64))
        if len(count) and int(count.min()) < 1:
            raise ValueError("every event needs at least one row")
        escaped = count > 255
        big = np.flatnonzero(escaped)
        wide = np.int32 if n <= _I32.max else np.int64
        sizes = np.zeros(-(-len(count) // _BOUNDS_BLOCK) * _BOUNDS_BLOCK, np.uint8)
        sizes[:len(count)] = np.where(escaped, 0, count)
        dtype = bounds.dtype
        return EventBounds(sizes, bounds[::_BOUNDS_BLOCK].astype(dtype), big.astype(wide),
                           count[big].astype(dtype), n, dtype)

    def fresh(self) -> EventBounds:
        return EventBounds(_fresh(self.sizes), _fresh(self.offsets), _fresh(self.big), _fresh(self.big_sizes),
                           self.n, self.dtype)

    def copy(self) -> EventBounds:
        return self.fresh()

    ndim = 1

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    @property
    def nbytes(self) -> int:
        return self.sizes.nbytes + self.offsets.nbytes + self.big.nbytes + self.big_sizes.nbytes

    def counts(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """The row counts of events [first, stop) (all of them by default), int64."""
        stop = self.n - 1 if stop is None else stop
        got = self.sizes[first:stop].astype(np.int64)
        lo, hi = np.searchsorted(self.big, (first, stop))
        got[self.big[lo:hi] - first] = self.big_sizes[lo:hi]
        return got

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._span(0, self.n).astype(self.dtype if dtype is None else dtype)

    def _span(self, start: int, stop: int) -> np.ndarray:
        first = start - start % _BOUNDS_BLOCK
        out = np.empty(stop - first, self.dtype)
        out[0] = self.offsets[first // _BOUNDS_BLOCK]
        np.cumsum(self.sizes[first:stop - 1], dtype=self.dtype, out=out[1:])
        out[1:] += out[0]
        lo, hi = np.searchsorted(self.big, (first, stop - 1))
        for e, size in zip(self.big[lo:hi].tolist(), self.big_sizes[lo:hi].tolist()):  # few: each escape's rows
            out[e - first + 1:] += size
        return out[start - first:]

    def _at(self, i: int) -> Any:
        k, first = i // _BOUNDS_BLOCK, i - i % _BOUNDS_BLOCK
        got = int(self.offsets[k])
        if i > first:
            got += int(self.sizes[first:i].sum(dtype=np.int64))
            lo, hi = np.searchsorted(self.big, (first, i))
            if hi > lo:
                got += int(self.big_sizes[lo:hi].sum(dtype=np.int64))
        return self.dtype.type(got)

    def _take(self, index: np.ndarray) -> np.ndarray:
        """The bounds at `index` (bounds numbers or a mask), from the blocks they fall in."""
        if index.dtype == bool:
            if index.shape != (self.n,):
                raise IndexError(f"a mask of {index.shape} over {self.n} bounds")
            index = np.flatnonzero(index)
        at = index.astype(np.int64).reshape(-1)
        if len(at) and (int(at.min()) < -self.n or int(at.max()) >= self.n):
            raise IndexError(f"bounds numbers out of {self.n} bounds")
        at = np.where(at < 0, at + self.n, at)
        if not len(at):
            return np.zeros(index.shape, self.dtype)
        lo, hi = int(at.min()), int(at.max()) + 1
        if len(at) * _BOUNDS_BLOCK >= hi - lo:  # dense (a scrub's interval): the span they fall in
            return self._span(lo, hi)[at - lo].reshape(index.shape)
        k = at // _BOUNDS_BLOCK  # a few, far apart: the blocks they fall in
        blocks, which = np.unique(k, return_inverse=True)
        rows = self.sizes.reshape(-1, _BOUNDS_BLOCK)[np.minimum(blocks, len(self.sizes) // _BOUNDS_BLOCK - 1)] \
            if len(self.sizes) else np.zeros((len(blocks), _BOUNDS_BLOCK), np.uint8)
        before = np.cumsum(rows, axis=1, dtype=np.int64) - rows  # the counts before each event of the block
        got = self.offsets[k].astype(np.int64)
        inside = at % _BOUNDS_BLOCK
        got += np.where(inside > 0, before[which.reshape(-1), np.minimum(inside, _BOUNDS_BLOCK - 1)], 0)
        if len(self.big):
            total = np.concatenate(([0], np.cumsum(self.big_sizes, dtype=np.int64)))
            got += total[np.searchsorted(self.big, at)] - total[np.searchsorted(self.big, k * _BOUNDS_BLOCK)]
        return got.astype(self.dtype).reshape(index.shape)

    def searchsorted(self, v: Any, side: str = "left", sorter: Any = None) -> Any:
        """Where `v` would go among the bounds (as `np.searchsorted` on the array): the
        block by its offset, then within the block's bounds."""
        v = np.asarray(v)
        if v.ndim:
            if len(v) > 16:
                return np.searchsorted(np.asarray(self), v, side=side)
            return np.array([self.searchsorted(x, side) for x in v], np.intp).reshape(v.shape)
        c = int(np.searchsorted(self.offsets, v, side=side))
        if c == 0:
            return np.intp(0)
        first = (c - 1) * _BOUNDS_BLOCK  # the next block's first bound is past `v`: not read
        part = self._span(first, min(first + _BOUNDS_BLOCK, self.n))
        return np.intp(first + int(np.searchsorted(part, v, side=side)))

    def starts(self) -> _BoundsView:
        """Each event's first row (the bounds but the last)."""
        return _BoundsView(self, 0)

    def ends(self) -> _BoundsView:
        """One past each event's last row (the bounds but the first)."""
        return _BoundsView(self, 1)


class _BoundsView(_AsArray):
    """`EventBounds` less its last bound (`shift` 0: the events' first rows) or its first
    (`shift` 1: their ends), read as that array; a view, nothing kept of its own."""

    __slots__ = ("bounds", "shift", "n")
    ndim = 1
    nbytes = 0

    def __init__(self, bounds: EventBounds, shift: int) -> None:
        self.bounds, self.shift, self.n = bounds, shift, bounds.n - 1

    @property
    def dtype(self) -> np.dtype:
        return self.bounds.dtype

    @property
    def base(self) -> EventBounds:
        """The bounds viewed (as a numpy view's `base`): the starts' and the ends' are one."""
        return self.bounds

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.bounds._span(self.shift, self.shift + self.n) if self.n else np.zeros(0, self.dtype)
        return whole if dtype is None else whole.astype(dtype)

    def copy(self) -> np.ndarray:
        return np.asarray(self)

    def _span(self, start: int, stop: int) -> np.ndarray:
        return self.bounds._span(start + self.shift, stop + self.shift)

    def _at(self, i: int) -> Any:
        return self.bounds._at(i + self.shift)

    def _take(self, index: np.ndarray) -> np.ndarray:
        if index.dtype == bool:
            if index.shape != (self.n,):
                raise IndexError(f"a mask of {index.shape} over {self.n} events")
            index = np.flatnonzero(index)
        at = index.astype(np.int64)
        if at.size and (int(at.min()) < -self.n or int(at.max()) >= self.n):
            raise IndexError(f"event numbers out of {self.n} events")
        return self.bounds._take(np.where(at < 0, at + self.n, at) + self.shift)

    def counts(self) -> np.ndarray:
        """Each event's row count (ends less starts), int64."""
        return self.bounds.counts()

    def searchsorted(self, v: Any, side: str = "left", sorter: Any = None) -> Any:
        """As `np.searchsorted` over the view: the bounds are strictly increasing from the
        first, so the last bound counts in none of the starts' answers and the first in all
        the ends' (past it)."""
        got = np.asarray(self.bounds.searchsorted(v, side=side))
        out = np.minimum(got, self.n) if self.shift == 0 else np.maximum(got - 1, 0)
        out = out.astype(np.intp)
        return out if out.ndim else np.intp(out)


RECENT_BLOCKS = 1 << 16  # `BornRows` keeps the rows of its last extend when they are at most this many


class BornRows:
    """Each block's born row (the first row that saw it; -1: there from the start), ascending,
    as blocks are numbered in the order they appear (`ColumnarLog._grow`): `ArithmeticRuns`
    while the runs pay (`paying`), else an int32 array (int64 past it) grown by half again
    where it lies. A pool fills in bursts of new blocks, one a row: an attached server's
    journal makes a block at every store until its pool is full, and then only when its
    vacant blocks run out; a few runs, where the array was 4 bytes a block (40 MB held at
    10M blocks). Read by place (`span`, `last`) and searched (`searchsorted`), never whole."""

    __slots__ = ("n", "_runs", "_arr", "_recent")

    def __init__(self, initial: int = 0, runs: ArithmeticRuns | None = None, arr: np.ndarray | None = None,
                 n: int | None = None) -> None:
        if runs is None and arr is None:  # `initial` blocks, there from the start: one run of -1
            k = 1 if initial else 0
            runs = ArithmeticRuns(np.int32, np.zeros(k, np.int32), np.full(k, -1, np.int32), np.zeros(k, np.uint8),
                                  initial, -1 if initial else 0, 0 if initial > 1 else _NO_STEP)
        self._runs, self._arr = runs, arr
        self.n = initial if n is None else n
        # the blocks the last `extend` added: their first, the born row of the block before
        # it (-1 none) and their rows. A journal tick reads and searches the blocks born in
        # it (two searches and two spans a tick): from these, where the runs' numpy passes
        # over the many runs of a busy server's tick (its births between its reuses) were
        # ~200 us a tick, a sixth of its commit
        self._recent: tuple[int, int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.n

    @property
    def dtype(self) -> np.dtype:
        return self._runs.dtype if self._arr is None else self._arr.dtype

    @property
    def nbytes(self) -> int:
        return self._runs.nbytes if self._arr is None else self._arr.nbytes

    @property
    def last(self) -> int:
        """The newest block's born row (-1 with none)."""
        if not self.n:
            return -1
        return self._runs.last if self._arr is None else int(self._arr[self.n - 1])

    def extend(self, rows: np.ndarray) -> None:
        """The born rows of the next blocks (ascending, none below `last`)."""
        m = len(rows)
        if not m:
            return
        rows = np.asarray(rows, np.int64)
        # (a tick's births, not a large pool's first fill: kept, its rows were as large as the runs saved)
        self._recent = (self.n, self.last, rows) if m <= RECENT_BLOCKS else None
        if int(rows[-1]) > _I32.max and self.dtype == np.int32:
            if self._arr is None:
                self._runs.widen()
            else:
                self._arr = self._arr.astype(np.int64)
        if self._arr is None:
            self._runs.extend(rows)
            self.n += m
            if self._runs.paying:
                return
            # the runs no longer pay (a pool whose blocks came a few at a time): an array from now on
            arr = np.empty(max(self.n + self.n // 2, 1024), self._runs.dtype)
            arr[:self.n] = np.asarray(self._runs)
            self._arr, self._runs = arr, None
            return
        if self.n + m > len(self._arr):
            # the room left unset: every read stops at `n` (`regrow`'s mapping keeps it no
            # resident memory until written; zeroing it held half again the array at 10M blocks)
            regrow(self, "_arr", max(self.n + m, len(self._arr) * 3 // 2), self.n)
        self._arr[self.n:self.n + m] = rows
        self.n += m

    def span(self, start: int, stop: int) -> np.ndarray:
        """The born rows of blocks start..stop-1 (int64)."""
        stop = min(stop, self.n)
        if stop <= start:
            return np.zeros(0, np.int64)
        recent = self._recent
        if recent is not None and start >= recent[0]:  # the blocks the last `extend` added
            return recent[2][start - recent[0]:stop - recent[0]]
        got = self._runs[start:stop] if self._arr is None else self._arr[start:stop]
        return np.asarray(got, np.int64)

    def searchsorted(self, rows: Any, side: str = "left") -> Any:
        """`np.searchsorted` of the born rows (blocks born before each of `rows`, side left)."""
        recent = self._recent
        if recent is not None and np.ndim(rows) == 0:
            at, before, added = recent
            row = int(rows)
            if before < row if side == "left" else before <= row:  # every block before them counts
                return np.intp(at + int(np.searchsorted(added, row, side=side)))
        if self._arr is None:
            return self._runs.searchsorted(rows, side=side)
        born = self._arr[:self.n]
        if np.ndim(rows) == 0:  # a Python int beside int32 born rows: numpy would convert them all first
            return np.searchsorted(born, as_key(rows, born), side=side)
        return np.searchsorted(born, rows, side=side)

    def view(self, n: int) -> BornRows:
        """Its first `n` blocks, read while blocks are added here (`LiveColumnarLog.snapshot`):
        the runs cut to them (`ArithmeticRuns.view`), or the array shared (rows written never change)."""
        if self._arr is None:
            return BornRows(runs=self._runs.view(n), n=n)
        return BornRows(arr=self._arr, n=n)


def _fresh(arr: np.ndarray) -> np.ndarray:
    """A copy of `arr` in a new allocation (the old one freed when its last reference goes)."""
    return np.array(arr, copy=True)


def _last_write(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """target[index] = values where, for a repeated index, the last value wins."""
    if not len(index):
        return
    rev_idx = index[::-1]
    uniq, first = np.unique(rev_idx, return_index=True)
    target[uniq] = values[::-1][first]


def _runs_extend_loop(values, n, last, at, first, step, k0):  # pragma: no cover - compiled
    """`ArithmeticRuns.extend`'s pass, compiled by numba: `values` appended after row `n - 1`
    (value `last`) to the runs `at`, `first`, `step` (`k0` of them so far), each row going on
    with the last run while the difference into it is that run's step (a run of one row so
    far takes the difference into its second as its step, if 0 or 1), else starting one.
    Returns how many runs there are now, or -1 when the arrays had no room for them."""
    k = k0
    length = n - at[k0 - 1] if k0 > 0 else 0  # rows in the last run
    cur = step[k0 - 1] if k0 > 0 else 0
    prev = last
    for i in range(len(values)):
        x = values[i]
        d = x - prev
        if length == 1 and (d == 0 or d == 1):
            step[k - 1] = d
            cur = d
            length = 2
        elif length >= 2 and d == cur:
            length += 1
        else:
            if k == len(at):
                return -1
            at[k] = n + i
            first[k] = x
            step[k] = 0
            k += 1
            length = 1
            cur = 0
        prev = x
    return k


def _advance_loop(kind, block, a, key, flag, seq, request, sizes, start, stop, heads0, ref, hk, pos,
                  got):  # pragma: no cover - compiled
    """`ColumnarLog._advance`'s vectorised passes as one pass over rows [start, stop) in order
    (so the last write to a block wins), compiled by numba: ref counts, hashes and free-queue
    places written into `ref`, `hk`, `pos`; `got` gets (lookups, prompt tokens, hit blocks,
    stores, evictions, refusals, finishes, head prepends). A head prepend's place counts the
    head rows of its event within the range only, as the vectorised code does when a range
    cuts an event."""
    g = heads0  # head rows before this one
    g0 = 0
    m = 0
    group = -1  # the first row of the current event's head rows (-1: none yet)
    group_seq = seq[start]
    for i in range(start, stop):
        k = kind[i]
        b = block[i]
        if k == 5:  # REF
            if b >= 0:
                ref[b] = a[i]
                if a[i] > 0:
                    pos[b] = 9223372036854775807  # FREE_ABSENT: taken
        elif k == 4:  # STORED
            got[3] += 1
            if b >= 0:
                hk[b] = key[i]
                if flag[i] == 1:
                    pos[b] = (1 << 40) + 2 * i
        elif k == 7:  # EVICTED
            if b >= 0:
                hk[b] = -1
                got[4] += 1
        elif k == 10:  # RESET
            if b >= 0:
                hk[b] = -1
        elif k == 6:  # FREED
            if b >= 0:
                if flag[i] == 1:
                    pos[b] = (1 << 40) + 2 * i
                else:
                    s = seq[i]
                    if group < 0 or s != group_seq:  # the event's first head row in the range
                        group = i
                        group_seq = s
                        g0 = g
                        m = 0
                        j = i
                        while j < stop and seq[j] == s:
                            if kind[j] == 6 and block[j] >= 0 and flag[j] != 1:
                                m += 1
                            j += 1
                    pos[b] = -(2 * g0 + m - g)
                    g += 1
                    if flag[i] == 0:  # as `ColumnarLog._head_count` counts them
                        got[7] += 1
        elif k == 2:  # LOOKUP
            got[0] += 1
            got[1] += sizes[request[i]]
            got[2] += a[i]
        elif k == 8:  # REFUSED
            got[5] += 1
        elif k == 9:  # FINISHED
            got[6] += 1


_COMPILED: list[Any] = []


_RUNS_LOOP: list[Any] = []


def _compiled_runs_extend() -> Any:
    """`_runs_extend_loop` compiled (cached on disk), or None without numba; loaded (or
    compiled) here for the runs a journal log keeps (int32 rows, int32 or int64 values)."""
    if not _RUNS_LOOP:
        try:
            from numba import njit
        except ImportError:
            _RUNS_LOOP.append(None)
        else:
            loop = njit(cache=True, nogil=True)(_runs_extend_loop)
            for dtype in (np.int32, np.int64):
                loop(np.arange(3, dtype=np.int64), 0, 0, np.zeros(4, np.int32), np.zeros(4, dtype),
                     np.zeros(4, np.uint8), 0)
            _RUNS_LOOP.append(loop)
    return _RUNS_LOOP[0]


def _compiled_advance() -> Any:
    """`_advance_loop` compiled (cached on disk), or None without numba."""
    if not _COMPILED:
        try:
            from numba import njit
        except ImportError:
            _COMPILED.append(None)
        else:
            _COMPILED.append(njit(cache=True, nogil=True)(_advance_loop))
    return _COMPILED[0]
