"""Compile the engine's numba functions into numba's on-disk cache once per test run.

Run by tests/conftest.py on the pytest-xdist controller (`python tests/_warmup.py DONE`)
while the workers collect. In a fresh clone the cache is empty, and every worker that
meets the replay kernel or the columnar pool first compiled the same functions at the
same moment (the colpool fixture test spent 34 s on it); after this they load them from
the cache. The calls are the engine's own public paths on small bundled traces, so they
compile the signatures the suite and the app use: the kernel's replay with and without a
log, on a token trace and a hash-id (Mooncake) trace, the log's series and indexes, the
columnar statistics, and the live pool with its wire decoder.

DONE is written when it ends, with "ok" or the error; the workers wait for it (or for
this process to die) before their first test. A failure here fails no test: a worker
then compiles what it needs itself, as before.
"""

from __future__ import annotations

import itertools
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "resources" / "traces"


def warm_numba() -> None:
    from engine.analysis.statistics_columnar import compute_columnar
    from engine.core.columnar_log import ColumnarEventLog
    from engine.core.replay import ReplayConfig
    from engine.core.trace import read_trace
    from engine.kernel import replay_kernel
    from engine.remote import colpool

    for name in ("demo_tokens.jsonl", "mooncake_conversation_trace.jsonl"):
        requests = list(itertools.islice(read_trace(TRACES / name), 200))
        config = ReplayConfig(block_size=16, capacity_blocks=256)
        replay_kernel(requests, config, record=False)
        log = ColumnarEventLog(replay_kernel(requests, config, record=True).log)
        log.warm()  # the series loop and the indexes the views read first
        compute_columnar(log)
    colpool.warm_up()  # the columnar pool's loops and fastwire's skimmers


def main(done: Path) -> int:
    started = time.monotonic()
    try:
        warm_numba()
    except Exception:  # noqa: BLE001 - reported, and the workers compile for themselves
        done.write_text("failed\n" + traceback.format_exc())
        return 1
    done.write_text(f"ok {time.monotonic() - started:.1f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
