"""Screenshots of the views on the live columnar log after real flows (issue 20, step 3)."""
import sys, time
from contextlib import contextmanager
from pathlib import Path
sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parents[3] / "tests")]
import pytest
from app.runtime.context import make_test_context
from app.window.main_window import MainWindow

OUT = Path(__file__).resolve().parent
VIEWS = ("block_table", "timeline", "event_log", "metrics", "kv_memory")


def _grab(qtbot, win, flow, out=OUT, themes=("dark", "light"), sizes=((1280, 800), (1600, 1000))):
    from engine.core.live_log import LiveColumnarLog
    assert out != OUT or isinstance(win.ctx.state.log, LiveColumnarLog), type(win.ctx.state.log)
    print(flow, "events", len(win.ctx.state.log), "blocks", win.ctx.state.projection.num_blocks)
    layout = win.saveState()
    for theme in themes:
        win.apply_theme(theme)
        for size in sizes:
            tag = "" if size == (1280, 800) else "_1600x1000"
            win.resize(*size)
            win.restoreState(layout)
            qtbot.wait(500)
            win.grab().save(str(out / f"{flow}_window{tag}_{theme}.png"))
            for name in VIEWS:
                dock = win.docks.get(name)
                if dock is None:
                    print("no dock", name); continue
                win.restoreState(layout)
                dock.show(); dock.raise_()
                qtbot.wait(300)
                dock.grab().save(str(out / f"{flow}_{name}{tag}_{theme}.png"))
    win.restoreState(layout)


def _window(qtbot, tmp_path, load_model=False):
    ctx = make_test_context(tmp_path)
    w = MainWindow(ctx, load_model=load_model)
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    return ctx, w


@contextmanager
def recorded_attach(qtbot, ctx, w, journal=False):
    """The recorded vLLM server over ZMQ, every batch published and settled in the window."""
    from test_remote_app import RecordedServer, attach, join, settle
    from test_vllm_attach import free_ports
    port, replay = free_ports(1), free_ports(1)
    server = RecordedServer(0, port, replay)
    try:
        attach(w, port, replay)
        if journal:
            assert w.remote.journalling and ctx.state.journal_fed
        join(qtbot, w, server, 1)
        seqs = sorted(int.from_bytes(f[1], "big") for f in server.pub_frames)
        for s in seqs:
            if s > 1:
                server.publish(s)
                qtbot.wait(30)
        settle(qtbot, w, lambda: w.remote.health().batches >= len(seqs))
        qtbot.wait(500)
        yield server
    finally:
        w.remote.detach()
        server.close()
        ctx.shutdown()


@pytest.mark.parametrize("columnar", [True, False])
def test_attach(qtbot, tmp_path, columnar):
    ctx, w = _window(qtbot, tmp_path)
    ctx.state.columnar = columnar
    out = OUT if columnar else tmp_path / "reference"  # the Python EventLog, to compare by eye
    out.mkdir(exist_ok=True)
    with recorded_attach(qtbot, ctx, w):
        ctx.bridge.flush(everything=True)
        qtbot.wait(1500)
        _grab(qtbot, w, "attach", out)
        ctx.state.scrub_to(3)
        qtbot.wait(800)
        _grab(qtbot, w, "attach_scrubbed", out, sizes=((1280, 800),))


def test_demo_and_chat(qtbot, tmp_path):
    import torch
    from app.demos.runner import install_demos
    from engine.demos import get_demo
    from engine.model.loader import load_model
    from engine.model.runner import ModelRunner
    torch.set_num_threads(1)
    model = load_model()
    ctx, w = _window(qtbot, tmp_path)
    try:
        runner = install_demos(w, model=model)
        title = get_demo("eviction-under-pressure").title
        with qtbot.waitSignal(runner.sigFinished, timeout=600_000):
            next(a for a in w.demos_menu.actions() if a.text() == title).trigger()
        qtbot.waitUntil(lambda: ctx.bridge.num_pending == 0, timeout=60_000)
        qtbot.wait(1500)
        _grab(qtbot, w, "demo")
        # a chat with the real model on its own engine
        r = ModelRunner(model, num_blocks=96, block_size=16, seed=0)
        ctx.set_runner(r)
        conv = w.panels.get("conversation")
        if conv is None:
            w.docks["conversation"].show(); qtbot.wait(200); conv = w.panels.get("conversation")
        chat = conv.chat
        for text in ("What is a KV cache, in one sentence?", "And why does a shared prefix make it faster?",
                     "Give one example of a prompt that breaks prefix reuse."):
            with qtbot.waitSignal(chat.sigIdle, timeout=600_000):
                chat.send(text)
        qtbot.waitUntil(lambda: ctx.bridge.num_pending == 0, timeout=60_000)
        if "demo_guide" in w.docks:
            w.docks["demo_guide"].close()
        w.docks["conversation"].raise_()
        qtbot.wait(1500)
        _grab(qtbot, w, "chat")
    finally:
        ctx.shutdown()
