"""The main window: docks, theme, settings, opening traces, errors and the gui command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QApplication

from app.ui import theme
from app.runtime.context import make_test_context
from app.runtime.jobs import classify_file
from app.window.main_window import MainWindow
from app.window.panels import PANELS, load_factory

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "traces" / "demo_tokens.jsonl"


def _token_trace(path: Path, num_requests: int = 24) -> Path:
    """Requests sharing a 32-token prefix, two tenants, each with 10 output tokens."""
    shared = list(range(500, 532))
    rows = []
    for i in range(num_requests):
        rows.append({"id": f"r{i}", "tenant": "a" if i % 4 else "b",
                     "tokens": shared + [1000 + i * 7 + k for k in range(20 + i % 9)],
                     "output_tokens": [2000 + i + k for k in range(10)]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def shared(qapp, tmp_path_factory):
    """One window for the tests that do not restart it: building one costs seconds."""
    c = make_test_context(tmp_path_factory.mktemp("gui"))
    w = MainWindow(c, load_model=False)
    w.show()
    yield c, w
    c.shutdown()
    w.close()
    w.deleteLater()
    qapp.processEvents()


@pytest.fixture
def ctx(shared):
    shared[0].errors.clear()
    return shared[0]


@pytest.fixture
def window(qtbot, shared):
    qtbot.waitExposed(shared[1])
    return shared[1]


def _open_and_wait(qtbot, window, path) -> dict:
    done: list = []
    assert window.open_file(path, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=30_000)
    qtbot.waitUntil(lambda: window.ctx.bridge.num_pending == 0, timeout=5000)
    window.ctx.bridge.flush(everything=True)
    return done[0]


def test_every_registered_panel_that_exists_gets_a_dock(window):
    importable = []
    for spec in PANELS:
        try:
            load_factory(spec.factory)
        except (ImportError, AttributeError):
            continue
        importable.append(spec.object_name)
    # The shell's own panel and F's engine views are always there.
    for name in ("conversation", "block_table", "hash_chains", "timeline", "event_log", "metrics", "kv_memory"):
        assert name in importable
    assert sorted(window.docks) == sorted(importable)
    for name, dock in window.docks.items():
        assert dock.objectName() == name
        assert dock.toggleViewAction() in window.view_menu.actions()
    assert window.scrub_bar is not None
    assert [m.title().replace("&", "") for m in window.menuBar().findChildren(type(window.view_menu))
            if m.parent() is window.menuBar()][:5] == ["File", "View", "Engine", "Demos", "Help"]


def test_view_menu_toggles_a_dock_and_reset_layout_restores_it(qtbot, window):
    dock = window.docks["event_log"]
    dock.toggleViewAction().trigger()
    assert dock.isHidden()
    window.docks["metrics"].setFloating(True)
    window.reset_layout()
    assert not dock.isHidden()
    assert not window.docks["metrics"].isFloating()


def test_theme_toggle_restyles_the_app_and_is_remembered(qtbot, window, ctx):
    assert theme.current_theme() == "dark"
    dark_bg = QApplication.instance().palette().window().color().name()
    seen: list[str] = []
    ctx.sigThemeChanged.connect(seen.append)
    assert window.act_theme.text().replace("&", "") == "Light theme"  # names where a click goes
    window.act_theme.trigger()
    assert theme.current_theme() == "light"
    assert window.act_theme.text().replace("&", "") == "Dark theme"
    assert seen == ["light"]
    assert QApplication.instance().palette().window().color().name() == theme.PALETTES["light"]["bg"] != dark_bg
    assert theme.PALETTES["light"]["bg"] in QApplication.instance().styleSheet()
    assert ctx.settings.value("ui/theme") == "light"
    window.toggle_theme()
    assert theme.current_theme() == "dark" and window.act_theme.text().replace("&", "") == "Light theme"


def test_layout_geometry_and_theme_survive_a_restart(qtbot, tmp_path):
    ctx1 = make_test_context(tmp_path)
    w1 = MainWindow(ctx1, load_model=False)
    qtbot.addWidget(w1)
    w1.show()
    w1.resize(1520, 860)
    size = (w1.width(), w1.height())
    w1.docks["kv_memory"].hide()
    w1.apply_theme("light")
    w1.close()  # closeEvent saves
    ctx1.shutdown()
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    assert isinstance(settings.value("window/state"), QByteArray)
    ctx2 = make_test_context(tmp_path)
    w2 = MainWindow(ctx2, load_model=False)
    qtbot.addWidget(w2)
    w2.show()
    try:
        assert (w2.width(), w2.height()) == size == (1520, 860)
        assert w2.docks["kv_memory"].isHidden()
        assert not w2.docks["block_table"].isHidden()
        assert theme.current_theme() == "light"
    finally:
        w2.apply_theme("dark")
        ctx2.shutdown()


def test_opening_a_trace_replays_it_into_every_view(qtbot, window, ctx, tmp_path):
    trace = _token_trace(tmp_path / "t.jsonl")
    engines: list[dict] = []
    ctx.bridge.sigEngineChanged.connect(engines.append)
    result = _open_and_wait(qtbot, window, trace)
    assert result["totals"]["requests"] == 24
    assert engines and engines[-1]["block_size"] == 16 and engines[-1]["model"] is None
    proj = ctx.state.projection
    # Model to view: the projection fed through the bridge agrees with the replay's totals.
    assert proj.counters.num_requests == 24
    assert proj.counters.num_cached_tokens == result["totals"]["cached_tokens"] > 0
    assert proj.num_cached_free == result["totals"]["stored_blocks"] - result["totals"]["evicted_blocks"]
    # The status bar is refreshed by a 100 ms timer after the state changes.
    expected = f"hit rate {result['totals']['hit_rate']:.1%}"
    qtbot.waitUntil(lambda: window.status_labels["hit_rate"].text() == expected, timeout=5000)
    assert "16 tokens" in window.status_labels["block_size"].text()
    log = window.panels["event_log"]
    assert log.model.rowCount() == len(ctx.state.log) > 24 * 5
    assert str(trace.resolve()) == window.recent_files()[0]
    # View to model: scrubbing back to the first event empties the pool in the state.
    first, last = ctx.state.seq_range
    ctx.state.scrub_to(first)
    assert not ctx.state.is_live and ctx.state.projection.counters.num_cached_tokens == 0
    window.act_live.trigger()
    assert ctx.state.is_live and ctx.state.projection.counters.num_requests == 24


def test_bad_files_are_one_sentence_errors_and_the_app_keeps_running(qtbot, window, ctx, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": [1, 2, 3]}\n{"tokens": [1, "x"]}\n')
    _open_and_wait(qtbot, window, bad)
    assert len(ctx.errors) == 1
    msg = ctx.errors[0]
    assert "bad.jsonl" in msg and "line 2" in msg and "tokens" in msg and "\n" not in msg
    assert not window.open_file(tmp_path / "missing.jsonl")
    assert ctx.errors[-1].endswith("no such file.")
    assert not window.open_file(tmp_path)
    assert "folder" in ctx.errors[-1]
    good = _token_trace(tmp_path / "good.jsonl", 4)
    assert _open_and_wait(qtbot, window, good)["totals"]["requests"] == 4


def test_classify_file(tmp_path):
    assert classify_file(_token_trace(tmp_path / "a.jsonl", 1)) == "trace"
    (tmp_path / "m.jsonl").write_text('{"hash_ids": [1, 2], "input_length": 600}\n')
    assert classify_file(tmp_path / "m.jsonl") == "trace"
    (tmp_path / "c.json").write_text('{"messages": [{"role": "user", "content": "hi"}]}')
    assert classify_file(tmp_path / "c.json") == "conversation"
    assert classify_file(tmp_path / "s.db") == "session"


def test_demos_hook_and_shortcuts(qtbot, window):
    hits: list[int] = []
    act = window.add_demo_action("Eviction", "fill the pool until blocks are evicted", lambda: hits.append(1))
    assert [a.text() for a in window.demos_menu.actions()] == ["Eviction"]
    act.trigger()
    assert hits == [1]
    rows = dict(window.shortcut_rows())
    assert rows["Open…"] == "Ctrl+O" and rows["Light theme"] == "Ctrl+T"
    assert len(set(rows.values())) == len(rows)  # no shortcut bound twice


def test_model_load_failure_is_a_dialog_and_the_window_stays_usable(qtbot, tmp_path):
    ctx = make_test_context(tmp_path)
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"this is not a gguf file")
    w = MainWindow(ctx, model=str(corrupt), load_model=True)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: bool(ctx.errors), timeout=30_000)
    assert len(ctx.errors) == 1 and "\n" not in ctx.errors[0] and "broken.gguf" in ctx.errors[0]
    assert ctx.runner is None and w.status_labels["model"].text() == "no model"
    trace = _token_trace(tmp_path / "t.jsonl", 3)
    try:
        assert _open_and_wait(qtbot, w, trace)["totals"]["requests"] == 3
    finally:
        ctx.shutdown()


def test_screenshot_command_writes_one_png_per_panel(tmp_path):
    out = tmp_path / "shots"
    trace = _token_trace(tmp_path / "t.jsonl")
    proc = subprocess.run([sys.executable, "-m", "app", "gui", "--screenshot", str(out), str(trace)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {p.stem for p in out.glob("*.png")}
    assert {"main_window", "conversation", "block_table", "hash_chains", "timeline", "event_log",
            "metrics", "kv_memory"} <= names
    from PySide6.QtGui import QImage

    img = QImage(str(out / "main_window.png"))
    assert img.width() >= 1200 and img.height() >= 800


def test_gui_command_rejects_a_missing_file(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "app", "gui", str(tmp_path / "nope.jsonl")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such file" in proc.stderr
