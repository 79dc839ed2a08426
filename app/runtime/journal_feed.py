"""The journal route's placing thread: an attached server's journal rows placed off the GUI thread.

`JournalFeed` takes each pool's new journal rows under the attachment's lock, places them for
the state's log (`engine.core.live_journal.prepare_journal`: the compiled placer, which runs
without the GIL) and queues the prepared blocks; the GUI tick (`RemoteController.tick`)
writes them to the log (`PoolState.apply_prepared`), so what runs there is one array copy
per block and the moves of the series, live pool and overlay. `take_journal_rows` is the one
way rows are taken, by the feed and by the GUI tick that runs without one (a drain at detach,
tests).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable

from engine.core.threads import lower_priority

# The feed places ahead of the GUI tick by at most this many rows (a window that cannot keep
# up is not handed an unbounded backlog: the rest waits in the pools' journals).
MAX_READY_ROWS = 1 << 18
# After a bite smaller than a full one the feed waits this long before the next: every block
# costs a fixed price to place and to write (about 1 ms each: the live pool, series, overlay
# move on), so rows arriving meanwhile make one block, not one per frame. The views hear of
# a burst's rows every VIEW_FRAME_S (0.2 s) anyway; at 16 ms (a GUI frame) the window's
# attach had about twice the blocks and its GUI thread a tenth more CPU.
TAKE_EVERY_S = 0.05
# ... except when a burst ends: the feed looks at the pools every QUIET_S while it waits, and
# takes at once when rows wait, none came since the last look (the stream paused) and the
# stream was busy (QUIET_ROWS rows or more wait, or its last bite had as many), so a burst's
# last rows are not left waiting the rest of TAKE_EVERY_S. A steady stream keeps adding rows
# between two looks, and a slow one brings fewer: both still take every TAKE_EVERY_S.
QUIET_S = 0.004
QUIET_ROWS = 2048


class JournalPools:
    """Journalling columnar pools read as `take_journal_rows` reads an `Attachment` (its lock
    and pools) where no attachment holds them: a recorded attach replayed (`pool` makes one
    per source, server and rank, in the order they first sent) and the headless route's
    bench and tests (the pools given)."""

    def __init__(self, pools: Iterable[Any] = ()) -> None:
        self.lock = threading.RLock()
        self.pools: list[Any] = list(pools)
        self._of: dict[tuple[str, str, int], Any] = {}

    def pool(self, source: str, server: str, rank: int) -> Any:
        """The stream's pool, made (`engine.remote.overlay.journal_pool_class`) at its first use."""
        got = self._of.get((source, server, rank))
        if got is None:
            from engine.remote.overlay import journal_pool_class

            got = self._of[(source, server, rank)] = journal_pool_class()(source, rank, server=server)
            self.pools.append(got)
        return got


def untaken_rows(att: Any, taken: dict[int, int]) -> int:
    """Journal rows the attachment's pools have journalled that no take has taken yet
    (`taken`: id(pool) -> its rows taken so far); read under the attachment's lock for a
    count that does not move while it is read."""
    return sum(pool.num_journal_rows - taken.get(id(pool), 0) for pool in att.pools)


def take_journal_rows(att: Any, taken: dict[int, int], limit: int, timeout: float = -1,
                      counted: Callable[[int], None] | None = None) -> tuple[list, bool] | None:
    """Under `att.lock`, each pool's journal rows from `taken[id(pool)]` on, at most `limit`
    rows shared between the pools with rows, as (`JournalRows`, pool, batch times); and
    whether rows were left for later. `taken` moves on, the pools release the rows taken
    (`ColumnarPool.release_journal`: nothing reads them from the pool again), and
    `counted(rows taken)` is called before the lock is let go. None if the lock was not had
    within `timeout` seconds (-1: wait)."""
    from engine.core.live_journal import journal_head

    if not att.lock.acquire(timeout=timeout):
        return None
    try:
        waiting = [pool for pool in att.pools if pool.num_journal_rows > taken.get(id(pool), 0)]
        takes = []
        left = False
        for pool in waiting:
            rows = pool.journal_since(taken.get(id(pool), 0))
            # a copy (held until written: views would hold the pool's journal array, which it
            # then could not grow or drop where it lies, `JournalRows.copy`)
            head = journal_head(rows, max(1, limit // len(waiting))).copy()
            left = left or len(head) < len(rows)
            del rows
            taken[id(pool)] = head.stop
            takes.append((head, pool, pool.times_of(head)))
            # the app reads taken rows only through `head` (placed into its own log): the pool
            # may drop them
            pool.release_journal(head.stop)
        if counted is not None:
            counted(sum(len(t[0]) for t in takes))
        return takes, left
    finally:
        att.lock.release()


class JournalFeed:
    """Places an attachment's journal rows for `log` on a thread of its own.

    `ready` holds (`PreparedJournal`, batch times) in the order they must be committed; the
    GUI thread pops them (`pop_ready`). `bite()` says how many rows to place at a time (the
    tick's budget, so one block fits in a tick). Rows are counted as taken (under the
    attachment's lock), prepared (by this thread) and committed (popped by the GUI thread),
    each counter written by one thread only. `error` is the exception that stopped the
    thread, if one did."""

    def __init__(self, att: Any, log: Any, taken: dict[int, int], bite: Callable[[], int], nice: int = 0) -> None:
        self.att, self.log, self.taken, self.bite = att, log, taken, bite
        self.nice = nice  # the thread's priority below the GUI thread's (`engine.core.threads`)
        self.ready: collections.deque[tuple[Any, Any]] = collections.deque()
        self.num_taken = 0
        self.num_prepared = 0
        self.num_committed = 0
        self.error: BaseException | None = None
        self._last_bite = 0  # rows the last step took
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="journal-placer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop placing (what is in `ready` stays, to be committed)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def pending(self) -> int:
        """Rows taken from the pools and not yet committed."""
        return self.num_taken - self.num_committed

    @property
    def num_ready(self) -> int:
        """Rows in `ready`."""
        return self.num_prepared - self.num_committed

    def pop_ready(self) -> tuple[Any, Any] | None:
        try:
            item = self.ready.popleft()
        except IndexError:
            return None
        self.num_committed += len(item[0])
        return item

    def pop_blocks(self, limit: int | None) -> list[tuple[Any, Any]]:
        """Placed blocks in order (`pop_ready`) until they hold `limit` rows or more (a GUI
        tick's budget; None: every one ready)."""
        blocks: list[tuple[Any, Any]] = []
        rows = 0
        while limit is None or rows < limit:
            item = self.pop_ready()
            if item is None:
                break
            blocks.append(item)
            rows += len(item[0])
        return blocks

    def _run(self) -> None:
        lower_priority(self.nice)
        try:
            while not self._stop.is_set():
                if self.num_ready >= MAX_READY_ROWS:
                    self._wake.wait(TAKE_EVERY_S)
                    self._wake.clear()
                elif self.step() < self.bite():
                    self._rest()
        except BaseException as exc:  # noqa: BLE001 - kept for the GUI thread to report
            self.error = exc

    def _rest(self) -> None:
        """Wait up to TAKE_EVERY_S for rows to gather, less when a burst has ended."""
        end = time.monotonic() + TAKE_EVERY_S
        seen = self._journalled()
        while not self._wake.wait(max(0.0, min(QUIET_S, end - time.monotonic()))):
            if time.monotonic() >= end:
                return
            now = self._journalled()
            if now == seen:
                waiting = now - sum(self.taken.get(id(p), 0) for p in self.att.pools)
                if waiting >= QUIET_ROWS or (waiting > 0 and self._last_bite >= QUIET_ROWS):
                    return
            seen = now
        self._wake.clear()

    def _journalled(self) -> int:
        """Rows the pools have journalled in all, read without the lock (only this thread
        releases rows, so the count is whole; a batch being applied shows up at the next look)."""
        return sum(pool.num_journal_rows for pool in self.att.pools)

    def step(self) -> int:
        """Take and place one bite; the rows placed (0: nothing new)."""
        from engine.core.live_journal import prepare_journal

        got = take_journal_rows(self.att, self.taken, max(1, int(self.bite())), counted=self._count_taken)
        if got is None or not got[0]:
            self._last_bite = 0
            return 0
        made = 0
        for journal, pool, times in got[0]:
            prepared = prepare_journal(self.log, journal, pool, pool.source, int(pool.rank))
            self.num_prepared += len(journal)  # before it is in `ready`: popped rows are prepared ones
            self.ready.append((prepared, times))
            made += len(journal)
        self._last_bite = made
        return made

    def _count_taken(self, rows: int) -> None:
        self.num_taken += rows
