"""An opened trace's first draws: the heap's freed pages are handed back after each paint
of the window for a moment after the open (`app.runtime.replays._ReleaseAfterPaints`),
then the watch ends."""

from __future__ import annotations

import threading

from PySide6.QtCore import QCoreApplication, QEvent, QObject
from PySide6.QtWidgets import QLabel

import app.runtime.replays as replays_mod
from app.runtime.context import make_test_context
from app.runtime.replays import TraceReplays
from tests._traces import trace_head



class _Paints(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.num_paints = 0

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.UpdateRequest:
            self.num_paints += 1
        return False


def test_freed_pages_go_back_after_the_paints_that_follow_an_open(qtbot, tmp_path, monkeypatch):
    path = trace_head(tmp_path, 200)
    releases: list[int] = []
    paints = _Paints()
    QCoreApplication.instance().installEventFilter(paints)
    # the worker trims at once (`release_freed`, on its thread); the trims after the paints are
    # asked of the releaser's thread (`release_freed_soon`): the GUI thread never waits for one
    on_threads: list[str] = []
    monkeypatch.setattr(replays_mod, "release_freed", lambda: on_threads.append(threading.current_thread().name) or True)
    monkeypatch.setattr(replays_mod, "release_freed_soon", lambda: releases.append(paints.num_paints))
    monkeypatch.setattr(replays_mod._ReleaseAfterPaints, "SETTLE_MS", 300)
    ctx = make_test_context(tmp_path / "ctx")
    try:
        label = QLabel("events: 0")  # a window that redraws when the log arrives
        qtbot.addWidget(label)
        label.show()
        qtbot.waitExposed(label)
        ctx.state.sigChanged.connect(lambda: label.setText(f"events: {len(ctx.state.log):,}"))
        replays = TraceReplays(ctx)
        with qtbot.waitSignal(replays.sigShown, timeout=120_000):
            replays.start(path, num_blocks=300)
        shown_at = len(releases)
        painted_at = paints.num_paints
        qtbot.waitUntil(lambda: len(releases) > shown_at and releases[-1] > painted_at, timeout=5000)
        watches = replays.findChildren(replays_mod._ReleaseAfterPaints)
        assert len(watches) == 1
        qtbot.waitUntil(lambda: not replays.findChildren(replays_mod._ReleaseAfterPaints), timeout=5000)
        # the watch has ended: later paints release nothing
        after, painted = len(releases), paints.num_paints
        label.setText("later")
        qtbot.waitUntil(lambda: paints.num_paints > painted, timeout=2000)
        qtbot.wait(50)
        assert len(releases) == after
        assert on_threads and threading.main_thread().name not in on_threads
    finally:
        QCoreApplication.instance().removeEventFilter(paints)
        ctx.shutdown()
