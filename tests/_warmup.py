"""Compile the engine's numba functions into numba's on-disk cache once per test run.

Run by tests/conftest.py on the pytest-xdist controller, in two processes side by side
(`python tests/_warmup.py kernel|pool DONE`), while the workers collect. In a fresh clone
the cache is empty, and every worker that met the replay kernel or the columnar pool first
compiled the same functions at the same moment (the colpool fixture test spent 34 s on
it); after this they load them from the cache. The calls are the engine's own paths on
the bundled traces and the recorded wire fixtures, large enough that the tables grow, so
they compile the signatures the suite and the app use:

- kernel: the replay with and without a log on a token trace and a Mooncake slice, the
  chunked stream, the log's series and indexes, the columnar statistics, and a live
  source's columnar log (seven test files use it; `make test` no longer runs the install's
  warm-up first, so each worker would compile it);
- pool: every recorded vLLM/SGLang fixture through the columnar pool and its wire
  decoder, with a short removal memory and resets, and journalling (a frame at a time and
  many at once), token ids that outgrow uint16 on each route, and the pool's queries.

DONE is written when it ends, with "ok" or the error; the workers wait for it (the
controller writes it if this process dies) before their first test. A failure here fails
no test: a worker then compiles what it needs itself, as before.
"""

from __future__ import annotations

import itertools
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "resources" / "traces"
sys.path.insert(0, str(ROOT))  # `tests.test_fastwire` holds the readers of the recorded frames


def warm_kernel() -> None:
    from engine.analysis.statistics_columnar import compute_columnar
    from engine.core.columnar_log import ColumnarEventLog
    from engine.core.live_log import warm_up as warm_live_log
    from engine.core.replay import ReplayConfig
    from engine.core.trace import read_trace
    from engine.kernel import replay_kernel
    from engine.kernel.stream import chunks_of, replay_stream

    for name, block_size, num_requests in (("demo_tokens.jsonl", 16, 200),
                                           ("mooncake_conversation_trace.jsonl", 512, 3000)):
        requests = list(itertools.islice(read_trace(TRACES / name, block_size), num_requests))
        config = ReplayConfig(block_size=block_size, capacity_blocks=256, concurrency=2)
        replay_kernel(requests, config, record=False)
        log = ColumnarEventLog(replay_kernel(requests, config, record=True).log)
        log.warm()  # the series loop and the indexes the views read first
        compute_columnar(log)
    replay_stream(chunks_of(requests, 500), config)  # the Mooncake slice, in chunks
    warm_live_log()


def warm_pool() -> None:
    from engine.remote import colpool, fastwire, wire
    from engine.remote.colpool import ColumnarPool
    from engine.remote.wire import MalformedFrame, VllmEvent, encode_batch
    from tests.test_fastwire import FIXTURES

    colpool.warm_up()
    from engine.remote import receive

    receive.warm_up()  # the subscriber's compiled receive
    for frames in FIXTURES.values():
        whole, short = ColumnarPool("warm-up"), ColumnarPool("warm-up-short", max_removed=64)
        # journalling pools, a frame at a time and many at once (the attach route's): the
        # sglang and connector fixtures give them types the plain pools do not see
        journal, journal_many = (ColumnarPool(f"warm-up-journal-{i}", max_removed=64, journal=True) for i in (1, 2))
        held = []
        for i, (seq, payload) in enumerate(frames):
            try:
                batch = fastwire.decode_columns(seq, payload)
                fastwire.decode_batch(seq, payload)
            except MalformedFrame:
                continue
            whole.apply(batch)
            short.apply(batch)
            journal.apply(batch)
            held.append(batch)
            if len(held) == 64:
                journal_many.apply_many(held)
                held = []
            if i and i % 97 == 0:
                short.reset(seq)
                journal.take_journal()
        journal_many.apply_many(held)
        for pool in (whole, short):
            hashes = list(pool.cached_hashes())[:64] + list(pool.departed)[:64] + [b"\x00" * 8, b"\x07" * 32]
            for h in hashes:  # a few of each kind: compiling wants the types, not the numbers
                pool.find(h), pool.tiers_holding(h), pool.details_of(h), pool.removal_of(h)
                for medium in ("GPU", "CPU", "STORAGE"):
                    pool.num_copies(h, medium), pool.num_copies(h, medium, 0)
            list(pool.blocks()), list(pool.held()), pool.mediums()
    grow = ColumnarPool("warm-up-grow")  # more blocks than a new pool has room for: its tables grow
    for seq in range(3):
        hashes = tuple((seq * 1000 + i).to_bytes(8, "big") for i in range(1, 1001))
        stored = VllmEvent("BlockStored", hashes, None, tuple(range(16 * len(hashes))), 16)
        grow.apply(fastwire.decode_columns(seq, encode_batch(float(seq), [stored], 0)))
    # token ids that outgrow uint16 (Llama 3's vocabulary), on every route into a pool: a
    # frame at a time, many at once, and the reference's decoded batches
    # (hashes with the top bit set, each block the next one's parent, and a removal)
    def stored(i: int, first: int) -> VllmEvent:
        return VllmEvent("BlockStored", (((1 << 63) + i).to_bytes(8, "big"),),
                         ((1 << 63) + i - 1).to_bytes(8, "big") if i else None, tuple(range(first, first + 16)), 16)

    wide_frames = [(0, encode_batch(1.0, [stored(0, 49_136), stored(1, 60_000)], 0)),
                   (1, encode_batch(2.0, [stored(2, 128_240)], 0)),
                   (2, encode_batch(3.0, [VllmEvent("BlockRemoved", (((1 << 63) + 1).to_bytes(8, "big"),)),
                                          stored(3, 2**32 - 16)], 0))]
    for journalled, route in itertools.product((False, True), ("one", "many", "reference")):
        wide = ColumnarPool("warm-up-wide", journal=journalled)
        decode = wire.decode_batch if route == "reference" else fastwire.decode_columns
        batches = [decode(seq, payload) for seq, payload in wide_frames]
        if route == "many":
            wide.apply_many(batches[:1])
            wide.apply_many(batches[1:])
        else:
            for batch in batches:
                wide.apply(batch)
        if journalled:
            wide.take_journal()
    from engine.warmup import warm_journal_route

    warm_journal_route()  # the attach tests' placer and overlay passes (17 s compiled in each worker otherwise)


PARTS = {"kernel": warm_kernel, "pool": warm_pool}


def main(part: str, done: Path) -> int:
    started = time.monotonic()
    try:
        PARTS[part]()
    except Exception:  # noqa: BLE001 - reported, and the workers compile for themselves
        done.write_text(f"{part} failed\n" + traceback.format_exc())
        return 1
    done.write_text(f"{part} ok {time.monotonic() - started:.1f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
