"""The fleet model (engine.remote.fleet) on frames recorded from vLLM 0.33.0's own publisher.

`three-pods-one-endpoint` (tests/data/vllm_connector/README.md): three pods, each its own
topic `kv@<pod>@<model>` and its own sequence from 0. Pod .11 stores request A (4 blocks)
then removes A's last two; pod .12 stores A's first two on GPU, then on CPU; pod .13
stores C (A's first two blocks, then two of its own). The tests probe A and C the way a
KV-aware router does and check every number against what those frames say.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from engine.remote.fleet import Fleet, TierWeights, fleet_of, server_of_topic
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmBatch, VllmEvent, canonical_hash, decode_batch, parse_pub

DATA = Path(__file__).resolve().parent / "data" / "vllm_connector" / "vllm_connector_frames.jsonl"
A = [canonical_hash(int(x, 16)) for x in ("d1ecdf87c874fd55", "2e94951059393917", "144e9e182eba6c69",
                                          "6c7227160ecd624a")]
C = A[:2] + [canonical_hash(int(x, 16)) for x in ("f75a7a8ae8906883", "6ef4ef4f48e20601")]
PODS = ("10.0.0.11:8000", "10.0.0.12:8000", "10.0.0.13:8000")


def case_frames(case: str) -> list[list[bytes]]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    out = [[base64.b64decode(f) for f in row["frames"]] for row in rows if row["case"] == case]
    assert out, f"no recorded case {case!r}"
    return out


def three_pod_fleet() -> Fleet:
    """Each topic its own pool, fed in arrival order (as one bound endpoint receives them)."""
    pools: dict[str, RemotePool] = {}
    for frames in case_frames("three-pods-one-endpoint"):
        topic, seq, payload = parse_pub(frames)
        pod = server_of_topic(topic)
        pool = pools.setdefault(pod, RemotePool(f"{pod}", server=pod))
        pool.apply(decode_batch(seq, payload))
    return fleet_of({pod: [pools[pod]] for pod in PODS})


def test_the_pod_is_read_from_llm_d_topics():
    assert server_of_topic(b"kv@10.0.0.11:8000@Qwen/Qwen3-8B") == "10.0.0.11:8000"
    assert server_of_topic("kv@pod-a@org/model@rev") == "pod-a"
    assert server_of_topic("kv-events") is None and server_of_topic("") is None and server_of_topic("kv@@m") is None


def test_three_pods_hold_what_their_frames_say():
    fleet = three_pod_fleet()
    assert fleet.server_names == list(PODS)
    p11, p12, p13 = (fleet.pools(p)[0] for p in PODS)
    assert set(p11.tiers["GPU"]) == set(A[:2]) and p11.mediums() == ["GPU"]
    assert set(p12.tiers["GPU"]) == set(A[:2]) == set(p12.tiers["CPU"])
    assert set(p13.tiers["GPU"]) == set(C)
    assert [s.to_dict()["tiers"] for s in fleet.summaries()] == [{"GPU": 2}, {"GPU": 2, "CPU": 2}, {"GPU": 4}]
    assert sum(s.num_cached for s in fleet.summaries()) == 10


def test_where_a_prefix_lives_and_what_is_held_twice():
    fleet = three_pod_fleet()
    where = fleet.locate(A)
    assert [loc.servers for loc in where] == [PODS, PODS, (), ()]  # .11 removed A's last two blocks
    assert [(h.server, h.tier) for h in where[0].holdings] == [
        (PODS[0], "GPU"), (PODS[1], "GPU"), (PODS[1], "CPU"), (PODS[2], "GPU")]
    shared = fleet.shared_blocks()
    assert {s.key for s in shared} == set(A[:2])  # C's own blocks live on .13 only
    assert all(s.servers == PODS and s.num_copies == 4 for s in shared)
    assert shared[0].to_dict()["servers"] == list(PODS)


def test_the_router_view_of_a_probe():
    fleet = three_pod_fleet()
    view = fleet.route(C, block_size=16)
    assert [s.to_dict() for s in view.servers] == [
        {"server": PODS[0], "matched_blocks": 2, "cached_tokens": 32, "score": 2.0, "overlap_blocks": 2},
        {"server": PODS[1], "matched_blocks": 2, "cached_tokens": 32, "score": 2.0, "overlap_blocks": 2},
        {"server": PODS[2], "matched_blocks": 4, "cached_tokens": 64, "score": 4.0, "overlap_blocks": 4},
    ]
    assert view.best_server == PODS[2]
    assert view.score_of(PODS[1]).tiers == ("GPU", "GPU")  # the best tier of each block counts
    # A: every pod holds its first two blocks on GPU; a tie goes to the pod listed first
    view_a = fleet.route(A, 16)
    assert [s.score for s in view_a.servers] == [2.0, 2.0, 2.0] and view_a.best_server == PODS[0]
    # a prompt nobody holds: no best server (a router would pick by load)
    assert fleet.route([canonical_hash(12345)], 16).best_server is None


def test_tier_weights_score_offloaded_blocks_lower():
    fleet = three_pod_fleet()
    p12 = fleet.pools(PODS[1])[0]
    p12.apply(VllmBatch(2, 1.0, (VllmEvent("BlockRemoved", tuple(A[:2]), medium="GPU"),), 0))
    view = fleet.route(A, 16)  # .12 now holds A's first two on CPU only: 0.8 each
    assert view.score_of(PODS[1]).to_dict()["score"] == 1.6 and view.score_of(PODS[1]).tiers == ("CPU", "CPU")
    assert view.score_of(PODS[1]).matched_blocks == 2 and view.best_server == PODS[0]
    heavy_cpu = TierWeights.parse("cpu_pinned=1.5")
    assert heavy_cpu.of("CPU") == 1.5 and heavy_cpu.of("GPU") == 1.0
    view = fleet.route(A, 16, heavy_cpu)
    assert view.score_of(PODS[1]).score == 3.0 and view.best_server == PODS[1]
    assert TierWeights.parse("other=0").of("STORAGE") == 0.0
    for bad in ("GPU", "GPU=x", "CPU=-1", "=1", "GPU=inf"):
        with pytest.raises(ValueError):
            TierWeights.parse(bad)


def test_dynamo_overlap_is_per_rank_and_llm_d_per_server():
    """Rank 0 holds block 0, rank 1 block 1: the server holds the prefix (llm-d), but no
    single worker does (Dynamo counts matched blocks per (worker, rank))."""
    r0, r1 = RemotePool("s rank 0", 0, server="s"), RemotePool("s rank 1", 1, server="s")
    r0.apply(VllmBatch(0, 0.0, (VllmEvent("BlockStored", (A[0],), token_ids=tuple(range(16)), block_size=16),), 0))
    r1.apply(VllmBatch(0, 0.0, (VllmEvent("BlockStored", (A[1],), A[0], tuple(range(16)), 16),), 1))
    fleet = fleet_of([r0, r1])
    score = fleet.route(A, 16).score_of("s")
    assert (score.matched_blocks, score.overlap_blocks, score.overlap_by_rank) == (2, 1, ((0, 1), (1, 0)))
    assert fleet.summaries()[0].ranks == (0, 1)


def test_a_32_byte_digest_matches_the_integer_a_server_sent():
    fleet = three_pod_fleet()
    digest = bytes(24) + A[0]  # vLLM's events carry a digest's last 8 bytes
    assert [h.server for h in fleet.holdings(digest)] == [PODS[0], PODS[1], PODS[1], PODS[2]]
    assert fleet.route([digest], 16).score_of(PODS[2]).matched_blocks == 1


def test_bad_arguments_are_sentences():
    fleet = Fleet()
    with pytest.raises(ValueError, match="block size"):
        fleet.route(A, 0)
    with pytest.raises(ValueError, match="name"):
        fleet.add("", RemotePool("x"))
    assert fleet.route(A, 16).servers == () and fleet.shared_blocks() == []


def test_pools_per_server_rank_tier_and_group():
    fleet = three_pod_fleet()
    assert [r.to_dict() for r in fleet.pool_rows()] == [
        {"server": PODS[0], "rank": 0, "tier": "GPU", "group": 0, "blocks": 2},
        {"server": PODS[1], "rank": 0, "tier": "GPU", "group": 0, "blocks": 2},
        {"server": PODS[1], "rank": 0, "tier": "CPU", "group": 0, "blocks": 2},
        {"server": PODS[2], "rank": 0, "tier": "GPU", "group": 0, "blocks": 4},
    ]
    p13 = fleet.pools(PODS[2])[0]  # a sliding-window group's block and a second copy of block 0
    p13.apply(VllmBatch(1, 1.0, (VllmEvent("BlockStored", (C[3],), C[2], tuple(range(8)), 8, group_idx=1),
                                 VllmEvent("BlockStored", (C[0],), None, tuple(range(16)), 16, medium="cuda:0")), 0))
    assert p13.num_cached_by_group("GPU") == {0: 5, 1: 1}
    assert [(r.tier, r.group, r.num_blocks) for r in fleet.pool_rows() if r.server == PODS[2]] == [
        ("GPU", 0, 5), ("GPU", 1, 1)]
