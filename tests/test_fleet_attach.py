"""A fleet over real ZMQ: vLLM 0.33.0's recorded frames from separate publisher processes.

`three-pods-one-endpoint` (tests/data/vllm_connector/): three pods, each its own process,
connect their PUB sockets to ONE endpoint we bind (llm-d's centralized mode), each with
topic `kv@<pod>@<model>` and its own sequence from 0. Every batch must be kept, each pod
must be a server of its own with what its frames stored, and the router's view of a
probe must score and pick as llm-d would. `one-server` goes through the attach path and
must end as vLLM held it, tier by tier. A recorded fleet capture must open offline.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.remote import AttachOptions, Attachment
from tests.test_fleet import A, C, DATA, PODS
from tests.test_vllm_attach import free_ports, wait_for, wait_for_subscriber

ROOT = Path(__file__).resolve().parents[1]
# One pod: an XPUB socket that connects to the bound endpoint, waits for the subscriber's
# subscription (so nothing is lost to ZMQ's slow joiner), sends its pod's recorded frames
# in their recorded order, then waits to be told to exit.
POD = textwrap.dedent("""
    import base64, json, sys, zmq
    endpoint, data, topic = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    frames = [[base64.b64decode(f) for f in row["frames"]] for row in map(json.loads, open(data))
              if row["case"] == "three-pods-one-endpoint"]
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.connect(endpoint)
    while not pub.recv_multipart()[0].startswith(b"\\x01"):
        pass
    for f in frames:
        if f[0] == topic:
            pub.send_multipart(f)
    sys.stdout.write("sent\\n"); sys.stdout.flush()
    sys.stdin.read()
    pub.close(linger=1000)
""")
TOPICS = [f"kv@{pod}@Qwen/Qwen3-8B" for pod in PODS]


def start_pods(endpoint: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", POD, endpoint, str(DATA), topic], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True) for topic in TOPICS]


def stop_pods(pods: list[subprocess.Popen]) -> None:
    for p in pods:
        try:
            p.stdin.close()
            p.wait(timeout=10)
        except Exception:  # noqa: BLE001 - a pod that hangs is killed
            p.kill()


def test_three_pods_on_one_bound_endpoint_are_three_servers():
    port = free_ports()
    endpoint = f"tcp://127.0.0.1:{port}"
    att = Attachment(AttachOptions((endpoint,), bind=True))
    notices: list = []
    att.on_notice = lambda pool, kind, message: notices.append(kind)
    att.start()
    pods = start_pods(endpoint)
    try:
        assert all(p.stdout.readline() == "sent\n" for p in pods)
        wait_for(lambda: sum(h.batches for h in att.health()) == 5)
        with att.lock:
            fleet = att.fleet()
            assert sorted(fleet.server_names) == sorted(PODS)  # arrival order varies between processes
            by_pod = {name: fleet.pools(name) for name in PODS}
            assert all(len(pools) == 1 for pools in by_pod.values())
            p11, p12, p13 = (by_pod[p][0] for p in PODS)
            assert set(p11.tiers["GPU"]) == set(A[:2]) and p11.mediums() == ["GPU"]
            assert set(p12.tiers["GPU"]) == set(A[:2]) == set(p12.tiers["CPU"])
            assert set(p13.tiers["GPU"]) == set(C)
            assert sum(p.num_cached for p in fleet.pools()) == 10  # the run kept 4 of 12
            health = {h.source: h for h in att.health()}
            assert {pod: (health[pod].batches, health[pod].missed, health[pod].last_seq) for pod in PODS} == {
                PODS[0]: (2, 0, 1), PODS[1]: (2, 0, 1), PODS[2]: (1, 0, 0)}
            assert health[endpoint].batches == 0 and health[endpoint].malformed == 0
            view = fleet.route(C, 16)
            assert view.best_server == PODS[2] and view.score_of(PODS[2]).score == 4.0
            assert {s.server: s.matched_blocks for s in view.servers} == {PODS[0]: 2, PODS[1]: 2, PODS[2]: 4}
            assert {s.key for s in fleet.shared_blocks()} == set(A[:2])
        assert notices.count("joined") == 3
    finally:
        att.stop()
        stop_pods(pods)


def test_attach_bind_cli_reports_each_pod_and_the_router_view(tmp_path):
    port = free_ports()
    endpoint = f"tcp://127.0.0.1:{port}"
    prompt = tmp_path / "c.jsonl"
    prompt.write_text(json.dumps({"id": "c", "tokens": list(range(100, 132)) + list(range(900, 932))}) + "\n")
    db = tmp_path / "fleet.db"
    proc = subprocess.Popen([sys.executable, "-m", "app", "attach", endpoint, "--bind", "--probe", str(prompt),
                             "--json", "--max-batches", "5", "--seconds", "90", "--record", "--db", str(db)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pods: list[subprocess.Popen] = []
    try:
        wait_for(lambda: _listening(port), timeout=60)
        pods = start_pods(endpoint)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        stop_pods(pods)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    summary = lines[-1]
    assert "summary" in summary and all("summary" not in x for x in lines[:-1])
    rows = {r["server"]: r for r in summary["summary"]}
    assert {pod: (rows[pod]["batches"], rows[pod]["missed_batches"], rows[pod]["tiers"]) for pod in PODS} == {
        PODS[0]: (2, 0, {"GPU": 2}), PODS[1]: (2, 0, {"GPU": 2, "CPU": 2}), PODS[2]: (1, 0, {"GPU": 4})}
    assert rows[endpoint]["batches"] == 0
    assert sorted(s["server"] for s in summary["servers"]) == sorted(PODS) and summary["shared_blocks"] == 2
    probe = [x for x in lines if "probe" in x][-1]
    assert probe["best_server"] == PODS[2] and probe["probe"]["cached_tokens"] == 64
    assert {s["server"]: (s["matched_blocks"], s["score"]) for s in probe["servers"]} == {
        PODS[0]: (2, 2.0), PODS[1]: (2, 2.0), PODS[2]: (4, 4.0)}
    # the capture opens offline like any session, each event naming its server
    from engine.store.database import Store
    from engine.analysis.remote_capture import recorded_events

    store = Store(str(db))
    try:
        run = store.runs(summary["recorded"]["session"])[0]
        events = recorded_events(store, run.id)  # the frames as the pods sent them, through the reference pools
        stored = [e for e in events if e.kind == "block_stored"]
        assert len(stored) == 12 and {e.remote.source for e in stored} == set(PODS)
        assert {e.remote.medium for e in stored if e.remote.source == PODS[1]} == {"GPU", "CPU"}
        assert sum(1 for e in events if e.kind == "block_evicted") == 2
    finally:
        store.close()


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_one_server_with_offload_tiers_ends_as_vllm_held_it():
    """vLLM's connector story over ZMQ: reference-counted STORAGE chunks, placeholders,
    a reuse report, a GPU duplicate, Mooncake's `cpu`, LMCache's `cuda:0`, a sliding window."""
    import zmq

    frames = [[base64.b64decode(f) for f in row["frames"]]
              for row in map(json.loads, DATA.read_text().splitlines()) if row["case"] == "one-server"]
    port = free_ports()
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    att = Attachment(AttachOptions((f"tcp://127.0.0.1:{port}",), topic="kv-events"))
    att.start()
    try:
        wait_for_subscriber(pub)
        pub.send_multipart([b"kv-events-evil", (0).to_bytes(8, "big"), frames[0][2]])  # ZMQ's prefix match
        for f in frames:
            pub.send_multipart(f)
        wait_for(lambda: att.subscribers[0].health.last_seq == 8)
        with att.lock:
            pool = att.pools[0]
            a, c = A, C
            assert {m: set(pool.tiers[m]) for m in pool.mediums()} == {
                "GPU": set(a + c), "CPU": set(a[:2] + c[2:]), "STORAGE": set(c)}
            assert {m: pool.num_cached_in(m) for m in pool.mediums()} == {"GPU": 8, "CPU": 4, "STORAGE": 4}
            assert pool.num_copies(a[0], "GPU") == 2  # LMCache's cuda:0 copy; the reuse report added none
            assert pool.num_copies(c[3], "GPU", 1) == 1 and pool.groups[1].to_dict() == {
                "group_idx": 1, "kind": "sliding_window", "sliding_window": 128, "block_size": 8}
            assert pool.block_size == 16  # the sliding window's partial block does not change it
            assert pool.num_without_tokens("CPU") == 2 and pool.hits_by_session == {"sess-c": 2}
            assert pool.media["CPU"] == {"CPU": 2, "cpu": 2} and pool.media["GPU"]["cuda:0"] == 1
            d = pool.details_of(c[3])
            assert d["announced"] == 4 and d["removed"] == 0  # GPU, STORAGE chunk C, Mooncake cpu, the window
            assert d["tiers"]["GPU"]["lookahead_token_ids"] == ((7, 8),)
            assert pool.details_of(a[2])["removed"] == 1 and "STORAGE" not in pool.details_of(a[2])["tiers"]
            assert (pool.details_of(a[0])["announced"], pool.details_of(a[0])["removed"]) == (
                7, 2)  # GPU twice, the report, cuda:0, the CPU placeholder, STORAGE chunks A and C; removed: a GPU copy, chunk A

            assert pool.details_of(a[0])["tiers"]["CPU"] == {"copies": 1, "locality": "LOCAL", "no_token_ids": True}
            assert att.subscribers[0].num_other_topics == 1 and att.subscribers[0].health.malformed == 0
    finally:
        att.stop()
        pub.close(linger=0)


@pytest.mark.parametrize("line, why", [
    ("a tcp://127.0.0.1:1 tcp://127.0.0.1:2 extra", "expected 'name endpoint"),
    ("a http://x:1", "not a ZMQ endpoint"),
    ("a tcp://127.0.0.1:1\na tcp://127.0.0.1:2", "named twice"),
    ("# nothing", "names no server"),
])
def test_a_bad_servers_file_is_one_sentence(tmp_path, line, why):
    f = tmp_path / "servers.txt"
    f.write_text(line + "\n")
    proc = subprocess.run([sys.executable, "-m", "app", "attach", "--servers", str(f), "--seconds", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and why in proc.stderr


def test_a_servers_file_names_each_server(tmp_path):
    ports = [free_ports() for _ in range(2)]
    f = tmp_path / "servers.txt"
    f.write_text(f"# the fleet\npod-a tcp://127.0.0.1:{ports[0]}\npod-b tcp://127.0.0.1:{ports[1]} "
                 f"tcp://127.0.0.1:{ports[1] + 1}  # with its replay socket\n")
    proc = subprocess.run([sys.executable, "-m", "app", "attach", "--servers", str(f), "--json", "--seconds", "0.5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert [(r["server"], r["endpoint"]) for r in summary["summary"]] == [("pod-a", "pod-a"), ("pod-b", "pod-b")]
    assert [s["server"] for s in summary["servers"]] == ["pod-a", "pod-b"]
