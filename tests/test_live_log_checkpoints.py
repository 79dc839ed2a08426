"""A live log's checkpoints fall on an event's first row, as a finished log's do
(`ColumnarLog.build_checkpoints`): a pass started inside an event numbers a multi-block free
to the free queue's head among that event's rows in that pass only, so a scrub from such a
checkpoint put the freed blocks in the wrong order."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.live_log import LiveColumnarLog
from engine.core.replay import ReplayConfig
from engine.core.trace import load_trace
from engine.kernel import replay_kernel
from tests.test_columnar import TRACES, reference_states

NUM_BLOCKS, BLOCK_SIZE = 300, 512


def _live_log(checkpoint_rows: int) -> tuple[LiveColumnarLog, list]:
    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", BLOCK_SIZE)[:600]
    log = replay_kernel(requests, ReplayConfig(block_size=BLOCK_SIZE, capacity_blocks=NUM_BLOCKS), record=True).log
    events = list(log.events())
    live = LiveColumnarLog(NUM_BLOCKS, BLOCK_SIZE, checkpoint_rows=checkpoint_rows, max_checkpoints=1000)
    for i in range(0, len(events), 50):  # as the bridge hands them over, a batch at a time
        live.extend(events[i:i + 50])
    return live, events


@pytest.mark.parametrize("spacing", [997, 61])
def test_a_live_logs_checkpoints_start_events_and_scrub_to_the_reference(spacing):
    # 997 rows apart: on the trace's first 600 requests at 300 blocks, one fell inside an
    # event that freed several blocks (seq 15,068's free queue came out with its first two
    # blocks swapped); 61: events longer than the spacing, a checkpoint after each
    live, events = _live_log(spacing)
    col = live.columnar
    seqs = col.col("seq")
    cuts = [int(r) for r in col._cp_rows[1:] if 0 < r < col.num_rows]
    assert len(cuts) > 50
    if spacing == 61:  # some events longer than the spacing: their checkpoint at their end
        sizes = np.diff(np.flatnonzero(np.diff(seqs, prepend=-1)))
        assert int(sizes.max()) > spacing
    assert all(seqs[r] != seqs[r - 1] for r in cuts)  # each on the first row of its event
    targets = sorted({int(seqs[r - 1]) for r in cuts} | {int(seqs[r]) for r in cuts} | {15_068})
    ref = reference_states(events, NUM_BLOCKS, BLOCK_SIZE, targets)
    for seq in targets:
        st = live.state_at(seq)
        ref_counts, hashes, free = ref[seq][:3]
        assert st.free_order().tolist() == free, seq
        assert st.ref_counts.tolist() == ref_counts, seq
        got = [col.keys.digest(k) if k >= 0 else None for k in np.asarray(st.hash_keys).tolist()]
        assert got == hashes, seq
