"""The overlay's table of removals remembered (`JournalFollower.room`) grows for a second of
ticks like the one that grows it: a fast stream's reaches the size MAX_REMEMBERED_REMOVALS
takes in two steps (each a new array's page faults and a rehash), a slow stream's stays small."""

from __future__ import annotations

from engine.remote.overlay import MAX_REMEMBERED_REMOVALS, ROOM_TICKS, JournalFollower


def _sizes(per_tick: int, ticks: int) -> list[int]:
    """The table's sizes as `ticks` ticks of `per_tick` removals each are remembered (the
    oldest forgotten past MAX_REMEMBERED_REMOVALS, as the compiled pass does)."""
    follow, sizes = JournalFollower(), []
    for _ in range(ticks):
        follow.room(per_tick)
        st = follow.st
        st[6] += per_tick  # the ring's tail
        st[9] = min(int(st[9]) + per_tick, MAX_REMEMBERED_REMOVALS)
        st[5] = max(int(st[5]), int(st[6]) - int(st[9]))  # the head: past what was forgotten
        if not sizes or sizes[-1] != len(follow.removed):
            sizes.append(len(follow.removed))
        assert 2 * int(st[9]) <= len(follow.removed)  # at most half full
    return sizes


def test_a_fast_streams_table_reaches_its_size_in_two_steps():
    sizes = _sizes(2_000, 300)  # the recorded attach's ~2,000 removals a tick
    cap = 1 << (2 * (MAX_REMEMBERED_REMOVALS + 1) - 1).bit_length()
    assert sizes[-1] == cap and len(sizes) <= 3, sizes  # 1,024, then 256K, then 512K rows


def test_a_slow_streams_table_stays_small():
    sizes = _sizes(5, 2_000)  # 10,000 removals, 5 a tick
    assert sizes[-1] <= 2 * (10_000 + 5 * ROOM_TICKS) * 2, sizes  # the next power of two above
    assert sizes[-1] < 64 * 1024
