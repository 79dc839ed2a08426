"""Screenshots of the block table and the KV memory view after the live log's real flows
(issue 20: rows made on the engine thread, a large remote pool's kept grid): the Mooncake
replay's events pushed through the bridge from a producer thread, and a 1,000,000-block
remote vLLM pool held through the journal route. The window and its views (block table, timelines,
event log, metrics, KV memory), 1280x800, both themes.

Run: QT_QPA_PLATFORM=offscreen .venv/bin/python -m pytest -q -p no:cacheprovider docs/screenshots/live_log/shots.py
"""
import importlib.util
import sys
import threading
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[3])]
from app.runtime.context import engine_info, make_test_context  # noqa: E402
from app.window.main_window import MainWindow  # noqa: E402

OUT = Path(__file__).resolve().parent


def _window(qtbot, tmp_path):
    ctx = make_test_context(tmp_path)
    w = MainWindow(ctx, load_model=False)
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    getattr(w, "finish_startup", lambda: None)()
    qtbot.wait(200)
    return ctx, w


def _grab(qtbot, win, flow):
    """The window and its views, 1280x800, both themes: the live columnar log's shots do it."""
    spec = importlib.util.spec_from_file_location("live_columnar_shots", OUT.parent / "live_columnar" / "shots.py")
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    shots._grab(qtbot, win, flow, out=OUT, sizes=((1280, 800),))


def test_mooncake_through_the_bridge(qtbot, tmp_path):
    from app.commands._bench_gui import _recorded_events

    ctx, w = _window(qtbot, tmp_path)
    try:
        events = _recorded_events(1500, 512, 4096)
        ctx.new_event_bus(engine_info(block_size=512, num_blocks=4096))
        deliver = ctx.bridge._on_event  # what the bus calls, on the producer thread
        producer = threading.Thread(target=lambda: [deliver(e) for e in events])
        producer.start()
        qtbot.waitUntil(lambda: len(ctx.state.log) == len(events), timeout=600_000)
        producer.join()
        qtbot.wait(800)
        print("events", len(ctx.state.log), "blocks", ctx.state.projection.num_blocks)
        _grab(qtbot, w, "bridge_mooncake")
    finally:
        ctx.shutdown()


def test_held_remote_pool(qtbot, tmp_path):
    from app.commands._bench_gui import _churn_frames, _held_frames
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    n = 1_000_000
    ctx, w = _window(qtbot, tmp_path)
    try:
        ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True,
                               "model": "vLLM (bench held frames)"})
        pool = journal_pool_class()("bench")
        state = ctx.state
        for seq, payload in enumerate(_held_frames(n)):
            pool.apply(fastwire.decode_columns(seq, payload))
            if seq % 64 == 63:
                rows = pool.take_journal()
                state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
        for j, payload in enumerate(_churn_frames(n, 5)):
            pool.apply(fastwire.decode_columns(n + 1 + j, payload))
        rows = pool.take_journal()
        state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
        qtbot.wait(800)
        print("events", len(state.log), "blocks", state.projection.num_blocks)
        _grab(qtbot, w, "held_1m")
    finally:
        ctx.shutdown()
