"""`sglang-sha256` against the page hashes recorded from SGLang 0.5.23 (tests/data/sglang/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.hashing import BlockHasher, sglang_event_hash, sglang_salt_root
from engine.remote.wire import canonical_hash

DATA = Path(__file__).resolve().parent / "data" / "sglang"
ROWS = [json.loads(line) for line in (DATA / "sglang_page_hashes.jsonl").read_text().splitlines()]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_page_hashes_and_event_ints_equal_sglangs(row):
    hasher = BlockHasher("sglang-sha256")
    chain = hasher.hash_chain(row["tokens"], row["page_size"])
    assert [h.hex() for h in chain] == row["page_hashes"]
    assert [hasher.event_int(h) for h in chain] == [sglang_event_hash(h) for h in chain] == row["event_int_hashes"]
    # block by block gives the same digests as the sliced chain
    parent = None
    for i, h in enumerate(chain):
        parent = hasher.hash_block(parent, row["tokens"][i * 16:(i + 1) * 16])
        assert parent == h
    # the canonical 16-hex form of the signed event int is the digest's first 8 bytes
    assert [canonical_hash(n).hex() for n in row["event_int_hashes"]] == [h[:16] for h in row["page_hashes"]]
    assert [hasher.event_key(h) for h in chain] == [canonical_hash(n) for n in row["event_int_hashes"]]


def test_a_partial_page_is_not_hashed_and_a_salt_seeds_the_first_page():
    hasher = BlockHasher("sglang-sha256")
    row = ROWS[0]
    assert hasher.hash_chain(row["tokens"] + [7, 8, 9], 16) == hasher.hash_chain(row["tokens"], 16)
    salted = hasher.hash_chain(row["tokens"], 16, "tenant-a")
    assert salted[0] == hasher.hash_block(sglang_salt_root("tenant-a"), row["tokens"][:16])
    assert salted[0].hex() != row["page_hashes"][0]
    assert hasher.hash_chain(row["tokens"], 16, "") == hasher.hash_chain(row["tokens"], 16)  # "" is no salt
    with pytest.raises(ValueError):
        BlockHasher("sglang-sha256", hash_seed="1")


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_the_hash_command_prints_sglangs_hashes(row, tmp_path):
    tokens = tmp_path / "t.json"
    tokens.write_text(json.dumps(row["tokens"]))
    proc = subprocess.run([sys.executable, "-m", "app.cli", "hash", "--tokens", str(tokens), "--block-size", "16",
                           "--hash", "sglang-sha256", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [b["hash"] for b in out["blocks"]] == row["page_hashes"]
    assert [b["event_hash"] for b in out["blocks"]] == row["event_int_hashes"]
    assert [b["event_key"] for b in out["blocks"]] == [h[:16] for h in row["page_hashes"]]


def test_the_engine_and_replay_hash_with_sglangs_scheme(tmp_path):
    from engine.core.manager import PrefixCacheManager, Request

    manager = PrefixCacheManager(10, 16, BlockHasher("sglang-sha256"))
    for row in ROWS:
        assert [h.hex() for h in manager.hash_request(Request("r", row["tokens"]))] == row["page_hashes"]
        # a model keys Cachescope's own schemes; a server's scheme ignores it, as the server does
        assert [h.hex() for h in manager.hash_request(Request("r", row["tokens"], model="m"))] == row["page_hashes"]
    trace = tmp_path / "t.jsonl"
    six = ROWS[2]["tokens"]
    trace.write_text(json.dumps({"id": "a", "tokens": six, "output_length": 1}) + "\n"
                     + json.dumps({"id": "b", "tokens": six[:40], "output_length": 1}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "app", "replay", str(trace), "--no-model", "--capacity-blocks", "50",
                           "--block-size", "16", "--hash", "sglang-sha256", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["config"]["hash"] == "sglang-sha256"
    assert [r["cached_tokens"] for r in out["requests"]] == [0, 32]  # b reuses a's first two pages
