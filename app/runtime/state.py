"""The pool state every engine view reads: the event log, the live or scrubbed projection.

`PoolState` listens to the bridge (one batch of events per frame), appends each batch to
its columnar log (`engine.core.live_log.LiveColumnarLog`), and tells views once per batch
or scrub (`sigChanged`); an attached vLLM server's tiers, ranks and ages follow in a
`RemoteOverlay`.
An opened trace is adopted whole instead: an `EventLog`, or the kernel's columnar log as an
`engine.core.columnar_log.ColumnarEventLog` (read-only). `projection` is an
`ArrayProjection` on a columnar log, a `PoolProjection` on an `EventLog`; views read
either through the same names.
Event seq is the one numbering every view uses: "event 120" is `Event.seq == 120`.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from app.runtime.allocator import release_freed_soon
from engine.remote.overlay import RemoteOverlay
from engine.core.events import Event
from engine.core.live_log import LiveColumnarLog
from engine.core.projection import EventLog, PoolProjection

if TYPE_CHECKING:
    from engine.core.columnar_log import ArrayProjection, ColumnarEventLog

# While scrubbing, blocks evicted this many events before the shown one still flash.
SCRUB_FLASH_EVENTS = 8
# Live, only the evictions of the last batch flash, and at most this many events back,
# so that opening a whole trace in one batch does not paint every eviction ever made.
LIVE_FLASH_EVENTS = 256
# What "next miss" and "next eviction" jump to.
MISS_REASONS = ("new_content", "evicted", "salt", "model")
EVICTION_KINDS = ("block_evicted", "cache_reset")


def is_miss(event: Event) -> bool:
    """A lookup that missed a whole block it could have hit (not just the tail)."""
    miss = getattr(event, "miss", None)
    return event.kind == "lookup" and miss is not None and miss.reason in MISS_REASONS


def is_eviction(event: Event) -> bool:
    return event.kind in EVICTION_KINDS
# A remote pool can reach a million blocks, and every checkpoint is a copy of it: keep few,
# far apart (scrubbing replays at most one interval).
REMOTE_CHECKPOINTS = 4
REMOTE_CHECKPOINT_EVENTS = 1 << 17
# A tick of an attached server's journal this many rows or more hands the heap's freed
# pages back, on a thread of its own (app.runtime.allocator.release_freed_soon: ~1.5 ms on the
# window's own heap, tens of ms on a large one): its temporaries of 0.5-4 MiB,
# under the mmap threshold, stayed resident as holes (bench held's ticks of 524,288 rows:
# 25-30 B a block at 1M). A tick of the attach route (~4,400 rows) never pays for it.
RELEASE_ROWS = 1 << 16


@dataclass(slots=True, frozen=True)
class Timing:
    """Time to first token of one request, and the same prompt without reuse if measured."""

    request_id: str
    ttft_ms: float
    cold_ttft_ms: float | None = None


class PoolState(QObject):
    """The projection views draw: live (following new events) or scrubbed to event N.

    `projection` is the live projection or a rebuilt past one; views must treat it as
    read-only. `sigReset` fires when a new engine replaces the old (views clear caches);
    `sigChanged` after each applied batch, scrub or timing. With `columnar=False` a live
    source goes to the Python `EventLog` instead (the reference the tests hold it to).
    """

    sigChanged = Signal()
    sigReset = Signal()

    def __init__(self, bridge: Any = None, parent: QObject | None = None, columnar: bool = True) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.columnar = columnar
        self.engine_info: dict[str, Any] = {}
        self.log: EventLog | ColumnarEventLog = LiveColumnarLog(0, 16) if columnar else EventLog(0, 16)
        self.timings: dict[str, Timing] = {}
        self.version = 0  # bumps whenever `projection` changes
        self.last_batch: tuple[int, int] | None = None  # first and last seq of the last batch
        # Tier, rank and age of each block while the pool is a remote vLLM one (engine_info
        # "remote"), else None.
        self.remote: RemoteOverlay | None = None
        self._scrubbed: PoolProjection | None = None
        self._scrub_seq: int | None = None
        self.journal_seconds = 0.0  # the last `apply_journal`'s own time (the views' redraw apart)
        self._unnotified = False  # journal rows appended that no sigChanged has told of yet
        if bridge is not None:
            bridge.sigEvents.connect(self.apply_events)
            bridge.sigEngineChanged.connect(self.set_engine)
            if getattr(bridge, "engine_info", None):
                self.set_engine(bridge.engine_info)

    # ------------------------------------------------------------------ inputs
    def set_engine(self, info: dict[str, Any]) -> None:
        """Start over for a new engine (`sigEngineChanged` dict: block_size, num_blocks, ...)."""
        self.engine_info = dict(info)
        self.reset(int(info.get("num_blocks") or 0), int(info.get("block_size") or 16))

    def reset(self, num_blocks: int, block_size: int) -> None:
        if self.engine_info.get("remote") and self.engine_info.get("journal") and self.columnar:
            # an attached server whose pools journal (`RemoteController`): rows from arrays
            from engine.core.live_journal import journal_log

            self.log = journal_log(block_size, checkpoint_rows=REMOTE_CHECKPOINT_EVENTS,
                                   max_checkpoints=REMOTE_CHECKPOINTS)
            self.remote = RemoteOverlay()
        elif self.engine_info.get("remote"):
            self.log = LiveColumnarLog(num_blocks, block_size, checkpoint_rows=REMOTE_CHECKPOINT_EVENTS,
                                       max_checkpoints=REMOTE_CHECKPOINTS) if self.columnar else \
                EventLog(num_blocks, block_size, checkpoint_every=REMOTE_CHECKPOINT_EVENTS,
                         max_checkpoints=REMOTE_CHECKPOINTS)
            self.remote = RemoteOverlay()
        else:
            self.log = LiveColumnarLog(num_blocks, block_size) if self.columnar else EventLog(num_blocks, block_size)
            self.remote = None
        self.timings = {}
        self.last_batch = None
        self._scrubbed = None
        self._scrub_seq = None
        self.version += 1
        self.sigReset.emit()
        self.sigChanged.emit()

    def apply_events(self, events: list[Event]) -> None:
        """Append one batch to the log; the live projection follows it, a scrubbed one stays."""
        if not events:
            return
        if getattr(self.log, "columnar_log", False) and not getattr(self.log, "live_log", False):
            # An opened trace's log is read-only and its bus is detached: a batch still in
            # flight from the engine before it belongs to no log shown now.
            return
        last = self.log.last_seq
        if last is not None and events[0].seq <= last:
            # A bus shared across engines or a re-delivered batch: keep only what is new.
            events = [e for e in events if e.seq > last]
            if not events:
                return
        if self.remote is not None and getattr(self.log, "live_log", False):
            first_row = self.log.columnar.num_rows
            self.log.extend(events)
            self.remote.observe(events, self.log.live, self.log.blocks_of_rows(first_row))
        elif self.remote is not None:
            self.remote.before(events, self.log.live)
            self.log.extend(events)
            self.remote.observe(events, self.log.live)
        else:
            self.log.extend(events)
        self.last_batch = (events[0].seq, events[-1].seq)
        if self._scrubbed is not None and any(e.kind == "request_started" for e in events):
            # A new request is what the user is looking at now: a scrubbed past must not
            # hide it (scrub, New session, send would otherwise show the old pool).
            self._scrubbed = None
            self._scrub_seq = None
        if self._scrubbed is None:
            self.version += 1
        self.sigChanged.emit()

    @property
    def journal_fed(self) -> bool:
        """True while the log takes an attached server's journal rows (`apply_journal`)."""
        return bool(getattr(self.log.columnar, "journal_fed", False)) if getattr(self.log, "live_log", False) \
            else False

    def apply_journal(self, takes: list[tuple[Any, Any, int, int, Any]], notify: bool = True) -> int:
        """Append one GUI tick of journal rows: `takes` holds, per pool, (its `JournalRows`,
        the pool, its rank, the number of ranks, each row's batch time), rows taken under
        the attachment's lock. They are placed here (`prepare_journal`) and written as
        `apply_prepared` writes them. Returns the number of events appended."""
        if not self.journal_fed:
            return 0
        from engine.core.live_journal import prepare_journal

        started = time.perf_counter()
        prepared = [(prepare_journal(self.log, journal, pool, pool.source, rank), times)
                    for journal, pool, rank, _num_ranks, times in takes if len(journal)]
        placed = time.perf_counter() - started
        made = self.apply_prepared(prepared, notify)
        self.journal_seconds += placed
        return made

    def apply_prepared(self, prepared: list[tuple[Any, Any]], notify: bool = True) -> int:
        """Write journal rows placed for this log (`engine.core.live_journal.prepare_journal`,
        on any thread), in the order they were placed: `prepared` holds (`PreparedJournal`,
        each row's batch time). The log gets one event per row (`commit_journal`), the
        remote overlay follows from the same arrays, and views hear `sigChanged` once.
        Returns the number of events appended (0: nothing new, no signal); blocks placed for
        a log this state no longer shows are dropped. With `notify=False` the views hear of
        it at the next `notify()` (a burst redraws them at their frame rate, not per tick)."""
        if not self.journal_fed:
            return 0
        from engine.core.live_journal import commit_journal

        first = None if self.log.last_seq is None else self.log.last_seq + 1
        made = 0
        now = time.time()
        started = time.perf_counter()
        stores = self.log.columnar.store_attributes
        for block, times in prepared:
            if block.stores is not stores or not len(block):
                continue
            made += commit_journal(self.log, block, now=now, times=times)
            if self.remote is not None:  # the slots of the stored and removed rows, as placed
                self.remote.observe_journal(block.journal, times, self.log.live, block.slots, block.pool, block.rank)
        if made >= RELEASE_ROWS:
            release_freed_soon()
        self.journal_seconds = time.perf_counter() - started  # the append and overlay, not the views
        if not made:
            return 0
        self.last_batch = (first if first is not None else int(self.log.first_seq), int(self.log.last_seq))
        if self._scrubbed is None:
            self.version += 1
        self._unnotified = True
        if notify:
            self.notify()
        return made

    @property
    def unnotified(self) -> bool:
        """True if journal rows were appended that the views have not heard of (`notify`)."""
        return self._unnotified

    def notify(self) -> None:
        """Tell the views (`sigChanged`) of journal rows appended without a signal, if any."""
        if self._unnotified:
            self._unnotified = False
            self.sigChanged.emit()

    def adopt_log(self, log: EventLog | ColumnarEventLog) -> None:
        """Show `log`, a whole log built elsewhere (a trace replayed and projected on the
        worker), in one step: views reset to it and redraw once, live at its last event.
        The engine (`set_engine`) must already be the one that produced it."""
        self.log = log
        self.remote = None
        self.timings = {}
        self._scrubbed = None
        self._scrub_seq = None
        self.last_batch = (log.first_seq, log.last_seq) if len(log) else None
        self.version += 1
        self.sigReset.emit()
        self.sigChanged.emit()

    def record_timing(self, request_id: str, ttft_ms: float, cold_ttft_ms: float | None = None) -> None:
        """Remember a request's time to first token (and without reuse, if it was measured)."""
        self.timings[request_id] = Timing(request_id, float(ttft_ms),
                                          None if cold_ttft_ms is None else float(cold_ttft_ms))
        self.version += 1
        self.sigChanged.emit()

    # ------------------------------------------------------------------ scrubbing
    def scrub_to(self, seq: int | None) -> None:
        """Show the pool as it was right after event `seq`; None follows the live pool again."""
        if seq is None:
            if self._scrubbed is None:
                return
            self._scrubbed = None
            self._scrub_seq = None
        else:
            seq = int(seq)
            first = self.log.first_seq
            if first is not None and seq < first:
                seq = first
            if seq == self._scrub_seq:
                return
            self._scrubbed = self.log.state_at(seq, base=self._scrubbed)
            self._scrub_seq = seq
        self.version += 1
        self.sigChanged.emit()

    def contains(self, seq: int | None) -> bool:
        """True if event `seq` is in the log (a link to it can scrub there)."""
        if seq is None:
            return False
        position_of = getattr(self.log, "position_of", None)
        if position_of is not None:  # a columnar log: no event built to answer
            return position_of(int(seq)) is not None
        return self.log.event_at_seq(int(seq)) is not None

    def find(self, predicate: Any, forward: bool, start: int | None = None) -> int | None:
        """The seq of the nearest event after (or before) `start` (default: the shown one)
        that satisfies `predicate`; None if there is none."""
        seqs, events = self.log.seqs, self.log.events
        if not len(seqs):
            return None
        here = self.current_seq if start is None else start
        if getattr(self.log, "columnar_log", False) and predicate in (is_miss, is_eviction):
            # the kind and miss-reason columns answer at once, without an Event per row
            mask = self.log.miss_mask() if predicate is is_miss else self.log.eviction_mask()
            return self.log.find(mask, forward, here)
        if here is None:
            here = seqs[0] - 1
        if forward:
            rng = range(bisect.bisect_right(seqs, here), len(seqs))
        else:
            rng = range(bisect.bisect_left(seqs, here) - 1, -1, -1)
        for i in rng:
            if predicate(events[i]):
                return int(seqs[i])
        return None

    @property
    def is_live(self) -> bool:
        return self._scrubbed is None

    def touch(self) -> None:
        """Something the views draw with changed outside the projection (a tokenizer that
        decodes token text arrived): every view redraws once."""
        self.version += 1
        self.sigChanged.emit()

    @property
    def projection(self) -> PoolProjection | ArrayProjection:
        return self.log.live if self._scrubbed is None else self._scrubbed

    @property
    def seq_range(self) -> tuple[int, int] | None:
        """First and last seq of the log, or None while it is empty."""
        if not len(self.log):
            return None
        return self.log.first_seq, self.log.last_seq

    @property
    def current_seq(self) -> int | None:
        """The seq of the last event the shown projection includes (None before any)."""
        seq = self.projection.seq
        return None if seq < 0 else seq

    @property
    def flash_since_seq(self) -> int:
        """Blocks evicted at or after this seq count as just evicted and flash."""
        if self._scrubbed is not None:
            return self._scrubbed.seq - SCRUB_FLASH_EVENTS + 1
        if self.last_batch is None:
            return 1 << 62
        return max(self.last_batch[0], self.last_batch[1] - LIVE_FLASH_EVENTS + 1)
