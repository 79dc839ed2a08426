"""`RemoteOverlay.observe_journal` on its own: the removals it remembers for "stored again"
(its table, probed across its end, bounded) against a plain ordered dict, and tiers past
vLLM's three against the event route (`tests/test_journal_app.py` holds the recorded streams)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.remote import overlay
from engine.remote.overlay import JournalFollower, RemoteOverlay, observe_journal


class _Rows:
    """What `observe_journal` reads of a `JournalRows`: stores (op 0) and removals (op 1) of GPU blocks."""

    tier_names = ["GPU", "CPU", "STORAGE", "REMOTE"]

    def __init__(self, ops: list[int], keys: list[int]) -> None:
        n = len(ops)
        self.op = np.array(ops, np.int64)
        self.tier = np.zeros(n, np.int64)
        self.key = np.array(keys, np.int64).view(np.uint64)
        self.width = np.ones(n, np.int64)
        self.store = np.zeros(n, np.int64)

    def __len__(self) -> int:
        return len(self.op)


class _Pool:
    source, rank = "tcp://10.0.0.5:5557", 0


class _Slots:
    """A projection of `num_blocks` slots, every one held."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.hashed = bytearray(b"\x01" * num_blocks)


def _colliding(num: int, rows: int, homes: set[int], seed: int) -> list[int]:
    """`num` distinct identities whose place in a table of `rows` rows is one of `homes`."""
    rng = np.random.default_rng(seed)
    shift = np.uint64(64 - (rows.bit_length() - 1))
    out: list[int] = []
    while len(out) < num:
        ids = rng.integers(-(1 << 63), (1 << 63) - 1, 1 << 16, dtype=np.int64)
        home = (ids.view(np.uint64) * overlay._GOLDEN) >> shift
        out += [int(x) for x in ids[np.isin(home, list(homes))] if int(x) not in out]
    return out[:num]


@pytest.mark.parametrize("remembered", [1, 6, 40])
def test_removals_remembered_equal_an_ordered_dict(monkeypatch, remembered):
    """Stores and removals of a few identities that all probe the table's last rows and its
    first (so probes and deletions wrap around), a few removals remembered at most: each
    tick's "stored again" and the identities remembered equal a dict's, oldest forgotten first."""
    monkeypatch.setattr(overlay, "MAX_REMEMBERED_REMOVALS", remembered)
    remote, pool = RemoteOverlay(), _Pool()
    follow = remote.journal = JournalFollower()
    rows = len(follow.removed)
    # an identity is the key mixed with the tier's and the stream's terms: undo them
    mix = int((np.array([1], np.int64) * overlay._MIX_TIER)[0] ^ follow.stream_mix(pool))
    ids = _colliding(12, rows, {rows - 3, rows - 2, rows - 1, 0, 1}, seed=remembered)
    rng = random.Random(remembered)
    model: dict[int, None] = {}
    again = 0
    for tick in range(300):
        ops = [rng.choice((0, 1, 1)) for _ in range(rng.randint(1, 12))]
        idents = [rng.choice(ids) for _ in ops]
        for op, ident in zip(ops, idents):
            if op == 0 and ident in model:
                del model[ident]
                again += 1
            elif op == 1 and ident not in model:
                model[ident] = None
                if len(model) > remembered:
                    del model[next(iter(model))]
        rows_of = _Rows(ops, [ident ^ mix for ident in idents])
        observe_journal(remote, rows_of, np.full(len(ops), 100.0 + tick), _Slots(1),
                        np.full(len(ops), -1, np.int64), pool, 0)
        assert remote.num_stored_again == again, tick
        held = follow.removed[follow.removed[:, 1] >= 0, 0]
        assert sorted(held.tolist()) == sorted(model), tick
        assert follow.num_remembered == len(model)
    assert len(follow.removed) == rows  # never grown: at most `remembered` + 1 at once
    assert again > 20


def test_the_table_grows_and_keeps_what_it_remembers():
    """Many removals, then each stored again: the table grew (at most half full) and found them all."""
    remote, pool = RemoteOverlay(), _Pool()
    keys = list(range(1, 5_001))
    observe_journal(remote, _Rows([1] * len(keys), keys), np.zeros(len(keys)), _Slots(1),
                    np.full(len(keys), -1, np.int64), pool, 0)
    follow = remote.journal
    assert follow.num_remembered == len(keys) and len(follow.removed) >= 2 * len(keys)
    observe_journal(remote, _Rows([0] * len(keys), keys[::-1]), np.ones(len(keys)), _Slots(1),
                    np.full(len(keys), -1, np.int64), pool, 0)
    assert remote.num_stored_again == len(keys) and follow.num_remembered == 0
    assert not (follow.removed[:, 1] >= 0).any()


def _tiered(num_batches: int, seed: int) -> list[tuple[int, bytes]]:
    """Stores and removals on GPU, CPU and a remote store (`EXTERNAL`: a tier past vLLM's three)."""
    from engine.remote.wire import VllmEvent, encode_batch

    rng = random.Random(seed)
    held: list[tuple[int, str | None]] = []
    frames = []
    for seq in range(num_batches):
        events = []
        for _ in range(rng.randint(1, 5)):
            if rng.random() < 0.6 or not held:
                medium = rng.choice(["GPU", None, "cpu", "EXTERNAL", "cuda:0"])
                hashes = [rng.randrange(1, 1 << 64) for _ in range(rng.randint(1, 4))]
                events.append(VllmEvent("BlockStored", tuple(h.to_bytes(8, "big") for h in hashes), None,
                                        tuple(rng.randrange(50_000) for _ in range(16 * len(hashes))), 16,
                                        medium=medium))
                held += [(h, medium) for h in hashes]
            else:
                h, medium = held.pop(rng.randrange(len(held)))
                events.append(VllmEvent("BlockRemoved", (h.to_bytes(8, "big"),), medium=medium))
        frames.append((seq, encode_batch(1_796_000_000.0 + seq * 0.5, events, 0)))
    return frames


@pytest.mark.parametrize("per_tick", [1, 7])
def test_a_tier_past_the_three_equals_the_event_route(per_tick):
    """`EXTERNAL` (the remote tier) gets the overlay's fourth code in both routes, and every
    code shifts with it: the same tiers, counts, codes and rates."""
    from tests.test_journal_app import _both, _same

    js, rs = _both([_tiered(120, per_tick)], per_tick)
    assert "REMOTE" in js.remote.tier_names and js.remote.tier_names == rs.remote.tier_names
    _same(js, rs, f"{per_tick} a tick", in_order=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_tier_counts_moved_on_by_each_tick_equal_a_count_of_every_slot(monkeypatch, seed):
    """After every tick (stores, removals, clears, a restart, a tier past the three) the tier
    counts the pass moved on equal a count of every slot, and most ticks were not counted
    over every slot."""
    from tests.test_colpool import _synthetic
    from tests.test_journal_app import _both

    frames = [*_synthetic(60, seed), *[(60 + seq, p) for seq, p in _tiered(60, seed)]]
    full = RemoteOverlay.tier_counts
    num_full = []

    def counted(remote, projection):
        n = min(projection.num_blocks, len(remote.base))
        kept = remote._counts
        got = full(remote, projection)
        if remote.journal is not None:  # the journal route: against a count from scratch
            if remote._counts[:2] != (remote.revision, n) or remote._counts is not kept:
                num_full.append(remote.revision)
            remote._counts = None
            assert full(remote, projection) == got, remote.revision
        return got

    monkeypatch.setattr(RemoteOverlay, "tier_counts", counted)
    js, rs = _both([frames], 3, restart_at=70)
    assert js.remote.tier_counts(js.projection) == rs.remote.tier_counts(rs.projection)
    assert "REMOTE" in js.remote.tier_names and js.projection.num_resets >= 1
    ticks = js.remote.revision
    assert ticks > 30 and len(set(num_full)) < ticks // 2, num_full
