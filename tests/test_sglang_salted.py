"""Salted SGLang pages against SGLang 0.5.23's own code (tests/data/sglang/record.py).

`sglang_event_hashes.jsonl` holds the digests and event ints SGLang's `KVCacheEventRecorder`
published for radix paths with a `cache_salt` (its `compute_node_event_hash_values` and
its C++ page hash, built from the wheel), and without one. `sglang_salted_frames.jsonl`
holds those events as SGLang's own ZmqEventPublisher sent them. `--hash sglang-sha256` with
`--salt` must give the same digests, and a salted probe must find the salted pages.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from engine.core.hashing import BlockHasher, sglang_salt_root
from engine.remote.pool import RemotePool
from engine.remote.probe import probe_prompt
from engine.remote.wire import canonical_hash, decode_batch, parse_replay

DATA = Path(__file__).resolve().parent / "data" / "sglang"
ROWS = {r["case"]: r for r in map(json.loads, (DATA / "sglang_event_hashes.jsonl").read_text().splitlines())}
UNSALTED = [json.loads(line) for line in (DATA / "sglang_page_hashes.jsonl").read_text().splitlines()]
HASHER = BlockHasher("sglang-sha256")


@pytest.mark.parametrize("case", sorted(ROWS))
def test_page_digests_and_event_ints_equal_sglangs(case):
    row = ROWS[case]
    chain = HASHER.hash_chain(row["tokens"], row["page_size"], row["cache_salt"])
    assert [h.hex() for h in chain] == row["page_hashes"]
    assert [HASHER.event_int(h) for h in chain] == row["event_int_hashes"]
    # each node's event links to the last page of the node before it, as SGLang linked it
    ends = [sum(row["node_lengths"][:k + 1]) // row["page_size"] for k in range(len(row["node_lengths"]))]
    parents = [None] + [HASHER.event_int(chain[e - 1]) for e in ends[:-1]]
    assert [e["parent_block_hash"] for e in row["events"]] == parents
    assert all(e["cache_salt"] == (row["cache_salt"] or None) for e in row["events"])


def test_a_salt_seeds_the_first_page_and_an_empty_salt_is_none():
    a, b = ROWS["salted_two_nodes"], ROWS["other_salt"]
    assert a["tokens"] == b["tokens"]
    assert not set(a["page_hashes"]) & set(b["page_hashes"])  # two salts share no page
    first = HASHER.hash_block(sglang_salt_root("tenant-a"), a["tokens"][:16])
    assert first.hex() == a["page_hashes"][0]
    # SGLang's unsalted pages (the recorder's and the separately recorded native hash) agree
    two_pages = next(r for r in UNSALTED if r["case"] == "two_pages")
    assert ROWS["unsalted"]["page_hashes"] == ROWS["empty_salt_is_none"]["page_hashes"] == two_pages["page_hashes"]


def _salted_pool() -> RemotePool:
    pool = RemotePool("sglang-0")
    for line in (DATA / "sglang_salted_frames.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["socket"] != "replay":
            continue
        parsed = parse_replay([base64.b64decode(f) for f in row["frames"]])
        if parsed is not None:
            pool.apply(decode_batch(*parsed))
    return pool


def test_a_salted_probe_finds_the_pages_sglang_published_under_its_salt():
    pool = _salted_pool()
    a = ROWS["salted_two_nodes"]
    assert {canonical_hash(n) for n in a["event_int_hashes"]} <= set(pool.tiers["GPU"])
    hit = probe_prompt([pool], a["tokens"], HASHER, 16, "tenant-a")
    assert (hit.cached_tokens, hit.first_missing_block) == (96, None)
    other = probe_prompt([pool], a["tokens"], HASHER, 16, "tenant-b")
    assert other.cached_tokens == 96  # the other salt's own pages
    wrong = probe_prompt([pool], a["tokens"], HASHER, 16, "tenant-c")
    assert wrong.cached_tokens == 0 and "another salt" in wrong.reason
    # the unsalted chain of the same tokens is not what a salted request's pages are named
    plain = probe_prompt([pool], a["tokens"], HASHER, 16)
    assert plain.cached_tokens == 0
