"""The window's widget-free parts on their own: trace replays, recent files, the store's
lifecycle in the context, and the chat controller without a model."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from app.runtime.chat import ChatController
from app.runtime.context import make_test_context
from app.runtime.replays import TraceReplays
from app.window.recent import MAX_RECENT, RecentFiles
from engine.core.errors import InputError

DEMO = Path(__file__).resolve().parents[1] / "resources" / "traces" / "demo_tokens.jsonl"


@pytest.fixture
def ctx(qtbot, tmp_path):
    c = make_test_context(tmp_path)
    yield c
    c.shutdown()


def test_a_replay_is_shown_once_the_views_have_every_event(qtbot, ctx):
    replays = TraceReplays(ctx)
    done: list = []
    progress: list = []
    replays.sigProgress.connect(lambda text, f: progress.append((text, f)))
    with qtbot.waitSignal(replays.sigShown, timeout=60_000) as shown:
        replays.start(DEMO, on_done=done.append)
    # Shown means drawn: nothing is left in the bridge and the state holds every request.
    assert ctx.bridge.num_pending == 0
    assert done and done[0] is replays.last_result
    totals = done[0]["totals"]
    assert ctx.state.projection.counters.num_requests == totals["requests"] > 0
    assert shown.args[0].startswith(f"{DEMO.name}: {totals['requests']:,} requests")
    assert progress[0] == (f"replaying {DEMO.name}", -1.0)
    assert ctx.subject.kind == "trace" and ctx.job is None


def test_a_cancelled_replay_says_so_and_calls_back_with_none(qtbot, ctx):
    replays = TraceReplays(ctx)
    done: list = []
    ctx.worker.submit(lambda: __import__("time").sleep(0.2))  # so Cancel lands before the replay starts
    with qtbot.waitSignal(replays.sigCancelled, timeout=60_000) as cancelled:
        replays.start(DEMO, on_done=done.append)
        assert ctx.cancel_job()
    assert "cancelled" in cancelled.args[0] and done == [None]


def test_recent_files_are_newest_first_without_duplicates(tmp_path):
    recent = RecentFiles(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    assert recent.files() == [] and recent.last_dir() == str(Path.home())
    paths = [tmp_path / f"f{i}.jsonl" for i in range(MAX_RECENT + 2)]
    for p in paths:
        recent.add(p)
    recent.add(paths[3])
    files = recent.files()
    assert files[0] == str(paths[3].resolve()) and len(files) == MAX_RECENT == len(set(files))
    assert recent.last_dir() == str(tmp_path.resolve())


def test_a_refused_store_leaves_the_open_one_open(ctx, tmp_path):
    first = ctx.open_store(tmp_path / "a.db")
    closing: list = []
    ctx.sigStoreClosing.connect(lambda: closing.append(True))

    def refuse(store):
        raise InputError("no chat here")

    with pytest.raises(InputError, match="no chat"):
        ctx.open_store(tmp_path / "b.db", accept=refuse)
    assert ctx.store is first and closing == []
    second = ctx.open_store(tmp_path / "b.db")
    assert ctx.store is second and closing == [True]
    sessions: list = []
    ctx.sigSessionChanged.connect(sessions.append)
    ctx.set_session(7)
    assert ctx.session_id == 7 and sessions == [7]


def test_without_a_model_the_controller_waits_then_gives_up(qtbot, ctx):
    chat = ChatController(ctx)
    statuses: list = []
    chat.sigStatus.connect(statuses.append)
    assert not chat.send("   ")
    assert chat.send("Hello")
    assert chat.is_generating and statuses[-1] == "waiting for the model to load…"
    assert [m.role for m in chat.messages] == ["user"]
    ctx.model_error = "no weights"
    with qtbot.waitSignal(chat.sigIdle, timeout=5000):
        chat.model_unavailable()
    assert not chat.is_generating and statuses[-1] == "no model: turns as recorded"
    assert not chat.edit_message(5, "x") and ctx.errors == ["There is no message 5 to edit."]
