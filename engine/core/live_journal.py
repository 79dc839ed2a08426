"""A columnar pool's journal as rows of the app's live columnar log, without an Event per block.

`engine.remote.colpool.ColumnarPool(journal=True)` writes one journal row per block
operation (stored, removed, cleared) in the order the reference `RemotePool` emits its
`BlockStored`/`BlockEvicted`/`CacheReset`. `append_journal` turns the rows taken since the
last GUI tick into rows of a `LiveColumnarLog` with numpy: one event per journal row, the
slot `PoolProjection` gives the copy as the block (each server's and rank's pool slots
apart, however many share the log), a hash id whose digest
`JournalKeys` reads from the pool (`hash_of`) and, per store, parent, token ids and tenant
read from the pool's per-store arrays only when a view asks (`JournalStores`). The slots are
the columnar pool's, not `PoolProjection`'s: tests/test_live_journal.py holds what does not
depend on slot numbers (events, counts, series, the held blocks) equal to the reference.
The journal is duck-typed (`JournalRows`): engine.core imports nothing of engine.remote.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.core.columnar import EVICTED, RESET, STORED, KeyTable
from engine.core.live_log import _Growing
from engine.core.projection import stream_code
from engine.core.threads import made_once

OP_STORED, OP_REMOVED, OP_CLEARED = 0, 1, 2  # engine.remote.colpool's journal ops
W_U64 = 1  # engine.remote.colpool's width code of an 8-byte hash (its key is the value)
_I32_TOP = int(np.iinfo(np.int32).max)  # a number above it needs an int64 array


IDENTITY = np.dtype([("wide", np.uint8), ("value", np.uint64)])


def hash_identity(pools: list[Any], pool_of: np.ndarray, key: np.ndarray, width: np.ndarray,
                  wide: dict[bytes, int]) -> np.ndarray:
    """Journal (key, width) pairs as `IDENTITY` codes, equal exactly when the hashes are: an
    8-byte hash (wide 0) by its value, another digest (wide 1) by its number in `wide`
    (numbered here as first met); width 0 (no hash) is wide 2."""
    out = np.zeros(len(key), IDENTITY)
    out["value"] = key
    width = np.asarray(width)
    other = np.flatnonzero(width != W_U64)
    for i in other.tolist():
        w = int(width[i])
        if not w:
            out[i] = (2, 0)
            continue
        d = pools[int(pool_of[i])].hash_of(int(key[i]), w)
        out[i] = (1, wide.setdefault(d, len(wide)))
    return out


def _hash_bytes(pools: list[Any], pool_of: np.ndarray, key: np.ndarray, width: np.ndarray) -> list[bytes | None]:
    """Journal (key, width) pairs as the hashes `pool.hash_of` gives, many at once: an
    8-byte hash is its key, big-endian; another (a digest) its pool's; width 0 is None."""
    raw = np.asarray(key, np.uint64).astype(">u8").tobytes()
    out: list[bytes | None] = [raw[i:i + 8] for i in range(0, len(raw), 8)]
    for i in np.flatnonzero(np.asarray(width) != W_U64).tolist():
        w = int(width[i])
        out[i] = pools[int(pool_of[i])].hash_of(int(key[i]), w) if w else None
    return out


class _Grow(_Growing):
    """A `_Growing` grown by an eighth: a journal log's per-row and per-store columns grow with
    every block the app tracks, and growing by half left up to a third of them unused. With
    `uniform`, no buffer while every value is one (one pool's rows, 8-byte hashes' width):
    read it through `view` (`append_same` appends one value many times)."""

    __slots__ = ()

    def __init__(self, dtype: Any, narrow: Any = None, uniform: bool = False) -> None:
        super().__init__(dtype, narrow, uniform=uniform, grow_by=8)


class _Steps:
    """A column of ints kept as its runs that count up by one, each run's first position and
    value (a journal log's pool store numbers: a pool numbers its stores in order, so a
    pool's ticks make one run, 4 bytes a store otherwise); once runs would take more than
    the values themselves, the values (`_Grow`, int32 while they fit). Read by position (`take`)."""

    __slots__ = ("_start", "_first", "_last", "_values", "n")

    def __init__(self) -> None:
        self._start, self._first = _Grow(np.int64, np.int32), _Grow(np.int64)
        self._last = -2  # the last value (-2: none, so no first value continues a run)
        self._values: _Grow | None = None  # the values, once runs did not pay
        self.n = 0

    def append(self, values: np.ndarray, counting: bool = False) -> None:
        """Append `values`; `counting`: the caller knows they count up by one (a tick's
        stores of one pool, `_scan_loop`), so they continue the last run or start one."""
        values = np.asarray(values, np.int64)
        k = len(values)
        if not k:
            return
        if self._values is not None:
            self._values.append(values)
            self.n += k
            return
        if counting and int(values[0]) == self._last + 1:  # the last run goes on: nothing kept
            self._last = int(values[-1])
            self.n += k
            return
        breaks = np.flatnonzero(np.diff(values) != 1) + 1
        at = breaks if int(values[0]) == self._last + 1 else np.concatenate(([0], breaks))
        if 16 * (len(self._start.view) + len(at)) > 4 * (self.n + k) + 4096:  # runs cost more than values
            kept = _Grow(np.int64, np.int32)
            kept.append(self.take(np.arange(self.n)))
            kept.append(values)
            self._values = kept
            self._start, self._first = _Grow(np.int64, uniform=True), _Grow(np.int64, uniform=True)  # runs dropped
        else:
            self._start.append(self.n + at)
            self._first.append(values[at])
        self._last = int(values[-1])
        self.n += k

    def take(self, ids: Any) -> Any:
        """The values at positions `ids` (an int, or an array of them)."""
        if self._values is not None:
            return self._values.view[ids]
        ids = np.asarray(ids, np.int64)
        ids = np.where(ids < 0, ids + self.n, ids)  # a negative one counts from the end, as numpy's
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.n):
            raise IndexError(f"positions past a column of {self.n}")
        start = self._start.view
        r = np.searchsorted(start, ids, side="right") - 1
        out = self._first.view[r] + (ids - start[r])
        return int(out) if out.ndim == 0 else out

    @property
    def nbytes(self) -> int:
        return self._values.nbytes if self._values is not None else self._start.nbytes + self._first.nbytes


class JournalKeys(KeyTable):
    """Hash ids of a journal-fed log: one per journal row, its digest the pool's
    `hash_of(key, width)` (computed when asked for, not kept). The key is not kept either
    where the pool keeps it: a stored row's is its store's, and a removal's that took a
    block the key of the store that made it, in the pool's per-store keys
    (`JournalRows.store_key`, each written once and kept for good: 8 bytes a block the log
    kept again). Each id keeps that store's number (`_Steps`: one run while a pool only
    stores, 4 bytes an id otherwise) or -1, with its own key (`_own_id`, `_own_key`): a
    removal of a hash its pool did not hold, a clear."""

    def __init__(self) -> None:
        z = np.zeros(0, np.int64)
        super().__init__(z.astype(np.int32), z, z, np.zeros((1, 1), np.uint32), [], None, 1)
        self.pools: list[Any] = []
        self._store = _Steps()
        self._own_id, self._own_key = _Grow(np.int64), _Grow(np.uint64)
        self._store_keys: dict[int, StoreArrays] = {}  # pool -> where its per-store keys are read
        self._width, self._pool = _Grow(np.int64, np.uint8, uniform=True), _Grow(np.int16, uniform=True)
        self._wide: dict[bytes, int] = {}  # a digest that is no 8-byte value -> its number (identities)

    def __len__(self) -> int:
        return self._store.n

    def add(self, pool: int, stores: np.ndarray, keys: np.ndarray, widths: np.ndarray, store_keys: StoreArrays,
            width_range: tuple[int, int] | None = None, counting: bool = False) -> None:
        """Hash ids for a tick's rows of pool `pool`: `stores`, each row's store whose key is
        its own (-1: none, its key in `keys` kept), `store_keys` where the pool's per-store
        keys are read (`StoreArrays`: `JournalRows.store_key` as of the latest rows);
        `counting`, `stores` count up by one (every row a store);
        `width_range`, the widths' least and most if known (the placer's scan): one width
        appended as one value, the rows not compared (a strided compare of a tick's widths
        was ~25 us)."""
        n0 = self._store.n
        self._store_keys[pool] = store_keys
        self._pool.append_same(pool, len(stores))
        if width_range is not None and width_range[0] == width_range[1]:
            self._width.append_same(width_range[0], len(stores))
        else:
            self._width.append(widths)
        if not counting:
            own = np.flatnonzero(np.asarray(stores) < 0)
            if len(own):
                self._own_id.append(own + n0)
                self._own_key.append(np.asarray(keys, np.uint64)[own])
        self._store.append(stores, counting)

    def keys_of(self, ids: Any) -> np.ndarray:
        """The hash key (uint64) of each id of `ids` (an array): its store's in its pool's
        per-store keys, or its own."""
        ids = np.asarray(ids, np.int64)
        src = np.asarray(self._store.take(ids), np.int64)
        pools = self._pool.view[ids]
        held = src >= 0
        if len(ids) and held.all() and int(pools.min()) == int(pools.max()):  # one pool's (an attach's, mostly)
            return np.asarray(self._store_keys[int(pools[0])].arrays().store_key[src], np.uint64)
        out = np.zeros(len(ids), np.uint64)
        own = np.flatnonzero(~held)
        if len(own):
            out[own] = self._own_key.view[np.searchsorted(self._own_id.view, ids[own])]
        for p in np.unique(pools[held]).tolist():
            at = np.flatnonzero(held & (pools == p))
            out[at] = self._store_keys[p].arrays().store_key[src[at]]
        return out

    def _key_of(self, key: int) -> int:
        return int(self.keys_of(np.array([key], np.int64))[0])

    def digest(self, key: int) -> bytes:
        return self.pools[int(self._pool.view[key])].hash_of(self._key_of(key), int(self._width.view[key]))

    def identities(self, ids: np.ndarray) -> np.ndarray:
        """Per id a code equal for equal digests (`hash_identity`)."""
        ids = np.asarray(ids, np.int64)
        return hash_identity(self.pools, self._pool.view[ids], self.keys_of(ids), self._width.view[ids], self._wide)

    def digests(self, ids: np.ndarray) -> list[bytes]:
        """`digest` of many ids at once."""
        ids = np.asarray(ids, np.int64)
        return _hash_bytes(self.pools, self._pool.view[ids], self.keys_of(ids), self._width.view[ids])

    def parent_of(self, key: int) -> int:
        return -1  # each store's parent is in JournalStores

    def attributes(self, key: int) -> tuple:
        return None, (), None, None

    def key_of(self, digest: bytes, attributes: tuple | None = None) -> int:
        raise TypeError("a journal-fed log takes journal rows (append_journal), not events")


@dataclass(slots=True, frozen=True)
class StoreArrays:
    """Where the log reads a pool's per-store arrays (`JournalRows.parent`, ... , `tokens`)
    when a view asks: the pool and its `store_counts` as of the latest rows committed,
    read through `pool.per_store(counts)` then. It holds on to neither the journal's row
    array, which the pool drops into a new one when its rows are released, nor a view of
    the per-store arrays, which the pool then grows where they lie: a view kept had every
    growth of its token ids copied whole (20 ms of a 100K-event attach's 0.11 s pool stage)."""

    pool: Any
    counts: tuple

    @classmethod
    def of(cls, journal: Any) -> StoreArrays:
        return cls(journal.pool, journal.store_counts)

    def arrays(self) -> Any:
        """The per-store arrays now (`parent`, `parent_width`, `token_start`, `token_count`,
        `tenant`, `tokens` and `token_ids(store)`), views to read and let go."""
        return self.pool.per_store(self.counts)


class JournalStores(Sequence[tuple]):
    """Per store of the log (a stored row's `a`): (parent digest, token ids, salt, external
    id, tenant) read from its pool's per-store arrays when asked for."""

    def __init__(self, keys: JournalKeys, compiled: bool = True) -> None:
        self._keys = keys
        self._pool, self._local = _Grow(np.int16, uniform=True), _Steps()
        self.journals: dict[int, StoreArrays] = {}  # pool -> its per-store arrays, whole, as of its latest rows
        self.placer: Any = _CompiledPlacer(keys) if compiled and _compiled() else _Placer()
        self._slot_ids: dict[int, np.ndarray] = {}  # pool index -> per pool slot its placer slot id (-1: none yet)
        # pool index -> (first, lo, n): its slots lo..n-1 are numbered first + slot - lo, no table
        # kept, while each tick's new slots are past the last (a pool gives its slots in order,
        # from its first, a few skipped: a number each, never placed) and no other pool's came
        # between (one server, one rank: a table was 4 bytes a slot). A number only keys a
        # slot's copies (the placer's FIFOs), so it need not be dense, only the pool's own.
        self._slot_runs: dict[int, tuple[int, int, int]] = {}
        self._num_slot_ids = 0
        # per store: its tenant code as PoolProjection sets it (no buffer while every store has one)
        self.tenants = _Grow(np.int64, np.int32, uniform=True)
        self.plan = _Plan()  # the log's numbers once every prepared row is committed
        # per server, the newest batch seq its rows named so far: a tick's batches past it are
        # new requests (`commit_journal` looks up the others)
        self.top_batch: dict[str, int] = {}

    def __len__(self) -> int:
        return self._pool.n

    def slot_ids(self, pool: int, slot: np.ndarray) -> np.ndarray:
        """The placer's number for each (pool, pool slot) (-1 stays -1): every server's and
        rank's slots apart, numbered densely as first seen (a tick's new slots in slot order),
        by one lookup table per pool."""
        slot = np.asarray(slot, np.int64)  # a pool's: a strided view of its journal rows, read in place
        top = int(slot.max()) + 1 if len(slot) else 0
        if top <= 0:  # no real slot
            return np.full(len(slot), -1, np.int64)
        if pool not in self._slot_ids and isinstance(self.placer, _CompiledPlacer):
            run = self._slot_runs.get(pool)
            if run is None:  # a pool's first slots: its run from the least
                lo = int(slot[slot >= 0].min())
                run = (self._num_slot_ids, lo, lo)
            first, lo, have = run
            if top <= have or first + have - lo == self._num_slot_ids:  # no other pool numbered slots since
                out = np.empty(len(slot), np.int64)
                got = self.placer.slot_run(slot, lo, have, first - lo, out)
                if got >= 0:
                    self._slot_runs[pool] = (first, lo, got)
                    self._num_slot_ids = max(self._num_slot_ids, first + got - lo)
                    return out
            # numbered by a table from now on, the run's numbers first
            self._slot_runs.pop(pool, None)
            kind = np.int32 if first + have + len(slot) <= _I32_TOP else np.int64
            table = self._slot_ids[pool] = np.full(max(have, 1024), -1, kind)
            table[lo:have] = first + np.arange(have - lo, dtype=kind)
        table = self._slot_ids.get(pool)
        if table is None or len(table) < top:
            old = np.zeros(0, np.int32) if table is None else table
            grown = np.full(max(top, len(old) + len(old) // 8, 1024), -1, old.dtype)
            grown[:len(old)] = old
            table = self._slot_ids[pool] = grown
        if table.dtype == np.int32 and self._num_slot_ids + len(slot) > _I32_TOP:
            table = self._slot_ids[pool] = table.astype(np.int64)  # the numbers given would pass int32
        if isinstance(self.placer, _CompiledPlacer):
            # the pass writes every row's number (a mask and a fill over the strided rows
            # first were ~45 us a tick)
            out = np.empty(len(slot), np.int64)
            self._num_slot_ids = self.placer.number_slots(table, slot, out, self._num_slot_ids)
            return out
        out = np.full(len(slot), -1, np.int64)
        real = slot >= 0
        mine = slot[real]
        fresh = np.unique(mine[table[mine] < 0])
        table[fresh] = self._num_slot_ids + np.arange(len(fresh), dtype=np.int64)
        self._num_slot_ids += len(fresh)
        out[real] = table[mine]
        return out

    def add(self, pool: int, local: np.ndarray, counting: bool = False) -> None:
        """Stores `local` of pool `pool` (`counting`: they count up by one)."""
        self._pool.append_same(pool, len(local))
        self._local.append(local, counting)

    def _parent_keys(self, stores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per store its pool and its parent's journal (key, width), read from each pool's arrays."""
        stores = np.asarray(stores, np.int64)
        pool_of, local = self._pool.view[stores], self._local.take(stores)
        key = np.zeros(len(stores), np.uint64)
        width = np.zeros(len(stores), np.int64)
        for p in np.unique(pool_of).tolist():
            at = np.flatnonzero(pool_of == p)
            j = self.journals[p].arrays()
            key[at] = j.parent[local[at]]
            width[at] = np.asarray(j.parent_width, np.int64)[local[at]]
        return pool_of, key, width

    def parents(self, stores: np.ndarray) -> list[bytes | None]:
        """The parent digest (`self[i][0]`) of many stores at once."""
        return _hash_bytes(self._keys.pools, *self._parent_keys(stores))

    def tokens(self, stores: np.ndarray) -> list[tuple[int, ...]]:
        """The token ids (`self[i][1]`) of many stores at once."""
        out = []
        arrays: dict[int, Any] = {}
        for p, s in zip(self._pool.view[stores].tolist(), self._local.take(stores).tolist()):
            j = arrays.get(p)
            if j is None:
                j = arrays[p] = self.journals[p].arrays()
            out.append(tuple(j.token_ids(s).tolist()))
        return out

    def parent_identities(self, stores: np.ndarray) -> np.ndarray:
        """The parent hash of many stores as `IDENTITY` codes (wide 2: no parent)."""
        return hash_identity(self._keys.pools, *self._parent_keys(stores), self._keys._wide)

    def salts(self, stores: np.ndarray) -> list[str | None]:
        """The salt (`self[i][2]`) of many stores at once."""
        codes, names = self.salt_codes(stores)
        return [names[c - 1] if c else None for c in codes.tolist()]

    def salt_codes(self, stores: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """`salts` as codes into a list of names (0: none, else names[code - 1])."""
        stores = np.asarray(stores, np.int64)
        out = np.zeros(len(stores), np.int64)
        names: list[str] = []
        if not any(pool.tenant_names for pool in self._keys.pools):  # no server named a salt
            return out, names
        pool_of, local = self._pool.view[stores], self._local.take(stores)
        for p in np.unique(pool_of).tolist():
            at = np.flatnonzero(pool_of == p)
            codes = np.asarray(self.journals[p].arrays().tenant[local[at]], np.int64)
            out[at] = np.where(codes > 0, codes + len(names), 0)
            names.extend(self._keys.pools[p].tenant_names)
        return out, names

    def tenant_names(self, stores: np.ndarray) -> list[str | None]:
        """The tenant (`self[i][4]`) of many stores at once."""
        stores = np.asarray(stores, np.int64)
        out: list[str | None] = [None] * len(stores)
        codes = self.tenants.view[stores]
        for i in np.flatnonzero(codes).tolist():
            names = self._keys.pools[int(self._pool.view[stores[i]])].tenant_names
            out[i] = names[int(codes[i]) - 1]
        return out

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        p, s = int(self._pool.view[i]), int(self._local.take(i))
        j = self.journals[p].arrays()
        pool = self._keys.pools[p]
        width = int(j.parent_width[s])
        parent = pool.hash_of(int(j.parent[s]), width) if width else None
        t, t_set = int(j.tenant[s]), int(self.tenants.view[i])
        salt = pool.tenant_names[t - 1] if t else None
        tenant = pool.tenant_names[t_set - 1] if t_set else None
        return parent, tuple(j.token_ids(s).tolist()), salt, None, tenant


@dataclass(slots=True)
class _Plan:
    """What a journal log's rows, seqs, hash ids, stores and blocks will number once every
    prepared row is written (the log starts empty, and only `commit_journal` writes it)."""

    pools: list[Any] = field(default_factory=list)
    row: int = 0
    seq: int = 0
    key: int = 0
    store: int = 0
    blocks: int = 0


JOURNAL_ROW_FIELDS = ("op", "tier", "slot", "seq", "store", "key", "width")  # one value per row


def journal_head(journal: Any, n: int) -> Any:
    """The first `n` rows of `journal` (a `JournalRows`, the per-store arrays whole), so a
    tick can take part of what arrived and the rest at the next; `journal` if it has no more."""
    if len(journal) <= n:
        return journal
    cut = object.__new__(type(journal))
    for name in type(journal).__slots__:
        setattr(cut, name, getattr(journal, name))
    for name in JOURNAL_ROW_FIELDS:
        setattr(cut, name, getattr(journal, name)[:n])
    cut.stop = journal.start + n
    return cut


@dataclass(slots=True, eq=False)
class PreparedJournal:
    """One pool's journal rows placed (`prepare_journal`) and waiting to be written to the
    log (`commit_journal`): the log's rows with event indexes where seq and request go, and
    what the log's numbers (rows, seqs, hash ids, stores, blocks) will be when it is written;
    made on any thread, written on the one that owns the log, in the order prepared."""

    stores: JournalStores
    journal: Any
    pool: Any
    source: str
    rank: int
    table: np.ndarray
    store_tenants: np.ndarray
    born: np.ndarray  # per new block, the row it is first stored at
    r0: int  # the log's rows, seqs, hash ids and stores before these
    seq0: int
    key0: int
    store0: int
    num_blocks: int  # the log's blocks after these
    rows: _JournalColumns  # what the commit reads of the journal, read off the writing thread
    # the block of each stored and removed row (-1: none), in row order: what the remote
    # overlay follows (`LiveColumnarLog.blocks_of_rows` of these rows once written)
    slots: np.ndarray

    def __len__(self) -> int:
        return len(self.journal)


@dataclass(slots=True, eq=False)
class _JournalColumns:
    """A journal's columns as `commit_journal` writes them, made by `prepare_journal` (off
    the thread that owns the log, in the app): the journal's hash fields (views of the pool's
    rows, which it never writes again: `release_journal` drops them into a new array), and the
    tick's (batch, tier) pairs, which one request and RemoteInfo each stand for."""

    keys: np.ndarray  # uint64 hash code per row
    # per row, the pool store whose key is its key (a stored row's own, a removal's that took
    # a block the store that made it; -1: none, a clear or a removal of a hash not held), and
    # whether those count up by one (every row a store): the log's hash ids (`JournalKeys`)
    key_store: np.ndarray
    key_counting: bool
    widths: np.ndarray  # int64
    width_range: tuple[int, int]  # the widths' least and most
    num_cleared: int  # clear rows (a clear's rows' `a` is the pool's count of copies it cleared)
    store_local: np.ndarray  # int64 pool store number of each storing row
    stores_counting: bool  # those count up by one (a pool numbers its stores in order)
    pairs: np.ndarray  # ascending (batch seq << 10) | (tier + 1), one per run of rows
    of_pair: np.ndarray  # per row, its pair
    batches: np.ndarray  # the pairs' batch seqs, once each
    media: list[str]  # per pair, its tier's name
    table_pair: np.ndarray  # per row of the log's table, its journal row's pair
    table_batch: np.ndarray  # and its index in `batches`


def prepare_journal(log: Any, journal: Any, pool: Any, source: str, rank: int = 0) -> PreparedJournal:
    """The placing half of `append_journal`: each copy's slot (the placer, compiled), read
    from `journal` and the placer's own state only, so it may run off the thread that owns
    `log` (the log is not touched: `commit_journal` writes it). Rows prepared must be
    committed in the order they were prepared, and before any other is appended."""
    col = log.columnar
    stores = col.store_attributes
    if not isinstance(col.keys, JournalKeys) or not isinstance(stores, JournalStores):
        raise TypeError("this log was not made for a journal (engine.core.live_journal.journal_log)")
    plan = stores.plan
    if pool not in plan.pools:
        plan.pools.append(pool)
    p = plan.pools.index(pool)
    n = len(journal)
    # the journal's columns as they are (a pool's: strided views of its rows, read in place)
    op = np.asarray(journal.op, np.int64)
    local = np.asarray(journal.store, np.int64)
    hcode = np.asarray(journal.key, np.uint64).view(np.int64)
    hwide = np.asarray(journal.width, np.int64)
    who = stream_code(source, rank)  # whose blocks a clear takes
    placed = stores.slot_ids(p, np.asarray(journal.slot, np.int64))
    seq, tier = np.asarray(journal.seq, np.int64), np.asarray(journal.tier, np.int64)
    nb0 = plan.blocks
    if isinstance(stores.placer, _CompiledPlacer):
        scan = stores.placer.scan(op, seq, tier, local, hwide)
        # each store's parent (code, width) and tenant, read from the pool's per-store arrays
        pcode, pwide, tenant = stores.placer.store_fields(journal, scan.store_local)
        table, store_tenants, born, nb, table_pair, table_batch, slots = stores.placer.place_rows(
            nb0, op, placed, plan.key, hcode, hwide, pcode, pwide, tenant, local, who, plan.row, plan.seq,
            plan.store, scan)
    else:
        scan = _scan_numpy(op, seq, tier, local, hwide)
        is_st = op == OP_STORED
        # per row, its store's parent (code, width) and tenant (0 for a row that stores nothing)
        st_local = np.where(is_st, local, 0)
        pk = _per_store(journal.parent, st_local, is_st, np.uint64).tolist()
        pw = _per_store(journal.parent_width, st_local, is_st, np.int64).tolist()
        parents = [(k, w) if w else None for k, w in zip(pk, pw)]
        hashes = list(zip(hcode.view(np.uint64).tolist(), hwide.tolist()))
        key = plan.key + np.arange(n, dtype=np.int64)  # the hash ids keys.add will give
        table, store_tenants, born, nb = _place(stores.placer, nb0, op.tolist(), placed.tolist(), key.tolist(), who,
                                                local.tolist(), plan.row, hashes, parents,
                                                _per_store(journal.tenant, st_local, is_st, np.int64).tolist())
        # the table's event indexes made seqs and stores' ids here, as the commit will number them
        ev = table[:, 2]
        table_pair = scan.of_pair[ev]
        table_batch = scan.batch_of_pair[table_pair]
        store_id = np.cumsum(is_st) - 1 + plan.store  # a storing row's store id (JournalStores.add)
        table[:, 5] = np.where(table[:, 0] == STORED, store_id[ev], table[:, 5])
        table[:, 1] = plan.seq + ev
        kind = table[:, 0]
        slots = table[:, 3][(kind == STORED) | (kind == EVICTED)]
    # the request and RemoteInfo of each row: one per vLLM batch (and tier) in the tick
    names = journal.tier_names
    media = [names[t] if 0 <= t < len(names) else "GPU" for t in ((scan.pairs & 1023) - 1).tolist()]
    if scan.num_stored == n and scan.stores_counting:
        key_store, key_counting = scan.store_local, True
    else:
        key_store, key_counting = np.where(op == OP_CLEARED, -1, local), False
    rows = _JournalColumns(hcode.view(np.uint64), key_store, key_counting, hwide, scan.width_range,
                           scan.num_cleared, scan.store_local,
                           scan.stores_counting, scan.pairs, scan.of_pair, scan.batches, media, table_pair, table_batch)
    done = PreparedJournal(stores, journal, pool, source, rank, table, np.asarray(store_tenants, np.int64),
                           np.asarray(born, np.int64), plan.row, plan.seq, plan.key, plan.store, nb, rows, slots)
    plan.row += len(table)
    plan.seq += n
    plan.key += n
    plan.store += len(scan.store_local)
    plan.blocks = nb
    return done


def commit_journal(log: Any, prepared: PreparedJournal, now: float = 0.0, times: Any = None) -> int:
    """The writing half of `append_journal`, on the thread that owns `log`: the prepared
    rows, their requests (one per vLLM batch) and RemoteInfos written, the pool grown, the
    series and live pool moved on. `times`: each row's batch time as taken with the rows
    (`app.runtime.journal_feed.take_journal_rows`); None reads them from the pool
    (`times_of`), which it can only while it holds them (`release_journal`). How many
    events that made."""
    col = log.columnar
    keys, stores = col.keys, col.store_attributes
    if stores is not prepared.stores:
        raise ValueError("these journal rows were prepared for another log")
    if (col.num_rows, len(keys), len(stores)) != (prepared.r0, prepared.key0, prepared.store0):
        raise ValueError("journal rows must be committed in the order they were prepared")
    journal, pool, source, rank = prepared.journal, prepared.pool, prepared.source, prepared.rank
    n = len(journal)
    if pool not in keys.pools:
        keys.pools.append(pool)
    p = keys.pools.index(pool)
    stores.journals[p] = arrays = StoreArrays.of(journal)
    rows = prepared.rows
    keys.add(p, rows.key_store, rows.keys, rows.widths, arrays, rows.width_range, rows.key_counting)
    if isinstance(stores.placer, _CompiledPlacer):
        stores.placer.committed(len(keys))  # the codes it kept for these rows' ids: in `keys` now
    stores.add(p, rows.store_local, rows.stores_counting)  # the ids prepare_journal wrote (store0 on, checked above)
    stores.tenants.append(prepared.store_tenants)
    # no `_live_keys` (4 bytes a block, never written here: the placer holds what each block holds)
    slots = col._remote_slots()
    pairs, of_pair = rows.pairs, rows.of_pair
    live_request = col._live_request
    batches = rows.batches.tolist()  # ascending, once each
    rids = [f"{source}#{u}" for u in batches]
    top = stores.top_batch.get(source)
    if top is not None and batches and batches[0] <= top:
        occurrence = [live_request.get(rid) for rid in rids]
        new = [rid for rid, r in zip(rids, occurrence) if r is None]  # a batch's first rows (the rest: a tick before)
        if new:
            live_request.update(zip(new, col.requests.add_many(new)))
            occurrence = [live_request[rid] for rid in rids]
    else:  # every batch past the server's newest so far: each a new request, none looked up
        occurrence = col.requests.add_many(rids)
        live_request.update(zip(rids, occurrence))
    if batches:
        stores.top_batch[source] = batches[-1] if top is None else max(top, batches[-1])
    # each pair's batch time, as the reference's RemoteInfo carries it (a pool that keeps
    # none, or a clear outside any batch: 0, the event's own time stands for it)
    pair_time = np.zeros(len(pairs), np.float64)
    if times is None and getattr(pool, "times_of", None) is not None:
        times = pool.times_of(journal)
    if times is not None:
        pair_time[of_pair] = times
        pair_time[pairs >> 10 < 0] = 0.0
    numbers = np.asarray(slots.info_ids(source, rank, (pairs >> 10).tolist(), pair_time.tolist(), rows.media),
                         np.int64)
    table = prepared.table  # seqs and stores' ids written by prepare_journal
    table[:, 2] = (np.arange(occurrence.start, occurrence.stop) if isinstance(occurrence, range)
                   else np.asarray(occurrence, np.int64))[rows.table_batch]
    table[:, 6] = numbers[rows.table_pair]
    nb0 = col.num_blocks
    if prepared.num_blocks > nb0:  # the pool grows to the new slots, each from the row that first stored it
        col._grow(prepared.num_blocks - 1, prepared.born)
    # seqs, stores' ids and info numbers: int32 while these bounds are (no pass over them)
    fit32 = not rows.num_cleared and max(prepared.seq0 + n, prepared.store0 + len(rows.store_local),
                                         len(slots.infos)) <= _I32_TOP
    col.write_rows(table, fit32)
    # each event's seq: the rows' own (as written) while each row is an event (a clear's rows share one)
    seqs = table[:, 1].copy() if len(table) == n else prepared.seq0 + np.arange(n, dtype=np.int64)
    col.num_seq = int(seqs[-1]) + 1
    log.rows_appended(prepared.r0, seqs, float(now))  # one time for the tick's rows
    return n


def append_journal(log: Any, journal: Any, pool: Any, source: str, rank: int = 0, num_ranks: int = 1,
                   now: float = 0.0) -> int:
    # the slot of each copy is chosen here as PoolProjection chooses it for the reference's
    # events (`_Placer`), so the blocks the views show are the reference's blocks
    """Append the rows of `journal` (a `JournalRows` of `pool`, rank `rank` of server
    `source`) to `log`, a `LiveColumnarLog` made with `journal_log`; how many events that
    made: `prepare_journal` then `commit_journal` on this thread. Any number of servers and
    ranks share the log: each pool's slots are its own, and its clear takes its own blocks
    (`engine.core.projection.stream_code`). `num_ranks` is not used (the slots were once
    interleaved by rank); it stays for callers."""
    if not len(journal):
        return 0
    return commit_journal(log, prepare_journal(log, journal, pool, source, rank), now)


def _unique_runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` sorting one value per run of equal
    neighbours, not one per row: a journal's rows come in runs of one batch (and tier).
    Runs that already ascend (a pool's batch seqs) are their own unique values, unsorted."""
    if not len(values):
        return values, np.zeros(0, np.int64)
    change = values[1:] != values[:-1]
    if not change.any():
        return values[:1], np.zeros(len(values), np.int64)
    starts = np.flatnonzero(np.concatenate(([True], change)))
    firsts = values[starts]
    if (firsts[1:] > firsts[:-1]).all():
        return firsts, np.cumsum(np.concatenate(([False], change))).astype(np.int64)
    uniq, inv = np.unique(firsts, return_inverse=True)
    return uniq, np.repeat(inv.reshape(-1), np.diff(np.append(starts, len(values))))


def _per_store(values: Any, at: np.ndarray, is_store: np.ndarray, dtype: Any) -> np.ndarray:
    """`values[at]` as `dtype` where a row stores, 0 elsewhere (a pool that stored nothing yet
    has no per-store rows: a stream that began with removals). Indexed before it is converted:
    the per-store arrays are the pool's whole (a narrow array, or one read as a field:
    `StoreParents`, `StoreRuns`, made only at `at`), and converting them first cost a pass
    over every store so far at every tick."""
    if not len(values):
        return np.zeros(len(at), dtype)
    return np.where(is_store, np.asarray(values[at]).astype(dtype), 0).astype(dtype, copy=False)


def _store_fields_loop(keys, px, rx, pwidth, stores, out):  # pragma: no cover - compiled
    """Each store's parent (its code's bits as an int64), parent width and tenant + 1, from a
    pool's per-store arrays (`keys`, `pwidth`), explicit parents (`px`: rows of store and key,
    `engine.remote.colpool.StoreParents`) and runs of stores (`rx`: rows of first store,
    count, tenant + 1, `StoreRuns`) into `out`'s three rows: one pass, where numpy gathers
    and conversions each walked the per-store records (2.3 -> 0.65 ms per 100K vLLM events,
    2026-12-04). A store with a parent that is not in `px` has the store before it as its
    parent. `px` and `rx` are in store order, and a tick's stores count up, so their rows
    are walked once from the first store's."""
    n, m = len(px), len(rx)
    j = np.searchsorted(px[:, 0], stores[0]) if len(stores) else 0
    r = np.searchsorted(rx[:, 0], stores[0], side="right") - 1 if len(stores) else 0
    last = -1
    for i in range(len(stores)):
        s = stores[i]
        if s < last:  # (not counting up: looked for again)
            j = np.searchsorted(px[:, 0], s)
            r = np.searchsorted(rx[:, 0], s, side="right") - 1
        last = s
        w = pwidth[s]
        while j < n and px[j, 0] < s:
            j += 1
        while r + 1 < m and rx[r + 1, 0] <= s:
            r += 1
        if w == 0:
            out[0, i] = 0
        elif j < n and px[j, 0] == s:
            out[0, i] = px[j, 1]
        else:
            out[0, i] = np.int64(keys[s - 1])
        out[1, i] = w
        out[2, i] = rx[r, 2]


@dataclass(slots=True, eq=False)
class _JournalScan:
    """What `prepare_journal` reads of a tick's rows before placing them (`_scan_loop`, or
    `_scan_numpy` for the Python placer): the storing rows' pool store numbers, the (batch,
    tier) pairs (`(seq << 10) | (tier + 1)`: the values of its runs of rows, sorted, once each) and each row's,
    the pairs' batches and each pair's, and the counts and width codes' range the placer's
    room and checks need."""

    store_local: np.ndarray
    pairs: np.ndarray
    of_pair: np.ndarray
    batches: np.ndarray
    batch_of_pair: np.ndarray
    num_stored: int
    num_cleared: int
    width_range: tuple[int, int]
    stores_counting: bool = False  # the storing rows' store numbers count up by one


def _scan_numpy(op: np.ndarray, seq: np.ndarray, tier: np.ndarray, store: np.ndarray,
                width: np.ndarray) -> _JournalScan:
    """`_scan_loop` with numpy (the Python placer's)."""
    is_st = op == OP_STORED
    pairs, of_pair = _unique_runs(seq * 1024 + (tier + 1))
    batches, batch_of_pair = _unique_runs(pairs >> 10)
    wr = (int(width.min()), int(width.max())) if len(width) else (0, 0)
    local = store[is_st].astype(np.int64)
    return _JournalScan(local, pairs, of_pair, batches, batch_of_pair, int(np.count_nonzero(is_st)),
                        int(np.count_nonzero(op == OP_CLEARED)), wr, bool((np.diff(local) == 1).all()))


def _scan_loop(op, seq, tier, store, width, store_local, pairs, of_pair, batches, batch_of_pair,
               st):  # pragma: no cover - compiled
    """`_scan_numpy` in one pass (compiled): the runs of equal pairs, then, when the runs do
    not ascend (a batch's tiers interleave), their values sorted and numbered as `np.unique`
    numbers them. st: stores, clears, the width codes' least and most, pairs, batches, and 1
    if the stores' numbers count up by one."""
    n_st = 0
    counting = 1
    n_clear = 0
    wmin = width[0] if len(width) else 0
    wmax = wmin
    m = -1
    ascend = True
    for i in range(len(op)):
        o = op[i]
        if o == 0:
            store_local[n_st] = store[i]
            if n_st and store[i] != store_local[n_st - 1] + 1:
                counting = 0
            n_st += 1
        elif o == 2:
            n_clear += 1
        w = width[i]
        if w < wmin:
            wmin = w
        if w > wmax:
            wmax = w
        v = seq[i] * 1024 + tier[i] + 1
        if m < 0 or v != pairs[m]:
            if m >= 0 and v < pairs[m]:
                ascend = False
            m += 1
            pairs[m] = v
        of_pair[i] = m
    if not ascend:
        order = np.argsort(pairs[:m + 1])
        number = np.empty(m + 1, np.int64)  # per run, its value's place among the values
        u = -1
        for j in range(m + 1):
            v = pairs[order[j]]
            if u < 0 or v != batch_of_pair[u]:
                u += 1
                batch_of_pair[u] = v  # (as scratch: the sorted values)
            number[order[j]] = u
        for j in range(u + 1):
            pairs[j] = batch_of_pair[j]
        for i in range(len(op)):
            of_pair[i] = number[of_pair[i]]
        m = u
    nb = 0
    for j in range(m + 1):
        b = pairs[j] >> 10
        if nb == 0 or b != batches[nb - 1]:
            batches[nb] = b
            nb += 1
        batch_of_pair[j] = nb - 1
    st[0] = n_st
    st[1] = n_clear
    st[2] = wmin
    st[3] = wmax
    st[4] = m + 1
    st[5] = nb
    st[6] = counting


class _Placer:
    """The slot of each stored copy, as `PoolProjection` chooses it for the reference's
    events: the newest vacant slot, else a new one; a removal frees its pool slot's oldest
    copy; a clear a stream's held slots (all of them when no other stream holds any); a
    "rank" here is the stream's `stream_code`, a slot the (pool, slot) number `slot_ids` gives."""

    def __init__(self) -> None:
        self.vacant: list[int] = []
        self.copies: dict[tuple[int, int], list[int]] = {}  # (rank, pool slot) -> log blocks, oldest first
        self.block_rank: list[int] = []
        self.block_copy: list[tuple[int, int]] = []
        self.block_tenant: list[int] = []  # tenant code (journal's: index + 1, 0 none) set at the store
        self.by_hash: dict[tuple[int, int], list[int]] = {}  # (hash key, width) -> blocks, in store order
        self.block_hash: list[tuple[int, int]] = []
        self.cur: list[int] = []  # per log block, the hash id it holds (-1: vacant)


def _place(pl: _Placer, nb0: int, ops: list, slots: list, keys: list, rank: int, stores: list,
           r0: int, hashes: list, parents: list, tenants: list) -> tuple[np.ndarray, list, list, int]:
    """The rows of the journal's rows: (kind, event index, event index, block, hash id, a,
    event index, flag), the columns the caller fills from the event index marked so; each
    store's tenant, the row each new block is first stored at, and the blocks after."""
    nb = nb0
    cur = pl.cur
    cur.extend([-1] * (nb0 + ops.count(OP_STORED) - len(cur)))
    born: list[int] = []  # the row each slot made here is first stored at
    out: list[tuple[int, ...]] = []
    vacant, copies, brank, bcopy = pl.vacant, pl.copies, pl.block_rank, pl.block_copy
    by_hash, bhash, btenant = pl.by_hash, pl.block_hash, pl.block_tenant
    store_tenants: list[int] = []  # per store here: its tenant as PoolProjection sets it
    for i in range(len(ops)):
        o = ops[i]
        if o == OP_STORED:
            b = -1
            while vacant:
                c = vacant.pop()
                if cur[c] < 0:
                    b = c
                    break
            if b < 0:
                b = nb
                nb += 1
                born.append(r0 + len(out))
                brank.append(rank)
                bcopy.append((rank, -1))
                bhash.append((0, 0))
                btenant.append(0)
            k = (rank, slots[i])
            lst = copies.get(k)
            if lst is None:
                copies[k] = [b]
            else:
                lst.append(b)
            brank[b], bcopy[b] = rank, k
            cur[b] = keys[i]
            # the tenant: the store's salt at a root or under a parent no slot holds, else the
            # parent's holder's (PoolProjection._on_stored)
            parent = parents[i]
            holders = by_hash.get(parent) if parent is not None else None
            t = btenant[holders[0]] if holders else tenants[i]
            btenant[b] = t
            store_tenants.append(t)
            h = hashes[i]
            bhash[b] = h
            got = by_hash.get(h)
            if got is None:
                by_hash[h] = [b]
            else:
                got.append(b)
            out.append((STORED, i, i, b, keys[i], 0, i, 1))
        elif o == OP_REMOVED:
            lst = copies.get((rank, slots[i])) if slots[i] >= 0 else None
            b = -1
            if lst:
                b = lst.pop(0)
                cur[b] = -1
                vacant.append(b)
                _unhold(by_hash, bhash[b], b)
            out.append((EVICTED, i, i, b, keys[i], 0, i, 0))
        else:  # a clear: the rank's held slots, every tier (as PoolProjection applies a CacheReset)
            held = [b for b in range(nb) if cur[b] >= 0]
            if any(brank[b] != rank for b in held):
                held = [b for b in held if brank[b] == rank]
            for b in held:
                out.append((RESET, i, i, b, int(cur[b]), stores[i], i, 0))
                cur[b] = -1
                vacant.append(b)
                lst = copies.get(bcopy[b])
                if lst is not None and b in lst:
                    lst.remove(b)
                _unhold(by_hash, bhash[b], b)
            if not held:
                out.append((RESET, i, i, -1, -1, stores[i], i, 0))
    return np.array(out, np.int64).reshape(-1, 8), store_tenants, born, nb


def _unhold(by_hash: dict, h: tuple[int, int], b: int) -> None:
    got = by_hash.get(h)
    if got is not None and b in got:
        got.remove(b)
        if not got:
            del by_hash[h]


def journal_log(block_size: int = 16, compiled: bool = True, **options: Any) -> Any:
    """A `LiveColumnarLog` for `append_journal` (hash ids and stores read from the pools);
    `compiled=False` places copies with the Python loop (the compiled one is held to it)."""
    from engine.core.live_log import LiveColumnarLog, _compiled_journal_loop

    _compiled_journal_loop()  # its ticks' series and live pool pass, loaded (or compiled) now, not at a tick
    log = LiveColumnarLog(0, block_size, **options)
    keys = JournalKeys()
    log.columnar.keys = keys
    log.columnar.store_attributes = JournalStores(keys, compiled)
    log.columnar.journal_fed = True
    return log


# A placed block's record: one row of `_CompiledPlacer.blocks`, so what a store or a removal
# reads and writes of a block is one or two cache lines (20 bytes while int32), not one per
# array: the placer's state outgrows the caches, and the loop waited on a miss per field.
# B_CODE_LO, B_CODE_HI and B_LNEXT come last: a placer that keeps no table of hashes keeps no
# such fields (8 bytes a record, not 20): only a lookup in the table reads a record's hash,
# and the log's key table (`JournalKeys`) has every hash id's code (`_CompiledPlacer._codes`).
B_CUR, B_OWN, B_CODE_LO, B_CODE_HI, B_LNEXT = range(5)
NUM_BARE_FIELDS = B_CODE_LO  # a record's fields while no table is kept
# ... and B_CUR alone while every record's B_OWN is one value, kept once (`state[10]`): one
# server's rank storing 8-byte hashes with no tenant, as an attach mostly is (4 bytes a block)
# B_OWN holds tenant << (RB + 2) | rank << 2 | the width code of the block's hash (0, 1 or 2:
# colpool's W_*), RB the placer's rank bits (`state[7]`, more when a higher rank comes);
# B_CUR the hash id it holds (-1: vacant); B_LNEXT its hash's next holder. Its slot is not
# kept: only a clear needs it, and a clear mends every slot's FIFO at once. A record's slot's
# next copy is not in the record: the copies' table (`_CompiledPlacer.cp`) has it for each
# record that has one, an entry made by a store to a slot that holds a copy already (vLLM
# keeps a physical block per request that computed it: two requests of one step with one
# prompt make copies, which the next eviction mostly takes). A slot without copies is its
# one record; a record without a next copy costs nothing (4 bytes a block where a record
# kept its next, -1 nearly always). The copies' table is an open-addressing table of int64
# entries (linear probing, at most TABLE_LOAD full): _cp_tag(record) << 32 | its next copy,
# -1 empty; `state[9]` counts its entries (no probe while it is 0).
# An entry of the table of hashes (`_CompiledPlacer.table`, int64): the hash's tag
# (`_ht_tag`, whose high bits choose its home entry: `_ht_home`) << 32 | its oldest holder; -1 is
# empty. The (code, width) a tag stands for is the holder's record's: 8 bytes an entry, not 13.
HOLDER_BITS = 0xFFFFFFFF
# The table of hashes is kept at most TABLE_LOAD full and grown by an eighth (any length, not
# a power of two: at twice the hashes held, a power of two was 16 to 32 bytes a hash). Half,
# not two thirds: 4 bytes more a hash held, and the headless route's placing 0.082 -> 0.075 s
# per 100K vLLM events (its probes at a full pool's churn; route 234K -> 244K events/s, medians
# of 5 alternated in one process, 2026-12-04).
TABLE_LOAD = 0.5
# ... by a quarter while it stays this small (2 MB): each growth writes a new table and rehashes
# the old, and an attach's first 100K vLLM events grew a table of ~2**17 entries some 40
# times by an eighth (~5 ms of the placing thread's CPU); a quarter's room is at most 0.5 MB.
SMALL_TABLE = 1 << 18


def _place_loop(ops, pslots, key0, hcode, hwide, pcode, pwide, tenants, stores, rank, r0, seq0, store0, of_pair,
                batch_of_pair, blocks, fifo, cp, vacant, table, state, out, table_pair, table_batch, born,
                store_tenants, slots_out):  # pragma: no cover - compiled
    """`_place` over arrays (compiled by numba): the same choices, the same rows, and what
    `prepare_journal` adds to them: each row's seq (`seq0` on) and a store's id (`store0` on),
    its (batch, tier) pair and batch (`table_pair`, `table_batch`), and the block of each
    stored and removed row (`slots_out`, -1: none), what the overlay follows. Row i's hash id is
    `key0 + i`; `pcode`, `pwide` and `tenants` are per store, in the rows' order.

    state: [vacant top, blocks, rows out, born count, stores seen, hashes in the table,
    stored and removed rows, B_OWN's rank bits, 1 once the table is kept (`_make_table`:
    till then no hash is looked up, and every block's tenant is its store's own, none),
    entries of the copies' table, the B_OWN of every record while `blocks` keeps none
    (one field, B_CUR: `_CompiledPlacer.own_column`; -1 before a first store)].
    `blocks` holds a record per block (B_*); per placer slot (`JournalStores.slot_ids`) a FIFO
    of its copies (`fifo`: its oldest, then each one's next in the copies' table `cp`)
    gives a removal its oldest copy; per hash
    a FIFO of holders (`table`: (hash code, width) -> its oldest holder, then B_LNEXT) gives a
    store its parent's holder. A hash whose last holder goes leaves the table: it holds the
    hashes held now, not every hash ever stored (a table that outgrew the caches cost a miss
    a probe)."""
    _fetch_ahead(ops, pslots, hcode, hwide, pcode, pwide, blocks, fifo, vacant, table, state)
    keep = state[8] != 0
    bare = blocks.shape[1] == 1  # no B_OWN: every record's is state[10] (`_CompiledPlacer.own_column`)
    nb = state[1]
    rb = state[7]
    ranks = (1 << rb) - 1
    o_n = 0
    b_n = 0
    s_n = 0
    m_n = 0
    for i in range(len(ops)):
        o = ops[i]
        if o == 0:
            b = -1
            while state[0] > 0:
                state[0] -= 1
                c = vacant[state[0]]
                if blocks[c, B_CUR] < 0:
                    b = c
                    break
            if b < 0:
                b = nb
                nb += 1
                born[b_n] = r0 + o_n
                b_n += 1
            s = pslots[i]
            code = hcode[i]
            wide = hwide[i]
            if not bare:
                blocks[b, B_OWN] = (rank << 2) | wide  # its tenant below, once its parent is looked up
            x = fifo[s]
            if x < 0:
                fifo[s] = b
            else:  # after the slot's last copy (mostly none: a slot's copy goes before it is stored
                # again; `place_rows` made room in `cp` for the call's copies: `_copies_ahead`)
                y = _cp_next(cp, x) if state[9] else -1
                while y >= 0:
                    x = y
                    y = _cp_next(cp, x)
                _cp_link(cp, x, b, state)
            blocks[b, B_CUR] = key0 + i
            t = tenants[s_n]
            if keep and pwide[s_n] > 0:
                e = table[_ht_slot(table, blocks, pcode[s_n], pwide[s_n])]
                if e != -1:
                    t = blocks[e & HOLDER_BITS, B_OWN] >> (rb + 2)
            if not bare:
                blocks[b, B_OWN] = (t << (rb + 2)) | (rank << 2) | wide
            store_tenants[s_n] = t
            if keep:
                blocks[b, B_CODE_LO] = _low_half(code)
                blocks[b, B_CODE_HI] = code >> 32
                blocks[b, B_LNEXT] = -1  # appended at the end of the hash's holders
                _ht_hold(table, blocks, b, code, wide, state)
            _put_row(out, table_pair, table_batch, o_n, 4, i, b, key0 + i, store0 + s_n, 1, seq0, of_pair,
                     batch_of_pair)
            o_n += 1
            s_n += 1
            slots_out[m_n] = b
            m_n += 1
        elif o == 1:
            b = -1
            s = pslots[i]
            if s >= 0 and fifo[s] >= 0:
                b = fifo[s]
                fifo[s] = _cp_take(cp, b, state) if state[9] else -1
                blocks[b, B_CUR] = -1
                vacant[state[0]] = b
                state[0] += 1
                if keep:
                    _unlink_hash(b, blocks, table, state)
            _put_row(out, table_pair, table_batch, o_n, 7, i, b, key0 + i, 0, 0, seq0, of_pair, batch_of_pair)
            o_n += 1
            slots_out[m_n] = b
            m_n += 1
        else:
            others = False
            for x in range(nb):
                if blocks[x, B_CUR] >= 0 and ((state[10] if bare else blocks[x, B_OWN]) >> 2) & ranks != rank:
                    others = True
                    break
            any_held = False
            for x in range(nb):
                if blocks[x, B_CUR] >= 0 and (not others or ((state[10] if bare else blocks[x, B_OWN]) >> 2) & ranks
                                              == rank):
                    any_held = True
                    _put_row(out, table_pair, table_batch, o_n, 10, i, x, blocks[x, B_CUR], stores[i], 0, seq0,
                             of_pair, batch_of_pair)
                    o_n += 1
                    blocks[x, B_CUR] = -1
                    vacant[state[0]] = x
                    state[0] += 1
                    if keep:
                        _unlink_hash(x, blocks, table, state)
            if any_held:
                _mend_fifos(fifo, blocks, cp, state)
            else:
                _put_row(out, table_pair, table_batch, o_n, 10, i, -1, -1, stores[i], 0, seq0, of_pair,
                         batch_of_pair)
                o_n += 1
    state[1] = nb
    state[2] = o_n
    state[3] = b_n
    state[4] = s_n
    state[6] = m_n


def _ht_hold(table, blocks, b, code, wide, state):  # pragma: no cover - compiled
    """Block `b` (holding (`code`, `wide`)) last among its hash's holders; a hash no block
    held enters the table."""
    h = _ht_slot(table, blocks, code, wide)
    e = table[h]
    if e == -1:
        table[h] = (_ht_tag(code, wide) << 32) | b
        state[5] += 1
    else:
        x = e & HOLDER_BITS
        while blocks[x, B_LNEXT] >= 0:
            x = blocks[x, B_LNEXT]
        blocks[x, B_LNEXT] = b


def _ht_build(blocks, nb, table, state):  # pragma: no cover - compiled
    """Every held block of the first `nb` records in `table` (empty), in block order."""
    for x in range(nb):
        if blocks[x, B_CUR] >= 0:
            blocks[x, B_LNEXT] = -1
            _ht_hold(table, blocks, x, _joined(blocks[x, B_CODE_LO], blocks[x, B_CODE_HI]), blocks[x, B_OWN] & 3,
                     state)


def _put_row(out, table_pair, table_batch, o, kind, i, b, key, a, flag, seq0, of_pair,
             batch_of_pair):  # pragma: no cover - compiled
    """Row `o` of the placer's table, every column (`ColumnarLog.write_rows`' layout: the
    request and info the commit writes), made by journal row `i`."""
    out[o, 0] = kind
    out[o, 1] = seq0 + i
    out[o, 2] = i
    out[o, 3] = b
    out[o, 4] = key
    out[o, 5] = a
    out[o, 6] = 0
    out[o, 7] = flag
    p = of_pair[i]
    table_pair[o] = p
    table_batch[o] = batch_of_pair[p]


def _fetch_ahead(ops, pslots, hcode, hwide, pcode, pwide, blocks, fifo, vacant, table,
                 state):  # pragma: no cover - compiled
    """Ask, before the placing pass, for the lines it will need, in three passes of
    prefetches (`_prefetch`: no wait), each reading only what the one before brought: the
    vacant blocks stores take, each row's slot (`fifo`) and hash entries, a parent's; then the
    blocks those name (a slot's tail or oldest copy, a parent's holder); then the hash entry
    of each block a removal takes. The placing pass follows chains of reads (a slot's head,
    then its block, then its hash's entry) and so waits on each miss in turn; here the rows
    are independent. The state outgrows the caches (a 56K-block pool: 4 MB) and is mostly
    evicted between ticks. `pcode`, `pwide`: per store."""
    size = len(table)
    keep = state[8] != 0  # no table kept: no hash looked up (`_place_loop`)
    for j in range(state[0] - 1, max(-1, state[0] - 1 - len(ops)), -1):  # the vacant blocks stores take
        _prefetch_record(blocks, vacant[j])
    s_n = 0
    for i in range(len(ops)):
        if ops[i] == 0:
            _prefetch(fifo, pslots[i])
            if keep:
                _prefetch(table, _ht_home(_ht_tag(hcode[i], hwide[i]), size))
                if pwide[s_n] > 0:
                    _prefetch(table, _ht_home(_ht_tag(pcode[s_n], pwide[s_n]), size))
            s_n += 1
        elif ops[i] == 1 and pslots[i] >= 0:
            _prefetch(fifo, pslots[i])
    s_n = 0
    for i in range(len(ops)):
        if ops[i] == 0:
            t = fifo[pslots[i]]  # a store's slot's oldest copy: mostly its last too
            if t >= 0:
                _prefetch_record(blocks, t)
            if keep and pwide[s_n] > 0:
                e = table[_ht_home(_ht_tag(pcode[s_n], pwide[s_n]), size)]
                if e != -1:
                    _prefetch_record(blocks, e & HOLDER_BITS)
            s_n += 1
        elif ops[i] == 1 and pslots[i] >= 0:
            b = fifo[pslots[i]]
            if b >= 0:
                _prefetch_record(blocks, b)
    for i in range(len(ops)):
        if keep and ops[i] == 1 and pslots[i] >= 0:
            b = fifo[pslots[i]]
            if b >= 0:
                code = _joined(blocks[b, B_CODE_LO], blocks[b, B_CODE_HI])
                _prefetch(table, _ht_home(_ht_tag(code, blocks[b, B_OWN] & 3), size))


def _prefetch_record(blocks, b):  # pragma: no cover - compiled
    """`_prefetch` of block `b`'s record, both its cache lines: a record of 24 bytes crosses
    a line's end at one block in four, and a fetch of its first line only left a wait on the
    second (a churning pool's placing was a quarter slower)."""
    _prefetch(blocks, b)
    _prefetch_at(blocks, b, blocks.shape[1] - 1)


def _low_half(code):  # pragma: no cover - compiled
    """The low 32 bits of `code` as a signed int32 value (the high ones: `code >> 32`)."""
    return ((code & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _joined(lo, hi):  # pragma: no cover - compiled
    """The code whose halves `_low_half` and `>> 32` gave `lo` and `hi`."""
    return (np.int64(hi) << 32) | (np.int64(lo) & 0xFFFFFFFF)


def _ht_slot(table, blocks, code, wide):  # pragma: no cover - compiled
    """The entry of (`code`, `wide`) in the open-addressing `table` (linear probing, at most
    TABLE_LOAD full), or the empty one where it would go. An array table, not a typed dict: a
    lookup is a multiply and (mostly) one cache line; an entry whose tag matches is checked
    against its holder's record (which the caller reads next: a parent's tenant, a removal's
    own record)."""
    size = len(table)
    tag = _ht_tag(code, wide)
    h = _ht_home(tag, size)
    lo = _low_half(code)
    hi = code >> 32
    while True:
        e = table[h]
        if e == -1:
            return h
        if (e >> 32) & HOLDER_BITS == tag:
            x = e & HOLDER_BITS
            if blocks[x, B_CODE_LO] == lo and blocks[x, B_CODE_HI] == hi and blocks[x, B_OWN] & 3 == wide:
                return h
        h += 1
        if h == size:
            h = 0


def _ht_tag(code, wide):  # pragma: no cover - compiled
    """(`code`, `wide`) mixed to 32 bits: its entry's tag, whose high bits choose its home entry."""
    h = code * -7046029254386353131 + wide  # wraps: 0x9E3779B97F4A7C15 mixes the bits
    return (h ^ (h >> 29)) & HOLDER_BITS


def _ht_home(tag, size):  # pragma: no cover - compiled
    """The home entry of `tag` in a table of `size` entries (below 2**31): the tag scaled to
    the size (a multiply and a shift, not a modulo), so the table is any length and a
    rehash writes the entries in the order it reads them."""
    return (tag * size) >> 32


def _ht_rehash(table, grown):  # pragma: no cover - compiled
    size = len(grown)
    for i in range(len(table)):
        e = table[i]
        if e != -1:
            h = _ht_home((e >> 32) & HOLDER_BITS, size)
            while grown[h] != -1:
                h += 1
                if h == size:
                    h = 0
            grown[h] = e


def _ht_delete(table, h):  # pragma: no cover - compiled
    """Empty entry `h`, the entries after it in its probe run moved back where their own probe
    passes it (linear probing's deletion: no tombstones, so probes stay short)."""
    size = len(table)
    i = h
    j = h
    while True:
        j += 1
        if j == size:
            j = 0
        e = table[j]
        if e == -1:
            break
        k = _ht_home((e >> 32) & HOLDER_BITS, size)  # its home
        if (j > i and (k <= i or k > j)) or (j < i and k <= i and k > j):  # home not in (i, j]
            table[i] = e
            i = j
    table[i] = -1


def _unlink_hash(b, blocks, table, state):  # pragma: no cover - compiled
    """`b` out of its hash's holders; a hash left with none leaves the table."""
    h = _ht_slot(table, blocks, _joined(blocks[b, B_CODE_LO], blocks[b, B_CODE_HI]), blocks[b, B_OWN] & 3)
    e = table[h]
    x = -1 if e == -1 else e & HOLDER_BITS
    if x == b:
        if blocks[b, B_LNEXT] < 0:
            _ht_delete(table, h)
            state[5] -= 1
        else:
            table[h] = ((e >> 32) << 32) | blocks[b, B_LNEXT]
        return
    while x >= 0:
        prev = x
        x = blocks[x, B_LNEXT]
        if x == b:
            blocks[prev, B_LNEXT] = blocks[b, B_LNEXT]
            return


def _number_slots(table, slot, out, num):  # pragma: no cover - compiled
    """`JournalStores.slot_ids` in one pass (compiled): a pool slot `table` has no number for
    (-1) gets the next, in slot order; `out` each row's number (-1 stays -1). The numbers
    given after this call."""
    fresh = np.empty(len(slot), np.int64)
    n = 0
    for i in range(len(slot)):
        s = slot[i]
        if s >= 0 and table[s] == -1:
            table[s] = -2  # met: once in `fresh`
            fresh[n] = s
            n += 1
    fresh = np.sort(fresh[:n])
    for j in range(n):
        table[fresh[j]] = num + j
    for i in range(len(slot)):
        s = slot[i]
        out[i] = table[s] if s >= 0 else -1
    return num + n


def _slot_run(slot, lo, have, offset, out):  # pragma: no cover - compiled
    """`JournalStores.slot_ids` while a pool's slots lo..have-1 are numbered offset + slot:
    if none is below `lo` (-1 aside) and those at `have` or past skip few (at most an eighth
    of those met, and 64), each row's number into `out` (-1 stays -1) and the slots numbered
    after (one past the run's last); else -1."""
    top = have
    for i in range(len(slot)):
        s = slot[i]
        if 0 <= s < lo:
            return -1
        if s >= top:
            top = s + 1
    if top > have:
        met = np.zeros(top - have, np.bool_)
        k = 0
        for i in range(len(slot)):
            s = slot[i]
            if s >= have and not met[s - have]:
                met[s - have] = True
                k += 1
        if top - have > k + (k >> 3) + 64:
            return -1
    for i in range(len(slot)):
        s = slot[i]
        out[i] = offset + s if s >= 0 else -1
    return top


def _mend_fifos(fifo, blocks, cp, state):  # pragma: no cover - compiled
    """Each slot's FIFO without the copies a clear just made vacant (B_CUR -1): every copy
    a FIFO holds is held until then, and a record does not keep its slot (the copies' table
    empty: a slot's one copy at most)."""
    for s in range(len(fifo)):
        x = fifo[s]
        if x < 0:
            continue
        if not state[9]:
            if blocks[x, B_CUR] < 0:
                fifo[s] = -1
            continue
        while x >= 0 and blocks[x, B_CUR] < 0:
            x = _cp_take(cp, x, state)
        fifo[s] = x
        while x >= 0:
            y = _cp_next(cp, x)
            if y < 0:
                break
            if blocks[y, B_CUR] < 0:  # vacant: x's next is the one after it
                z = _cp_take(cp, y, state)
                if z >= 0:
                    _cp_link(cp, x, z, state)
                else:
                    _cp_take(cp, x, state)
                continue
            x = y


def _cp_tag(x):  # pragma: no cover - compiled
    """Record `x`'s tag in the copies' table: `x` times an odd number, mod 2**32 (one record
    a tag), whose high bits choose its home entry (`_ht_home`)."""
    return (x * 2654435761) & HOLDER_BITS


def _cp_find(cp, x):  # pragma: no cover - compiled
    """The entry of record `x` in the copies' table, or the empty one where it would go."""
    size = len(cp)
    tag = _cp_tag(x)
    h = _ht_home(tag, size)
    while True:
        e = cp[h]
        if e == -1 or (e >> 32) & HOLDER_BITS == tag:
            return h
        h += 1
        if h == size:
            h = 0


def _cp_next(cp, x):  # pragma: no cover - compiled
    """Record `x`'s slot's next copy, -1 none."""
    e = cp[_cp_find(cp, x)]
    return -1 if e == -1 else e & HOLDER_BITS


def _cp_link(cp, x, y, state):  # pragma: no cover - compiled
    """Record `y` the next copy after record `x`."""
    h = _cp_find(cp, x)
    if cp[h] == -1:
        state[9] += 1
    cp[h] = (_cp_tag(x) << 32) | y


def _cp_take(cp, x, state):  # pragma: no cover - compiled
    """Record `x`'s next copy (-1 none), and its entry gone."""
    h = _cp_find(cp, x)
    e = cp[h]
    if e == -1:
        return -1
    _ht_delete(cp, h)
    state[9] -= 1
    return e & HOLDER_BITS


def _copies_ahead(ops, pslots, fifo, was, exact):  # pragma: no cover - compiled
    """At most how many copies placing these rows makes (stores to a slot holding one): the
    rows followed on the slots' FIFOs, a store marking its slot held (-2; -4 once it may
    hold more than one), a removal of a slot with one copy emptying it (-3) when `exact`
    (no slot holds more than one now), and the FIFOs put back as they were (`was`: room for
    two values a row). A clear's rows count as freeing nothing."""
    for i in range(len(ops)):  # the slots' lines asked for side by side first (`_fetch_ahead`)
        if pslots[i] >= 0:
            _prefetch(fifo, pslots[i])
    count = 0
    n = 0
    for i in range(len(ops)):
        o = ops[i]
        if o == 2:
            continue
        s = pslots[i]
        if s < 0:
            continue
        x = fifo[s]
        if x >= -1:  # not marked yet: kept to put back
            was[n] = s
            n += 1
            was[n] = x
            n += 1
        if o == 0:
            if x >= 0 or x == -2 or x == -4:
                count += 1
                fifo[s] = -4
            else:
                fifo[s] = -2
        elif exact and (x >= 0 or x == -2):
            fifo[s] = -3
    for j in range(n - 2, -1, -2):
        fifo[was[j]] = was[j + 1]
    return count


class _CompiledPlacer:
    """`_Placer`'s state as arrays for `_place_loop` (grown here, between calls): a record per
    block (`blocks`, B_*), the oldest copy of each slot (`fifo`), the stack of vacant blocks,
    all int32 (a block's record 8 B), each widened once to int64 before a number it must
    hold would not fit (`_fit`); and the table of hashes held (int64 entries) with each
    record's hash code and next holder of its hash (B_CODE_LO, B_CODE_HI, B_LNEXT: 12 B more
    a record), made at the first store that names a tenant (`state[8]`, `_make_table`): it
    finds a parent's holder for its tenant, and until then every holder's tenant is none, so
    each store's is its own (a stream that names no tenant, as vLLM's mostly do, keeps
    neither: 12 to 14 bytes a hash held, and no probe of the table a store or removal).

    `keys`, the log's `JournalKeys` (given by `JournalStores`), has the held blocks' codes
    when the table is made; the codes of hash ids it does not have yet (placed, not yet
    committed) are kept here until it does (`_recent`, dropped by `committed`, which the
    commit calls on its thread: this one only appends to it). A placer without one keeps
    every call's codes (a test's, placing arrays)."""

    def __init__(self, keys: JournalKeys | None = None) -> None:
        (self.loop, self.rehash, self.number_slots, self.scan_loop, self.fields_loop, self.build,
         self.slot_run, self.copies_ahead) = _compiled()
        self.state = np.zeros(11, np.int64)
        self.state[7] = 4  # B_OWN's rank bits: 16 streams, more when a higher rank comes (`_own_bits`)
        self.state[10] = -1  # every record's B_OWN while `blocks` keeps none: none yet
        self.most_tenant = 0  # the highest tenant code a record holds
        # B_CUR alone while every record's B_OWN is one (`own_column`); all five B_* once the table is kept
        self.blocks = np.full((0, 1), -1, np.int32)
        self.keys = keys
        # (first hash id, its rows' codes as int64) of each call placed, oldest first, until
        # `keys` has them (`committed`): what `_codes` reads past them. Appended on the placing
        # thread, dropped from the left on the committing one (a deque does both atomically)
        self._recent: deque[tuple[int, np.ndarray]] = deque()
        self.fifo = np.full(0, -1, np.int32)
        # the copies' table: each record's slot's next copy, if any; 32 KB, so that a call of
        # up to 2,047 stores (an attach's tick: ~600) has room for its copies uncounted
        self.cp = np.full(4096, -1, np.int64)
        self.vacant = np.zeros(0, np.int32)
        self.table = np.full(1024, -1, np.int64)  # kept at most TABLE_LOAD full

    def _fit(self, name: str, n: int, fill: int = 0, top: int = 0) -> None:
        """The array `self.<name>` at least `n` rows long, grown by an eighth (as colpool's
        arrays: a placer's arrays grow with every block held, and doubling left up to half of
        them unused) where it lies (realloc, as colpool's `_grow_rows`: the old and the grown
        array were both held at the peak, and the freed one stayed in the heap), the new rows
        `fill`. An int32 array is made int64 once a number it will hold (any below `top`)
        would not fit."""
        a = getattr(self, name)
        wide = a.dtype == np.int32 and top > _I32_TOP
        if len(a) >= n and not wide:
            return
        if wide:
            setattr(self, name, a.astype(np.int64))
        have, rows = len(a), max(n, len(a) + len(a) // 8)
        del a
        try:
            getattr(self, name).resize((rows, *getattr(self, name).shape[1:]))
        except ValueError:  # another reference to it (numpy checks): copied, as that one keeps the old
            old = getattr(self, name)
            grown = np.empty((rows, *old.shape[1:]), old.dtype)
            grown[:have] = old
            setattr(self, name, grown)
        getattr(self, name)[have:] = fill

    def _make_table(self, nb: int, n_store: int) -> None:
        """The table of hashes of the first `nb` records, made at the first store that names
        a tenant: each held block joins its hash's holders in block order, not in the order
        they were stored, which no lookup tells apart (every one of them has no tenant, and a
        lookup reads only the oldest holder's tenant); later stores join after them."""
        cur = self.blocks[:nb, B_CUR]
        on = np.flatnonzero(cur >= 0)
        # each record's hash code (its halves) and next holder of its hash, fields of their own
        # from now on (-1: the last holder; a vacant record's code is written at its next store)
        self.own_column()
        grown = np.full((len(self.blocks), B_LNEXT + 1), -1, self.blocks.dtype)
        grown[:, :NUM_BARE_FIELDS] = self.blocks
        code = self._codes(cur[on].astype(np.int64))
        grown[on, B_CODE_LO] = ((code & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000  # `_low_half`
        grown[on, B_CODE_HI] = code >> 32
        self.blocks = grown
        self._recent = deque()  # the records keep the codes from now on
        held = len(on)
        self.table = np.full(max(1024, int((held + n_store) / TABLE_LOAD) + 1), -1, np.int64)
        self.state[5] = 0
        self.build(self.blocks, nb, self.table, self.state)
        self.state[8] = 1

    def _codes(self, ids: np.ndarray) -> np.ndarray:
        """The hash code (int64) of each hash id of `ids`: the log's key table's for the ids
        it has, else a kept call's (`_recent`)."""
        out = np.zeros(len(ids), np.int64)
        kept = list(self._recent)  # first: a call dropped after this is in `keys` by the next line
        known = len(self.keys) if self.keys is not None else 0
        old = ids < known
        if old.any():
            out[old] = self.keys.keys_of(ids[old]).view(np.int64)
        new = np.flatnonzero(~old)
        if len(new):
            firsts = np.array([k0 for k0, _ in kept], np.int64)
            sizes = np.array([len(c) for _, c in kept], np.int64)
            at = np.searchsorted(firsts, ids[new], side="right") - 1
            if not len(firsts) or (at < 0).any() or (ids[new] >= (firsts + sizes)[np.maximum(at, 0)]).any():
                raise ValueError("a held block's hash id is neither in the log's keys nor in a call kept")
            codes = np.concatenate([c for _, c in kept])
            offset = np.concatenate(([0], np.cumsum(sizes)[:-1]))  # each call's first in `codes`
            out[new] = codes[offset[at] + ids[new] - firsts[at]]
        return out

    def committed(self, known: int) -> None:
        """The log's keys have the first `known` hash ids: the calls kept below them go (on
        the committing thread only)."""
        recent = self._recent
        while recent and recent[0][0] + len(recent[0][1]) <= known:
            recent.popleft()

    def _own_bits(self, nb: int, rb: int) -> None:
        """B_OWN of the first `nb` records re-laid with `rb` rank bits (a rank that did not fit
        came: a stream's code counts the process's streams)."""
        old = int(self.state[7]) + 2
        if self.blocks.shape[1] == 1:  # one B_OWN for all (with no tenant, which the bits move)
            own = int(self.state[10])
            if own >= 0:
                self.state[10] = ((own >> old) << (rb + 2)) | (own & ((1 << old) - 1))
        else:
            own = self.blocks[:nb, B_OWN].astype(np.int64)
            self.blocks[:nb, B_OWN] = ((own >> old) << (rb + 2)) | (own & ((1 << old) - 1))
        self.state[7] = rb

    def own_column(self) -> None:
        """Give each record its B_OWN field (the one all held till now, `state[10]`): a store
        whose B_OWN differs comes (another rank, a hash of another width, a tenant)."""
        if self.blocks.shape[1] == 1:
            grown = np.empty((len(self.blocks), NUM_BARE_FIELDS), self.blocks.dtype)
            grown[:, B_CUR] = self.blocks[:, B_CUR]
            grown[:, B_OWN] = self.state[10]
            self.blocks = grown

    def _owns_alike(self, op: np.ndarray, hwide: np.ndarray, rank: int) -> bool:
        """Whether every store of a call (no table kept: its tenant is none) gives its record
        the B_OWN every record has (`state[10]`, set by the first store)."""
        wide = hwide[op == OP_STORED]
        if not len(wide):
            return True
        lo, hi = int(wide.min()), int(wide.max())
        own = (rank << 2) | lo
        if lo != hi or (self.state[10] >= 0 and own != self.state[10]):
            return False
        self.state[10] = own
        return True

    def scan(self, op: np.ndarray, seq: np.ndarray, tier: np.ndarray, store: np.ndarray,
             width: np.ndarray) -> _JournalScan:
        """What a tick's rows need before they are placed (`_JournalScan`), in one compiled pass."""
        n = len(op)
        out = np.empty((5, n), np.int64)
        st = np.zeros(7, np.int64)
        self.scan_loop(op, seq, tier, store, width, out[0], out[1], out[2], out[3], out[4], st)
        num_stored, num_cleared, wmin, wmax, num_pairs, num_batches, counting = st.tolist()
        return _JournalScan(out[0, :num_stored], out[1, :num_pairs], out[2], out[3, :num_batches],
                            out[4, :num_pairs], num_stored, num_cleared, (wmin, wmax), bool(counting))

    def store_fields(self, journal: Any, stores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(parent code, parent width, tenant) of each of `journal`'s pool stores `stores`, int64."""
        out = np.empty((3, len(stores)), np.int64)
        arrays = journal.per_store()
        parents = arrays.parent
        self.fields_loop(parents.keys, parents.px, arrays.tenant.rx, arrays.parent_width, stores, out)
        return out[0], out[1], out[2]

    def place_rows(self, nb0: int, op: np.ndarray, pslot: np.ndarray, key0: int, hcode: np.ndarray,
                   hwide: np.ndarray, pcode: np.ndarray, pwide: np.ndarray, tenants: np.ndarray,
                   stores: np.ndarray, rank: int, r0: int, seq0: int, store0: int,
                   scan: _JournalScan) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray, np.ndarray,
                                                np.ndarray]:
        """The rows of a tick's journal rows placed (`_place_loop`): the log's table, each
        store's tenant, the row each new block is born at, the blocks after, each table
        row's (batch, tier) pair and batch, and the block of each stored and removed row.
        `pcode`, `pwide`, `tenants` are per store."""
        n = len(op)
        if n and (scan.width_range[1] > 3 or scan.width_range[0] < 0):
            raise ValueError("a hash's width code must be 0 to 3 (engine.remote.colpool's W_* codes)")
        n_store, n_clear = scan.num_stored, scan.num_cleared
        top = nb0 + n_store
        width = int(pslot.max()) + 1 if n else 0
        if len(tenants) and int(tenants.min()) < 0:
            raise ValueError("a tenant code must be 0 or more (the journal's: its tenant's index + 1, 0 none)")
        rb = max(int(self.state[7]), rank.bit_length())
        if len(tenants):
            self.most_tenant = max(self.most_tenant, int(tenants.max()))
        # the bound of what a record holds: hash ids, blocks, tenant << (rb + 2) | rank << 2 | width
        most = max(key0 + n, top, (self.most_tenant + 1) << (rb + 2))
        self._fit("blocks", top, -1, most)
        if rb > self.state[7]:  # a rank past the bits: every record's tenant moved up
            self._own_bits(nb0, rb)
        self.state[1] = nb0
        if not self.state[8] and self.most_tenant:
            self._make_table(nb0, n_store)
        elif self.blocks.shape[1] == 1 and not self._owns_alike(op, hwide, rank):
            self.own_column()
        # the stack of vacant blocks: those now, and what this call's removals and clears free
        # (room for a row each was 2 bytes a block held at bench held's ticks of 524K stores)
        self._fit("vacant", int(self.state[0]) + n - n_store + n_clear * top, 0, top)
        if top >= HOLDER_BITS:
            raise ValueError(f"the placer holds at most {HOLDER_BITS - 1:,} blocks, not {top:,}")
        need = int((int(self.state[5]) + n_store) / TABLE_LOAD) + 1  # every hash held after this call
        if self.state[8] and need > len(self.table):
            have = len(self.table)
            size = max(need, have + have // (4 if have + have // 4 <= SMALL_TABLE else 8))
            if size >= 1 << 31:  # `_ht_home`'s product must fit 63 bits
                raise ValueError(f"the placer holds at most {int(TABLE_LOAD * (1 << 31)):,} hashes at once")
            grown = np.full(size, -1, np.int64)
            self.rehash(self.table, grown)
            self.table = grown
        self._fit("fifo", width, -1, top)
        entries = int(self.state[9])
        if int((entries + n_store) / TABLE_LOAD) + 1 > len(self.cp):
            # room in the copies' table for every copy this call may make, if each store were
            # one does not fit (a call of more than 2,047 stores): how many may be, counted
            more = self.copies_ahead(op, pslot, self.fifo, np.empty(2 * n, np.int64), not entries)
            need = int((entries + more) / TABLE_LOAD) + 1
            if need > len(self.cp):
                grown = np.full(max(need, 2 * len(self.cp)), -1, np.int64)
                self.rehash(self.cp, grown)
                self.cp = grown
        rows = n + n_clear * top
        # every column written by the loop; column-major, so the log's columns are copied from
        # contiguous ones (`ColumnarLog.write_rows`) and the commit's writes of two are too
        out = np.empty((8, rows), np.int64).T
        pairs = np.empty((2, rows), np.int64)
        born = np.zeros(max(1, n_store), np.int64)
        store_tenants = np.zeros(max(1, n_store), np.int64)
        slots = np.empty(n, np.int64)
        self.loop(op, pslot, key0, hcode, hwide, pcode, pwide, tenants, stores, rank, r0, seq0, store0, scan.of_pair,
                  scan.batch_of_pair, self.blocks, self.fifo, self.cp, self.vacant, self.table, self.state, out,
                  pairs[0], pairs[1], born, store_tenants, slots)
        if not self.state[8] and n:  # no table yet: these rows' codes until the log's keys have them
            # a copy: `hcode` is a view of the pool's journal rows, which would keep them all
            # (the pool drops them into a new array when it releases them; a view keeps the old)
            self._recent.append((key0, np.array(hcode, np.int64)))
        k = int(self.state[2])
        return (out[:k], store_tenants[:int(self.state[4])], born[:int(self.state[3])], int(self.state[1]),
                pairs[0, :k], pairs[1, :k], slots[:int(self.state[6])])

    def place(self, nb0: int, op: np.ndarray, pslot: np.ndarray, key: np.ndarray, hcode: np.ndarray,
              hwide: np.ndarray, pcode: np.ndarray, pwide: np.ndarray, tenants: np.ndarray, stores: np.ndarray,
              rank: int, r0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """`place_rows` given per row what it takes per store (`_place`'s arguments as
        arrays, consecutive hash ids), each row its own batch: (table, tenants, born, blocks)."""
        op = np.asarray(op, np.int64)
        n = len(op)
        key0 = int(key[0]) if n else 0
        if not np.array_equal(key, key0 + np.arange(n)):
            raise ValueError("the placer numbers hash ids in row order: key must count up by one")
        is_st = op == OP_STORED
        zeros = np.zeros(n, np.int64)
        scan = _scan_numpy(op, zeros, zeros, np.asarray(stores, np.int64), np.asarray(hwide, np.int64))
        got = self.place_rows(nb0, op, pslot, key0, hcode, hwide, np.ascontiguousarray(pcode[is_st]),
                              np.ascontiguousarray(pwide[is_st]), np.ascontiguousarray(tenants[is_st]), stores,
                              rank, r0, 0, 0, scan)
        return got[:4]


_PREFETCH: list[Any] = []
_PREFETCH_AT: list[Any] = []


def _prefetch_codegen(context, builder, aryty, ary, at):  # pragma: no cover - compiled
    """The call of llvm.prefetch on the address of `ary[at]`: a read (0), kept in every cache
    level (3), of data (1)."""
    from llvmlite import ir
    from numba.core import cgutils

    ptr = cgutils.get_item_pointer2(context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                                    strides=cgutils.unpack_tuple(builder, ary.strides), layout=aryty.layout,
                                    inds=at, wraparound=False)
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def prefetch_at_intrinsic() -> Any:
    """`_prefetch_at(arr, i, j)` for compiled code: `prefetch_intrinsic`'s ask for the cache
    line of arr[i, j] of a 2-D array (i and j must be valid: not checked)."""
    return made_once(_PREFETCH_AT, _make_prefetch_at)[0]


def _make_prefetch_at() -> list[Any]:
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def prefetch_at(typingctx, arr, i, j):  # pragma: no cover - compiled
        def codegen(context, builder, signature, args):
            aryty, ity, jty = signature.args
            ary = context.make_array(aryty)(context, builder, args[0])
            at = [context.cast(builder, args[1], ity, types.intp), context.cast(builder, args[2], jty, types.intp)]
            _prefetch_codegen(context, builder, aryty, ary, at)
            return context.get_dummy_value()
        return types.void(arr, i, j), codegen

    return [prefetch_at]


def prefetch_intrinsic() -> Any:
    """`_prefetch(arr, i)` for compiled code (numba's intrinsic, made once): ask the CPU for
    the cache line of arr[i] (of row i, for a 2-D array) and go on, no value, no wait,
    nothing written (i must be a valid index: it is not checked). A pass of loads instead
    holds the CPU's window on each miss (the columnar pool's and the overlay's passes
    use it too)."""
    return made_once(_PREFETCH, _make_prefetch)[0]


def _make_prefetch() -> list[Any]:
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx, arr, i):  # pragma: no cover - compiled
        def codegen(context, builder, signature, args):
            aryty, ity = signature.args
            ary = context.make_array(aryty)(context, builder, args[0])
            zero = context.get_constant(types.intp, 0)
            at = [context.cast(builder, args[1], ity, types.intp)] + [zero] * (aryty.ndim - 1)
            _prefetch_codegen(context, builder, aryty, ary, at)
            return context.get_dummy_value()
        return types.void(arr, i), codegen

    return [prefetch]


_COMPILED: list[Any] = []


def _compiled() -> list[Any]:
    """[`_place_loop`, `_ht_rehash`, `_number_slots`, `_scan_loop`, `_store_fields_loop`,
    `_ht_build`, `_slot_run`, `_copies_ahead`] compiled by numba (cached on disk), or [] without numba."""
    return made_once(_COMPILED, _make_compiled)


def _make_compiled() -> list[Any]:
    try:
        from numba import njit
    except ImportError:
        return []
    global _prefetch, _prefetch_at
    # The placing loop and its helpers without numba's reference counts (`_nrt=False`):
    # they allocate nothing, and every array they touch is held by the caller. With them,
    # each helper call on a row (`_ht_slot`, `_put_row`, `_unlink_hash`: 2 to 5 arrays each)
    # made an atomic increment and decrement of each array's count, a lock'ed instruction
    # apiece, ~6% of the place-and-commit's CPU time (perf: numba's NRT_incref and
    # NRT_decref); inlining the helpers (inline="always") kept them.
    _prefetch = prefetch_intrinsic()
    _prefetch_at = prefetch_at_intrinsic()
    helpers = globals()
    for name in ("_low_half", "_joined", "_ht_tag", "_ht_home", "_ht_slot", "_prefetch_record",
                 "_fetch_ahead", "_ht_delete", "_cp_tag", "_cp_find", "_cp_next", "_cp_link", "_cp_take",
                 "_mend_fifos", "_unlink_hash", "_ht_hold", "_put_row"):
        helpers[name] = njit(cache=True, nogil=True, _nrt=False)(helpers[name])
    made: list[Any] = []
    made.append(njit(cache=True, nogil=True, _nrt=False)(_place_loop))
    made.append(njit(cache=True, nogil=True, _nrt=False)(_ht_rehash))
    made.append(njit(cache=True, nogil=True)(_number_slots))
    made.append(njit(cache=True, nogil=True)(_scan_loop))
    made.append(njit(cache=True, nogil=True)(_store_fields_loop))
    made.append(njit(cache=True, nogil=True, _nrt=False)(_ht_build))
    made.append(njit(cache=True, nogil=True)(_slot_run))
    made.append(njit(cache=True, nogil=True, _nrt=False)(_copies_ahead))
    # compiled (or loaded) with the loop, so the warm-up that places a few rows caches it
    # too: a table grows only past 512 hashes, at a first attach
    t = np.full(1, -1, np.int64)
    made[1](t, t.copy())
    # and the table's first making (at a first tenant, mid-attach): one held record
    rec = np.zeros((1, B_LNEXT + 1), np.int32)
    made[5](rec, 1, np.full(4, -1, np.int64), np.zeros(10, np.int64))
    made[5](rec.astype(np.int64), 1, np.full(4, -1, np.int64), np.zeros(10, np.int64))
    # and a pool's slots numbered as a run: a pool's journal slots (a strided view of its
    # rows) and a contiguous array
    rows = np.zeros((2, 3), np.int64)
    for slot in (rows[:, 1], rows[0]):
        made[6](slot, 0, 0, 0, np.empty(len(slot), np.int64))
        # and by a table, int32 or int64, once a pool's slots leave their run (a slot
        # below it, a long skip): mid-attach, where its compile cost 1.2 s of the GUI's
        # placing (bench gui's route, after the run made the table path rare)
        for kind in (np.int32, np.int64):
            made[2](np.full(4, -1, kind), slot, np.empty(len(slot), np.int64), 0)
    # and the first copy's look ahead, on int32 and int64 FIFOs (`_fit` widens them)
    for kind in (np.int32, np.int64):
        made[7](np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, -1, kind), np.empty(2, np.int64),
                True)
    # and the store fields' reader, on engine.remote.colpool's per-store arrays (one layout)
    made[4](np.zeros((2, 1), np.uint64)[:, 0], np.zeros((1, 2), np.int64), np.zeros((1, 4), np.int64),
            np.zeros(2, np.uint8), np.zeros(1, np.int64), np.empty((3, 1), np.int64))
    return made
