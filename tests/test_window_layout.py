"""The main window's default layout at laptop and desktop sizes: no stray tab bars, and
the bottom plots get room for their rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTabBar, QWidget

from app.runtime.context import make_test_context
from app.demos.runner import install_demos
from app.window.main_window import MainWindow

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("size", [(1600, 1000), (1280, 800)])
def test_no_tab_bar_is_left_over_a_dock_and_bottom_docks_have_room(qtbot, tmp_path, size):
    ctx = make_test_context(tmp_path)
    window = MainWindow(ctx, load_model=False)
    qtbot.addWidget(window)
    request_shutdown = ctx.shutdown
    try:
        _check_layout(qtbot, window, size)
    finally:
        request_shutdown()


def _check_layout(qtbot, window, size) -> None:
    install_demos(window)  # the demo guide joins the Conversation tabs after the first layout
    window.adopt_extra_docks()
    window.resize(*size)
    window.show()
    qtbot.waitExposed(window)
    qtbot.wait(50)
    docks = [d.geometry() for d in window.docks.values() if d.isVisible() and not d.isFloating()]
    bars = [b for b in window.findChildren(QTabBar) if b.parent() is window and b.isVisible()]
    assert bars, "tabbed docks show tab bars"
    for bar in bars:
        assert not any(bar.geometry().intersects(g) for g in docks), \
            f"tab bar {[bar.tabText(i) for i in range(bar.count())]} is drawn over a dock"
    groups = {tuple(bar.tabText(i) for i in range(bar.count())) for bar in bars}
    seen: set[str] = set()
    for group in groups:
        assert not (set(group) & seen), f"tab {group} appears in two different tab bars"
        seen |= set(group)
    assert {"Conversation", "Demo guide"} <= seen
    timeline = window.docks["timeline"]
    assert timeline.height() >= 0.3 * size[1], "the bottom plots are squeezed"


def test_lazy_panels_are_built_when_first_shown_or_asked_for(qtbot, tmp_path):
    from app.views.tools.billing_view import BillingView
    from app.views.tools.diff_view import DiffView

    ctx = make_test_context(tmp_path)
    window = MainWindow(ctx, load_model=False)
    qtbot.addWidget(window)
    try:
        window.show()
        qtbot.waitExposed(window)
        assert "diff" in window.panels and not window.panels.is_built("diff")
        window.docks["diff"].raise_()  # the user clicks its tab
        qtbot.waitUntil(lambda: window.panels.is_built("diff"), timeout=5000)
        assert isinstance(window.panels["diff"], DiffView)
        assert window.docks["diff"].widget().widget() is window.panels["diff"]
        assert not window.panels.is_built("billing")
        assert isinstance(window.panels.get("billing"), BillingView)  # asked for by code
        assert window.panels.is_built("billing")
    finally:
        ctx.shutdown()


def test_a_trace_opened_at_start_survives_the_model_finishing_its_load(qtbot, tmp_path, default_tokenizer):
    """`cachescope gui TRACE`: the replay runs while the model loads; the model's arrival
    must not wipe the trace from the views. The model takes over at the first chat."""
    from engine.model.loader import tiny_random_model
    from engine.model.runner import ModelRunner

    ctx = make_test_context(tmp_path)
    window = MainWindow(ctx, load_model=False)
    qtbot.addWidget(window)
    try:
        done: list = []
        trace = Path(__file__).resolve().parents[1] / "resources" / "traces" / "demo_tokens.jsonl"
        assert window.open_file(trace, on_done=done.append)
        qtbot.waitUntil(lambda: bool(done), timeout=60_000)
        qtbot.waitUntil(lambda: ctx.bridge.num_pending == 0, timeout=5000)
        ctx.bridge.flush(everything=True)
        requests_before = ctx.state.projection.counters.num_requests
        assert requests_before == done[0]["totals"]["requests"] > 0
        runner = ModelRunner(tiny_random_model(tokenizer=default_tokenizer), num_blocks=32)
        window._on_model_loaded(runner)
        ctx.bridge.flush(everything=True)
        assert ctx.runner is runner
        assert ctx.state.projection.counters.num_requests == requests_before  # the trace is still shown
        assert "ready" in window.status_labels["model"].text()
        assert ctx.activate_runner() and ctx.bridge.bus is runner.manager.events
        ctx.bridge.flush(everything=True)
        assert ctx.state.projection.counters.num_requests == 0  # now the model's own, empty pool
    finally:
        ctx.shutdown()


def test_gui_without_a_display_is_one_sentence_not_a_qt_abort(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    out = subprocess.run([sys.executable, "-m", "app", "gui", "--no-model"], capture_output=True, text=True,
                         env=env, cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "no display" in out.stderr


def test_a_window_larger_than_the_screen_is_shrunk_and_moved_onto_it():
    from PySide6.QtCore import QRect

    from app.window.main_window import fit_rect

    laptop = QRect(0, 27, 1280, 773)  # 1280x800 less a top panel
    assert fit_rect(QRect(0, 0, 1480, 920), laptop) == QRect(0, 27, 1280, 773)
    # a geometry remembered on a second, larger monitor to the right comes back on screen
    assert fit_rect(QRect(2000, 400, 1000, 700), laptop) == QRect(280, 100, 1000, 700)
    assert fit_rect(QRect(100, 100, 800, 600), laptop) == QRect(100, 100, 800, 600)  # fits: untouched


# ---- panels built after a subject change ---------------------------------------------

def _shown(panel) -> list[tuple[str, str, object]]:
    """What a panel shows, widget by widget: label and edit texts, rows, choices, checks."""
    from PySide6.QtWidgets import (QAbstractButton, QAbstractItemView, QComboBox, QLabel, QLineEdit, QPlainTextEdit,
                                   QTextEdit, QWidget)

    out: list[tuple[str, str, object]] = []
    for w in panel.findChildren(QWidget):
        name = f"{type(w).__name__}:{w.objectName()}"
        if isinstance(w, (QLabel, QLineEdit)):
            out.append((name, "text", w.text()))
        elif isinstance(w, (QPlainTextEdit, QTextEdit)):
            out.append((name, "text", w.toPlainText()))
        elif isinstance(w, QAbstractItemView) and w.model() is not None:
            out.append((name, "rows", w.model().rowCount()))
        elif isinstance(w, QComboBox):
            out.append((name, "current", w.currentText()))
        elif isinstance(w, QAbstractButton) and w.isCheckable():
            out.append((name, "checked", w.isChecked()))
    return out


def _open(qtbot, window, path: Path) -> None:
    done: list = []
    assert window.open_file(path, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=60_000)
    qtbot.waitUntil(lambda: window.ctx.bridge.num_pending == 0, timeout=5000)
    window.ctx.bridge.flush(everything=True)


def _window_after(qtbot, tmp_path: Path, traces: list[Path], build_first: bool):
    """A window that opened `traces` one after the other, its panels built before the first
    (`build_first`) or only after the last, then every panel raised once, as a user would."""
    from app.window.panels import PANELS

    ctx = make_test_context(tmp_path / ("early" if build_first else "late"))
    window = MainWindow(ctx, load_model=False)
    qtbot.addWidget(window)
    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)
    if build_first:
        window.finish_startup()
        for spec in PANELS:
            window.panels.get(spec.object_name)
    for trace in traces:
        _open(qtbot, window, trace)
    if not build_first:
        assert not any(window.panels.is_built(s.object_name) for s in PANELS if s.lazy)
    window.finish_startup()
    for spec in PANELS:
        window.docks[spec.object_name].raise_()  # a lazy panel is built when first shown
        qtbot.wait(20)
    return window


def test_a_panel_built_after_a_trace_opened_shows_that_trace_as_one_built_before_does(qtbot, tmp_path):
    """Two traces opened one after the other, every lazy panel built only after the second:
    each shows what the same panel built before the first shows, widget by widget, and the
    ones that show the subject show the second trace (Statistics counts its log, not the
    first's; the Conversation says it does not apply to it)."""
    from app.window.panels import PANELS
    from app.views.tools.statistics_view import StatisticsView

    lines = (ROOT / "resources" / "traces" / "mooncake_synthetic_trace.jsonl").read_text().splitlines()
    second = tmp_path / "mooncake_slice.jsonl"
    second.write_text("\n".join(lines[:150]) + "\n")
    traces = [ROOT / "resources" / "traces" / "demo_tokens.jsonl", second]
    early = _window_after(qtbot, tmp_path, traces, build_first=True)
    late = _window_after(qtbot, tmp_path, traces, build_first=False)
    try:
        for window in (early, late):
            assert window.ctx.subject.title == "mooncake_slice.jsonl"
            stats = window.panels["statistics"]
            assert isinstance(stats, StatisticsView)
            num_events = len(window.ctx.state.log.events)
            qtbot.waitUntil(lambda s=stats, n=num_events: s.stats is not None and s.stats.num_events == n,
                            timeout=30_000)  # the second trace's log, not the first's
            conversation = window.panels["conversation"]
            assert "does not apply to the trace \u201cmooncake_slice.jsonl\u201d" in conversation.placeholder.text()
            assert conversation.title_label.text() == "mooncake_slice.jsonl"
        qtbot.wait(300)
        for spec in PANELS:
            if spec.lazy:
                assert _shown(late.panels[spec.object_name]) == _shown(early.panels[spec.object_name]), spec.title
    finally:
        early.ctx.shutdown()
        late.ctx.shutdown()


def test_a_deferred_panel_is_told_the_subject_it_missed_and_only_then(qtbot, tmp_path):
    """PanelMap gives a panel built after a subject change the `show_subject` the panels
    built before it heard, with the subject current when it is built; before any change,
    nothing (a panel built at start is told nothing either)."""
    from app.runtime.context import Subject
    from app.ui.widgets import PanelView
    from app.window.panels import BOTTOM, PanelMap, PanelSpec

    class Probe(PanelView):
        def __init__(self, ctx) -> None:
            super().__init__(ctx)
            self.told: list = []

        def show_subject(self, subject) -> None:
            self.told.append(subject)

    ctx = make_test_context(tmp_path)
    try:
        panels = PanelMap(lambda name: panels.add(name, Probe(ctx)), ctx)
        for name in ("at_start", "early", "late"):
            panels.defer(PanelSpec(name, name, "unused:Probe", BOTTOM, lazy=True))
        assert panels["at_start"].told == []  # no subject change yet: nothing to be told
        early = panels["early"]
        trace = Subject("trace", "a.jsonl", source="a.jsonl")
        assert ctx.open_subject(trace, ask=False)
        assert early.told == [trace]
        late = panels["late"]
        assert late.told == [trace] == early.told  # told once, as the early one was
        qtbot.addWidget(early)
        qtbot.addWidget(late)
        qtbot.addWidget(panels["at_start"])
    finally:
        ctx.shutdown()


def test_a_panel_whose_build_raises_a_key_error_is_not_taken_for_absent(qapp, tmp_path):
    """`PanelMap.get` returns the default only for a name it does not have. A KeyError
    raised while a put-off panel is built goes up (Mapping's own `get` turned it into None
    and left the panel unbuilt without a word: a start-up panel went missing so, once in
    25 starts under load), and the panel is built when next asked for."""
    from app.window.panels import BOTTOM, PanelMap, PanelSpec

    ctx = make_test_context(tmp_path)
    try:
        fails = [KeyError("raised inside the build")]

        def build(name: str) -> None:
            if fails:
                raise fails.pop()
            panels.add(name, QWidget())

        panels = PanelMap(build, ctx)
        panels.defer(PanelSpec("Flaky", "flaky", "unused:Probe", BOTTOM, lazy=True))
        assert panels.get("absent", "default") == "default"
        with pytest.raises(KeyError, match="raised inside the build"):
            panels.get("flaky")
        assert not panels.is_built("flaky") and "flaky" in panels
        widget = panels.get("flaky")
        assert isinstance(widget, QWidget) and panels.is_built("flaky")
        widget.deleteLater()
    finally:
        ctx.shutdown()


def test_a_start_up_panel_that_raises_does_not_stop_the_others(qtbot, tmp_path, monkeypatch):
    """The window builds its start-up panels one per turn of the event loop; one whose build
    raises is reported (the error goes up to Qt's handler) and the ones after it are still
    built, then the calls waiting for the start-up run."""
    import app.window.main_window as main_window

    real = main_window.build_panel
    failed: list[str] = []

    def build_panel(spec, ctx):
        if getattr(spec, "object_name", None) == "conversation" and not failed:
            failed.append(spec.object_name)
            raise KeyError("raised inside the conversation panel's build")
        return real(spec, ctx)

    monkeypatch.setattr(main_window, "build_panel", build_panel)
    ctx = make_test_context(tmp_path)
    window = main_window.MainWindow(ctx, load_model=False)
    qtbot.addWidget(window)
    try:
        after: list[bool] = []
        window.after_startup(lambda: after.append(True))
        startup = list(window._startup)
        assert "conversation" in startup and startup[-1] != "conversation"
        window.show()
        with qtbot.captureExceptions() as raised:
            qtbot.waitUntil(lambda: window.startup_done and bool(after), timeout=30_000)
        assert failed == ["conversation"]
        assert [str(e[1]) for e in raised] == ["\"raised inside the conversation panel's build\""]
        assert all(window.panels.is_built(n) for n in startup if n != "conversation")
        assert not window.panels.is_built("conversation")
        assert window.panels["conversation"] is not None and window.panels.is_built("conversation")
    finally:
        ctx.shutdown()


def _rows(window):
    top, bottom = window._split_docks(Qt.Orientation.Vertical)
    return top.height(), bottom.height()


def _columns(window):
    left, right = window._split_docks(Qt.Orientation.Horizontal)
    return left.width(), right.width()


def _share(window, orientation: str) -> float | None:
    return window._shares[getattr(Qt.Orientation, orientation)]


@pytest.fixture
def laid_out(qtbot, tmp_path):
    """A window at 1280x800, shown, its splits' shares noted."""
    ctx = make_test_context(tmp_path)
    window = MainWindow(ctx, load_model=False)
    qtbot.addWidget(window)
    try:
        window.resize(1280, 800)
        window.show()
        qtbot.waitExposed(window)
        qtbot.waitUntil(lambda: None not in window._shares.values(), timeout=5000)
        yield window
    finally:
        ctx.shutdown()


@pytest.mark.parametrize("raised", ["timeline", "event_log"])
def test_a_larger_window_shares_its_new_height_between_the_rows_as_before(qtbot, laid_out, raised):
    """Maximized from 1280x800 to 1920x1200 (with the bottom row's either tab raised), the
    block table's row grows with the plots' in the proportion they had, not the plots alone;
    back at 1280x800, both are as they were."""
    window = laid_out
    window.docks[raised].raise_()
    qtbot.wait(50)
    top0, bottom0 = _rows(window)
    window.resize(1920, 1200)
    qtbot.wait(100)
    top1, bottom1 = _rows(window)
    assert top1 - top0 >= 0.4 * 400, (top0, top1)  # Qt alone gave the plots all 400 px
    assert abs(bottom1 / (top1 + bottom1) - bottom0 / (top0 + bottom0)) < 0.05
    window.resize(1280, 800)
    qtbot.wait(100)
    assert all(abs(a - b) <= 10 for a, b in zip(_rows(window), (top0, bottom0)))


def test_the_rows_keep_the_share_a_user_dragged_them_to(qtbot, laid_out):
    """A drag of the separator between the rows ends in a mouse release on the window: the
    share it left is the one a resize keeps."""
    from PySide6.QtCore import QEvent, QPointF, Qt
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    window = laid_out
    top, bottom = window._split_docks(Qt.Orientation.Vertical)
    window.resizeDocks([top, bottom], [200, 400], Qt.Orientation.Vertical)  # as a drag of the separator leaves it
    qtbot.wait(50)
    release = QMouseEvent(QEvent.Type.MouseButtonRelease, QPointF(10, 10), QPointF(10, 10),
                          Qt.MouseButton.LeftButton, Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    before = _share(window, "Vertical")
    QApplication.sendEvent(window, release)
    dragged = _share(window, "Vertical")
    assert before < 0.45 and dragged > 0.5
    window.resize(1920, 1200)
    qtbot.wait(100)
    t, b = _rows(window)
    assert abs(b / (t + b) - dragged) < 0.05


def test_a_wider_window_shares_its_new_width_between_the_columns_as_before(qtbot, laid_out):
    """Maximized from 1280x800 to 1920x1200, the conversation's column and the block table's
    each take their share of the new width (Qt alone gave the conversation all of it: the
    two columns came out even); back at 1280x800, both are as they were. A narrower window
    and a column a user dragged wider keep theirs the same way."""
    from PySide6.QtCore import QEvent, QPointF, Qt
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    window = laid_out
    left0, right0 = _columns(window)
    assert right0 > 1.5 * left0  # the block table's column is the wide one
    window.resize(1920, 1200)
    qtbot.wait(100)
    left1, right1 = _columns(window)
    assert right1 - right0 >= 0.4 * 640, (right0, right1)
    assert abs(right1 / (left1 + right1) - right0 / (left0 + right0)) < 0.05
    window.resize(1280, 800)
    qtbot.wait(100)
    assert all(abs(a - b) <= 10 for a, b in zip(_columns(window), (left0, right0)))
    left, right = window._split_docks(Qt.Orientation.Horizontal)
    window.resizeDocks([left, right], [700, 500], Qt.Orientation.Horizontal)  # as a drag leaves them
    qtbot.wait(50)
    release = QMouseEvent(QEvent.Type.MouseButtonRelease, QPointF(10, 10), QPointF(10, 10),
                          Qt.MouseButton.LeftButton, Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, release)
    dragged = _share(window, "Horizontal")
    assert dragged < 0.5
    window.resize(1100, 800)
    qtbot.wait(100)
    a, b = _columns(window)
    assert abs(b / (a + b) - dragged) < 0.05
