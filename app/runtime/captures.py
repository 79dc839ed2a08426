"""Recorded vLLM attaches (`cachescope attach --record`) opened offline in the app.

A capture is a store session whose run of kind `attach` holds the frames its servers sent
(`Store.frames`): they are decoded and applied to one journalling columnar pool per stream
and the pools' journal rows placed into the views' log a tick at a time (`replay_frames`),
the route a live attach takes (`app.runtime.remote`), with no Python object per event, so
a capture opens at the engine's speed; the pools are the fleet views' servers. A capture
written before frames holds the converted events (`Store.events`): those are replayed into
the views as before, and the servers' pools rebuilt from them
(`engine.remote.fleet_view.fleet_from_events`). Recording is `engine.analysis.remote_capture`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.runtime.context import AppContext, Subject, engine_info
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
    """Show a recorded attach offline: its frames replayed into the views as a remote pool
    (tiers, ages, lifetimes, scrubbing; `replay_frames`), or an older capture's events;
    returns the number of events in the views' log. InputError when the database holds no
    capture or a damaged one."""
    from engine.core.errors import InputError
    from engine.store.database import Store

    with Store(path) as store:
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
        framed = store.num_frames(run) > 0
        settings = session.settings or {}
        endpoint = ", ".join(settings.get("endpoints") or []) or "vLLM"
        info = engine_info(block_size=session.block_size or 16, num_blocks=0, model=f"vLLM {endpoint} (recorded)")
        info.update(remote=True, endpoint=endpoint, hash_scheme=session.hash,
                    data_parallel_size=int(settings.get("data_parallel_size") or 1), recorded=True, journal=framed)
        if not framed:  # (read before the views change: a damaged row is one sentence, nothing replaced)
            events = store.events(run)
        ctx.open_subject(Subject("server", f"{session.title} (recorded)", source=str(path)), ask=False)
        ctx.attach_events(EventBus(), info)
        if framed:
            fleet = Fleet()
            for pool in replay_frames(ctx.state, store.frames(run)):
                fleet.add(pool.server or pool.source, pool)
        else:
            ctx.bridge.push(events)
            ctx.bridge.flush(everything=True)
            fleet = fleet_from_events(events)
    ctx.remote.show_recorded_fleet(fleet, _reading_settings(session, settings))
    return len(ctx.state.log)


class _Streams:
    """A capture's streams' pools (one journalling columnar pool per source, server and
    rank, in the order they first sent), read as `take_journal_rows` reads an attachment."""

    def __init__(self) -> None:
        from engine.remote.overlay import journal_pool_class

        self.lock = threading.RLock()
        self.pools: list[Any] = []
        self._of: dict[tuple[str, str, int], Any] = {}
        self._make = journal_pool_class()

    def pool(self, source: str, server: str, rank: int) -> Any:
        got = self._of.get((source, server, rank))
        if got is None:
            got = self._of[(source, server, rank)] = self._make(source, rank, server=server)
            self.pools.append(got)
        return got


def replay_frames(state: Any, chunks: Iterable[list[tuple]], frames_per_tick: int = 256) -> list[Any]:
    """A capture's frames (`Store.frames`: lists of (source, server, rank, seq, time,
    payload), payload None where the server restarted) into `state`, a journal-fed
    `PoolState`: each stream's runs of frames decoded at once (`fastwire.decode_columns_many`)
    and applied to its pool, and every `frames_per_tick` frames the pools' journal rows
    taken, placed and written (`take_journal_rows`, `prepare_journal`, `apply_prepared`), as
    a live attach's tick writes them; the views hear of it once, at the end. Returns the
    streams' pools. A frame that does not decode (a damaged file) raises InputError naming
    its stream and batch, the frames before it shown."""
    from app.runtime.journal_feed import take_journal_rows
    from engine.core.errors import InputError
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire
    from engine.remote.wire import MalformedFrame

    streams, taken = _Streams(), {}
    since = 0

    def commit() -> None:
        got = take_journal_rows(streams, taken, 1 << 30)
        state.apply_prepared([(prepare_journal(state.log, head, pool, pool.source, int(pool.rank)), times)
                              for head, pool, times in got[0]], notify=False)

    for rows in chunks:
        i = 0
        while i < len(rows):
            source, server, rank, seq, _, payload = rows[i]
            pool = streams.pool(source, server, rank)
            if payload is None:
                pool.reset(seq)  # as the attachment's restart handler resets it
                i += 1
                continue
            j = i + 1  # the run of this stream's frames that number on
            while (j < len(rows) and j - i < frames_per_tick and rows[j][5] is not None
                   and rows[j][3] == seq + j - i and rows[j][:3] == (source, server, rank)):
                j += 1
            try:
                pool.apply_many(fastwire.decode_columns_many(seq, [r[5] for r in rows[i:j]]))
            except MalformedFrame:  # a damaged file: the frames before the bad one shown, then why not more
                for k in range(i, j):
                    try:
                        pool.apply_many([fastwire.decode_columns(rows[k][3], rows[k][5])])
                    except MalformedFrame as exc:
                        commit()
                        state.notify()
                        raise InputError(f"{source}'s recorded {exc}; the views show the batches before it") from None
            since += j - i
            i = j
            if since >= frames_per_tick:
                commit()
                since = 0
    commit()
    state.notify()
    return streams.pools


def _reading_settings(session: Any, settings: dict[str, Any]) -> AttachSettings | None:
    """How the capture's servers hashed their blocks, for the router's probe; None when the
    session's settings no longer read (the fleet still shows, the probe says why not)."""
    try:
        return AttachSettings(AttachOptions.from_dict(settings), session.hash or "vllm-sha256",
                              block_size=session.block_size or 16)
    except ValueError:
        return None
