"""A removal map's FIFO (a ring) grows two ways (`_OrderedMap.fifo_room`): copied as it is,
every entry keeping its position, while next to no key left the map (a map filling up), else
its live keys moved to the start of a new one; at the bound it wraps round. Either way the maps must stay the reference's,
key for key and in order, through later growths, moves and pops at the bound."""

from __future__ import annotations

import random

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, decode_batch, encode_batch
from tests.test_colpool_p_maps import _h


def _apply(payloads: list[bytes], max_removed: int, monkeypatch) -> tuple[colpool.ColumnarPool, int, int]:
    """The pool after runs of 64 frames; how many new FIFOs kept the positions and how many moved the keys."""
    moved = []
    refifo = colpool._om_refifo

    def counted(ofifo, OV, OS, pos, out):
        moved.append(len(out))
        return refifo(ofifo, OV, OS, pos, out)

    monkeypatch.setattr(colpool, "_om_refifo", counted)
    pool = colpool.ColumnarPool("t", max_removed=max_removed)
    num_grown = 0
    for i in range(0, len(payloads), 64):
        before = [m.fifo for m in (pool.removed, pool.departed_map)]
        num_moved = len(moved)
        pool.apply_many([fastwire.decode_columns(seq, payloads[seq]) for seq in range(i, min(i + 64, len(payloads)))])
        num_grown += sum(m.fifo is not old for m, old in zip((pool.removed, pool.departed_map), before))
        num_grown -= len(moved) - num_moved
    return pool, num_grown, len(moved)


def _reference(payloads: list[bytes], max_removed: int) -> RemotePool:
    ref = RemotePool("t", max_removed=max_removed)
    for seq, p in enumerate(payloads):
        ref.apply(decode_batch(seq, p))
    return ref


def _same_maps(pool: colpool.ColumnarPool, ref: RemotePool) -> None:
    assert list(pool.removed_at.items()) == list(ref.removed_at.items())
    assert list(pool.departed.items()) == list(ref.departed.items())


def test_a_filling_map_keeps_its_positions_and_its_order(monkeypatch):
    """Below the bound: FIFOs grown as they are (no key moved), the maps the reference's."""
    payloads, _, _ = recorded_stream(20_000, gpu_blocks=1_500, seed=7)
    pool, num_kept, num_moved = _apply(payloads, 1_000_000, monkeypatch)
    assert len(pool.removed) > 8_000 and num_kept >= 6
    _same_maps(pool, _reference(payloads, 1_000_000))


def test_a_map_at_its_bound_wraps_round_and_keeps_its_order(monkeypatch):
    """At the bound the oldest keys leave: each FIFO is a ring whose head moves on and whose
    tail wraps round, so no key is moved (a FIFO's end once moved every key about once per
    `max_removed` keys), after growths that kept positions, and the maps stay the reference's."""
    payloads, _, _ = recorded_stream(20_000, gpu_blocks=1_500, seed=8)
    pool, num_kept, num_moved = _apply(payloads, 3_000, monkeypatch)
    assert len(pool.removed) == len(pool.departed_map) == 3_000
    assert num_kept >= 2 and num_moved == 0
    _same_maps(pool, _reference(payloads, 3_000))


def _restoring_frames(num_frames: int, restore: float, seed: int) -> list[bytes]:
    """Stores of new hashes and removals of held ones; a store names hashes that left before
    with probability `restore` (each leaves removed_at: a hole in its FIFO)."""
    rng = random.Random(seed)
    held: list[int] = []
    gone: list[int] = []
    fresh = 1
    frames = []
    for f in range(num_frames):
        if gone and rng.random() < restore:
            keys = [gone.pop(rng.randrange(len(gone)))]
        else:
            keys = list(range(fresh, fresh + rng.randint(1, 4)))
            fresh += len(keys)
        held.extend(keys)
        events = [VllmEvent("BlockStored", tuple(_h(i) for i in keys), None, tuple(range(16 * len(keys))), 16)]
        if len(held) > 8:
            out = [held.pop(rng.randrange(len(held))) for _ in range(rng.randint(1, 4))]
            events.append(VllmEvent("BlockRemoved", tuple(_h(i) for i in out)))
            gone.extend(out)
        frames.append(encode_batch(1.0 + f, events, 0))
    return frames


def test_a_map_with_keys_gone_from_it_keeps_them_gone_and_its_order(monkeypatch):
    """Keys stored again leave removed_at (holes in its FIFO) while the maps fill: a FIFO
    copied as it is keeps its holes and its live keys after them; one moved drops the holes."""
    holes = []
    room = colpool._OrderedMap.fifo_room

    def noted(m, more):
        if int(m.os[colpool.O_TAIL]) + more > len(m.fifo):
            holes.append((int(m.os[colpool.O_TAIL]) - len(m), len(m)))
        room(m, more)

    monkeypatch.setattr(colpool._OrderedMap, "fifo_room", noted)
    for restore in (0.02, 0.3):
        holes.clear()
        payloads = _restoring_frames(6_000, restore, 3)
        pool, num_kept, num_moved = _apply(payloads, 1_000_000, monkeypatch)
        # kept with holes (at most an eighth) at a low rate; moved at a high one
        assert any(0 < h <= n // 8 for h, n in holes) if restore < 0.1 else num_moved >= 1
        _same_maps(pool, _reference(payloads, 1_000_000))
