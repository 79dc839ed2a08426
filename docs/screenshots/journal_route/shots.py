"""Screenshots after an attached run on the journal route (issue 20): the bench's stream
(`app.commands._bench_live_attach`, 50,000 vLLM events over loopback ZMQ from a publisher
process into a 1280x800 window) applied in budgeted ticks, then the window, the hash chain
view, the block table, the timeline and the metrics, 1280x800 and 1600x1000, both themes:
    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/journal_route/shots.py [events]"""
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parents[1] / "live_columnar")]
OUT = Path(__file__).resolve().parent


class _Waits:
    """What `shots._grab` asks of pytest-qt's qtbot: wait(ms), the events processed meanwhile."""

    def __init__(self, app):
        self.app = app

    def wait(self, ms):
        end = time.monotonic() + ms / 1000
        while time.monotonic() < end:
            self.app.processEvents()
            time.sleep(0.005)


def main(num_events: int = 50_000) -> None:
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    import shots
    from app.commands._bench_live_attach import attached_app_rate
    from app.runtime.context import make_test_context
    from app.window.main_window import MainWindow

    w = MainWindow(make_test_context(tempfile.mkdtemp(prefix="cachescope-shots-")), load_model=False)
    w.resize(1280, 800)
    w.show()
    got = attached_app_rate(num_events, journal=True, window=w)
    print({k: got[k] for k in ("cachescope_events", "events_per_s_wall", "longest_process_events_ms")})
    waits = _Waits(app)
    waits.wait(1500)
    shots.VIEWS = ("hash_chains", "block_table", "timeline", "metrics")
    shots._grab(waits, w, "journal_run", OUT)
    chains = w.panels["hash_chains"]
    print("chain view:", chains.summary.text()[:160])
    w.ctx.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000)
