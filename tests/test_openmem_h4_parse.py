"""What a trace's parse leaves behind in Python's small-object allocator after the app's open.

The worker reads a trace with `prepare(..., keep_content=False)`. Python objects the open
keeps (a request kept as an object, its timestamp, its id) made amid the parse's
temporaries (each line's dict, its hash ids as ints) keep resident every 1 MiB arena of
Python's allocator those temporaries filled: the Mooncake trace's open kept 10 arenas
(60 B per distinct block) when the parse ran 8,192 lines at a time and kept each request
as a slim `TraceRequest`. Now the requests are made from the arrays when read
(`SlimRequests`) and the parse runs a few hundred lines at a time.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

from engine.core.trace import load_trace
from engine.kernel.replay import prepare
from engine.resources import RESOURCES

MOONCAKE = RESOURCES / "traces" / "mooncake_conversation_trace.jsonl"


# In a process of its own: a thread another test left running (a worker, a warm-up) would
# count its own allocations in the process-wide count of blocks.
_COUNT_CHILD = """
import dataclasses, gc, sys
from engine.core.trace import load_trace
from engine.kernel.replay import prepare
whole = load_trace(sys.argv[1], 512)[:3000]
prepare(iter(whole[:10]), 512, keep_content=False)  # numba's `cut_items` loaded before the count
gc.collect()
before = sys.getallocatedblocks()
lean = prepare(iter(whole), 512, keep_content=False)
gc.collect()
kept = sys.getallocatedblocks() - before
slims = [dataclasses.replace(r, tokens=None, output_tokens=None, hash_ids=None) for r in whole]
same = list(lean.requests) == slims and lean.requests[-1] == slims[-1] and lean.requests[5:9] == slims[5:9]
print(kept, len(whole), same)
"""


def test_a_lean_prepare_keeps_no_python_object_a_request_but_its_id():
    proc = subprocess.run([sys.executable, "-c", _COUNT_CHILD, str(MOONCAKE)], capture_output=True, text=True,
                          cwd=RESOURCES.parent, check=True, timeout=600)
    kept, num_requests, same = proc.stdout.split()
    # the ids are the parse's own strings (shared with `whole` there, as are the slim
    # requests' fields): a slim request kept one block, its object
    assert int(kept) < int(num_requests) // 2, kept
    assert same == "True"  # and each request reads back as the slim one it was


def test_the_stamps_tenants_and_models_of_a_lean_prepare_are_each_requests():
    requests = [dataclasses.replace(r, tenant=t, timestamp=ts, model=m) for r, t, ts, m in zip(
        load_trace(MOONCAKE, 512)[:6], ("a", None, "b", "a", None, "c"), (None, 0.5, 1.0, None, 2.25, 3.0),
        (None, "m1", None, "m2", "m1", None))]
    lean = prepare(iter(requests), 512, keep_content=False)
    assert [(r.tenant, r.timestamp, r.model, r.id, r.line, r.index) for r in lean.requests] == \
        [(r.tenant, r.timestamp, r.model, r.id, r.line, r.index) for r in requests]


# A real (offscreen) window opens the trace as `bench gui`'s open step does: the GUI thread
# runs its event loop while the worker parses, and what it keeps is made amid the parse.
_CHILD = """
import os, sys, tempfile, time
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
from pathlib import Path
from app.runtime.context import make_test_context
from app.window.main_window import MainWindow

def arenas():
    fd = os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(fd, 2)
            os.close(fd)
        out.seek(0)
        text = out.read().decode()
    return int(next(line for line in text.splitlines() if line.startswith("# arenas allocated current"))
               .split("=")[1].replace(",", ""))

def open_file(path):
    done = []
    w.open_file(Path(path), on_done=done.append)
    while not done:
        app.processEvents()
        time.sleep(0.001)
    for _ in range(5):
        app.processEvents()
    assert done[0] is not None

ctx = make_test_context(sys.argv[1])
w = MainWindow(ctx, load_model=False)
w.resize(1280, 800)
w.show()
app.processEvents()
getattr(w, "finish_startup", lambda: None)()
app.processEvents()
getattr(ctx, "wait_warm", lambda timeout=None: False)(120)
tiny = os.path.join(sys.argv[1], "tiny.jsonl")
with open(sys.argv[2], "rb") as src, open(tiny, "wb") as dst:
    dst.write(b"".join(line for _, line in zip(range(20), src)))
open_file(tiny)  # numba's functions loaded, the views drawn once
import gc
gc.collect()
before = arenas()
open_file(sys.argv[2])
gc.collect()
print(arenas() - before, len(ctx.state.log.columnar.requests))
ctx.shutdown()
w.deleteLater()
app.processEvents()
"""


def test_a_windows_open_of_the_mooncake_trace_leaves_few_arenas_of_python_objects(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), str(MOONCAKE)], capture_output=True,
                          text=True, cwd=RESOURCES.parent, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
                          check=True, timeout=600)
    grown, num_requests = (int(x) for x in proc.stdout.split()[-2:])
    assert num_requests == 12_031
    # the log's 12,031 ids (~0.6 MB of str) need one arena; 10 were kept before
    assert grown <= 3, grown
