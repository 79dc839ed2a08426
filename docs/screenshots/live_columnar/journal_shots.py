"""Screenshots after an attach through the pools' journal (issue 20): the recorded vLLM server
over ZMQ, live (1280x800 and 1600x1000) and scrubbed back (1280x800), both themes:
    QT_QPA_PLATFORM=offscreen .venv/bin/python -m pytest -q -p no:cacheprovider \
        docs/screenshots/live_columnar/journal_shots.py"""
import sys
from pathlib import Path
sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parents[3] / "tests")]
from shots import _grab, _window, recorded_attach  # noqa: E402

SIZE = ((1280, 800), (1600, 1000))


def test_journal_attach(qtbot, tmp_path):
    ctx, w = _window(qtbot, tmp_path)
    with recorded_attach(qtbot, ctx, w, journal=True):
        qtbot.wait(1000)
        _grab(qtbot, w, "journal_attach", sizes=SIZE)
        ctx.state.scrub_to(3)
        qtbot.wait(800)
        _grab(qtbot, w, "journal_attach_scrubbed", sizes=SIZE[:1])
