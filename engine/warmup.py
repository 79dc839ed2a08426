"""Fill numba's disk cache with every compiled function the app and `cachescope replay` use.

`make`'s install step runs `python -m engine.warmup` once, so that the first trace
opened after `make run` (and the first `replay --kernel`) loads the kernel from the cache
instead of compiling it (tens of seconds on a loaded 2-core machine). The calls are the
engine's own paths on the bundled traces, large enough that the pool evicts and the
tables grow, so the signatures compiled are the ones real use asks for:

- the replay kernel, with and without a log, on a token trace and a hash-id trace, and
  the chunked stream (`engine.kernel.stream`);
- the columnar log's series and indexes, and the columnar statistics;
- a live source's columnar log (`engine.core.live_log.warm_up`);
- the attached server's columnar pool and its wire decoder (`engine.remote.colpool.warm_up`),
  and the subscriber's compiled receive (`engine.remote.receive.warm_up`).

It never fails the install: a part that fails is named on one stderr line (that part then
compiles at its first use, as before) and the exit status stays 0. Each part reports how
many functions it compiled and how many it loaded from the cache.

Run without arguments, the parts run in two processes side by side (`GROUPS`: the remote
pool alone, the rest together): numba compiles on one thread, and the pool, the longest
part, would otherwise leave the second core idle for a minute or more. Each process writes
its own functions' cache files, so they never write the same file.
"""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import time
from typing import Callable

from engine.resources import RESOURCES

TRACES = RESOURCES / "traces"


def _kernel() -> None:
    from engine.core.replay import ReplayConfig
    from engine.core.trace import read_trace
    from engine.kernel.replay import replay_kernel
    from engine.kernel.stream import chunks_of, replay_stream

    for name, block_size in (("demo_tokens.jsonl", 16), ("mooncake_conversation_trace.jsonl", 512)):
        requests = list(itertools.islice(read_trace(TRACES / name, block_size), 600))
        for concurrency in (1, 2):
            config = ReplayConfig(block_size=block_size, capacity_blocks=256, concurrency=concurrency)
            replay_kernel(requests, config, record=False)
            replay_kernel(requests, config, record=True)
    replay_stream(chunks_of(requests, 200), config)  # the Mooncake slice, in chunks
    # ids too large for the dense interning (a server's 64-bit hashes) take intern_chains' hash table
    wide = [dataclasses.replace(r, hash_ids=tuple(h + (1 << 40) for h in r.hash_ids)) for r in requests[:100]]
    replay_kernel(wide, ReplayConfig(block_size=512, capacity_blocks=256))


def _columnar_log() -> None:
    from engine.analysis.statistics_columnar import compute_columnar
    from engine.core.columnar_log import ColumnarEventLog
    from engine.core.replay import ReplayConfig
    from engine.core.trace import read_trace
    from engine.kernel.replay import replay_kernel

    requests = list(itertools.islice(read_trace(TRACES / "mooncake_conversation_trace.jsonl", 512), 300))
    log = ColumnarEventLog(replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=200),
                                         record=True).log)
    log.warm()
    compute_columnar(log)


def _live_log() -> None:
    from engine.core.live_log import warm_up

    warm_up()


def _remote_pool() -> None:
    from engine.remote import receive
    from engine.remote.colpool import warm_up

    warm_up()
    receive.warm_up()


def warm_attach() -> None:
    """What an attach runs, loaded (or compiled) in this process: the remote pool's part and
    the journal route's (the app's warm-up thread calls it after the first paint)."""
    _remote_pool()
    warm_journal_route()


def warm_journal_route() -> None:
    """An attach's journal route as the app runs it: a journalling pool's rows placed
    (`prepare_journal`) and written into a journal-fed live log, the overlay's pass over
    them and its kept grid of cells (compiled at the first attach otherwise: 4.5 s)."""
    from engine.core.live_journal import commit_journal, journal_log, prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import RemoteOverlay, journal_pool_class
    from engine.remote.wire import VllmEvent, encode_batch

    log, overlay = journal_log(16), RemoteOverlay()
    pool = journal_pool_class()("warm-up", rank=0)
    for i in range(4):
        frame = [VllmEvent("BlockStored", ((i + 9 << 56).to_bytes(8, "big"),), None, tuple(range(16)), 16)]
        if i:
            frame.append(VllmEvent("BlockRemoved", ((i + 8 << 56).to_bytes(8, "big"),)))
        pool.apply(fastwire.decode_columns(i, encode_batch(2.0 + i, frame, 0)))
    pool.apply(fastwire.decode_columns(4, encode_batch(6.0, [VllmEvent("AllBlocksCleared")], 0)))
    # a tick of many rows, then one of a single row: a journal's columns are strided views of
    # the pool's rows, but numba types a one-row view as contiguous, another signature of the
    # overlay's passes (compiled at a quiet server's first one-row tick otherwise: ~3 s)
    ticks = [pool.take_journal()]
    frame = [VllmEvent("BlockStored", ((14 << 56).to_bytes(8, "big"),), None, tuple(range(16)), 16)]
    pool.apply(fastwire.decode_columns(5, encode_batch(7.0, frame, 0)))
    ticks.append(pool.take_journal())
    for journal in ticks:  # as `PoolState.apply_prepared` commits a tick and hands the overlay its slots
        prepared = prepare_journal(log, journal, pool, pool.source, 0)
        commit_journal(log, prepared)
        overlay.observe_journal(journal, pool.times_of(journal), log.live, prepared.slots, pool, 0)
    assert len(ticks[1]) == 1
    overlay.cell_codes(log.live, now=8.0, max_cells=1)


PARTS: tuple[tuple[str, Callable[[], None]], ...] = (
    ("replay kernel", _kernel), ("columnar log", _columnar_log), ("live log", _live_log),
    ("remote pool", _remote_pool), ("journal route", warm_journal_route))


# The processes of a whole warm-up; the kernel's parts stay together (the columnar log's part
# replays through the kernel, so apart they would compile the kernel twice).
GROUPS: tuple[tuple[str, ...], ...] = (("remote pool", "journal route"), ("replay kernel", "columnar log", "live log"))


def _dispatchers() -> list:
    """Every numba dispatcher in the modules loaded now."""
    try:
        from numba.core.registry import CPUDispatcher
    except ImportError:
        return []
    out, seen = [], set()
    for mod in list(sys.modules.values()):
        name = getattr(mod, "__name__", "")
        if not (name.startswith("engine.") or name.startswith("app.")):
            continue
        for value in list(vars(mod).values()):
            if isinstance(value, CPUDispatcher) and id(value) not in seen:
                seen.add(id(value))
                out.append(value)
    return out


def counts() -> tuple[int, int]:
    """(signatures compiled, signatures loaded from the cache) by the engine's dispatchers so far."""
    compiled = loaded = 0
    for d in _dispatchers():
        compiled += sum(d.stats.cache_misses.values())
        loaded += sum(d.stats.cache_hits.values())
    return compiled, loaded


def warm_all(out=sys.stdout, err=sys.stderr, only: list[str] | None = None) -> dict[str, dict]:
    """Run every part (or those named in `only`); returns per part its seconds and whether it ran."""
    report: dict[str, dict] = {}
    for name, part in PARTS:
        if only and name not in only:
            continue
        t = time.perf_counter()
        try:
            part()
        except Exception as exc:  # noqa: BLE001 - never fail the install; the part compiles at first use
            err.write(f"cachescope warm-up: {name} not cached ({type(exc).__name__}: {exc}); "
                      "it compiles at its first use\n")
            report[name] = {"ok": False, "s": round(time.perf_counter() - t, 2)}
            continue
        report[name] = {"ok": True, "s": round(time.perf_counter() - t, 2)}
    compiled, loaded = counts()
    total = sum(r["s"] for r in report.values())
    parts = ", ".join(f"{name} {r['s']} s" for name, r in report.items())
    out.write(f"cachescope warm-up: {compiled} compiled functions written to numba's cache, {loaded} loaded from "
              f"it, in {total:.1f} s ({parts})\n")
    return report


def warm_side_by_side(groups=GROUPS, out=sys.stdout, err=sys.stderr) -> int:
    """Every part, each group of `groups` in a process of its own, all at once; each
    process's report (one line, and a line for each part that failed) is relayed when it
    ends. Returns the number of processes that did not exit 0 (a crash, not a failed part)."""
    procs = [(group, subprocess.Popen([sys.executable, "-m", "engine.warmup", *group],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for group in groups]
    crashed = 0
    for group, proc in procs:
        stdout, stderr = proc.communicate()
        out.write(stdout)
        err.write(stderr)
        if proc.returncode != 0:
            crashed += 1
            err.write(f"cachescope warm-up: the process for {', '.join(group)} ended with exit status "
                      f"{proc.returncode}; those parts compile at their first use\n")
    return crashed


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.warmup [PART...]`: the named parts in this process, or
    every part, in the processes of `GROUPS` side by side."""
    names = list(sys.argv[1:] if argv is None else argv)
    unknown = [n for n in names if n not in dict(PARTS)]
    if unknown:
        sys.stderr.write(f"cachescope warm-up: no part named {unknown[0]!r}; the parts are "
                         f"{', '.join(repr(n) for n, _ in PARTS)}\n")
        return 2
    if names:
        warm_all(only=names)
    else:
        warm_side_by_side()
    return 0  # never fail the install: what is not cached compiles at its first use


if __name__ == "__main__":
    sys.exit(main())
