"""Recorded vLLM attaches (`cachescope attach --record`) opened offline in the app.

A capture is a store session whose run of kind `attach` holds the converted events; it
is replayed into the views as a remote pool (tiers, ages, lifetimes, scrubbing), and its
servers' pools are rebuilt for the fleet views (`engine.remote.fleet_view.fleet_from_events`).
The live attach is `app.runtime.remote`; recording is `engine.analysis.remote_capture`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.runtime.context import AppContext, Subject, engine_info
from app.runtime.remote import AttachSettings
from engine.core.events import EventBus
from engine.remote.attachment import AttachOptions
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
    """Show a recorded attach offline: its events replayed into the views as a remote pool
    (tiers, ages, lifetimes, scrubbing); returns the number of events. InputError when the
    database holds no capture."""
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
        events = store.events(runs[-1].id)
    settings = session.settings or {}
    endpoint = ", ".join(settings.get("endpoints") or []) or "vLLM"
    ctx.open_subject(Subject("server", f"{session.title} (recorded)", source=str(path)), ask=False)
    info = engine_info(block_size=session.block_size or 16, num_blocks=0, model=f"vLLM {endpoint} (recorded)")
    info.update(remote=True, endpoint=endpoint, hash_scheme=session.hash,
                data_parallel_size=int(settings.get("data_parallel_size") or 1), recorded=True)
    ctx.attach_events(EventBus(), info)
    ctx.bridge.push(events)
    ctx.bridge.flush(everything=True)
    ctx.remote.show_recorded_fleet(fleet_from_events(events), _reading_settings(session, settings))
    return len(events)


def _reading_settings(session: Any, settings: dict[str, Any]) -> AttachSettings | None:
    """How the capture's servers hashed their blocks, for the router's probe; None when the
    session's settings no longer read (the fleet still shows, the probe says why not)."""
    try:
        return AttachSettings(AttachOptions.from_dict(settings), session.hash or "vllm-sha256",
                              block_size=session.block_size or 16)
    except ValueError:
        return None
