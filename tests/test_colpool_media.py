"""engine.remote.colpool: a store or removal naming a medium by a connector's own name
(`DISK`, `cpu`, `LocalDisk`, `cuda:0`) is applied by the compiled loop, the name kept as a
per-slot code, and every reading (details, details_of, media, held, the journal) still
answers as the reference does."""

from __future__ import annotations

import random

import pytest

from engine.remote import colpool, fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import _journal_events, _reference_events, _run, state

MEDIA = ["GPU", None, "CPU", "cpu", "DISK", "LocalDisk", "STORAGE", "SSD", "cuda:0", "CPU_PINNED"]


def _h(i: int) -> bytes:
    return (i | 1 << 63).to_bytes(8, "big")


def _mixed(num_batches: int, seed: int) -> list[tuple[int, bytes]]:
    """Stores and copies of a few hundred hashes under mixed media names (most of them plain
    but for the name), some with ownership, locality or a group (kept whole), removals
    naming the same media, and clears of a tier."""
    rng = random.Random(seed)
    frames = []
    for seq in range(num_batches):
        events = []
        for _ in range(rng.randint(1, 5)):
            r = rng.random()
            medium = rng.choice(MEDIA)
            if r < 0.6:
                k = rng.randint(1, 4)
                first = rng.randrange(300)
                hashes = tuple(_h(first + j) for j in range(k))
                parent = _h(first - 1) if first and rng.random() < 0.7 else None
                said = {}
                if rng.random() < 0.1:
                    said["ownership"] = rng.choice(["lmcache", "offload"])
                if rng.random() < 0.05:
                    said["locality"] = "local"
                if rng.random() < 0.05:
                    said["group_idx"] = 1
                events.append(VllmEvent("BlockStored", hashes, parent, tuple(range(16 * k)), 16, medium=medium,
                                        **said))
            elif r < 0.95:
                victims = tuple(_h(rng.randrange(320)) for _ in range(rng.randint(1, 3)))
                events.append(VllmEvent("BlockRemoved", victims, medium=medium))
            else:
                events.append(VllmEvent("AllBlocksCleared", medium=rng.choice(["DISK", "STORAGE", None])))
        frames.append((seq, encode_batch(1_796_000_000.0 + seq * 0.5, events, 0)))
    return frames


@pytest.mark.parametrize("seed", range(4))
def test_mixed_media_give_the_reference_pool(seed):
    frames = _mixed(300, seed)
    ref = _run(frames, False)
    assert _run(frames, True) == ref
    assert _run(frames, True, many=16) == ref
    assert _run(frames, True, via_reference=True) == ref
    assert _run(frames, True, 20, 53, many=8) == _run(frames, False, 20, 53)


@pytest.mark.parametrize("seed", range(2))
def test_the_journal_of_mixed_media_says_what_the_reference_emits(seed):
    frames = _mixed(200, seed)
    ref_events, _ = _reference_events(frames, 30, 61)
    quiet = _run(frames, False, 30, 61)[0]
    for many in (1, 16):
        got, pool = _journal_events(frames, 30, 61, many, take_every=5)
        assert got == ref_events
        assert state(pool) == quiet


def test_past_the_last_code_a_raw_name_is_kept_as_the_reference_keeps_it(monkeypatch):
    monkeypatch.setattr(colpool, "MAX_RAW", 4)  # GPU, CPU, then two: the rest go to the details dict
    frames = _mixed(300, 7)
    assert _run(frames, True) == _run(frames, False)
    assert _run(frames, True, many=16) == _run(frames, False)


def test_a_store_naming_only_its_medium_takes_the_compiled_loop(monkeypatch):
    """No Python per event and no dict per block for a connector's medium name (the old
    pool stored each such block through `_rare_store` and kept {"medium": ...} for it)."""
    pool, ref = ColumnarPool("t"), RemotePool("t")
    frames = [encode_batch(1.0 + f, [VllmEvent("BlockStored", tuple(_h(64 * f + j) for j in range(64)), None,
                                               tuple(range(1024)), 16, medium=m)
                                     for m in ("DISK", "LocalDisk", "cpu")], 0) for f in range(4)]
    frames.append(encode_batch(9.0, [VllmEvent("BlockRemoved", (_h(0), _h(1)), medium="DISK")], 0))

    def python_path(*args, **kwargs):
        raise AssertionError("a store naming only its medium went through Python")

    monkeypatch.setattr(ColumnarPool, "_rare_store", python_path)
    pool.apply_many([fastwire.decode_columns(f, p) for f, p in enumerate(frames)])
    for f, p in enumerate(frames):
        ref.apply(fastwire.decode_batch(f, p))
    assert pool._details == {}
    assert pool.details == ref.details and len(ref.details) == 3 * 4 * 64 - 2
    assert pool.media == ref.media
    assert [pool.details_of(_h(j)) for j in range(70)] == [ref.details_of(_h(j)) for j in range(70)]


def test_details_keep_the_references_key_order():
    """A raw name said before, after and between other details: the same keys in the same order."""
    pool, ref = ColumnarPool("t"), RemotePool("t")
    a, b, c = _h(1), _h(2), _h(3)
    batches = [
        [VllmEvent("BlockStored", (a,), None, tuple(range(16)), 16, medium="STORAGE", ownership="x"),
         VllmEvent("BlockStored", (b,), None, tuple(range(16)), 16, medium="DISK")],
        [VllmEvent("BlockStored", (a,), None, tuple(range(16)), 16, medium="DISK"),
         VllmEvent("BlockStored", (b,), None, tuple(range(16)), 16, medium="STORAGE", locality="near"),
         VllmEvent("BlockStored", (c,), None, tuple(range(16)), 16, medium="SSD")],
        [VllmEvent("BlockStored", (a,), None, tuple(range(16)), 16, medium="STORAGE", locality="far"),
         VllmEvent("BlockStored", (b,), None, tuple(range(16)), 16, medium="SSD"),
         VllmEvent("BlockStored", (c,), None, tuple(range(16)), 16, medium="DISK", ownership="y")],
    ]
    for seq, events in enumerate(batches):
        p = encode_batch(1.0 + seq, events, 0)
        pool.apply(fastwire.decode_columns(seq, p))
        ref.apply(fastwire.decode_batch(seq, p))
        for h in (a, b, c):
            got, want = pool.details_of(h), ref.details_of(h)
            assert got == want
            assert [list(t.items()) for t in got["tiers"].values()] == \
                [list(t.items()) for t in want["tiers"].values()]


def test_a_run_of_stores_leaves_the_removal_maps_their_size():
    """Only a removal adds to `removed_at` and `departed`: a run of stores reserves them no room
    (it reserved one entry per block stored: 2 x 64K entries for this run)."""
    pool = ColumnarPool("t")
    frames = [encode_batch(1.0 + f, [VllmEvent("BlockStored", tuple(_h(1000 * f + j) for j in range(1000)), None,
                                               tuple(range(16_000)), 16, medium=m)], 0)
              for f, m in enumerate(["GPU", "DISK", "CPU", "GPU"] * 16)]
    pool.apply_many([fastwire.decode_columns(f, p) for f, p in enumerate(frames)])
    assert pool.num_cached == 64_000
    assert len(pool.removed.k) < 10_000 and len(pool.departed_map.k) < 10_000
    pool.apply(fastwire.decode_columns(99, encode_batch(99.0, [VllmEvent("BlockRemoved", (_h(5),))], 0)))
    assert list(pool.removed_at) == [_h(5)]


def test_the_raw_medium_column_comes_with_the_first_raw_name():
    """A stream naming only GPU and CPU keeps 3 bytes a slot in F (no F_RAW column: the
    engine's pool held 100.1 B a block with it, 99.1 without); the first connector's name adds
    the column, zero for the slots before, and every reading still answers as the reference."""
    pool, ref = ColumnarPool("t"), RemotePool("t")
    plain = [encode_batch(1.0 + f, [VllmEvent("BlockStored", tuple(_h(64 * f + j) for j in range(64)), None,
                                              tuple(range(1024)), 16, medium=m)
                                    for m in ("GPU", "CPU")], 0) for f in range(3)]
    for f, p in enumerate(plain):
        pool.apply(fastwire.decode_columns(f, p))
        ref.apply(fastwire.decode_batch(f, p))
    assert pool.F.shape[1] == colpool.F_RAW and pool.details == ref.details == {}
    disk = encode_batch(9.0, [VllmEvent("BlockStored", (_h(5000), _h(5001)), None, tuple(range(32)), 16,
                                        medium="DISK")], 0)
    pool.apply_many([fastwire.decode_columns(3, disk)])
    ref.apply(fastwire.decode_batch(3, disk))
    assert pool.F.shape[1] == colpool.F_RAW + 1
    assert pool.details == ref.details and len(ref.details) == 2
    assert [pool.details_of(_h(j)) for j in (0, 64, 5000, 5001)] == [ref.details_of(_h(j)) for j in (0, 64, 5000, 5001)]
