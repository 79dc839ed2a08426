"""A journal log numbers each pool's slots without a table while they come in order (a pool
gives its slots in order from its first, a few skipped, and one server of one rank is the
only pool): each (pool, slot) keeps one number, no two share one, and the table is made,
the run's numbers in it, at a slot below the run, a long skip, or another pool's slots."""

from __future__ import annotations

import numpy as np

from engine.core.live_journal import JournalKeys, JournalStores, _compiled


class _Numbers:
    """Every number `slot_ids` gave, checked as it goes: one per (pool, slot), each its own."""

    def __init__(self) -> None:
        assert _compiled()
        self.stores = JournalStores(JournalKeys(), compiled=True)
        self.of: dict[tuple[int, int], int] = {}
        self.owner: dict[int, tuple[int, int]] = {}

    def ids(self, pool, slots, strided=False):
        slots = np.asarray(slots, np.int64)
        if strided:  # as a pool's journal gives them: a column of its rows
            rows = np.zeros((len(slots), 3), np.int64)
            rows[:, 1] = slots
            slots = rows[:, 1]
        got = self.stores.slot_ids(pool, slots)
        assert len(got) == len(slots)
        for s, g in zip(slots.tolist(), got.tolist()):
            if s < 0:
                assert g == -1
                continue
            assert 0 <= g < self.stores._num_slot_ids
            assert self.of.setdefault((pool, s), g) == g, (pool, s)  # the number it had
            assert self.owner.setdefault(g, (pool, s)) == (pool, s), g  # no other's
        return got


def test_one_pools_slots_in_order_keep_no_table():
    nums = _Numbers()
    rng = np.random.default_rng(3)
    top = 1024  # a pool's first slot need not be 0
    for tick in range(200):
        k = int(rng.integers(1, 300))
        new = np.arange(top, top + int(rng.integers(0, 40)))
        new = new[rng.random(len(new)) > 0.02]  # a few slots skipped
        old = rng.integers(1024, max(1025, top), k) if top > 1024 else np.zeros(0, np.int64)
        slots = np.concatenate([old, new, [-1] * (tick % 3 == 0)])
        rng.shuffle(slots)  # a tick's new slots in any row order
        nums.ids(0, slots, strided=tick % 2 == 1)
        top = max(top, int(new[-1]) + 1 if len(new) else top)
    stores = nums.stores
    assert not stores._slot_ids and stores._slot_runs[0][:2] == (0, 1024)  # no table: was 4 bytes a slot
    assert len(nums.of) > 3000 and stores._num_slot_ids <= (top - 1024) * 1.05


def test_a_slot_below_the_run_a_long_skip_or_another_pools_make_the_table():
    nums = _Numbers()
    stores = nums.stores
    nums.ids(0, [10, 11, 12])
    nums.ids(0, [14, 11, -1])  # 13 skipped: numbered all the same
    assert not stores._slot_ids and stores._slot_runs == {0: (0, 10, 15)}
    nums.ids(0, [9, 15])  # below the run: a table, the run's numbers in it
    assert 0 in stores._slot_ids and 0 not in stores._slot_runs
    nums.ids(0, [10, 9, 14, 16])
    nums.ids(1, [0, 1, 2])  # a second pool: a run of its own, from the numbers given
    first = stores._slot_runs[1][0]
    nums.ids(2, [5, 6])
    nums.ids(1, [3, 0])  # pool 2 numbered since: pool 1's new slot takes a table
    assert 1 in stores._slot_ids and 2 in stores._slot_runs
    nums.ids(2, [6, 5000])  # a skip past an eighth of the slots met, and 64
    assert 2 in stores._slot_ids and not stores._slot_runs
    got = nums.ids(1, [-1, 2, 0, 4])
    assert got.tolist()[1:3] == [first + 2, first]


_TABLE_PATH_AFTER_WARM_UP = r"""
import numpy as np
from numba.core.registry import CPUDispatcher
import gc
from engine.core.live_journal import JournalKeys, JournalStores, _compiled

assert _compiled()  # what the warm-up compiles (or loads): every path the placer takes
def overloads():
    return sum(len(o.overloads) for o in gc.get_objects() if isinstance(o, CPUDispatcher))
before = overloads()
stores = JournalStores(JournalKeys(), compiled=True)
for pool, strided in ((0, False), (1, True)):
    for slots in ([1024, 1025, 1026], [3, 1027]):  # a run, then a slot below it: the table
        slots = np.asarray(slots, np.int64)
        if strided:  # as a pool's journal gives them: a column of its rows
            rows = np.zeros((len(slots), 3), np.int64)
            rows[:, 1] = slots
            slots = rows[:, 1]
        stores.slot_ids(pool, slots)
    assert pool in stores._slot_ids
print(overloads() - before)
"""


def test_the_warm_up_compiles_the_slot_tables_path_too():
    # With the run path, the table's numbering is met only mid-attach; left out of the
    # warm-up, its compile cost 1.2 s of placing inside bench gui's route (a fresh process:
    # one here would have it compiled by the tests before)
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _TABLE_PATH_AFTER_WARM_UP], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout.split()[-1] == "0"  # nothing compiled or loaded past the warm-up
