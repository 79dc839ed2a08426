"""Screenshots after an attach through the pools' journal (issue 20): the recorded vLLM server
over ZMQ, live and scrubbed back, 1280x800, both themes:
    QT_QPA_PLATFORM=offscreen .venv/bin/python -m pytest -q -p no:cacheprovider \
        docs/screenshots/live_columnar/journal_shots.py"""
import sys
from pathlib import Path
sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parents[3] / "tests")]
from shots import _grab, _window  # noqa: E402

SIZE = ((1280, 800),)


def test_journal_attach(qtbot, tmp_path):
    from test_remote_app import RecordedServer, attach, join, settle
    from test_vllm_attach import free_ports
    ctx, w = _window(qtbot, tmp_path)
    port, replay = free_ports(1), free_ports(1)
    server = RecordedServer(0, port, replay)
    try:
        attach(w, port, replay)
        assert w.remote.journalling and ctx.state.journal_fed
        join(qtbot, w, server, 1)
        seqs = sorted(int.from_bytes(f[1], "big") for f in server.pub_frames)
        for s in seqs:
            if s > 1:
                server.publish(s)
                qtbot.wait(30)
        settle(qtbot, w, lambda: w.remote.health().batches >= len(seqs))
        qtbot.wait(1500)
        _grab(qtbot, w, "journal_attach", sizes=SIZE)
        ctx.state.scrub_to(3)
        qtbot.wait(800)
        _grab(qtbot, w, "journal_attach_scrubbed", sizes=SIZE)
    finally:
        w.remote.detach()
        server.close()
        ctx.shutdown()
