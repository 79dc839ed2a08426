"""A journal tick's RemoteInfos (`RemoteSlots.info_ids`): a tick whose batches are all past
the stream's newest numbers them without a lookup each, also when a batch comes in two tiers
(GPU and CPU: two infos of one batch seq, as the recorded vLLM stream's ticks have them), and
every number is the one a lookup of each info in order gives."""

from __future__ import annotations

import random

from engine.core.live_slots import RemoteSlots


class _CountedGets(dict):
    """A dict that counts its lookups (`get`)."""

    gets = 0

    def get(self, key, default=None):
        _CountedGets.gets += 1
        return super().get(key, default)


def _reference(calls):
    """Each info numbered at its first sight, in order (1 on), as one lookup an info does."""
    seen: dict = {}
    out = []
    for source, rank, seqs, times, media in calls:
        out.append([seen.setdefault((source, rank, s, t, m), len(seen) + 1) for s, t, m in zip(seqs, times, media)])
    return out


def test_a_tick_of_new_batches_in_two_tiers_is_numbered_without_lookups():
    slots = RemoteSlots([])
    slots._field_ids = _CountedGets()
    _CountedGets.gets = 0
    got = slots.info_ids("tcp://a:1", 0, [0, 0, 1, 2, 2], [1.0, 1.0, 1.5, 2.0, 2.0], ["GPU", "CPU", "GPU", "GPU", "CPU"])
    got += slots.info_ids("tcp://a:1", 0, [3, 3, 4], [2.5, 2.5, 3.0], ["GPU", "CPU", "GPU"])
    assert got == list(range(1, 9)) and _CountedGets.gets == 0
    # a batch the last tick named (its rows taken over two ticks): looked up, the same number
    assert slots.info_ids("tcp://a:1", 0, [4, 5], [3.0, 3.5], ["GPU", "GPU"]) == [8, 9]
    assert _CountedGets.gets == 2
    # two tiers that are one info (a tier vLLM does not name stands for "GPU"): one number
    assert slots.info_ids("tcp://a:1", 0, [6, 6], [4.0, 4.0], ["GPU", "GPU"]) == [10, 10]
    assert len(slots.infos) == 10


def test_numbers_equal_a_lookup_of_each_info_in_order():
    rng = random.Random(7)
    calls, top = [], {}
    for _ in range(400):
        source, rank = rng.choice(["tcp://a:1", "tcp://b:2"]), rng.randrange(2)
        seq = top.get((source, rank), -1) + (0 if rng.random() < 0.3 else 1)  # a batch again, or new ones
        seqs, times, media = [], [], []
        for _ in range(rng.randint(1, 12)):
            for medium in rng.choice([["GPU"], ["GPU", "CPU"], ["GPU", "GPU"], ["CPU"]]):
                seqs.append(seq), times.append(1000.0 + seq * 0.25), media.append(medium)
            seq += rng.randint(0, 2)
        top[source, rank] = max(top.get((source, rank), -1), max(seqs))
        calls.append((source, rank, seqs, times, media))
    slots = RemoteSlots([])
    got = [slots.info_ids(*call) for call in calls]
    assert got == _reference(calls)
    assert len(slots.infos) == max(max(g) for g in got)
    assert [slots.info(i).batch_seq for i in got[-1]] == calls[-1][2]
