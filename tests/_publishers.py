"""What the app's attach tests share: recorded publisher frames and the window they attach.

tests/test_remote_app.py (one vLLM server) and tests/test_fleet_app.py (a fleet of pods)
both play recorded frames, byte for byte, from loopback sockets into a real MainWindow.
The sockets themselves stay in each test file: a vLLM rank with its replay socket there,
a pod's XPUB here is too small to share.
"""

from __future__ import annotations

import base64
import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from app.runtime.context import make_test_context
from app.window.main_window import MainWindow


def recorded_frames(path: Path, **match) -> list[list[bytes]]:
    """The frames of every row of a recorded stream (JSONL, one message a row, its frames in
    base64) whose fields equal `match` (e.g. rank=0, socket="pub"), in recorded order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [[base64.b64decode(f) for f in r["frames"]] for r in rows
            if all(r.get(k) == v for k, v in match.items())]


@contextmanager
def attach_window(qtbot, tmp_path: Path) -> Iterator[MainWindow]:
    """A main window without a model, shown at 1280x800 on a test context in `tmp_path`;
    detached from whatever the test attached, its context shut down, and the tokenizer
    loads its attaches started finished, afterwards."""
    ctx = make_test_context(tmp_path)
    w = MainWindow(ctx, load_model=False)
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    try:
        yield w
    finally:
        w.remote.detach()
        ctx.shutdown()
        _wait_for_tokenizer_loads()


def _wait_for_tokenizer_loads(timeout_s: float = 120.0) -> None:
    """An attach loads the server's tokenizer on a thread of its own (RemoteController.
    _load_tokenizer), which a short test outlives by seconds. Left running, it allocates,
    turns gc off and on and freezes every object (app.runtime.jobs.collector_paused) in
    the middle of the worker's next test: test_collector, run after an attach test, saw
    its objects counted (a young collection where none was due)."""
    for t in threading.enumerate():
        if t.name == "attach-tokenizer":
            t.join(timeout_s)
            assert not t.is_alive(), f"the attach's tokenizer load still runs after {timeout_s:g} s"
