"""A fleet snapshot's server health is its streams' `total_health`, one definition for both.

The pools are fed the recorded three-pod frames of vLLM 0.33.0's own publisher
(tests/data/vllm_connector, `three-pods-one-endpoint`); pods .11 and .12 are put under
one server, as two ranks, so the sums have more than one stream to add.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from engine.remote.fleet import Fleet
from engine.remote.fleet_view import snapshot
from engine.remote.pool import RemotePool
from engine.remote.subscriber import StreamHealth, total_health
from engine.remote.wire import decode_batch, parse_pub

DATA = Path(__file__).resolve().parent / "data" / "vllm_connector" / "vllm_connector_frames.jsonl"


def two_servers() -> tuple[Fleet, dict[str, RemotePool]]:
    pools: dict[str, RemotePool] = {}
    for line in DATA.read_text().splitlines():
        row = json.loads(line)
        if row["case"] != "three-pods-one-endpoint":
            continue
        topic, seq, payload = parse_pub([base64.b64decode(f) for f in row["frames"]])
        pod = topic.decode().split("@")[1]
        pool = pools.setdefault(pod, RemotePool(pod, len(pools)))
        pool.apply(decode_batch(seq, payload))
    fleet = Fleet()
    fleet.add("pods-11-12", pools["10.0.0.11:8000"])
    fleet.add("pods-11-12", pools["10.0.0.12:8000"])
    fleet.add("pod-13", pools["10.0.0.13:8000"])
    return fleet, pools


def test_a_servers_health_is_its_streams_summed():
    fleet, pools = two_servers()
    streams = [StreamHealth("10.0.0.11:8000", 0, batches=2, refilled=1, missed=3, malformed=1, restarts=0,
                            lag_s=0.4, last_error="a frame of 3 parts"),
               StreamHealth("10.0.0.12:8000", 1, batches=5, refilled=0, missed=1, malformed=0, restarts=2,
                            lag_s=0.1),
               StreamHealth("10.0.0.13:8000", 0, batches=1, lag_s=2.5, last_error="late")]
    snap = snapshot(fleet, streams)
    both, alone = snap.server("pods-11-12"), snap.server("pod-13")
    assert both.health == total_health(streams[:2], "pods-11-12")
    h = both.health
    assert (h.batches, h.refilled, h.missed, h.malformed, h.restarts) == (7, 1, 4, 1, 2)
    assert h.lag_s == 0.1 and h.last_error == "a frame of 3 parts"  # the freshest lag, the last error said
    assert alone.health == total_health(streams[2:], "pod-13") and alone.health.lag_s == 2.5
    assert both.last_seen == max(pools[p].last_batch_time for p in ("10.0.0.11:8000", "10.0.0.12:8000"))
    assert both.last_seen is not None


def test_a_recorded_fleet_counts_the_batches_its_pools_took():
    fleet, pools = two_servers()
    snap = snapshot(fleet)  # no streams: a capture opened offline
    assert [s.health.batches for s in snap.servers] == [4, 1]  # .11's two and .12's two; .13's one
    assert [s.health.missed for s in snap.servers] == [0, 0]
    assert snap.server("pod-13").last_seen == pools["10.0.0.13:8000"].last_batch_time
