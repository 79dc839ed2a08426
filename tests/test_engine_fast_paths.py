"""The Python engine's fast paths give what the plain ones give: the msgspec trace-line
parse against `validation.loads`, the chain of block-id hashes against `hash_external`
block by block, and the pool's batched takes, touches and frees against single steps."""

from __future__ import annotations

import json
import random
import struct

import pytest

from engine.core import trace, validation as v
from engine.core.block_pool import BlockPool
from engine.core.errors import TraceError
from engine.core.hashing import HASH_NAMES, BlockHasher
from engine.resources import RESOURCES

TRACES = RESOURCES / "traces"

# Lines each reader must answer alike: accepted with the same value, or refused by
# `validation.loads` (the fast path then steps aside so the refusal is its sentence).
LINES = [
    b'{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, 2, 3]}',
    b'{"id": "a", "tenant": "t", "tokens": [1, 2, 3], "output_tokens": [4]}',
    b'{"id": 7, "tokens": [1], "timestamp": 1.5e-3}',
    b'{"hash_ids": [18446744073709551615], "input_length": 4}',
    b'{"hash_ids": [99999999999999999999], "input_length": 4}',   # 20 digits: parsed, then out of range
    b'{"hash_ids": [100000000000000000000], "input_length": 4}',  # 21 digits: refused while parsing
    b'{"input_length": -100000000000000000000, "hash_ids": []}',
    b'{"meta": {"deep": [1, [2, [123456789012345678901234]]]}, "tokens": [1]}',
    b'{"tokens": [1, 2.5, true, null, "x"]}',
    b'{"tokens": [1], "timestamp": 1e400}',
    b'{"tokens": [1], "timestamp": NaN}',
    b'{"tokens": [1], "timestamp": -Infinity}',
    b'{"tokens": [1], "id": "\\ud800"}',
    b'{"tokens": [1], "id": "caf\\u00e9 \xc3\xa9"}',
    b'{"tokens": [1], "id": "a\tb"}',
    b'{"tokens": [1], "id": "\xff"}',
    b'{"tokens": [1], "id": "\xed\xa0\x80"}',  # a UTF-8-encoded surrogate
    b'\xef\xbb\xbf{"tokens": [1]}',
    b'{"tokens": [1], "tokens": [2]}',
    b'{"tokens": [01]}',
    b'{"tokens": [1]} trailing',
    b'{"tokens": [1],}',
    b'[' * 70 + b']' * 70,
    b'{"a": ' + b'[' * 40 + b']' * 40 + b', "tokens": [1]}',
    b'null',
    b'[1, 2, 3]',
    b'"text"',
    b'-0',
    b'',
    b'   ',
]


def _slow(raw: bytes):
    try:
        return "value", v.loads(raw, "t.jsonl", 1)
    except TraceError as exc:
        return "error", str(exc)


@pytest.mark.parametrize("raw", LINES)
def test_fast_loads_is_validation_loads_or_steps_aside(raw):
    fast = trace.fast_loads(raw)
    kind, slow = _slow(raw)
    if fast is not None:
        assert kind == "value" and fast == slow and type(fast) is type(slow)


def test_fast_loads_takes_the_lines_it_should():
    # The fast path is only worth having if ordinary lines take it.
    assert trace.fast_loads(LINES[0]) == json.loads(LINES[0])
    assert trace.fast_loads(LINES[1]) is not None
    assert trace.fast_loads(LINES[5]) is None  # 21 digits
    assert trace.fast_loads(LINES[7]) is None  # 24 digits, nested
    assert trace.fast_loads(LINES[9]) is None  # 1e400


def test_fast_loads_reads_every_float_as_python_does():
    rng = random.Random(5)
    values = [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(3000)]
    texts = [repr(x) for x in values if x == x and abs(x) != float("inf")]
    texts += [f"{rng.randrange(1, 10**17)}e{rng.randrange(-330, 310)}" for _ in range(2000)]
    texts += ["4.0", "-0.0", "1e-400", "2.2250738585072011e-308", "1.7976931348623157e308", "0.1", "5e-324"]
    for text in texts:
        raw = b'{"timestamp": ' + text.encode() + b', "tokens": [1]}'
        fast = trace.fast_loads(raw)
        kind, slow = _slow(raw)
        if fast is not None:
            assert kind == "value" and repr(fast["timestamp"]) == repr(slow["timestamp"]), text


@pytest.mark.parametrize("name,block_size", [("mooncake_synthetic_trace.jsonl", 512), ("demo_tokens.jsonl", None)])
def test_read_trace_gives_the_same_requests_either_way(name, block_size, monkeypatch):
    fast = trace.load_trace(TRACES / name, block_size)
    monkeypatch.setattr(trace, "FAST_LINE_BYTES", -1)  # every line through validation.loads
    assert trace.fast_loads(b'{"tokens": [1]}') is None
    assert trace.load_trace(TRACES / name, block_size) == fast


def test_a_refused_line_keeps_its_sentence(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"tokens": [1, 2]}\n{"tokens": [1], "timestamp": 1e400}\n')
    with pytest.raises(TraceError, match=r"line 2.*too large for a number"):
        trace.load_trace(path)
    path.write_bytes(b'{"hash_ids": [100000000000000000000], "input_length": 4}\n')
    with pytest.raises(TraceError, match=r"line 1.*21 digits is too large"):
        trace.load_trace(path)


@pytest.mark.parametrize("algorithm", HASH_NAMES)
@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_hash_external_chain_is_hash_external_block_by_block(algorithm, salt):
    hasher = BlockHasher(algorithm, seed=None if algorithm.startswith(("vllm", "sglang")) else 3)
    for keyed in (hasher, hasher.for_model("m")):
        ids = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 12345]
        expected, parent = [], None
        for i, ext in enumerate(ids):
            parent = keyed.hash_external(parent, ext, salt if i == 0 else None)
            expected.append(parent)
        assert keyed.hash_external_chain(ids, salt) == expected
        assert keyed.hash_external_chain(tuple(ids[:1]), salt) == expected[:1]
        assert keyed.hash_external_chain([], salt) == []


def test_hash_external_chain_refuses_an_id_as_hash_external_does():
    hasher = BlockHasher(seed=0)
    for ids in ([1, 2**64], [1, -1], [2**64]):
        with pytest.raises(struct.error):
            hasher.hash_external_chain(ids)


# ---------------------------------------------------------------- the pool's batched loops
def _state(pool: BlockPool):
    blocks = [(b.block_id, b.ref_count, b.block_hash, b.parent_hash, b.token_ids, b.salt, b.external_id,
               b.last_used, b.prev_free is not None) for b in pool.blocks]
    by_hash = {h: [b.block_id for b in pool.cached_blocks(h)] for h in pool.blocks_by_hash}
    return blocks, [b.block_id for b in pool.free_queue], by_hash, pool.use_clock, pool.num_free_blocks


def _warm_pair(seed: int) -> tuple[BlockPool, BlockPool, random.Random]:
    """Two pools driven through the same random history with the single-step methods."""
    rng = random.Random(seed)
    pools = (BlockPool(24), BlockPool(24))
    held: list[int] = []
    for step in range(60):
        if held and rng.random() < 0.4:
            out = [held.pop(rng.randrange(len(held))) for _ in range(rng.randint(1, len(held)))]
            for pool in pools:
                pool.free_blocks([pool.blocks[i] for i in out])
        elif pools[0].num_free_blocks:
            h = bytes([rng.randrange(6)]) * 4  # few hashes: duplicate copies are common
            cache = rng.random() < 0.7
            for pool in pools:
                block, _, _ = pool.take_free_block()
                pool.touch(block)
                if cache:
                    pool.cache(block, h, None, (step,), None, None)
            held.append(block.block_id)
    assert _state(pools[0]) == _state(pools[1])
    return pools[0], pools[1], rng


@pytest.mark.parametrize("seed", range(12))
def test_take_blocks_is_single_takes_and_touches(seed):
    batched, single, rng = _warm_pair(seed)
    n = rng.randint(0, batched.num_free_blocks)
    seen_batched: list = []
    taken = batched.take_blocks(n, lambda b, h, p: seen_batched.append((b.block_id, h, p, _state(batched))))
    seen_single, expected = [], []
    for _ in range(n):
        block, evicted, parent = single.take_free_block()
        if evicted is not None:
            seen_single.append((block.block_id, evicted, parent, _state(single)))
        single.touch(block)
        expected.append(block.block_id)
    assert [b.block_id for b in taken] == expected
    assert seen_batched == seen_single  # the pool as each eviction is reported, too
    assert _state(batched) == _state(single)
    with pytest.raises(IndexError):
        batched.take_blocks(batched.num_free_blocks + 1, lambda b, h, p: None)


@pytest.mark.parametrize("seed", range(12))
def test_touch_blocks_is_touch_in_order(seed):
    batched, single, rng = _warm_pair(seed)
    ids = rng.sample(range(24), rng.randint(0, 24))
    batched.touch_blocks([batched.blocks[i] for i in ids])
    for i in ids:
        single.touch(single.blocks[i])
    assert _state(batched) == _state(single)


@pytest.mark.parametrize("seed", range(12))
def test_free_blocks_follows_vllm_order(seed):
    pool, _, rng = _warm_pair(seed)
    held = [b for b in pool.blocks if b.ref_count > 0]
    rng.shuffle(held)
    before = [b.block_id for b in pool.free_queue]
    refs = {b.block_id: b.ref_count for b in held}
    freed = pool.free_blocks(held)
    now_free = [b.block_id for b in held if refs[b.block_id] == 1]
    assert [b.block_id for b in freed] == now_free
    hashless = [i for i in now_free if pool.blocks[i].block_hash is None]
    cached = [i for i in now_free if pool.blocks[i].block_hash is not None]
    # vLLM 0.33.0: blocks without a hash to the head in order, cached ones to the tail
    assert [b.block_id for b in pool.free_queue] == hashless + before + cached
    assert pool.num_free_blocks == len(before) + len(now_free)
    assert all(b.last_used > 0 for b in held)


@pytest.mark.parametrize("algorithm", HASH_NAMES)
@pytest.mark.parametrize("block_size", [1, 3, 16, 33])
def test_hash_chain_is_hash_block_block_by_block(algorithm, block_size):
    hasher = BlockHasher(algorithm, seed=None if algorithm.startswith(("vllm", "sglang")) else 3)
    rng = random.Random(block_size)
    tokens = [rng.randrange(2**32) for _ in range(5 * block_size + block_size // 2)]
    for salt in (None, "tenant-a"):
        expected, parent = [], None
        for i in range(len(tokens) // block_size):
            parent = hasher.hash_block(parent, tokens[i * block_size:(i + 1) * block_size], salt if i == 0 else None)
            expected.append(parent)
        assert hasher.hash_chain(tokens, block_size, salt) == expected
        assert hasher.hash_chain(tuple(tokens[:5 * block_size]), block_size, salt) == expected
        assert hasher.hash_chain(tokens, block_size, salt, parent=expected[1], start_block=2) == expected[2:]
        assert hasher.hash_chain(tokens[:block_size - 1], block_size, salt) == []


def test_a_hash_maps_to_its_block_then_to_its_copies_oldest_first():
    pool = BlockPool(4)
    a, b, c = (pool.take_free_block()[0] for _ in range(3))
    h = b"h" * 32
    pool.cache(a, h, None, (1,), None, None)
    assert pool.blocks_by_hash[h] is a and pool.get_cached_block(h) is a  # one copy: the block itself
    pool.cache(b, h, None, (1,), None, None)
    pool.cache(c, h, None, (1,), None, None)
    assert pool.cached_blocks(h) == [a, b, c] and pool.get_cached_block(h) is a
    assert pool.num_cached_blocks == 3 and sorted(x.block_id for _, x in pool.iter_cached()) == [0, 1, 2]
    pool.uncache(a)
    assert pool.get_cached_block(h) is b and pool.cached_blocks(h) == [b, c]
    pool.uncache(c)
    pool.uncache(b)
    assert pool.get_cached_block(h) is None and h not in pool.blocks_by_hash and pool.num_cached_blocks == 0
    pool.cache(b, h, None, (1,), None, None)
    pool.cache(b, h, None, (1,), None, None)  # stored again under the same hash: still one copy
    assert pool.cached_blocks(h) == [b] and pool.num_cached_blocks == 1


def test_fast_loads_shares_small_ids_as_validation_does():
    # A trace in memory costs a list slot per token id, not an int object of its own.
    raw = b'{"tokens": [12345, 99999, 7], "hash_ids": [100000, 54321], "x": [true, 3]}'
    fast, slow = trace.fast_loads(raw), v.loads(raw, "t.jsonl", 1)
    assert fast == slow
    assert fast["tokens"][0] is slow["tokens"][0] and fast["tokens"][1] is slow["tokens"][1]
    assert fast["hash_ids"][1] is slow["hash_ids"][1]
    assert fast["x"][0] is True  # a boolean stays one
