"""The journal route's compiled placer keeps a block's hash code only once it keeps a table of
hashes (the first store that names a tenant): till then a record is its hash id, its owner
and its slot's next copy, 12 bytes, and the table reads the held blocks' codes from the log's
key table, or, for rows placed and not yet committed, from the calls it keeps until then."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np

from engine.core.live_journal import _CompiledPlacer, append_journal, commit_journal, journal_log, prepare_journal
from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.wire import VllmEvent, encode_batch

SOURCE = "tcp://10.0.0.7:5557"


def _frames(num_batches: int, salted_from: int, seed: int = 3) -> list[tuple[int, bytes]]:
    """Stores (new and held hashes, under held parents), removals; from batch `salted_from`
    on, some stores name a cache salt (a tenant: vLLM's `extra_keys`)."""
    rng = random.Random(seed)
    held: list[int] = []
    frames = []
    for seq in range(num_batches):
        events = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.6 or len(held) < 8:
                k = rng.randint(1, 5)
                hashes = [rng.choice(held) if held and rng.random() < 0.2 else rng.randrange(1, 1 << 64)
                          for _ in range(k)]
                parent = rng.choice(held) if held and rng.random() < 0.7 else None
                salt = f"tenant-{rng.randrange(3)}" if seq >= salted_from and rng.random() < 0.5 else None
                events.append(VllmEvent("BlockStored", tuple(h.to_bytes(8, "big") for h in hashes),
                                        parent.to_bytes(8, "big") if parent is not None else None,
                                        tuple(rng.randrange(50_000) for _ in range(16 * k)), 16,
                                        medium=rng.choice(["GPU", "GPU", "CPU"]),
                                        extra_keys=tuple((salt,) for _ in hashes) if salt else None))
                held.extend(hashes)
            else:
                victims = [held.pop(rng.randrange(len(held))) for _ in range(rng.randint(1, 3))]
                events.append(VllmEvent("BlockRemoved", tuple(h.to_bytes(8, "big") for h in victims),
                                        medium=rng.choice(["GPU", "CPU"])))
        frames.append((seq, encode_batch(1_796_000_000.0 + seq * 0.5, events, 0)))
    return frames


def _said(log) -> list[tuple]:
    return [(e.kind, e.block_hash, getattr(e, "parent_hash", None)) for e in log.events]


def _tenants(log) -> list:
    """Each store's tenant as placed (its parent holder's, else its own)."""
    return log.columnar.store_attributes.tenants.view.tolist()


def _held(log) -> Counter:
    p = log.live
    return Counter((p.hashes[b], p.parents[b]) for b in range(p.num_blocks) if p.hashes[b] is not None)


def test_a_record_is_4_bytes_until_a_tenant_comes():
    log = journal_log(16)
    pool = ColumnarPool(SOURCE, rank=0, journal=True)
    for seq, payload in _frames(400, salted_from=10**9):
        pool.apply(fastwire.decode_columns(seq, payload))
        if seq % 8 == 7:
            append_journal(log, pool.take_journal(), pool, SOURCE)
    append_journal(log, pool.take_journal(), pool, SOURCE)
    placer = log.columnar.store_attributes.placer
    assert isinstance(placer, _CompiledPlacer) and int(placer.state[8]) == 0
    nb = int(placer.state[1])
    assert nb > 1000
    # one int32 field a record (hash id: its owner, one server's rank 0, kept once), grown by
    # an eighth at most; a record's slot's next copy in the copies' table, sized for the
    # copies a tick may make (32 KB while a tick has 2,047 stores at most), not a field of
    # every record
    assert placer.blocks.dtype == np.int32 and placer.blocks.shape[1] == 1
    assert placer.blocks.nbytes <= 4 * max(1024, nb * 9 // 8)
    assert placer.cp.nbytes == 32 * 1024
    # codes kept here only between a call and its commit
    assert not placer._recent  # every call committed: no code kept here


def test_a_first_tenant_with_ticks_placed_and_not_committed_places_as_the_reference(monkeypatch):
    """Ticks prepared up to three ahead of their commit (as the journal feed's thread does),
    the first salted store among them: the table is made from the log's keys and the calls
    kept, and every event (hash, parent, tenant) and block held equals the Python placer's."""
    made = []
    make = _CompiledPlacer._make_table

    def spy(self, nb, n_store):
        made.append((len(self.keys), sum(len(c) for _, c in self._recent), len(self._recent)))
        make(self, nb, n_store)

    monkeypatch.setattr(_CompiledPlacer, "_make_table", spy)
    frames = _frames(500, salted_from=300)
    got, ref = journal_log(16), journal_log(16, compiled=False)
    pool, ref_pool = ColumnarPool(SOURCE, rank=0, journal=True), ColumnarPool(SOURCE, rank=0, journal=True)
    waiting = []
    for seq, payload in frames:
        pool.apply(fastwire.decode_columns(seq, payload))
        ref_pool.apply(fastwire.decode_columns(seq, payload))
        if seq % 4 == 3:
            rows = pool.take_journal()
            if len(rows):
                waiting.append(prepare_journal(got, rows, pool, SOURCE))
            if len(waiting) > 3:
                commit_journal(got, waiting.pop(0))
            placer = got.columnar.store_attributes.placer
            if not int(placer.state[8]):  # the codes of the rows placed and not committed, only those
                plan_key = got.columnar.store_attributes.plan.key
                assert sum(len(c) for _, c in placer._recent) == plan_key - len(got.columnar.keys)
            append_journal(ref, ref_pool.take_journal(), ref_pool, SOURCE)
    for block in waiting:
        commit_journal(got, block)
    append_journal(ref, ref_pool.take_journal(), ref_pool, SOURCE)
    assert len(made) == 1
    known, kept, calls = made[0]
    assert known > 0 and kept > 0 and calls >= 2  # codes read from both places
    placer = got.columnar.store_attributes.placer
    assert int(placer.state[8]) == 1 and placer.blocks.shape[1] == 5 and not placer._recent
    assert _said(got) == _said(ref)
    tenants = _tenants(got)
    assert tenants == _tenants(ref)
    # stores that named a tenant and got their parent holder's, none (a holder stored before
    # the table was made, whose code the table read back), and stores that kept their own
    stores = got.columnar.store_attributes
    named = [i for i in range(len(stores)) if stores[i][2] is not None]
    assert sum(tenants[i] == 0 for i in named) > 20 and sum(tenants[i] != 0 for i in named) > 20
    assert _held(got) == _held(ref)
