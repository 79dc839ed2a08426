"""Record the SGLang fixtures from SGLang 0.5.23's own code (run by hand, never in tests).

    pip download --no-deps -d /tmp/sgl sglang==0.5.23 && cd /tmp/sgl && unzip -q sglang-0.5.23-*.whl 'sglang/*'
    .venv/bin/python tests/data/sglang/record.py /tmp/sgl > /tmp/sglang_zmq_frames.jsonl
    TORCH_EXTENSIONS_DIR=/tmp/sgl/ext .venv/bin/python tests/data/sglang/record.py event-hashes /tmp/sgl \
        > tests/data/sglang/sglang_event_hashes.jsonl
    TORCH_EXTENSIONS_DIR=/tmp/sgl/ext .venv/bin/python tests/data/sglang/record.py salted-frames /tmp/sgl \
        > tests/data/sglang/sglang_salted_frames.jsonl

Frames: SGLang's publisher (`sglang.srt.disaggregation.kv_events`) is pure Python (msgspec,
pyzmq, pydantic); its package `__init__`s pull in the whole server, so they are skipped: the
packages are entered as namespaces of the unzipped wheel and only the publisher's module
is loaded. Nothing of SGLang is copied here. Block hashes are SGLang's page hashes
(`BlockHasher("sglang-sha256")`, checked against `sglang_page_hashes.jsonl`) as its events
carry them (the first 8 bytes, signed). Each frame is written base64, as a SUB socket
(`"socket": "pub"`) or a DEALER on the replay socket (`"socket": "replay"`) received it.

Event hashes (`event-hashes`): SGLang's `KVCacheEventRecorder.record_store`
(`sglang.srt.mem_cache.events`) over radix-tree paths with and without a `cache_salt`, so
its own `compute_node_event_hash_values` (the salt-seeded chain) and its C++ page hash
(`mem_cache/cpp_utils/hash_binding.cpp`, built from the wheel by SGLang's own loader with
torch's cpp_extension, g++ and OpenSSL) make every digest. SGLang's `utils` module
re-exports MLA buffer kernels that need triton and a GPU; they are stood in by empty names,
since hashing never calls them. The tree's nodes are stood in by `_Node`/`_Key`, which hold
only the fields of SGLang's `TreeNode` and `RadixKey` that the recorder reads (its radix
tree module needs triton too).
"""

from __future__ import annotations

import base64
import json
import socket
import sys
import time
import types
from array import array
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from engine.core.hashing import BlockHasher  # noqa: E402

HASHER = BlockHasher("sglang-sha256")


def load_sglang(wheel_dir: str):
    for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
        module = types.ModuleType(name)
        module.__path__ = [str(Path(wheel_dir, *name.split(".")))]
        sys.modules[name] = module
    sys.path.insert(0, wheel_dir)
    import sglang.srt.disaggregation.kv_events as kv_events

    return kv_events


def ints(tokens: list[int], parent: bytes | None = None) -> list[int]:
    chain = HASHER.hash_chain(tokens, 16, parent=parent)
    return [HASHER.event_int(h) for h in chain]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def story(kv):
    """(rank, topic, batches): what each rank publishes; batch 0 before anyone subscribes."""
    a = list(range(1, 33))
    b = list(range(1000, 1096))
    big = [151643, 0, 49151, 128000] * 12
    ha, hb, hbig = ints(a), ints(b), ints(big)
    rank0 = [
        (1796112016.0, [kv.BlockStored(ha, None, a, 16, None, medium="GPU")]),
        (1796112016.1, [kv.BlockStored(hb[:2], None, b[:32], 16, None, medium="GPU", cache_salt="tenant-a",
                                       session_id="sess-1")]),
        (1796112016.2, [kv.BlockStored(hb[2:4], hb[1], b[32:64], 16, None, medium="GPU", cache_salt="tenant-a",
                                       session_id="sess-1", lora_name="adapter-x")]),
        (1796112016.3, [kv.BlockStored(hb[4:6], hb[3], b[64:96], 16, None, medium="CPU_PINNED",
                                       cache_salt="tenant-a"),
                        kv.BlockStored(hbig, None, big, 16, None, medium="DISK")]),
        (1796112016.4, [kv.BlockRemoved([hb[3]], medium="GPU"), kv.BlockRemoved([hbig[0]], medium="DISK")]),
        (1796112016.5, [kv.AllBlocksCleared()]),
    ]
    rank1 = [
        (1796112017.0, [kv.BlockStored(ha[:1], None, a[:16], 16, None, medium="GPU")]),
        (1796112017.1, [kv.BlockStored(ha[1:], ha[0], a[16:], 16, None, medium="EXTERNAL")]),
    ]
    return [(0, "kv-events", rank0), (1, "", rank1)]


def record(kv, rank: int, topic: str, batches) -> list[dict]:
    port, replay_port = free_port(), free_port()
    pub = kv.ZmqEventPublisher(rank, f"tcp://127.0.0.1:{port - rank}", f"tcp://127.0.0.1:{replay_port - rank}",
                               topic=topic, bind=True)
    ctx = zmq.Context.instance()
    rows: list[dict] = []
    try:
        pub.publish(kv.KVEventBatch(ts=batches[0][0], events=batches[0][1]))  # nobody listens yet
        time.sleep(0.5)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.5)  # ZMQ's slow joiner: the subscription must reach the publisher first
        for ts, events in batches[1:]:
            pub.publish(kv.KVEventBatch(ts=ts, events=events))
        for _ in batches[1:]:
            rows.append({"rank": rank, "socket": "pub", "frames": sub.recv_multipart()})
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            frames = dealer.recv_multipart()
            rows.append({"rank": rank, "socket": "replay", "frames": frames})
            if frames[-2] == (-1).to_bytes(8, "big", signed=True):
                break
        sub.close(linger=0)
        dealer.close(linger=0)
    finally:
        pub.shutdown()
    return rows


def main(wheel_dir: str) -> None:
    kv = load_sglang(wheel_dir)
    for rank, topic, batches in story(kv):
        for row in record(kv, rank, topic, batches):
            row["frames"] = [base64.b64encode(f).decode() for f in row["frames"]]
            sys.stdout.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------- event hashes
_MLA_REEXPORTS = ("get_mla_kv_buffer_kernel", "get_mla_kv_buffer_triton", "set_mla_kv_buffer_dcp_sharded_triton",
                  "set_mla_kv_buffer_fp8_quant_kernel", "set_mla_kv_buffer_kernel", "set_mla_kv_buffer_triton",
                  "set_mla_kv_buffer_triton_fp8_quant", "set_mla_kv_scale_buffer_kernel",
                  "set_mla_kv_scale_buffer_triton")


def load_sglang_events(wheel_dir: str):
    """SGLang's `mem_cache.events` (its event recorder) and `mem_cache.utils` (its hashing)."""
    for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.mem_cache", "sglang.srt.mem_cache.cpp_utils",
                 "sglang.srt.disaggregation", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.kvcache"):
        module = types.ModuleType(name)
        module.__path__ = [str(Path(wheel_dir, *name.split(".")))]
        sys.modules[name] = module
    mla = types.ModuleType("sglang.kernels.ops.kvcache.mla_buffer")
    for name in _MLA_REEXPORTS:
        setattr(mla, name, None)
    sys.modules[mla.__name__] = mla
    sys.path.insert(0, wheel_dir)
    import sglang.srt.mem_cache.events as events
    import sglang.srt.mem_cache.utils as utils

    return events, utils


class _Key:
    """The fields of SGLang's `RadixKey` its hashing and recorder read (`cache_salt or None` as its own)."""

    def __init__(self, token_ids, cache_salt=None):
        self.token_ids = array("q", token_ids)
        self.extra_key = None
        self.cache_salt = cache_salt or None
        self.is_bigram = False
        self.limit = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def raw_token_ids(self):
        return self.token_ids


class _Node:
    """The fields of SGLang's `TreeNode` its recorder reads; the root has an empty key and hash list."""

    def __init__(self, key, parent=None):
        self.key, self.parent = key, parent
        self.hash_value = [] if parent is None else None
        self.event_hash_value = None


# (case, page size, cache salt, the token ids of each node along one path from the root)
EVENT_CASES = [
    ("salted_two_nodes", 16, "tenant-a", [list(range(1000, 1032)), list(range(1032, 1096))]),
    ("other_salt", 16, "tenant-b", [list(range(1000, 1096))]),
    ("salted_big_ids", 16, "租户-ü", [[151643, 0, 49151, 128000] * 12]),
    ("empty_salt_is_none", 16, "", [list(range(1, 33))]),
    ("unsalted", 16, None, [list(range(1, 17)), list(range(17, 33))]),
    ("salted_page_4", 4, "tenant-a", [[7, 8, 9, 10, 11, 12, 13, 14], [15, 16, 17, 18]]),
]


def record_event_hashes(wheel_dir: str) -> list[dict]:
    events, _ = load_sglang_events(wheel_dir)
    rows = []
    for case, page_size, salt, parts in EVENT_CASES:
        recorder = events.KVCacheEventRecorder(enabled=True, page_size=page_size)
        node = _Node(_Key([]))
        tokens: list[int] = []
        stored = []
        for part in parts:
            node = _Node(_Key(part, salt), node)
            recorder.record_store(node)
            # taken per node: the recorder would merge a child's event into its parent's
            stored += [e for e in recorder.take() if isinstance(e, events.BlockStored)]
            tokens += part
        path, page_hashes = [], []
        n = node
        while n.parent is not None:
            path.append(n)
            n = n.parent
        for n in reversed(path):
            page_hashes += n.event_hash_value if (salt or None) is not None else n.hash_value
        rows.append({"case": case, "page_size": page_size, "cache_salt": salt, "tokens": tokens,
                     "node_lengths": [len(p) for p in parts], "page_hashes": page_hashes,
                     "event_int_hashes": [h for e in stored for h in e.block_hashes],
                     "events": [{"block_hashes": e.block_hashes, "parent_block_hash": e.parent_block_hash,
                                 "cache_salt": e.cache_salt} for e in stored]})
    return rows


def record_salted_frames(wheel_dir: str) -> list[dict]:
    """SGLang's recorder's events for two salts and none, published by its own ZmqEventPublisher
    (rank 0, topic `kv-events`): one batch per radix node, as the scheduler would flush them."""
    events, _ = load_sglang_events(wheel_dir)
    kv = sys.modules["sglang.srt.disaggregation.kv_events"]
    batches = []
    for case, page_size, salt, parts in EVENT_CASES:
        if case not in ("salted_two_nodes", "other_salt", "unsalted"):
            continue
        recorder = events.KVCacheEventRecorder(enabled=True, page_size=page_size)
        node = _Node(_Key([]))
        for part in parts:
            node = _Node(_Key(part, salt), node)
            recorder.record_store(node, session_id="sess-1" if salt else None)
            batches.append((1796112020.0 + len(batches) / 10, recorder.take()))
    rows = record(kv, 0, "kv-events", batches)
    for row in rows:
        row["frames"] = [base64.b64encode(f).decode() for f in row["frames"]]
    return rows


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sgl"
    if mode in ("event-hashes", "salted-frames"):
        wheel = sys.argv[2] if len(sys.argv) > 2 else "/tmp/sgl"
        rows = record_event_hashes(wheel) if mode == "event-hashes" else record_salted_frames(wheel)
        for row in rows:
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        main(mode)
