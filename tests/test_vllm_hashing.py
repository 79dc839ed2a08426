"""vLLM's block hashes, byte for byte: every row of the fixture recorded from vLLM 0.33.0's
`hash_block_tokens` (sha256 and sha256_cbor, with and without cache_salt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.hashing import BlockHasher, cbor_canonical, event_hash

ROWS = [json.loads(line) for line in
        (Path(__file__).resolve().parent / "data" / "vllm" / "vllm_block_hashes.jsonl").read_text().splitlines()]
SCHEME = {"sha256": "vllm-sha256", "sha256_cbor": "vllm-sha256-cbor"}


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['algo']}-{r['case']}" for r in ROWS])
def test_every_fixture_row(row):
    hasher = BlockHasher(SCHEME[row["algo"]], hash_seed=None if row["none_hash_seed"] == "vllm-none-hash"
                         else row["none_hash_seed"])
    assert hasher.root.hex() == row["none_hash"]
    chain = hasher.hash_chain(row["tokens"], row["block_size"], row["cache_salt"])
    assert [h.hex() for h in chain] == row["block_hashes"]
    assert [event_hash(h) for h in chain] == row["event_int_hashes"]
    # block by block gives the same digests as the chain
    parent = None
    for i, h in enumerate(chain):
        bs = row["block_size"]
        parent = hasher.hash_block(parent, row["tokens"][i * bs:(i + 1) * bs], row["cache_salt"] if i == 0 else None)
        assert parent == h


def test_seed_salt_and_scheme_change_the_hashes():
    tokens = list(range(1, 33))
    base = BlockHasher("vllm-sha256").hash_chain(tokens, 16)
    assert BlockHasher("vllm-sha256", hash_seed="0").hash_chain(tokens, 16) != base
    assert BlockHasher("vllm-sha256").hash_chain(tokens, 16, "s")[1] != base[1]
    assert BlockHasher("vllm-sha256-cbor").hash_chain(tokens, 16) != base
    # seed and model id are Cachescope's, not vLLM's: they change nothing here
    assert BlockHasher("vllm-sha256", seed=5, model_id="m").hash_chain(tokens, 16) == base
    with pytest.raises(ValueError, match="only applies to the vllm"):
        BlockHasher("sha256", hash_seed="1")
    with pytest.raises(ValueError, match="2\\*\\*32"):
        BlockHasher("vllm-sha256").hash_chain([-1] * 16, 16)


def test_canonical_cbor_encoding():
    # RFC 8949 appendix A examples, and the shape of a block hash input
    assert cbor_canonical(0) == b"\x00" and cbor_canonical(23) == b"\x17" and cbor_canonical(24) == b"\x18\x18"
    assert cbor_canonical(1000) == b"\x19\x03\xe8" and cbor_canonical(2**32) == b"\x1b\x00\x00\x00\x01\x00\x00\x00\x00"
    assert cbor_canonical(-1) == b"\x20" and cbor_canonical(None) == b"\xf6"
    assert cbor_canonical("a") == b"\x61a" and cbor_canonical(b"\x01") == b"\x41\x01"
    assert cbor_canonical((1, (2, 3))) == b"\x82\x01\x82\x02\x03"
    with pytest.raises(ValueError):
        cbor_canonical(1.5)


def test_the_model_runner_stores_vllms_hashes(tiny_model):
    from engine.core.events import EventBus
    from engine.model.runner import ModelRunner

    row = next(r for r in ROWS if r["algo"] == "sha256" and r["case"] == "salted")
    bus = EventBus()
    stored = []
    bus.subscribe(lambda e: stored.append(e) if e.kind == "block_stored" else None)
    runner = ModelRunner(tiny_model, num_blocks=16, block_size=row["block_size"], hash_name="vllm-sha256", events=bus)
    runner.generate(row["tokens"] + [7], max_new_tokens=1, salt=row["cache_salt"], request_id="r")
    assert [e.block_hash.hex() for e in stored[:2]] == row["block_hashes"]
