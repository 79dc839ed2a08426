"""What a remote vLLM pool adds to the projection: the tier, rank and store time of each slot.

`PoolProjection` (or the app's live columnar log, `engine.core.live_log`) places each
remote copy of a block (vLLM names hashes, never block ids) in a slot of its own;
`RemoteOverlay` keeps, per slot, what the views need beyond that in
numpy arrays (so a million-block pool colours in a few milliseconds), plus the per-second
rates and block lifetimes of the timelines and metrics. Qt-free; `app.runtime.state.PoolState`
feeds it: the reference route's events (`observe`), or, for an attach through journalling
columnar pools (`journal_pool_class`, what `app.runtime.remote.RemoteController` runs), each
GUI tick's journal rows from arrays (`observe_journal`, one compiled pass).
"""

from __future__ import annotations

import math
import operator
import time
from array import array
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from engine.core.growth import regrow
from engine.core.events import BlockEvicted, BlockStored, CacheReset, Event
from engine.core.projection import PoolProjection, stream_code
from engine.core.threads import made_once
from engine.remote.tiers import tier_of_medium

# Tiers as vLLM's events name them (`medium`); an event without one is on the GPU.
TIERS = ("GPU", "CPU", "STORAGE")
TIER_CODE = {name: i + 1 for i, name in enumerate(TIERS)}  # 0 = no block
# Age buckets of a cached block (seconds since it was stored), newest first.
AGE_EDGES = (10.0, 60.0, 600.0)
NUM_AGES = len(AGE_EDGES) + 1
# A grid of more cells than this is aggregated: one cell shows its hottest block (a GPU
# block over a CPU one, a new one over an old one), so a redraw costs the same at any size.
MAX_CELLS = 1 << 18
# An aggregated grid re-ages this many slots a redraw (`cell_codes`, a millisecond or two), a
# whole pass per second of the stream in slices, so no redraw re-ages a 10M-slot pool at once.
SWEEP_SLOTS = 1 << 18
LARGE_POOL = 100_000
MAX_REMEMBERED_REMOVALS = 200_000  # for "stored again": bounded, as the engine's pool bounds its own
# The removals' table (`JournalFollower.room`) grows to hold as many more removals as this
# many ticks like the one that grows it would bring (about a second of GUI frames), at most
# the size MAX_REMEMBERED_REMOVALS takes: a fast stream's table reaches it in two steps, not ten.
ROOM_TICKS = 64
SAMPLE_EVERY_S = 0.25
# Slots changed since the last redraw are remembered for an update of those cells alone, up
# to this many: past it a redraw takes the whole pool again (a compiled pass, as the first
# draw does), and a pool filled while no view draws it keeps no list as long as itself.
MAX_TOUCHED = 1 << 16


def tier_of(event: Event) -> str:
    """The tier an event names (`engine.remote.tiers`); GPU when it names none (vLLM's default)."""
    info = getattr(event, "remote", None)
    medium = getattr(info, "medium", None) if info is not None else getattr(event, "medium", None)
    return tier_of_medium(medium)


def _stream_of(event: Event) -> int:
    """The stream (server and rank) a remote event came from: stored again counts a hash a
    server stores after that same server removed it."""
    info = event.remote
    return -1 if info is None else stream_code(info.source, info.rank)


def rank_of(event: Event) -> int:
    """The data-parallel rank that published an event (0 for a single server)."""
    info = getattr(event, "remote", None)
    rank = getattr(info, "rank", None) if info is not None else getattr(event, "rank", None)
    return int(rank) if rank is not None else 0


def time_of(event: Event) -> float:
    """When the server published an event (its batch time), else when it arrived."""
    info = getattr(event, "remote", None)
    t = getattr(info, "batch_time", 0.0) if info is not None else 0.0
    return float(t) if t else event.time


@dataclass(slots=True, frozen=True)
class TierCount:
    tier: str
    num_blocks: int


class RemoteOverlay:
    """Per-slot tier, rank and store time of a remote pool, and its rates over time.

    `before(events, projection)` and `observe(events, projection)` are called around the
    projection applying each batch. Slots follow the projection's. `base` holds each
    slot's code at its freshest (0 = no block) and is kept exact per batch; `codes` ages
    it, recomputed in full only when the stream's clock passes a whole second, so a
    redraw of a steady million-block pool costs one pass over a byte per block.
    """

    __slots__ = ("_ranks", "stored_run", "base", "_stored_times", "_removed_times", "_lifetimes",
                 "num_stored_again", "num_restarts", "last_reset_time", "tier_names", "_removed",
                 "sample_times", "sample_counts", "_last_sample", "_codes", "_codes_second",
                 "_touched", "revision", "_counts", "_written_top", "journal", "_cells", "_cells_k", "_cells_n",
                 "_sweep_at", "_sweep_second")

    def __init__(self) -> None:
        # a slot's tier is not kept: its code in `base` names it while it holds a block (`tier`)
        # each slot's rank (`rank`): none kept while every store came from rank 0 (a single
        # server, or data-parallel rank 0 alone: 2 bytes a slot for nothing); made at the
        # first store from another rank (`_own_ranks`)
        self._ranks: np.ndarray | None = None
        # each slot's store time as the run of `_stored_times` it was stored in (4 bytes a slot
        # where a float64 took 8, and the time exactly: `stored_at`); 0 (time 0.0) never stored
        self.stored_run = np.zeros(0, dtype=np.uint32)
        self.base = np.zeros(0, dtype=np.uint8)
        self._stored_times = _Runs()  # event time of every stored block, in runs (`stored_runs`)
        self._removed_times = _Runs()  # event time of every removed block, in runs (`removed_runs`)
        self._lifetimes = _Floats()  # seconds from stored to removed, per removed block (`lifetimes`)
        self.num_stored_again = 0  # stored after the server had removed it: computed twice
        self.num_restarts = 0
        self.last_reset_time: float | None = None
        self.tier_names = dict(TIER_CODE)  # a tier vLLM adds later gets a code of its own
        self._removed: dict[tuple[bytes, str, int], None] = {}  # (hash, tier, stream) removed, oldest first
        # Cached blocks per tier over time: one sample per applied batch, at most every
        # SAMPLE_EVERY_S of wall time once the pool is large (a sample costs a pass over it).
        self.sample_times = array("d")
        self.sample_counts: list[array] = []  # one array("q") per tier code - 1
        self._last_sample = 0.0
        self._codes = np.zeros(0, dtype=np.uint8)
        self._codes_second: float | None = None  # the stream second `_codes` was aged at
        self._touched = _Touched()  # slots changed since `_codes` was computed
        self.revision = 0  # bumps with every observed batch
        # tier_counts at (revision, slots): the list, and the slots per code (0 aside) it came from
        self._counts: tuple[int, int, list[TierCount], np.ndarray] | None = None
        self._written_top = 0  # one past the highest slot a code was ever written to
        self.journal: Any = None  # a JournalFollower once journal rows are observed
        # `cell_codes`: the aggregated grid kept between redraws (None: rebuild it), the
        # slots per cell and slots it covers, and how far the sweep that re-ages it got
        self._cells: np.ndarray | None = None
        self._cells_k = 0
        self._cells_n = 0
        self._sweep_at = 0
        self._sweep_second: float | None = None

    def _grow(self, n: int) -> None:
        if n <= len(self.base):
            return
        # by an eighth, where they lie (`regrow`: realloc, a copy only while a reader holds a
        # view): doubling, then growing by half, left a 10M-slot pool's 12 bytes a slot up to
        # 120 MB, then 60 MB, it did not use, and each growth copied them all on the GUI thread
        have = len(self.base)
        size = max(n, have + have // 8, 1024)
        for name in ("_ranks", "stored_run", "base") if self._ranks is not None else ("stored_run", "base"):
            regrow(self, name, size, have)
            getattr(self, name)[have:] = 0
        self._codes_second = None  # sizes changed: the next `codes` recomputes

    @property
    def stored_at(self) -> np.ndarray:
        """Each slot's store time (float64; 0.0 for a slot never stored), a copy: the time of
        its run (`stored_run`)."""
        return self._stored_times.times.take(self.stored_run)

    @property
    def tier(self) -> np.ndarray:
        """Each slot's tier code (uint8; 0 for a slot that holds no block), a copy: read from
        its code in `base`, which ranks tiers GPU highest (`_fresh_code`)."""
        held = self.base > 0
        return np.where(held, self._tier_of_code(self.base.astype(np.int64)), 0).astype(np.uint8)

    @property
    def rank(self) -> np.ndarray:
        """Each slot's data-parallel rank (uint16; 0 for a slot never stored), read-only: a
        zero-stride view of 0 while every store came from rank 0."""
        if self._ranks is None:
            return np.broadcast_to(np.uint16(0), self.base.shape)
        return self._ranks

    def _own_ranks(self) -> np.ndarray:
        """The slots' ranks as an array of their own (all 0 so far), from now on."""
        if self._ranks is None:
            self._ranks = np.zeros(len(self.base), np.uint16)
        return self._ranks

    def tier_code(self, name: str) -> int:
        code = self.tier_names.get(name)
        if code is None:
            code = self.tier_names[name] = len(self.tier_names) + 1
            if code > len(TIERS):  # one more tier below every other: each held code moves up an age row
                held = self.base > 0
                self.base[held] += NUM_AGES
                self._counts = None
            self._codes_second = None
        return code

    def _num_tiers(self) -> int:
        return max(len(self.tier_names), len(TIERS))

    def _fresh_code(self, code: int) -> int:
        return 1 + (self._num_tiers() - code) * NUM_AGES + NUM_AGES - 1

    def _tier_of_code(self, base: Any) -> Any:
        """The tier code of a held slot's code in `base` (an int or an int64 array): every age
        row of `_fresh_code`'s tier names it."""
        return self._num_tiers() - (base - NUM_AGES) // NUM_AGES

    def observe_journal(self, journal: Any, times: np.ndarray, projection: Any, slots: Any, pool: Any,
                        rank: int = 0) -> None:
        """`observe` for a tick of a journalling pool's rows (see `observe_journal` below)."""
        observe_journal(self, journal, times, projection, slots, pool, rank)

    def before(self, events: Iterable[Event], projection: PoolProjection) -> None:
        """Arm the projection to report the slot each stored or removed block takes or
        frees in this batch (a hash can have several copies, so its hash does not say)."""
        projection.remote_slots = []

    def observe(self, events: Iterable[Event], projection: PoolProjection | Any,
                slots: list[int] | None = None) -> None:
        """Record a batch the projection has just applied: call `before` first, or give
        `slots`, the slot each BlockStored and BlockEvicted took or freed (-1: none), as a
        columnar log's rows name them (`LiveColumnarLog.blocks_of_rows`)."""
        self.revision += 1
        self._grow(projection.num_blocks)
        if slots is None:
            slots = projection.remote_slots or []
            projection.remote_slots = None
        stored_run, base = self.stored_run, self.base
        removed, touched = self._removed, self._touched
        add_stored, add_removed, add_life = self._stored_times.add, self._removed_times.add, self.lifetimes.append
        run_times = self._stored_times
        reset = False
        k = 0  # the next entry of `slots`: one per BlockStored and BlockEvicted, in order
        for e in events:
            cls = type(e)
            if cls is BlockStored:
                t = time_of(e)
                run = add_stored(t)
                key = (e.block_hash, tier_of(e), _stream_of(e))
                if key in removed:  # the same server and tier again: computed twice (another tier: offloaded)
                    del removed[key]
                    self.num_stored_again += 1
                b = slots[k] if k < len(slots) else -1
                k += 1
                if b >= 0:
                    code = self.tier_code(tier_of(e))
                    r = rank_of(e)
                    if r or self._ranks is not None:
                        self._own_ranks()[b] = r
                    stored_run[b] = run
                    base[b] = self._fresh_code(code)
                    touched.append(b)
            elif cls is BlockEvicted:
                t = time_of(e)
                add_removed(t)
                removed[(e.block_hash, tier_of(e), _stream_of(e))] = None
                if len(removed) > MAX_REMEMBERED_REMOVALS:  # forget the oldest removal
                    del removed[next(iter(removed))]
                b = slots[k] if k < len(slots) else -1
                k += 1
                if b >= 0 and base[b]:  # the copy's lifetime, from its own store
                    add_life(max(0.0, t - float(run_times.times[stored_run[b]])))
                    base[b] = 0
                    touched.append(b)
            elif cls is CacheReset:
                t = self.last_reset_time = time_of(e)
                if e.num_blocks_cleared and e.num_blocks_cleared > 0:
                    add_removed(t, int(e.num_blocks_cleared))
                # The projection decides what a reset cleared (one rank's blocks, or all):
                # after the batch, every slot it no longer holds is emptied here too.
                reset = True
        if slots:
            self._written_top = max(self._written_top, int(max(slots)) + 1)
        if not self._can_touch(0):
            self._forget_touched()
        if reset:
            n = min(projection.num_blocks, len(base))
            held = np.frombuffer(projection.hashed, dtype=np.uint8, count=n)
            base[:n][held == 0] = 0
            self._codes_second = None
        self._sample(projection, self.now)

    def _can_touch(self, more: int) -> bool:
        """True while `more` changed slots fit beside those remembered (`MAX_TOUCHED`)."""
        return len(self._touched) + more <= MAX_TOUCHED

    def _forget_touched(self) -> None:
        """Past `MAX_TOUCHED` changed slots: the next redraw takes every slot again (`codes`
        and `cell_codes` start over) instead of a list of them."""
        self._touched = _Touched()
        self._codes_second = None
        self._cells = None

    def _sample(self, projection: PoolProjection, t: float) -> None:
        now = time.monotonic()
        if projection.num_blocks > LARGE_POOL and now - self._last_sample < SAMPLE_EVERY_S:
            return
        self._last_sample = now
        counts = {c.tier: c.num_blocks for c in self.tier_counts(projection)}
        while len(self.sample_counts) < len(self.tier_names):
            self.sample_counts.append(array("q", [0] * len(self.sample_times)))
        try:
            self.sample_times.append(t)
        except BufferError:  # a reader's numpy view of it is alive: grow a copy
            self.sample_times = array("d", self.sample_times)
            self.sample_times.append(t)
        for name, code in self.tier_names.items():
            col = self.sample_counts[code - 1]
            try:
                col.append(counts.get(name, 0))
            except BufferError:  # a reader's numpy view of it is alive: grow a copy
                self.sample_counts[code - 1] = col = array("q", col)
                col.append(counts.get(name, 0))

    # ------------------------------------------------------------------ reading
    @property
    def stored_times(self) -> array:
        """The event time of every stored block, an array('d') made from `stored_runs` at each
        read (the views count runs; this is for a reader that wants every value)."""
        return self._stored_times.values()

    @property
    def removed_times(self) -> array:
        """The event time of every removed block (a clear: one per copy it cleared), as `stored_times`."""
        return self._removed_times.values()

    @property
    def stored_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """The stores' times as runs: (time, number of stores) of each, in order (a vLLM batch's
        stores share its time). Views of the kept arrays: the last run's number can still grow,
        in place, while the arrays keep their room; a reader keeps what it needs of it."""
        return self._stored_times.runs()

    @property
    def removed_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """The removals' times as runs, as `stored_runs` (a clear: one run of the copies it cleared)."""
        return self._removed_times.runs()

    @property
    def lifetimes(self) -> array:
        """Seconds from stored to removed of every removed copy, as `stored_times`."""
        return self._lifetimes.read()

    @property
    def num_stored(self) -> int:
        """Blocks stored (`len(stored_times)`, without reading them)."""
        return len(self._stored_times)

    @property
    def num_removed(self) -> int:
        """Blocks removed (`len(removed_times)`, without reading them)."""
        return len(self._removed_times)

    @property
    def now(self) -> float:
        """The stream's clock: the time of its newest stored or removed block."""
        return max(self._stored_times.last(), self._removed_times.last())

    def codes(self, projection: PoolProjection, now: float | None = None) -> np.ndarray:
        """One uint8 per slot: 0 empty, else 1 + tier rank * NUM_AGES + freshness.

        Tiers rank GPU highest and freshness counts up to the newest age bucket, so the
        larger of two codes is the hotter block (what an aggregated cell shows). The
        result is shared and must be treated as read-only.
        """
        n = projection.num_blocks
        self._grow(n)
        now = self.now if now is None else now
        second = math.floor(now)
        if self._codes_second != second or len(self._codes) != len(self.base):
            stored = self._stored_times.times.take(self.stored_run)
            older = ((stored < now - AGE_EDGES[0]).view(np.uint8) + (stored < now - AGE_EDGES[1]).view(np.uint8)
                     + (stored < now - AGE_EDGES[2]).view(np.uint8))
            codes = self.base - older
            codes[self.base == 0] = 0
            self._codes, self._codes_second = codes, second
        elif self._touched:
            # Stores since the last full pass are the freshest blocks; removals are 0.
            idx = self._touched.slots()
            self._codes[idx] = self.base[idx]
        self._touched = _Touched()
        self._cells = None  # the touched slots are spent: an aggregated grid starts over
        return self._codes[:n]

    def cell_codes(self, projection: PoolProjection, now: float | None = None,
                   max_cells: int = MAX_CELLS) -> tuple[np.ndarray, int]:
        """(cell codes, slots per cell), as `aggregate(codes(...))` gives them, kept between
        calls: only the cells of slots stored or removed since the last call (or added to
        the pool) are taken again, and ages move on by a slice of `SWEEP_SLOTS` slots a
        call, a whole pass once per second of the stream, instead of the pool at every
        redraw. Ages may lag by the calls a pass takes (a 10M-slot pool: 39); a cell
        shows the hottest of its slots, each aged as its cell is taken (no code is kept a
        slot: 1 byte a block of the app's held pools). The result is shared and must be
        treated as read-only."""
        n = projection.num_blocks
        if n <= max_cells:
            return self.codes(projection, now), 1
        self._grow(n)
        now = self.now if now is None else now
        second = math.floor(now)
        k = math.ceil(n / max_cells)
        edges = np.array([now - edge for edge in AGE_EDGES], dtype=np.float64)
        loop = _compiled_cells()
        run_times = self._stored_times.times
        cells = self._cells
        if cells is None or self._cells_k != k or self._codes_second is None or len(cells) * k < len(self.base):
            self._codes = np.zeros(0, np.uint8)  # (the per-slot codes of a grid of a cell a slot)
            cells = self._cells = np.zeros(math.ceil(len(self.base) / k), np.uint8)
            self._cells_k = k
            loop(self.base, self.stored_run, run_times, edges, cells, k, 0, n, n)
            self._touched = _Touched()
            self._codes_second = self._sweep_second = second
            self._cells_n = self._sweep_at = n
            return cells[:math.ceil(n / k)], k
        if self._touched:
            # the cells of slots stored (the freshest blocks) or removed (0) taken again
            idx = self._touched.slots()
            which = np.unique(idx[idx < n] // k)
            _compiled_cells_at()(self.base, self.stored_run, run_times, edges, cells, k, n, which)
            self._touched = _Touched()
        if n != self._cells_n:  # slots the pool gained since: their cells from the first they touch
            lo = min(n, self._cells_n) // k * k
            loop(self.base, self.stored_run, run_times, edges, cells, k, lo, n, n)
            self._cells_n = n
        if self._sweep_at >= n and second != self._sweep_second:
            self._sweep_at, self._sweep_second = 0, second
        if self._sweep_at < n:
            lo = self._sweep_at
            hi = min(n, (lo + SWEEP_SLOTS + k - 1) // k * k)
            loop(self.base, self.stored_run, run_times, edges, cells, k, lo, hi, n)
            self._sweep_at = hi
        self._codes_second = second
        return cells[:math.ceil(n / k)], k

    def nbytes_by_part(self) -> dict[str, int]:
        """Bytes it holds, by part: per slot (code, rank, store time's run, aged codes, the grid), the
        times of stores and removals (runs of one time, for the rates) and the lifetimes (one float each), the
        slots listed since the last redraw (an int64 each), the removals remembered (table and ring)."""
        cells = self._cells.nbytes if self._cells is not None else 0
        ranks = self._ranks.nbytes if self._ranks is not None else 0
        slots = sum(a.nbytes for a in (self.stored_run, self.base, self._codes)) + ranks + cells
        times = sum(a.nbytes for a in (self._stored_times, self._removed_times, self._lifetimes)) + \
            sum(a.itemsize * len(a) for a in (self.sample_times, *self.sample_counts))
        ring = 0 if self.journal is None else self.journal.nbytes
        touched = self._touched.nbytes
        return {"slots": slots, "times": times, "touched": touched, "ring": ring}

    def tier_counts(self, projection: PoolProjection) -> list[TierCount]:
        """Cached blocks per tier (GPU, CPU, STORAGE, then any tier vLLM adds)."""
        n = min(projection.num_blocks, len(self.base))
        if self._counts is not None and self._counts[:2] == (self.revision, n):
            return self._counts[2]
        # `base` holds a tier's freshest code or 0: a compare per tier, not a bincount that
        # widens every byte to an int64 first
        base = self.base[:n]
        by_code = np.zeros(256, np.int64)
        for code in self.tier_names.values():
            fresh = self._fresh_code(code)
            by_code[fresh] = np.count_nonzero(base == fresh)
        return self._count_tiers(n, by_code)

    def _count_tiers(self, n: int, by_code: np.ndarray) -> list[TierCount]:
        """`tier_counts` from the slots per code of the first `n` slots, kept for the revision."""
        counts = by_code.tolist()
        out = [TierCount(name, counts[self._fresh_code(code)])
               for name, code in sorted(self.tier_names.items(), key=lambda kv: kv[1])]
        self._counts = (self.revision, n, out, by_code)
        return out

    def ranks(self, projection: PoolProjection) -> dict[int, int]:
        """Cached blocks per data-parallel rank (the combined pool split by who holds it)."""
        n = min(projection.num_blocks, len(self.base))
        if self._ranks is None:  # every store from rank 0
            held = int(np.count_nonzero(self.base[:n]))
            return {0: held} if held else {}
        counts = np.bincount(self._ranks[:n][self.base[:n] > 0])
        return {r: int(c) for r, c in enumerate(counts) if c}

    def tier_name(self, slot: int) -> str:
        code = 0
        if slot < len(self.base) and self.base[slot]:
            code = self._tier_of_code(int(self.base[slot]))
        return next((name for name, c in self.tier_names.items() if c == code), "GPU")

    def per_second(self, start: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(second since `start`, stored, removed) per whole second of the stream."""
        (stored, num_s), (removed, num_r) = self.stored_runs, self.removed_runs
        both = np.concatenate((stored, removed))
        if not len(both):
            return np.zeros(0), np.zeros(0), np.zeros(0)
        t0 = math.floor(both.min()) if start is None else start
        n = int(math.floor(both.max() - t0)) + 1
        n = max(1, min(n, 24 * 3600))  # a day of seconds at most; older ones fold into the first
        s = np.bincount(np.clip((stored - t0).astype(np.int64), 0, n - 1), weights=num_s, minlength=n)
        r = np.bincount(np.clip((removed - t0).astype(np.int64), 0, n - 1), weights=num_r, minlength=n)
        return np.arange(n, dtype=float), s, r


def aggregate(codes: np.ndarray, max_cells: int = MAX_CELLS) -> tuple[np.ndarray, int]:
    """(cell codes, blocks per cell): at most `max_cells` cells, each the max of its run."""
    n = len(codes)
    if n <= max_cells:
        return codes, 1
    k = math.ceil(n / max_cells)
    if n % k:
        padded = np.zeros(math.ceil(n / k) * k, dtype=codes.dtype)
        padded[:n] = codes
    else:
        padded = codes
    # k strided passes: numpy's max over a short last axis is several times slower
    out = padded[0::k].copy()
    for j in range(1, k):
        np.maximum(out, padded[j::k], out=out)
    return out, k


# ---- the journal route (`ColumnarPool(journal=True)` into the app's live columnar log) ----

_JOURNAL_POOL: list[Any] = []
_SEQ_OF, _TS_OF = operator.attrgetter("seq"), operator.attrgetter("ts")


def journal_pool_class() -> Any:
    """`ColumnarPool(journal=True)` that also keeps the batch time of each journal row
    (`row_times`, what `RemoteOverlay.observe_journal` dates stores and removals by, as
    the reference dates its events by their `RemoteInfo.batch_time`). A clear from `reset`
    without a batch time is dated when it happens, as the reference's `CacheReset` is.
    `row_times` is indexed like the pool's J (rows held, from `journal_base` on) and drops
    what a `release_journal` drops; `times_of` takes global rows, as `JournalRows` names them.
    Made on first use: the colpool module loads numba."""
    if not _JOURNAL_POOL:
        from engine.remote import colpool

        class JournalPool(colpool.ColumnarPool):
            """A journalling columnar pool with each journal row's batch time."""

            def __init__(self, source: str, rank: int = 0, events: Any = None, max_removed: int = 200_000,
                         server: str = "", capacity: int = 1024, journal: bool = True) -> None:
                super().__init__(source, rank, events, max_removed, server=server, capacity=capacity, journal=True)
                self.row_times = np.zeros(1024, np.float64)
                self._in_many = False

            def _num_rows(self) -> int:
                return int(self.S[colpool.S_JROWS])  # rows held: J's and row_times' local index

            def _date(self, r0: int, seqs: np.ndarray, tss: np.ndarray) -> None:
                r1 = self._num_rows()
                if r1 <= r0:
                    return
                if r1 > len(self.row_times):
                    grown = np.zeros(max(r1, 2 * len(self.row_times)), np.float64)
                    grown[:r0] = self.row_times[:r0]
                    self.row_times = grown
                n = len(seqs)
                if n == 1:
                    self.row_times[r0:r1] = tss[0]
                    return
                first = int(seqs[0])
                if int(seqs[-1]) - first == n - 1:
                    # numbers that follow on (a subscriber's run): a row's batch is its seq
                    # less the first; what searchsorted finds, without its strided search
                    # (a fifth of this wrapper's time at 64 frames a call)
                    at = self.J[r0:r1, colpool.J_SEQ] - first
                    tss.take(at, out=self.row_times[r0:r1], mode="clip")
                else:  # the batches of one call, seqs ascending: each row by its batch seq
                    at = np.searchsorted(seqs, self.J[r0:r1, colpool.J_SEQ]).clip(0, n - 1)
                    self.row_times[r0:r1] = tss[at]

            def _journal_released(self, dropped: int) -> None:
                held = self._num_rows()
                if len(self.J) <= len(self.row_times) <= 2 * len(self.J):  # (nothing else holds it: `times_of` copies)
                    self.row_times[:held] = self.row_times[dropped:dropped + held]
                    return
                # a new array as long as the new J, the rows still held at its front
                shifted = np.zeros(max(len(self.J), held), np.float64)
                shifted[:held] = self.row_times[dropped:dropped + held]
                self.row_times = shifted

            def apply(self, batch: Any) -> list:
                if self._in_many:
                    return super().apply(batch)
                r0 = self._num_rows()
                out = super().apply(batch)
                self._date(r0, np.array([batch.seq], np.int64), np.array([batch.ts], np.float64))
                return out

            def apply_many(self, batches: list) -> list:
                seqs = np.fromiter(map(_SEQ_OF, batches), np.int64, len(batches))
                if len(seqs) > 1 and not (seqs[1:] > seqs[:-1]).all():
                    for b in batches:
                        self.apply(b)
                    return []
                r0 = self._num_rows()
                self._in_many = True
                try:
                    super().apply_many(batches)
                finally:
                    self._in_many = False
                if self._num_rows() > r0:  # the batches' times read only when they made rows
                    self._date(r0, seqs, np.fromiter(map(_TS_OF, batches), np.float64, len(batches)))
                return []

            def reset(self, batch_seq: int = -1, batch_time: float = 0.0) -> list:
                r0 = self._num_rows()
                out = super().reset(batch_seq, batch_time)
                self._date(r0, np.array([batch_seq], np.int64), np.array([batch_time or time.time()], np.float64))
                return out

            def times_of(self, journal: Any) -> np.ndarray:
                """The batch time of each row of `journal` (a `JournalRows` of this pool, its
                rows global), a copy."""
                base = self.journal_base
                if journal.start < base:
                    raise ValueError(f"journal row {journal.start:,} was released (release_journal): this pool "
                                     f"holds its rows from {base:,} on")
                return self.row_times[journal.start - base:journal.stop - base].copy()

        _JOURNAL_POOL.append(JournalPool)
    return _JOURNAL_POOL[0]


_MIX_TIER = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 as int64: mixes a tier into an identity
_WIDE_TAG = np.int64(0x5BD1E9955BD1E995)
_MIX_STREAM = np.int64(-4417276706812531889)  # 0xC2B2AE3D27D4EB4F as int64: mixes the server and rank in
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # an identity's place in the removals' table: its top bits times this


def _scan_rows(op, jtier, store, width, times, seen):  # pragma: no cover - compiled
    """What a tick's rows need before `_observe_loop`: the removals (the ring's room), the
    rows naming a pool's wide hash, the times (one and the rows whose time is not the row's
    before: the runs of times' room); and `seen[t] = 1` for each tier a stored or removed row
    names (the last entry: a tier past them)."""
    num_removed, num_wide, num_times = 0, 0, 0
    last = len(seen) - 1
    for i in range(len(op)):
        if i == 0 or times[i] != times[i - 1]:
            num_times += 1
        o = op[i]
        if o == 2:
            continue
        if o == 1:
            num_removed += 1
        t = jtier[i]
        seen[t if 0 <= t < last else last] = 1
        if width[i] == 2:
            num_wide += 1
    return num_removed, num_wide, num_times


def _observe_ahead(op, jtier, key, width, slots, code_of, have, stream, rank_of, stored_run, base, removed,
                   shift, ring_id, st, max_removed):  # pragma: no cover - compiled
    """Ask for, before `_observe_loop`, the lines it will need: each row's home row in the
    removals' table and its slot's rank, store time's run and code. The table (up to 512K
    rows, 8 MB) and the per-slot arrays are past the caches; the loop's reads wait on one
    another (a probe, then a write it decides), here they are independent. Prefetches, not
    loads (`engine.core.live_journal.prefetch_intrinsic`): a load that misses holds the CPU's
    window until it comes, so a pass of loads waited on about as many misses as it saved
    (0.100 -> 0.088 s of commit per 100K vLLM events, 2026-12-04). The row's identity is the
    loop's own six lines, repeated: a compiled helper returning (identity, code) to both made
    the commit 8-10% slower (0.095 -> 0.105 s, 2026-12-04). Then, once the table holds
    `max_removed`, the home rows of the removals this tick's will make it forget (the ring's
    oldest, in order): each a probe at a row no tick has read lately."""
    k = 0
    last = len(code_of) - 1
    num_removed = 0
    for i in range(len(op)):
        if op[i] == 2:
            continue
        if op[i] == 1:
            num_removed += 1
        jt = jtier[i]
        c = code_of[jt if 0 <= jt < last else last]
        h = key[i]
        if width[i] == 2:
            h = (have[h] + 1) * np.int64(1000003) ^ _WIDE_TAG
        h = h ^ (c * _MIX_TIER) ^ stream
        _prefetch(removed, np.int64((np.uint64(h) * _GOLDEN) >> shift))
        b = slots[k] if k < len(slots) else -1
        k += 1
        if b >= 0:
            _prefetch(base, b)
            if len(rank_of):
                _prefetch(rank_of, b)
            _prefetch(stored_run, b)
    over = st[9] + num_removed - max_removed  # at most: a removal already remembered adds none
    for r in range(st[5], min(st[6], st[5] + max(0, over))):
        _prefetch(removed, np.int64((np.uint64(ring_id[r]) * _GOLDEN) >> shift))


def _observe_loop(op, jtier, key, width, store, slots, t, code_of, fresh_of, have, stream, rank, rank_of,
                  stored_run, base, tally, s_times, s_counts, r_times, r_counts, life_out, touched_out, removed,
                  shift, ring_id, ring_gen, st, max_removed):  # pragma: no cover - compiled
    """`RemoteOverlay.observe`'s loop over journal rows (compiled by numba): `slots` the log
    slot of each stored and removed row, `code_of` the overlay's tier code of each journal
    tier (the last: a tier past them), `fresh_of` each code's freshest code, `have` the
    number of each of the pool's wide hashes, `tally` what the slots per code (0 aside)
    moved by. Store and removal times go to their runs (`_Runs`: `s_times`, `s_counts`, with
    room for a run per change of time), a row joining the newest run when its time is that run's; a slot
    keeps its store's run. `removed` is the table of removals remembered (`JournalFollower`).
    st: stored, removed, lifetimes, touched written; generation counter; ring head, tail;
    stored again; the row of the last clear (-1 none); removals remembered; one past the
    highest slot given a code; the runs of store times, of removal times (run 0 none)."""
    _observe_ahead(op, jtier, key, width, slots, code_of, have, stream, rank_of, stored_run, base, removed,
                   shift, ring_id, st, max_removed)
    # the counters in locals, written back at the end: as st's entries, every one was a load
    # and a store a row (st may alias the other int64 arrays, so none stayed in a register)
    num_stored, num_removed, num_lives, num_touched = st[0], st[1], st[2], st[3]
    gen, head, tail, again, last_clear, num, top = st[4], st[5], st[6], st[7], st[8], st[9], st[10]
    runs_s, runs_r = st[11], st[12]
    keep_ranks = len(rank_of) > 0  # empty: every store so far from rank 0, none kept
    k = 0
    last = len(code_of) - 1
    mask = len(removed) - 1
    for i in range(len(op)):
        o = op[i]
        ti = t[i]
        if o == 2:  # a clear: every copy it cleared is a removal
            if store[i] > 0:
                if runs_r == 1 or r_times[runs_r - 1] != ti:
                    r_times[runs_r] = ti
                    r_counts[runs_r] = 0
                    runs_r += 1
                r_counts[runs_r - 1] += store[i]
                num_removed += store[i]
            last_clear = i
            continue
        b = slots[k] if k < len(slots) else -1
        k += 1
        jt = jtier[i]
        c = code_of[jt if 0 <= jt < last else last]
        # (hash, tier, stream) as one int64 across pools: an 8-byte hash by its value, a
        # wider one by the number of its digest
        h = key[i]
        if width[i] == 2:
            h = (have[h] + 1) * np.int64(1000003) ^ _WIDE_TAG
        h = h ^ (c * _MIX_TIER) ^ stream
        j = np.int64((np.uint64(h) * _GOLDEN) >> shift)
        while removed[j, 1] >= 0 and removed[j, 0] != h:
            j = (j + 1) & mask
        gone = -1  # the table entry to forget
        if o == 0:  # stored
            if runs_s == 1 or s_times[runs_s - 1] != ti:
                s_times[runs_s] = ti
                s_counts[runs_s] = 0
                runs_s += 1
            s_counts[runs_s - 1] += 1
            num_stored += 1
            if removed[j, 1] >= 0:
                gone = j
                again += 1
            if b >= 0:
                if keep_ranks:
                    rank_of[b] = rank
                stored_run[b] = runs_s - 1
                was = base[b]
                fresh = fresh_of[c]
                tally[was] -= 1
                base[b] = fresh
                tally[fresh] += 1
                touched_out[num_touched] = b
                num_touched += 1
                if b >= top:
                    top = b + 1
        else:  # removed
            if runs_r == 1 or r_times[runs_r - 1] != ti:
                r_times[runs_r] = ti
                r_counts[runs_r] = 0
                runs_r += 1
            r_counts[runs_r - 1] += 1
            num_removed += 1
            if removed[j, 1] < 0:
                g = gen
                gen += 1
                removed[j, 0] = h
                removed[j, 1] = g
                num += 1
                ring_id[tail] = h
                ring_gen[tail] = g
                tail += 1
                if num > max_removed:  # forget the oldest removal still remembered
                    while head < tail:
                        r, g = ring_id[head], ring_gen[head]
                        head += 1
                        j = np.int64((np.uint64(r) * _GOLDEN) >> shift)
                        while removed[j, 1] >= 0 and removed[j, 0] != r:
                            j = (j + 1) & mask
                        if removed[j, 1] == g:
                            gone = j
                            break
            if b >= 0:
                was = base[b]
                if was != 0:
                    life_out[num_lives] = max(0.0, ti - s_times[stored_run[b]])
                    num_lives += 1
                    tally[was] -= 1
                    base[b] = 0
                    touched_out[num_touched] = b
                    num_touched += 1
        if gone >= 0:  # linear probing's deletion: pull back the entries after it that may
            num -= 1  # move (their home is not in (gone, next]), so no lookup needs a tombstone
            nxt = gone
            while True:
                nxt = (nxt + 1) & mask
                if removed[nxt, 1] < 0:
                    break
                home = np.int64((np.uint64(removed[nxt, 0]) * _GOLDEN) >> shift)
                if (home <= gone or home > nxt) if gone < nxt else (home <= gone and home > nxt):
                    removed[gone, 0] = removed[nxt, 0]
                    removed[gone, 1] = removed[nxt, 1]
                    gone = nxt
            removed[gone, 1] = -1
    st[0], st[1], st[2], st[3] = num_stored, num_removed, num_lives, num_touched
    st[4], st[5], st[6], st[7], st[8], st[9], st[10] = gen, head, tail, again, last_clear, num, top
    st[11], st[12] = runs_s, runs_r


def _rehash(old, new, shift):  # pragma: no cover - compiled
    """The removals remembered in table `old`, placed in the larger `new` (every generation -1)."""
    mask = len(new) - 1
    for i in range(len(old)):
        if old[i, 1] >= 0:
            j = np.int64((np.uint64(old[i, 0]) * _GOLDEN) >> shift)
            while new[j, 1] >= 0:
                j = (j + 1) & mask
            new[j, 0] = old[i, 0]
            new[j, 1] = old[i, 1]


def _cell_code(base: np.ndarray, stored_run: np.ndarray, run_times: np.ndarray, edges: np.ndarray, k: int,
               c: int, n: int) -> int:  # pragma: no cover - compiled
    """The hottest code of cell `c`'s `k` slots (those below `n`), each aged at `edges` (now
    minus each age edge, newest first; a slot's store time its run's)."""
    e0, e1, e2 = edges[0], edges[1], edges[2]
    top = 0
    for i in range(c * k, min(c * k + k, n)):
        v = np.int64(base[i])
        if v:
            t = run_times[stored_run[i]]
            v -= np.int64(t < e0) + np.int64(t < e1) + np.int64(t < e2)
            if v > top:
                top = v
    return top


def _cells_loop(base: np.ndarray, stored_run: np.ndarray, run_times: np.ndarray, edges: np.ndarray,
                cells: np.ndarray, k: int, lo: int, hi: int, n: int) -> None:  # pragma: no cover - compiled
    """The code of every cell of `k` slots that slots [lo, hi) fall in (`lo` a cell's first;
    slots past `n` count as empty)."""
    for c in range(lo // k, (hi + k - 1) // k):
        cells[c] = _cell_code(base, stored_run, run_times, edges, k, c, n)


def _cells_at(base: np.ndarray, stored_run: np.ndarray, run_times: np.ndarray, edges: np.ndarray,
              cells: np.ndarray, k: int, n: int, which: np.ndarray) -> None:  # pragma: no cover - compiled
    """The code of each cell in `which` (`_cells_loop`'s, cells picked)."""
    for c in which:
        cells[c] = _cell_code(base, stored_run, run_times, edges, k, c, n)


_CELLS: list[Any] = []


def _compiled_cells() -> Any:
    """`_cells_loop` compiled (with `_cell_code` and `_cells_at`)."""
    return made_once(_CELLS, _make_cells)[0]


def _make_cells() -> list[Any]:
    from numba import njit

    global _cell_code
    _cell_code = njit(cache=True, nogil=True, inline="always")(_cell_code)
    return [njit(cache=True, nogil=True)(_cells_loop), njit(cache=True, nogil=True)(_cells_at)]


def _compiled_cells_at() -> Any:
    """`_cells_at` compiled."""
    _compiled_cells()
    return _CELLS[1]


_OBSERVE: list[Any] = []


def _compiled_observe() -> tuple[Any, Any, Any]:
    """(`_scan_rows`, `_observe_loop`, `_rehash`) compiled. `_rehash` is compiled (or loaded)
    here, for its one signature: the table first grows mid-attach, not in a warm-up's few rows."""
    return made_once(_OBSERVE, _make_observe)[0]


def _make_observe() -> list[Any]:
    from numba import njit

    from engine.core.live_journal import prefetch_intrinsic

    global _observe_ahead, _prefetch
    _prefetch = prefetch_intrinsic()
    _observe_ahead = njit(cache=True, nogil=True)(_observe_ahead)  # called by the loop
    scan, loop = (njit(cache=True, nogil=True)(f) for f in (_scan_rows, _observe_loop))
    rehash = njit("void(int64[:, ::1], int64[:, ::1], uint64)", cache=True, nogil=True)(_rehash)
    return [(scan, loop, rehash)]


class JournalFollower:
    """What `RemoteOverlay.observe_journal` keeps between ticks: the removals remembered for
    "stored again" (hash, tier and stream identities in a table of (identity, generation)
    rows, open addressing with linear probing, generation -1 an empty row; a ring of their
    insertion order), the cross-pool identity of each pool's 32-byte hashes (digest ->
    number) and the overlay's tier codes of the journal's tiers. A table, not a numba dict:
    a lookup is one row (a dict reads an index and then an entry), and at 200,000 removals
    remembered the table is past the caches, so every tick's rows wait on those reads."""

    def __init__(self) -> None:
        self.removed = np.full((1024, 2), -1, np.int64)
        self.ring_id = np.zeros(1024, np.int64)
        self.ring_gen = np.zeros(1024, np.int64)
        self.st = np.zeros(13, np.int64)
        self.wide: dict[bytes, int] = {}
        self.wide_of: dict[int, np.ndarray] = {}  # id(pool) -> surrogate -> number (-1 unknown)
        self.streams: dict[tuple[str, int], np.int64] = {}  # (source, rank) -> its mix
        # (the journal's tier names, the overlay's number of tiers) -> (code of each tier
        # index, the last for one past them; the freshest code of each code; the indexes
        # of tiers the overlay has no code for)
        self.codes: tuple[Any, np.ndarray, np.ndarray, list[int]] | None = None

    @property
    def num_remembered(self) -> int:
        """Removals remembered for "stored again"."""
        return int(self.st[9])

    @property
    def shift(self) -> np.uint64:
        """What an identity's product with `_GOLDEN` is shifted right by: the table's row."""
        return np.uint64(64 - (len(self.removed).bit_length() - 1))

    def wide_numbers(self, journal: Any, pool: Any, key: np.ndarray) -> np.ndarray:
        """The number of each of `pool`'s wide-hash surrogates among `journal`'s rows (the
        digest's number across pools: one digest, one number)."""
        have = self.wide_of.get(id(pool), np.zeros(0, np.int64))
        sur = key[np.asarray(journal.width, np.int64) == 2]  # colpool.W_WIDE: a surrogate of this pool's
        top = int(sur.max()) + 1
        if len(have) < top:
            have = np.concatenate([have, np.full(max(top, 2 * len(have)) - len(have), -1, np.int64)])
        for s in np.unique(sur[have[sur] < 0]).tolist():
            digest = pool.hash_of(s, 2)
            have[s] = self.wide.setdefault(digest, len(self.wide))
        self.wide_of[id(pool)] = have
        return have

    def stream_mix(self, pool: Any) -> np.int64:
        """The term a pool's server and rank mix into its rows' identities."""
        at = (pool.source, int(pool.rank))
        mix = self.streams.get(at)
        if mix is None:
            mix = self.streams[at] = (np.array([stream_code(*at) + 1], np.int64) * _MIX_STREAM)[0]  # wraps
        return mix

    def tier_codes(self, overlay: RemoteOverlay, names: list, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the overlay's code of each journal tier, the last for a tier past `names`; the
        freshest code of each code). A tier the rows name (`seen`) that the overlay has no
        code for gets one first, in the journal's order (as `observe` gives them in the
        order it meets them)."""
        known = overlay.tier_names
        cached = self.codes
        if cached is None or cached[0] != (names, len(known)):
            cached = self._tier_codes(overlay, names)
        if cached[3]:  # tiers the overlay has no code for yet: do the rows name one?
            flags = seen.tolist()
            new = [i for i in cached[3] if flags[i]]
            if new:
                medium = [*names, None]
                for i in new:
                    overlay.tier_code(tier_of_medium(medium[i]))
                cached = self._tier_codes(overlay, names)
        return cached[1], cached[2]

    def _tier_codes(self, overlay: RemoteOverlay, names: list) -> tuple:
        known = overlay.tier_names
        tiers = [tier_of_medium(m) for m in [*names, None]]
        code_of = np.array([known.get(t, 0) for t in tiers], np.int64)
        fresh_of = np.array([overlay._fresh_code(c) if c else 0 for c in range(len(known) + 1)], np.int64)
        unknown = [i for i, t in enumerate(tiers) if t not in known]
        self.codes = ((list(names), len(known)), code_of, fresh_of, unknown)
        return self.codes

    def room(self, n: int) -> None:
        """Room for `n` more removals: in the ring, and in the table at most half full (so a
        probe meets an empty row soon) for as many as it can hold at once, and for `ROOM_TICKS`
        more ticks of `n`. Doubling at each tick that needed it, a fast stream's table was
        made ten times on its way to 8 MB (512K rows), each a new array's page faults and a
        rehash of the old: 7-110 ms of CPU per 100K vLLM events of an attach's start, most
        of it kernel time in the faults (getrusage, 2026-12-04), against ~4 ms in two steps."""
        st = self.st
        head, tail, num = int(st[5]), int(st[6]), int(st[9])
        if head > len(self.ring_id) // 2:  # drop what the ring has passed
            live = tail - head
            self.ring_id[:live] = self.ring_id[head:tail]
            self.ring_gen[:live] = self.ring_gen[head:tail]
            st[5], st[6] = 0, live
            tail = live
        if tail + n > len(self.ring_id):
            # where they lie (`regrow`: from 256 KiB a mapping mremap grows): a new pair and a
            # copy at each doubling cost 2.3 ms of a 100K-event attach's start (to 391K removals)
            size = max(tail + n, 2 * len(self.ring_id))
            for name in ("ring_id", "ring_gen"):
                regrow(self, name, size, tail)
        rows = len(self.removed)
        while 2 * min(num + n * ROOM_TICKS, MAX_REMEMBERED_REMOVALS + 1) > rows:
            rows *= 2
        if rows > len(self.removed):
            grown = np.full((rows, 2), -1, np.int64)
            old, self.removed = self.removed, grown
            _compiled_observe()[2](old, grown, self.shift)

    @property
    def nbytes(self) -> int:
        """Bytes of the removals remembered: the table and the ring."""
        return self.removed.nbytes + self.ring_id.nbytes + self.ring_gen.nbytes


def _append_floats(overlay: RemoteOverlay, name: str, values: np.ndarray) -> None:
    """Append to the overlay's floats `name` (times, lifetimes, samples' times); while a
    reader holds a numpy view of an array('d') (np.frombuffer) it cannot grow in place, so
    it grows as a copy (the reader keeps the old)."""
    kept = getattr(overlay, "_" + name, None)
    if isinstance(kept, (_Floats, _Runs)):
        kept.append(values)
        return
    got = getattr(overlay, name)
    data = memoryview(np.ascontiguousarray(values, np.float64)).cast("B")
    try:
        got.frombytes(data)
    except BufferError:
        grown = array("d", got)
        grown.frombytes(data)
        setattr(overlay, name, grown)


class _Floats:
    """Floats appended a tick at a time and read (as an array('d')) at most once a redraw:
    appended into numpy chunks, moved to the array when it is read. An array('d') appended
    to at every tick grew by a sixteenth, each time a realloc that copied it whole (~3 ms of
    a journal tick's CPU per 100K vLLM events); here a tick writes its values once into room
    it has, and the array takes a read's worth in one append. A new chunk holds a sixteenth
    of the values (at least 1,024, at most `FLOAT_CHUNK`): the room is what the array's was."""

    __slots__ = ("_array", "_chunks", "_at", "_n")

    def __init__(self) -> None:
        self._array = array("d")
        self._chunks: list[np.ndarray] = []  # values not in the array yet, the last one filling
        self._at = 0  # values in the last chunk
        self._n = 0  # values in the chunks

    def __len__(self) -> int:
        return len(self._array) + self._n

    def append(self, values: np.ndarray) -> None:
        values = np.asarray(values, np.float64)
        done, k = 0, len(values)
        while done < k:
            if not self._chunks or self._at == len(self._chunks[-1]):
                size = min(FLOAT_CHUNK, max(1024, (len(self) + k - done) // 16))
                self._chunks.append(np.empty(size, np.float64))
                self._at = 0
            chunk, at = self._chunks[-1], self._at
            m = min(len(chunk) - at, k - done)
            chunk[at:at + m] = values[done:done + m]
            done += m
            self._at += m
            self._n += m

    def last(self) -> float:
        """The newest value (0.0 if none)."""
        if self._n:
            return float(self._chunks[-1][self._at - 1])
        return self._array[-1] if self._array else 0.0

    def read(self) -> array:
        """Every value, an array('d'): the array, the chunks' values appended first (as a
        copy while a reader's numpy view of it is alive)."""
        if self._n:
            last = self._chunks[-1][:self._at]
            data = np.concatenate([*self._chunks[:-1], last]) if len(self._chunks) > 1 else last
            raw = memoryview(data).cast("B")
            try:
                self._array.frombytes(raw)
            except BufferError:
                grown = array("d", self._array)
                grown.frombytes(raw)
                self._array = grown
            self._chunks, self._at, self._n = [], 0, 0
        return self._array

    @property
    def nbytes(self) -> int:
        return self._array.itemsize * len(self._array) + sum(c.nbytes for c in self._chunks)


FLOAT_CHUNK = 1 << 15  # 256 KiB of float64


class _Touched:
    """Slots changed since the last redraw: the compiled pass's array of a tick kept as it
    is (an array('q') that took each tick's by `frombytes` was realloc'd and copied as it
    grew: 2 ms of CPU per 100K vLLM events), the event route's slots one at a time."""

    __slots__ = ("_parts", "_one", "_num")

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self._one = array("q")
        self._num = 0

    def __len__(self) -> int:
        return self._num

    def append(self, slot: int) -> None:
        self._one.append(slot)
        self._num += 1

    def extend(self, slots: np.ndarray, num: int) -> None:
        """The first `num` of `slots` (an array made for this, kept: a copy where it has
        more room than values)."""
        if num:
            self._parts.append(slots[:num] if 2 * num >= len(slots) else slots[:num].copy())
            self._num += num

    def slots(self) -> np.ndarray:
        """Every slot listed (int64, in no particular order)."""
        parts = [*self._parts, np.frombuffer(self._one, np.int64)] if self._one else self._parts
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @property
    def nbytes(self) -> int:
        return sum((p.base if p.base is not None else p).nbytes for p in self._parts) + 8 * len(self._one)


class _Runs:
    """Times appended in order, kept as runs of one time: (time, number of values) each. A
    vLLM batch dates all its stores and removals alike, so a store's time took 8 bytes where
    its batch's run takes 16 for all of them; a slot names its store's run (`stored_run`).
    Run 0 is no run (time 0.0, none): what a slot never stored names. The arrays grow where
    they lie (`regrow`), as a copy while a reader holds a view of them."""

    __slots__ = ("times", "counts", "num_runs", "num", "_last")

    def __init__(self) -> None:
        self.times = np.zeros(RUN_ROOM, np.float64)
        self.counts = np.zeros(RUN_ROOM, np.int64)
        self.num_runs = 1  # runs kept, run 0 among them
        self.num = 0  # values
        self._last = 0.0  # the newest run's time (a float, for `add`'s compare)

    def __len__(self) -> int:
        return self.num

    def room(self, more: int) -> None:
        """Room for `more` new runs."""
        need = self.num_runs + more
        if need > len(self.times):
            size = max(need, len(self.times) + len(self.times) // 4)
            for name in ("times", "counts"):
                regrow(self, name, size, self.num_runs)

    def add(self, t: float, count: int = 1) -> int:
        """`count` values `t` appended; returns the run they are in."""
        nr = self.num_runs
        self.num += count
        if nr > 1 and t == self._last:
            self.counts[nr - 1] += count
            return nr - 1
        self.room(1)
        self.times[nr] = self._last = t
        self.counts[nr] = count
        self.num_runs = nr + 1
        return nr

    def append(self, values: np.ndarray) -> None:
        """Values appended in order (equal neighbours join a run, as `add` joins them)."""
        values = np.asarray(values, np.float64)
        if not len(values):
            return
        starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
        counts = np.diff(np.append(starts, len(values)))
        if self.num_runs > 1 and values[0] == self._last:
            self.add(float(values[0]), int(counts[0]))
            starts, counts = starts[1:], counts[1:]
        k = len(starts)
        if k:
            self.room(k)
            nr = self.num_runs
            self.times[nr:nr + k] = values[starts]
            self.counts[nr:nr + k] = counts
            self.num_runs = nr + k
            self.num += int(counts.sum())
            self._last = float(values[-1])

    def took(self, num_runs: int, num: int) -> None:
        """What the compiled pass wrote into the arrays is kept: `num` more values, now in
        `num_runs` runs (the newest run before it may have taken some)."""
        self.num += num
        self.num_runs = num_runs
        self._last = float(self.times[num_runs - 1]) if num_runs > 1 else 0.0

    def last(self) -> float:
        """The newest value (0.0 if none)."""
        return self._last

    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(time, number) of each run, in order: views of the kept arrays."""
        return self.times[1:self.num_runs], self.counts[1:self.num_runs]

    def values(self) -> array:
        """Every value, in order, an array('d') of its own."""
        times, counts = self.runs()
        return array("d", np.repeat(times, counts).tobytes())

    @property
    def nbytes(self) -> int:
        return self.times.nbytes + self.counts.nbytes


RUN_ROOM = 256  # runs a new `_Runs` has room for


def observe_journal(overlay: RemoteOverlay, journal: Any, times: np.ndarray, projection: Any,
                    slots: list[int] | np.ndarray, pool: Any, rank: int) -> None:
    """`RemoteOverlay.observe` for a tick of journal rows (a `JournalRows` of `pool`, one
    data-parallel `rank`) that a journal-fed live log (`engine.core.live_journal`) has just
    appended: `times` the batch time of each row (`JournalPool.times_of`), `slots` the log
    slot of each stored and removed row (`LiveColumnarLog.blocks_of_rows`). The same
    per-slot tier, rank, store time and code, rates, lifetimes and "stored again" as the
    reference's events give, from arrays in two compiled passes (what the rows need, then
    the rows), so a tick costs a few numpy calls whatever its size."""
    n = len(journal)
    if not n:
        return
    self = overlay
    follow = self.journal
    if follow is None:
        follow = self.journal = JournalFollower()
    counted, top = self._counts, self._written_top  # the tier counts of the tick before, if kept
    self.revision += 1
    self._grow(projection.num_blocks)
    scan, loop, _ = _compiled_observe()
    op, jtier = np.asarray(journal.op, np.int64), np.asarray(journal.tier, np.int64)
    store, width = np.asarray(journal.store, np.int64), np.asarray(journal.width, np.int64)
    key = np.asarray(journal.key, np.uint64).view(np.int64)
    names = journal.tier_names
    seen = np.zeros(len(names) + 1, np.int64)
    times = np.asarray(times, np.float64)
    num_removed, num_wide, num_times = scan(op, jtier, store, width, times, seen)
    code_of, fresh_of = follow.tier_codes(self, names, seen)
    have = follow.wide_numbers(journal, pool, key) if num_wide else np.zeros(0, np.int64)
    follow.room(num_removed)  # the ring holds removals only
    # what the pass writes: the runs of store and removal times (of each kind at most as many
    # as the tick's times: room for a run a row took 16 bytes a row of a big tick, 17 MB for
    # a 1M-block pool's ticks of 500K), lifetimes, slots changed
    runs_s, runs_r = self._stored_times, self._removed_times
    runs_s.room(num_times)
    runs_r.room(num_times)
    life_out = np.empty(n)
    touched_out = np.empty(n, np.int64)  # a slot at most a stored or removed row
    tally = np.zeros(256, np.int64)
    st = follow.st
    st[:4] = 0
    st[8] = -1
    st[10] = top
    st[11], st[12] = runs_s.num_runs, runs_r.num_runs
    if counted is not None and counted[0] != self.revision - 1:
        counted = None  # a tick it did not count came between
    # the slots' ranks: none written while every store is rank 0's (an empty array: the loop skips them)
    ranks = self._own_ranks() if rank or self._ranks is not None else np.zeros(0, np.uint16)
    loop(op, jtier, key, width, store, np.asarray(slots, np.int64), times, code_of,
         fresh_of, have, follow.stream_mix(pool), rank, ranks, self.stored_run, self.base, tally,
         runs_s.times, runs_s.counts, runs_r.times, runs_r.counts, life_out, touched_out, follow.removed,
         follow.shift, follow.ring_id, follow.ring_gen, st, MAX_REMEMBERED_REMOVALS)
    self._written_top = int(st[10])
    num_stored, num_removed, num_lives, num_touched = st[:4].tolist()
    runs_s.took(int(st[11]), num_stored)
    runs_r.took(int(st[12]), num_removed)
    if num_lives:
        self._lifetimes.append(life_out[:num_lives])
    if self._can_touch(num_touched):
        self._touched.extend(touched_out, num_touched)
    else:
        self._forget_touched()
    self.num_stored_again += int(st[7])
    st[7] = 0
    if st[8] >= 0:
        self.last_reset_time = float(times[st[8]])
        k = min(projection.num_blocks, len(self.base))
        held = np.frombuffer(projection.hashed, dtype=np.uint8, count=k)
        self.base[:k][held == 0] = 0
        self._codes_second = None
    else:
        # the tier counts move on by what the pass changed, not a pass over every slot: while
        # the counts of the tick before covered every slot ever given a code and this tick's too
        n = min(projection.num_blocks, len(self.base))
        if counted is not None and self._counts is counted and top <= counted[1] <= n and self._written_top <= n:
            self._count_tiers(n, counted[3] + tally)
    self._sample(projection, self.now)
