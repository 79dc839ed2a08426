"""Recorded vLLM attaches (`cachescope attach --record`) opened offline in the app.

A capture is a store session whose run of kind `attach` holds the frames its servers sent
(`Store.frames`): they are decoded and applied to one journalling columnar pool per stream
and the pools' journal rows placed into the views' log a tick at a time (`FrameReplay`; the
window goes on a slice at a time, `begin_capture`, so a large capture fills the views as a
live attach does and the window stays live),
the route a live attach takes (`app.runtime.remote`), with no Python object per event, so
a capture opens at the engine's speed; the pools are the fleet views' servers. A capture
written before frames holds the converted events (`Store.events`): those are replayed into
the views as before, and the servers' pools rebuilt from them
(`engine.remote.fleet_view.fleet_from_events`). Recording is `engine.analysis.remote_capture`.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.runtime.context import AppContext, Subject, engine_info
from app.runtime.journal_feed import JournalPools, take_journal_rows, untaken_rows
from app.runtime.remote import AttachSettings
from engine.core.events import EventBus
from engine.remote.attachment import AttachOptions
from engine.remote.fleet import Fleet
from engine.remote.fleet_view import fleet_from_events

CAPTURE_SOURCE = "vllm-attach"  # engine.analysis.remote_capture.SOURCE, without importing the store
# A capture's replay (`FrameReplay`) writes journal rows TAKE_ROWS at a time at most, once
# MIN_TAKE_ROWS wait (or the reading ended); its reader stays at most AHEAD_ROWS ahead of
# the writes, waiting WAIT_S at a time for room (and `step` as long for rows)
TAKE_ROWS = 1 << 15
MIN_TAKE_ROWS = 1 << 12
AHEAD_ROWS = 1 << 18
WAIT_S = 0.005


def latest_capture(path: str | Path) -> Any:
    """The newest session of a database when it is a recorded attach (`attach --record`), else None.

    A database whose newest session is a chat opens as a chat, as before.
    """
    from engine.store.database import Store

    try:
        with Store(path) as store:
            sessions = [s for s in store.list_sessions()
                        if s.source_format == CAPTURE_SOURCE or (s.kind == "chat" and s.num_messages)]
    except Exception:  # noqa: BLE001 - not our database: the chat path reports it
        return None
    last = sessions[-1] if sessions else None
    return last if last is not None and last.source_format == CAPTURE_SOURCE else None


def open_capture(ctx: AppContext, path: str | Path, session_id: int | None = None) -> int:
    """Show a recorded attach offline, at once: `begin_capture`, then its frames replayed to
    the end; returns the number of events in the views' log. InputError when the database
    holds no capture or a damaged one (the frames before a damaged one stay shown)."""
    job = begin_capture(ctx, path, session_id)
    if job is not None:
        while not job.step():
            pass
    return len(ctx.state.log)


def begin_capture(ctx: AppContext, path: str | Path, session_id: int | None = None) -> CaptureOpen | None:
    """Start showing a recorded attach offline (the newest capture of the database, or
    session `session_id`): the views reset to its servers' pool; a capture of frames is then
    replayed a slice at a time by the `CaptureOpen` returned (`step`), its database open
    until the last; a capture of events (from before frames) is shown here (None returned).
    InputError, with nothing replaced, when the database holds no capture."""
    from engine.core.errors import InputError
    from engine.store.database import Store

    store = Store(path)
    try:
        if session_id is None:
            session = latest_capture(path)
            if session is None:
                raise InputError(f"{path} holds no recorded vLLM attach")
        else:
            session = store.get_session(session_id)
        runs = [r for r in store.runs(session.id) if r.kind == "attach"]
        if not runs:
            raise InputError(f"session {session.id} of {path} holds no recorded stream")
        run = runs[-1].id
        num_frames = store.num_frames(run)
        settings = session.settings or {}
        endpoint = ", ".join(settings.get("endpoints") or []) or "vLLM"
        info = engine_info(block_size=session.block_size or 16, num_blocks=0, model=f"vLLM {endpoint} (recorded)")
        info.update(remote=True, endpoint=endpoint, hash_scheme=session.hash,
                    data_parallel_size=int(settings.get("data_parallel_size") or 1), recorded=True,
                    journal=num_frames > 0)
        # (a capture of events is read before the views change: a damaged row is one sentence, nothing replaced)
        events = None if num_frames else store.events(run)
        ctx.open_subject(Subject("server", f"{session.title} (recorded)", source=str(path)), ask=False)
        ctx.attach_events(EventBus(), info)
    except BaseException:
        store.close()
        raise
    reading = _reading_settings(session, settings)
    if events is None:
        # (1,024 frames read at once, about 4 MB: a read of 4,096 inside a 30 ms slice made it 80-100 ms)
        return CaptureOpen(ctx, store, FrameReplay(ctx.state, store.frames(run, chunk=1024)), num_frames, reading)
    store.close()
    ctx.bridge.push(events)
    ctx.bridge.flush(everything=True)
    ctx.remote.show_recorded_fleet(fleet_from_events(events), reading)
    return None


class CaptureOpen:
    """A capture of frames being shown: `step(budget_s, notify)` replays its frames into the
    views for about `budget_s` (`FrameReplay.step`) and, after the last, closes its database and hands
    the streams' pools to the fleet views; True then. `cancel()` stops it where it is (another
    subject came). A damaged frame raises InputError from `step` (the database closed)."""

    def __init__(self, ctx: AppContext, store: Any, replay: FrameReplay, num_frames: int,
                 reading: AttachSettings | None) -> None:
        self.ctx, self.replay, self.num_frames = ctx, replay, num_frames
        self._store, self._reading = store, reading

    @property
    def fraction(self) -> float:
        """How much of the capture's frames is replayed, 0 to 1."""
        return self.replay.num_read / max(1, self.num_frames)

    def step(self, budget_s: float = float("inf"), notify: bool = True) -> bool:
        try:
            if not self.replay.step(budget_s, notify):
                return False
        except BaseException:
            self.cancel()
            raise
        self.cancel()
        fleet = Fleet()
        for pool in self.replay.pools:
            fleet.add(pool.server or pool.source, pool)
        self.ctx.remote.show_recorded_fleet(fleet, self._reading)
        return True

    def cancel(self) -> None:
        self.replay.stop()  # its reader reads the database: stopped before it closes
        if self._store is not None:
            self._store.close()
            self._store = None


class FrameReplay:
    """A capture's frames (`Store.frames`: lists of (source, server, rank, seq, time,
    payload), payload None where the server restarted) into `state`, a journal-fed
    `PoolState`, as a live attach writes them: its reader (`FrameReader`, the capture's
    subscriber, on a thread of its own) applies them to one pool per stream, and `step`, on
    the thread that owns `state`, takes the pools' journal rows (`take_journal_rows`) and
    places and writes them (`PoolState.apply_journal`) meanwhile, on the machine's other core.

    `step(budget_s)` goes on for about `budget_s` and tells the views once; True when every
    frame is in. A frame that does not decode (a damaged file), or whatever else stops the
    reading, is raised by `step` once the frames before it are written (InputError naming
    its stream and batch). `stop()`, or the replay dropped (its window closed mid-open), ends
    the reading where it is.

    On one thread (a commit every 256 frames) the 7,213-frame capture of `bench capture`
    opened in 0.42-0.43 s (medians of 5 and 6 fresh windows); read on a thread beside the
    writes, in 0.50, 0.46, 0.36, 0.36-0.37 and 0.36 s with takes of at most 8K, 16K, 32K, 64K
    and 128K rows (runs alternating, 2026-12-06): TAKE_ROWS is 32K, about a window's slice
    (`app.window.files.CAPTURE_SLICE_S`) of writing."""

    def __init__(self, state: Any, chunks: Iterable[list[tuple]], frames_per_run: int = 256) -> None:
        self.state = state
        self.streams = JournalPools()
        self._taken: dict[int, int] = {}
        self.reader = FrameReader(chunks, self.streams, self._taken, frames_per_run)
        # (the reader holds no Qt object, so the thread that drops the replay may stop it)
        weakref.finalize(self, self.reader.stop, False)

    @property
    def pools(self) -> list[Any]:
        return self.streams.pools

    @property
    def num_read(self) -> int:
        """Frames (and restarts) the reader applied to the pools."""
        return self.reader.num_read

    def step(self, budget_s: float = float("inf"), notify: bool = True) -> bool:
        """Write what the reader applied for about `budget_s`; True when every frame is in.
        The views hear of it at the end of the step when `notify`, and always after the last
        frame (or a damaged one)."""
        start = time.perf_counter()
        reader = self.reader
        reader.start()
        done = True
        try:
            while True:
                reader.applied.clear()
                read_all = reader.read_all  # read before the count: every row applied before it is counted
                waiting = untaken_rows(self.streams, self._taken)
                # (the reader waits for room at AHEAD_ROWS)
                if waiting >= min(MIN_TAKE_ROWS, AHEAD_ROWS) or (read_all and waiting):
                    self._commit()
                elif read_all:
                    if reader.error is not None:
                        raise reader.error
                    return True
                else:  # too few rows yet: the reader's next run awaited, within the budget
                    reader.applied.wait(max(0.0, min(budget_s - (time.perf_counter() - start), WAIT_S)))
                if time.perf_counter() - start >= budget_s:
                    done = False
                    return False
        finally:
            if notify or done:
                self.state.notify()

    def stop(self) -> None:
        """End the reading where it is (the rows it applied stay untaken)."""
        self.reader.stop()

    def _commit(self) -> None:
        """Pools' new journal rows taken (at most TAKE_ROWS), then placed and written as a GUI
        tick with no placing thread writes them (`PoolState.apply_journal`)."""
        got = take_journal_rows(self.streams, self._taken, TAKE_ROWS)
        self.reader.taken_some.set()
        self.state.apply_journal([(head, pool, int(pool.rank), 1, times) for head, pool, times in got[0]],
                                 notify=False)


class FrameReader:
    """A capture's subscriber: on a thread of its own ('capture-reader', from `start`), each
    stream's runs of frames decoded at once (`fastwire.decode_columns_many`, at most
    `frames_per_run`) and applied to its pool (`streams`, made at a stream's first frame)
    under the pools' lock, as an attachment's subscriber applies what it receives; a restart
    resets its stream's pool. It stays at most AHEAD_ROWS journal rows ahead of the takes
    (`taken`, written by the taking thread, which sets `taken_some` after a take). `applied`
    is set after each run and when the reading ends; `read_all` is then True, and `error`
    what ended it early (a damaged frame: the frames before it applied)."""

    def __init__(self, chunks: Iterable[list[tuple]], streams: JournalPools, taken: dict[int, int],
                 frames_per_run: int = 256) -> None:
        self.streams, self.taken, self.frames_per_run = streams, taken, frames_per_run
        self.num_read = 0  # frames (and restarts) applied to the pools
        self.read_all = False  # set when the reading ends, after its last apply
        self.error: BaseException | None = None
        self.applied = threading.Event()
        self.taken_some = threading.Event()
        self._chunks = iter(chunks)
        self._rows: list[tuple] = []
        self._at = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start reading, once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._read, name="capture-reader", daemon=True)
            self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """End the reading where it is; with `wait`, once the thread has ended."""
        self._stopping.set()
        self.taken_some.set()
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _read(self) -> None:
        try:
            while not self._stopping.is_set() and self._read_some():
                pass
        except BaseException as exc:  # noqa: BLE001 - raised by `FrameReplay.step` on the state's thread
            self.error = exc
        finally:
            self.read_all = True
            self.applied.set()

    def _read_some(self) -> bool:
        """A wait for room while AHEAD_ROWS rows wait to be taken, a chunk read, or a run
        applied; False after the last frame."""
        if untaken_rows(self.streams, self.taken) >= AHEAD_ROWS:
            self.taken_some.wait(WAIT_S)
            self.taken_some.clear()
        elif self._at >= len(self._rows):
            rows = next(self._chunks, None)
            if rows is None:
                return False
            self._rows, self._at = rows, 0
        else:
            with self.streams.lock:
                self._run()
            self.applied.set()
        return True

    def _run(self) -> None:
        """The frames from `_at` that one call applies: a restart, or a run of one stream's
        frames that number on (at most `frames_per_run`)."""
        from engine.core.errors import InputError
        from engine.remote import fastwire
        from engine.remote.wire import MalformedFrame

        rows, i = self._rows, self._at
        source, server, rank, seq, _, payload = rows[i]
        pool = self.streams.pool(source, server, rank)
        if payload is None:
            pool.reset(seq)  # as the attachment's restart handler resets it
            self._at, self.num_read = i + 1, self.num_read + 1
            return
        j = i + 1
        while (j < len(rows) and j - i < self.frames_per_run and rows[j][5] is not None
               and rows[j][3] == seq + j - i and rows[j][:3] == (source, server, rank)):
            j += 1
        try:
            pool.apply_many(fastwire.decode_columns_many(seq, [r[5] for r in rows[i:j]]))
        except MalformedFrame:  # a damaged file: the frames before the bad one applied, then why no more
            for k in range(i, j):
                try:
                    pool.apply_many([fastwire.decode_columns(rows[k][3], rows[k][5])])
                except MalformedFrame as exc:
                    raise InputError(f"{source}'s recorded {exc}; the views show the batches before it") from None
        self._at, self.num_read = j, self.num_read + j - i


def _reading_settings(session: Any, settings: dict[str, Any]) -> AttachSettings | None:
    """How the capture's servers hashed their blocks, for the router's probe; None when the
    session's settings no longer read (the fleet still shows, the probe says why not)."""
    try:
        return AttachSettings(AttachOptions.from_dict(settings), session.hash or "vllm-sha256",
                              block_size=session.block_size or 16)
    except ValueError:
        return None
