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

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.runtime.context import AppContext, Subject, engine_info
from app.runtime.journal_feed import JournalPools, take_journal_rows
from app.runtime.remote import AttachSettings
from engine.core.events import EventBus
from engine.remote.attachment import AttachOptions
from engine.remote.fleet import Fleet
from engine.remote.fleet_view import fleet_from_events

CAPTURE_SOURCE = "vllm-attach"  # engine.analysis.remote_capture.SOURCE, without importing the store


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
        if self._store is not None:
            self._store.close()
            self._store = None


class FrameReplay:
    """A capture's frames (`Store.frames`: lists of (source, server, rank, seq, time,
    payload), payload None where the server restarted) into `state`, a journal-fed
    `PoolState`, as a live attach's ticks write them: each stream's runs of frames decoded at
    once (`fastwire.decode_columns_many`) and applied to its pool (`JournalPools`), and every
    `frames_per_tick` frames the pools' journal rows taken, placed and written
    (`take_journal_rows`, `PoolState.apply_journal`). `step(budget_s)` goes on for
    about `budget_s` and tells the views once; True when every frame is in. A frame that does
    not decode (a damaged file) raises InputError naming its stream and batch, the frames
    before it written. Ticks of 64, 128, 256 and 2,048 frames opened a 7,213-frame capture in
    0.28, 0.27, 0.25 and 0.31 s."""

    def __init__(self, state: Any, chunks: Iterable[list[tuple]], frames_per_tick: int = 256) -> None:
        self.state, self.frames_per_tick = state, frames_per_tick
        self.streams = JournalPools()
        self.num_read = 0  # frames (and restarts) replayed
        self._chunks = iter(chunks)
        self._rows: list[tuple] = []
        self._at = 0
        self._since = 0  # frames applied since the last tick's commit
        self._taken: dict[int, int] = {}

    @property
    def pools(self) -> list[Any]:
        return self.streams.pools

    def step(self, budget_s: float = float("inf"), notify: bool = True) -> bool:
        """Replay for about `budget_s`; True when every frame is in. The views hear of it at
        the end of the step when `notify`, and always after the last frame (or a damaged one)."""
        start = time.perf_counter()
        done = True
        try:
            while True:
                if self._at >= len(self._rows):
                    rows = next(self._chunks, None)
                    if rows is None:
                        self._commit()
                        return True
                    self._rows, self._at = rows, 0
                self._run()
                if self._since >= self.frames_per_tick:
                    self._commit()
                    if time.perf_counter() - start >= budget_s:
                        done = False
                        return False
        finally:
            if notify or done:
                self.state.notify()

    def _run(self) -> None:
        """The frames from `_at` that one call applies: a restart, or a run of one stream's
        frames that number on (at most a tick's)."""
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
        while (j < len(rows) and j - i < self.frames_per_tick and rows[j][5] is not None
               and rows[j][3] == seq + j - i and rows[j][:3] == (source, server, rank)):
            j += 1
        try:
            pool.apply_many(fastwire.decode_columns_many(seq, [r[5] for r in rows[i:j]]))
        except MalformedFrame:  # a damaged file: the frames before the bad one written, then why no more
            for k in range(i, j):
                try:
                    pool.apply_many([fastwire.decode_columns(rows[k][3], rows[k][5])])
                except MalformedFrame as exc:
                    self._commit()
                    raise InputError(f"{source}'s recorded {exc}; the views show the batches before it") from None
        self._at, self.num_read, self._since = j, self.num_read + j - i, self._since + j - i

    def _commit(self) -> None:
        """The pools' new journal rows taken, then placed and written as a GUI tick with no
        placing thread writes them (`PoolState.apply_journal`)."""
        got = take_journal_rows(self.streams, self._taken, 1 << 30)
        self.state.apply_journal([(head, pool, int(pool.rank), 1, times) for head, pool, times in got[0]],
                                 notify=False)
        self._since = 0


def _reading_settings(session: Any, settings: dict[str, Any]) -> AttachSettings | None:
    """How the capture's servers hashed their blocks, for the router's probe; None when the
    session's settings no longer read (the fleet still shows, the probe says why not)."""
    try:
        return AttachSettings(AttachOptions.from_dict(settings), session.hash or "vllm-sha256",
                              block_size=session.block_size or 16)
    except ValueError:
        return None
