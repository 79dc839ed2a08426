"""What the fleet views draw, without Qt (engine.remote.fleet_view), on the recorded frames.

A recorded capture holds the converted events, not the frames; `fleet_from_events` must
rebuild from them exactly the pools the live attach held (copies per tier and group,
tenants), or a fleet opened offline would show another fleet. The servers list is the
`--servers FILE` format the dialog reads.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from engine.core.errors import InputError
from engine.core.events import EventBus
from engine.remote.fleet import Fleet
from engine.remote.fleet_view import (ServerEntry, fleet_from_events, format_servers, locate, parse_servers, prefix_of,
                                      snapshot)
from engine.remote.pool import RemotePool
from engine.remote.wire import canonical_hash, decode_batch, parse_pub

DATA = Path(__file__).resolve().parent / "data"
CONNECTOR = DATA / "vllm_connector" / "vllm_connector_frames.jsonl"
SGLANG = DATA / "sglang" / "sglang_zmq_frames.jsonl"
A = [canonical_hash(int(x, 16)) for x in ("d1ecdf87c874fd55", "2e94951059393917", "144e9e182eba6c69",
                                          "6c7227160ecd624a")]


def live_pools(path: Path, key: str, **match) -> tuple[dict[str, RemotePool], list]:
    """Pools fed the recorded PUB frames (one per `key` value), and the events they emitted."""
    bus = EventBus()
    events: list = []
    bus.subscribe(events.append)
    pools: dict[str, RemotePool] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["socket"] != "pub" or any(row.get(k) != v for k, v in match.items()):
            continue
        frames = [base64.b64decode(f) for f in row["frames"]]
        topic, seq, payload = parse_pub(frames)
        name = topic.decode().split("@")[1] if key == "topic" else f"{key}-{row[key]}"
        pool = pools.setdefault(name, RemotePool(name, int(row.get("rank", 0)), bus))
        pool.apply(decode_batch(seq, payload))
    return pools, events


def held(pool: RemotePool) -> dict[str, dict[bytes, int]]:
    return {tier: {h: pool.num_copies(h, tier) for h in hashes} for tier, hashes in pool.tiers.items() if hashes}


@pytest.mark.parametrize("path, key, match", [
    (CONNECTOR, "case", {"case": "one-server"}),  # copies, reuse reports, offload tiers, a sliding-window group
    (CONNECTOR, "topic", {"case": "three-pods-one-endpoint"}),
    (SGLANG, "rank", {}),  # cache_salt tenants, an AllBlocksCleared, EXTERNAL
])
def test_a_capture_rebuilds_the_pools_the_attach_held(path, key, match):
    pools, events = live_pools(path, key, **match)
    rebuilt = fleet_from_events(events)
    assert sorted(rebuilt.server_names) == sorted(pools)
    for name, pool in pools.items():
        (again,) = rebuilt.pools(name)
        assert held(again) == held(pool), name
        assert again.tenants == pool.tenants and again.num_cached == pool.num_cached


def test_sglang_tenants_survive_the_capture():
    pools, events = live_pools(SGLANG, "rank")
    assert pools["rank-0"].tenants == {"tenant-a"}  # SGLang's own cache_salt field
    assert fleet_from_events(events).pools("rank-0")[0].tenants == {"tenant-a"}


def test_prefix_of_follows_parents_and_stops_at_a_removed_one():
    pools, _events = live_pools(CONNECTOR, "topic", case="three-pods-one-endpoint")
    fleet = Fleet()
    for name, pool in pools.items():
        fleet.add(name, pool)
    assert prefix_of(fleet, "10.0.0.12:8000", A[1]) == A[:2]
    assert prefix_of(fleet, "10.0.0.11:8000", A[0]) == A[:1]
    places = locate(fleet, A)
    assert [p.num_servers for p in places] == [3, 3, 0, 0]
    snap = snapshot(fleet, max_rows=3)
    assert snap.is_cut and snap.num_blocks == 10 and len(snap.blocks) == 3


def test_a_servers_list_reads_and_writes_back():
    text = "# pods\npod-a tcp://10.0.0.11:5557 tcp://10.0.0.11:5558  # with replay\n\ntcp://10.0.0.13:5557\n"
    entries = parse_servers(text)
    assert entries == [ServerEntry("pod-a", "tcp://10.0.0.11:5557", "tcp://10.0.0.11:5558"),
                       ServerEntry("", "tcp://10.0.0.13:5557")]
    assert parse_servers(format_servers(entries)) == entries


@pytest.mark.parametrize("text, words", [
    ("pod-a", "line 1"),
    ("pod-a tcp://h:1 tcp://h:2 tcp://h:3", "line 1"),
    ("pod-a tcp://h:0", "from 1 to 65535"),
    ("a tcp://h:1\na tcp://h:2", "names the server 'a' a second time"),
    ("a tcp://h:1\nb tcp://h:1", "lists tcp://h:1 a second time"),
])
def test_a_bad_servers_list_is_one_sentence_naming_its_line(text, words):
    with pytest.raises(InputError) as err:
        parse_servers(text, "fleet.txt")
    assert words in str(err.value) and "fleet.txt" in str(err.value) and "\n" not in str(err.value)
