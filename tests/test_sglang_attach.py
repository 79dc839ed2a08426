"""Attaching to SGLang 0.5.23: its recorded frames (tests/data/sglang/) through real ZMQ sockets.

Rank 0 (topic `kv-events`) published batch 0 before we joined (only its replay socket has
it), then stores with SGLang's own `cache_salt` and `session_id` fields on `GPU`,
`CPU_PINNED` and `DISK`, removals per medium and an `AllBlocksCleared`; rank 1 (topic
`""`) holds a page on `EXTERNAL` (a shared remote pool). Each tier must end as SGLang
held it, tenants included; `--hash sglang-sha256` must find the pages; and
`attach http://HOST:PORT` must read the endpoints from `/server_info`.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from engine.core.errors import InputError
from engine.remote import AttachOptions, Attachment
from engine.remote.discovery import describe
from engine.remote.wire import canonical_hash
from tests.test_vllm_attach import FixtureServer, free_ports, wait_for

DATA = Path(__file__).resolve().parent / "data" / "sglang"
ROOT = Path(__file__).resolve().parents[1]
H = canonical_hash
PAGES = json.loads((DATA / "sglang_page_hashes.jsonl").read_text().splitlines()[0])  # tokens 1..32


def sglang_frames(rank: int, sock: str) -> list[list[bytes]]:
    out = []
    for line in (DATA / "sglang_zmq_frames.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["rank"] == rank and row["socket"] == sock:
            out.append([base64.b64decode(f) for f in row["frames"]])
    assert out
    return out


class SglangServer(FixtureServer):
    """One SGLang rank that says what SGLang 0.5.23 once said (PUB and replay sockets)."""

    def __init__(self, rank: int, port: int | None = None, replay_port: int | None = None) -> None:
        super().__init__(port=port, replay_port=replay_port)
        self.pub_frames = sglang_frames(rank, "pub")
        self.replay_frames = sglang_frames(rank, "replay")


def seqs(frames: list[list[bytes]]) -> list[int]:
    return [int.from_bytes(f[1], "big") for f in frames]


def test_every_tier_tenant_and_rank_ends_as_sglang_held_it():
    s0, s1 = SglangServer(0), SglangServer(1)
    assert seqs(s0.pub_frames) == [1, 2, 3, 4, 5] and seqs(s1.pub_frames) == [1]
    att = Attachment(AttachOptions((s0.endpoint, s1.endpoint), (s0.replay_endpoint, s1.replay_endpoint),
                                   servers=("sglang-0", "sglang-1")))
    events: list = []
    att.events.subscribe(events.append)
    att.start()
    try:
        s0.wait_joined()
        s1.wait_joined()
        for frames in s0.pub_frames[:4]:
            s0.send(frames)
        s1.send(s1.pub_frames[0])
        wait_for(lambda: att.subscribers[0].health.last_seq == 4 and att.subscribers[1].health.last_seq == 1)
        with att.lock:
            r0, r1 = att.pools
            gpu = {8635429971592222890, 1256577331724852459, 5740554423035903369, -278502217879090434,
                   -2837292943662424665}  # batch 0 (replayed), 1 and 2; -8683505391760239007 removed
            assert set(r0.tiers["GPU"]) == {H(h) for h in gpu}
            assert set(r0.tiers["CPU"]) == {H(3688686297106194454), H(-2640381307293952556)}
            assert set(r0.tiers["STORAGE"]) == {H(1852452598310269177), H(7976061672556386568)}
            assert r0.media == {"GPU": {"GPU": 6}, "CPU": {"CPU_PINNED": 2}, "STORAGE": {"DISK": 3}}
            assert r0.tenants == {"tenant-a"}
            assert r0.tiers["GPU"][H(5740554423035903369)].tenant == "tenant-a"
            assert r0.tiers["CPU"][H(3688686297106194454)].tenant == "tenant-a"
            assert r0.tiers["GPU"][H(8635429971592222890)].tenant is None
            assert r0.details_of(H(-8683505391760239007)) == {"hash": H(-8683505391760239007).hex(), "tiers": {},
                                                              "announced": 1, "removed": 1}
            assert set(r1.tiers["GPU"]) == {H(8635429971592222890)} and set(r1.tiers["REMOTE"]) == {
                H(1256577331724852459)}
            assert r1.media["REMOTE"] == {"EXTERNAL": 1}
            assert (r0.server, r1.server) == ("sglang-0", "sglang-1")
        # the signed hashes in the one canonical form: the page digest's first 8 bytes
        assert H(PAGES["event_int_hashes"][0]).hex() == PAGES["page_hashes"][0][:16]
        stored = [e for e in events if e.kind == "block_stored"]
        assert {e.remote.rank for e in stored if e.remote.source == "sglang-1"} == {1}  # attn_dp_rank
        assert {e.remote.session_id for e in stored if e.salt == "tenant-a" and e.remote.medium == "GPU"} == {"sess-1"}
        assert {e.remote.lora_name for e in stored} >= {"adapter-x"}
        assert {e.remote.medium for e in stored} == {"GPU", "CPU", "STORAGE", "REMOTE"}
        s0.send(s0.pub_frames[4])  # AllBlocksCleared
        wait_for(lambda: att.subscribers[0].health.last_seq == 5)
        with att.lock:
            assert att.pools[0].num_cached == 0 and att.pools[1].num_cached == 2
            health = [(h.batches, h.missed, h.malformed, h.restarts) for h in att.health()]
            refilled = [h.refilled for h in att.health()]
        assert health == [(6, 0, 0, 0), (2, 0, 0, 0)]
        # batch 0 came from the replay socket; the live ones too if they beat the join's fetch
        assert 1 <= refilled[0] <= 6 and 1 <= refilled[1] <= 2
    finally:
        att.stop()
        s0.close()
        s1.close()


class InfoHandler(BaseHTTPRequestHandler):
    info: dict = {}

    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps(self.info).encode() if self.path == "/server_info" else b"{}"
        self.send_response(200 if self.path == "/server_info" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve_info(info: dict) -> HTTPServer:
    handler = type("Handler", (InfoHandler,), {"info": info})
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_server_info_names_the_endpoints_as_sglang_describes_them():
    kv = {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "kv-events",
          "block_size": 16, "dp_size": 2, "replay_endpoint_port_base": 5600}
    d = describe("http://10.1.2.3:30000", {"kv_events": kv})
    assert [(e.endpoint, e.replay_endpoint, e.rank) for e in d.endpoints] == [
        ("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5600", 0), ("tcp://10.1.2.3:5558", "tcp://10.1.2.3:5601", 1)]
    assert (d.server, d.topic, d.block_size) == ("10.1.2.3:30000", "kv-events", 16)
    d = describe("http://[::1]:30000", {"kv_events": {**kv, "endpoint_host": "::", "dp_size": 1}})
    assert d.endpoints[0].endpoint == "tcp://[::1]:5557"
    d = describe("http://h:1", {"kv_events": {**kv, "endpoint_host": "10.9.9.9"}})
    assert d.endpoints[1].endpoint == "tcp://10.9.9.9:5558"
    for bad, why in (({}, "no KV-event publisher"), ({"kv_events": {**kv, "endpoint_port_base": 0}}, "port_base"),
                     ({"kv_events": {**kv, "dp_size": "2"}}, "dp_size"),
                     ({"kv_events": {**kv, "endpoint_port_base": 65535}}, "past port"),
                     ({"kv_events": {**kv, "publisher": "null"}}, "only zmq")):
        with pytest.raises(InputError, match=why):
            describe("http://h:1", bad)


def run_attach(*args: str, timeout: float = 60) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app", "attach", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_attach_http_server_probes_with_sglangs_hash_and_follows_the_best_server(tmp_path):
    """Two SGLang servers, one found through /server_info: the probe (tokens 1..32, two
    pages) is matched with sglang-sha256; the router prefers rank 0's GPU pages until its
    cache is cleared, then rank 1 (GPU + EXTERNAL)."""
    port, replay = free_ports(), free_ports()
    s0, s1 = SglangServer(0, port, replay), SglangServer(1)
    httpd = serve_info({"kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": port,
                                      "topic": "", "block_size": 16, "dp_size": 1,
                                      "replay_endpoint_port_base": replay}})
    prompt = tmp_path / "prompt.jsonl"
    prompt.write_text(json.dumps({"id": "p", "tokens": PAGES["tokens"]}) + "\n")
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    proc = run_attach(url, s1.endpoint, "--replay", s1.replay_endpoint, "--probe", str(prompt), "--hash",
                      "sglang-sha256", "--json", "--max-batches", "8", "--seconds", "60")
    try:
        s0.wait_joined(90)  # the command loads the tokenizer first
        s1.wait_joined(90)
        for frames in s0.pub_frames:
            s0.send(frames)
        s1.send(s1.pub_frames[0])
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
        httpd.shutdown()
        s0.close()
        s1.close()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    probes = [x for x in lines if "probe" in x]
    name0 = f"127.0.0.1:{httpd.server_address[1]}"
    assert probes[-1]["best_server"] == s1.endpoint
    assert any(p["best_server"] == name0 and p["probe"]["cached_tokens"] == 32 for p in probes)
    last = {s["server"]: s for s in probes[-1]["servers"]}
    assert last[s1.endpoint] == {"server": s1.endpoint, "matched_blocks": 2, "cached_tokens": 32, "score": 1.5,
                                 "overlap_blocks": 2}  # GPU 1.0 + EXTERNAL (remote) 0.5
    assert last[name0]["matched_blocks"] == 0
    summary = lines[-1]
    assert "summary" in summary and all("summary" not in x for x in lines[:-1])
    rows = {r["server"]: r for r in summary["summary"]}
    assert rows[name0]["tenants"] == ["tenant-a"] and rows[name0]["cached"] == 0 and rows[name0]["batches"] == 6
    assert rows[s1.endpoint]["tiers"] == {"GPU": 1, "REMOTE": 1}
    assert rows[s1.endpoint]["media"] == {"GPU": {"GPU": 1}, "REMOTE": {"EXTERNAL": 1}}
    assert [s["server"] for s in summary["servers"]] == [name0, s1.endpoint]  # in the order given


def test_attach_http_refusals_are_one_line(tmp_path):
    httpd = serve_info({"version": "0.5.23"})
    try:
        proc = subprocess.run([sys.executable, "-m", "app", "attach", f"http://127.0.0.1:{httpd.server_address[1]}",
                               "--seconds", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        httpd.shutdown()
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "no KV-event publisher" in proc.stderr
