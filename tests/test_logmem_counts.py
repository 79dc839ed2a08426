"""A live log that no request ever held a block in (an attached server's journal) answers
its live pool's counts from its series, not from a pass over the whole pool each tick: the
same counts the pass finds, after every tick of a recorded vLLM stream with removals."""

from __future__ import annotations


def test_a_journal_logs_live_counts_are_the_whole_pools(qtbot):
    from app.runtime.context import make_test_context
    from engine.bench.attach import recorded_stream
    from engine.core.columnar_log import ArrayProjection
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    ctx = make_test_context()
    try:
        ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
        state = ctx.state
        pool = journal_pool_class()("test")
        payloads, _, _ = recorded_stream(20_000, gpu_blocks=2_000)
        checked = 0
        for seq, payload in enumerate(payloads):
            pool.apply(fastwire.decode_columns(seq, payload))
            if seq % 16 == 15 or seq == len(payloads) - 1:
                rows = pool.take_journal()
                state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
                pool.release_journal(rows.stop)
                log = state.log
                live = log.live
                assert "counts" in live._cache  # from the series, no pass
                fresh = ArrayProjection(log, log._live_arrays, len(log.seqs))
                assert (live.num_in_use, live.num_hashed, live.num_cached_free) == \
                    (fresh.num_in_use, fresh.num_hashed, fresh.num_cached_free)
                checked += 1
        assert checked > 80 and live.num_hashed > 2_000  # more than the GPU holds: other tiers' too
    finally:
        ctx.shutdown()
