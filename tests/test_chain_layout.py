"""The hash chain layout from arrays (`build_tree`: every cached block's hash and parent read
at once, one compiled pass) against the layout read block by block (`build_tree_reference`),
on the recorded servers through the journal route and the event route, scrubbed back, with
breaks and one request's hashes; and the projection's many-blocks accessors against the
per-block columns they replace."""

from __future__ import annotations

import numpy as np
import pytest

from app.views.pool.chain_layout import ORPHANS, build_tree, build_tree_reference
from test_journal_app import RECORDED, _both, _rank_frames


def _as_reference(tree) -> tuple:
    segs = [(s.hashes, s.depth, s.parent, s.children, s.y) for s in tree.segments]
    return segs, tree.groups


def _same_layout(p, where: str, breaks=None, only=None) -> None:
    ref = build_tree_reference(p, breaks, only)
    want = ([(s.hashes, s.depth, s.parent, s.children, s.y) for s in ref], ref.groups)
    for compiled in (True, False):
        got = build_tree(p, breaks, only, compiled=compiled)
        assert _as_reference(got) == want, (where, compiled)
        positions = {h: (float(s.depth + i), s.y) for s in ref for i, h in enumerate(s.hashes)}
        assert dict(got.positions) == positions and got.num_nodes == len(positions), where
        assert got.num_segments == len(ref)
        for s, seg in enumerate(ref):  # the arrays the view draws from
            assert got.hashes[got.first_nodes()[s]] == seg.hashes[0]
            assert got.hashes[got.last_nodes()[s]] == seg.hashes[-1]
            assert got.seg_children[s] == len(seg.children)


def _journal_states():
    for name in sorted(RECORDED):
        path, ranks = RECORDED[name]
        js, rs = _both(_rank_frames(path, ranks), 3, None)
        yield name, js, rs


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_array_layout_is_the_reference_layout_on_every_recorded_server(name):
    path, ranks = RECORDED[name]
    js, rs = _both(_rank_frames(path, ranks), 3, restart_at=None)
    seqs = [int(s) for s in rs.log.seqs]
    for seq in (None, seqs[len(seqs) // 2], seqs[1]):
        for st in (js, rs):
            st.scrub_to(seq)
            p = st.projection
            _same_layout(p, f"{name} at {seq}")
            hashes = list(p.by_hash)
            if hashes:
                _same_layout(p, f"{name} broken", breaks={hashes[len(hashes) // 2]})
                _same_layout(p, f"{name} only", only=set(hashes[::2]))
        if ranks == 1:  # both routes draw the same tree (two ranks' rows interleave otherwise)
            assert dict(build_tree(js.projection).positions) == dict(build_tree(rs.projection).positions), (name, seq)


def test_the_layout_groups_tenants_and_orphans_and_breaks_runs():
    from tests.test_colpool import _synthetic

    js, rs = _both([_synthetic(220, 0)], 5, restart_at=None)
    for st in (js, rs):
        tree = build_tree(st.projection)
        labels = [g for g, _ in tree.groups]
        assert labels == sorted(labels, key=lambda g: (g == ORPHANS, g)) and len(labels) >= 1
        _same_layout(st.projection, "synthetic")
    # a break splits a run in two: one segment more, the same nodes
    p = rs.projection
    tree = build_tree(p)
    long = max(range(tree.num_segments), key=lambda s: tree.seg_len[s])
    if tree.seg_len[long] > 2:
        cut = tree.hashes[tree.flat[tree.seg_start[long] + 1]]
        broken = build_tree(p, {cut})
        assert broken.num_nodes == tree.num_nodes and broken.num_segments > tree.num_segments


def test_a_cycle_of_parents_draws_no_node_and_never_hangs():
    class Cyclic:
        by_hash = {b"a": (0,), b"b": (1,), b"r": (2,)}
        parents = [b"b", b"a", None]
        salts = [None, None, "t"]

        def parents_of(self, blocks):
            return [self.parents[b] for b in blocks]

        def salts_of(self, blocks):
            return [self.salts[b] for b in blocks]

        def block_of_hash(self, h):
            return self.by_hash[h][0]

    tree = build_tree(Cyclic())
    assert list(tree.positions) == [b"r"] and tree.groups == [("tenant t", 1.0)]
    assert _as_reference(tree)[0] == [(s.hashes, s.depth, s.parent, s.children, s.y)
                                      for s in build_tree_reference(Cyclic())]


def test_many_block_accessors_equal_the_per_block_columns():
    for name, js, rs in _journal_states():
        seqs = [int(s) for s in rs.log.seqs]
        for seq in (None, seqs[len(seqs) // 3]):
            for st in (js, rs):
                st.scrub_to(seq)
                p = st.projection
                held = [b for b in range(p.num_blocks) if p.hashes[b] is not None]
                arr = np.asarray(held, np.int64)
                assert p.digests_of(arr) == [p.hashes[b] for b in held], name
                if len(held) > 2 and hasattr(p, "hash_keys"):  # a block that holds no hash now (a tree laid out earlier asks
                    # for it): None, not the last key's digest (a key of -1 read by a negative index)
                    keys = p.hash_keys
                    p.hash_keys = keys.copy()
                    p.hash_keys[held[0]] = -1
                    try:
                        assert p.digests_of(arr[:3]) == [None, p.hashes[held[1]], p.hashes[held[2]]], name
                    finally:
                        p.hash_keys = keys
                assert p.parents_of(arr) == [p.parents[b] for b in held], name
                assert p.tenants_of(arr) == [p.tenants[b] for b in held], name
                assert p.salts_of(arr) == [p.salts[b] for b in held], name
                assert p.tokens_of(arr) == [tuple(p.token_ids[b]) for b in held], name
            if "2 ranks" not in name:
                assert js.projection.by_hash == rs.projection.by_hash, (name, seq)


def test_the_comparison_can_fail():
    path, ranks = RECORDED["vllm_connector_frames"]
    js, _ = _both(_rank_frames(path, ranks), 3, None)
    tree = build_tree(js.projection)
    ref = build_tree_reference(js.projection)
    assert tree.num_segments == len(ref) > 1
    ref[-1].y += 1.0
    assert _as_reference(tree) != ([(s.hashes, s.depth, s.parent, s.children, s.y) for s in ref], ref.groups)


def test_a_hidden_hash_chain_tab_does_not_rebuild_until_it_comes_forward(qtbot, tmp_path):
    from _publishers import attach_window
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class
    from engine.remote.wire import MalformedFrame

    path, ranks = RECORDED["vllm_connector_frames"]
    with attach_window(qtbot, tmp_path) as w:
        qtbot.waitUntil(lambda: "hash_chains" in w.panels, timeout=20_000)
        st = w.ctx.state
        st.set_engine({"remote": True, "journal": True, "block_size": 16, "num_blocks": 0})
        w.docks["block_table"].raise_()
        qtbot.wait(300)
        view = w.panels["hash_chains"]
        assert view.isVisible() and not view.is_shown()  # a tab behind the block table
        pool = journal_pool_class()("tcp://10.0.0.5:5557")
        for seq, payload in _rank_frames(path, ranks)[0]:
            try:
                pool.apply(fastwire.decode_columns(seq, payload))
            except MalformedFrame:  # the recording's malformed frames, as both routes skip them
                pass
        rows = pool.take_journal()
        st.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
        qtbot.wait(600)
        assert st.projection.num_hashed > 0 and view.tree.num_nodes == 0  # nothing laid out while hidden
        w.docks["hash_chains"].raise_()
        qtbot.waitUntil(lambda: view.tree.num_nodes == len(st.projection.by_hash) > 0, timeout=5000)
