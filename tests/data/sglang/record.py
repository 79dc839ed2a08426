"""Record `sglang_zmq_frames.jsonl` from SGLang 0.5.23's own publisher (run by hand, never in tests).

    pip download --no-deps -d /tmp/sgl sglang==0.5.23 && cd /tmp/sgl && unzip -q sglang-0.5.23-*.whl 'sglang/*'
    .venv/bin/python tests/data/sglang/record.py /tmp/sgl > /tmp/sglang_zmq_frames.jsonl

SGLang's publisher (`sglang.srt.disaggregation.kv_events`) is pure Python (msgspec, pyzmq,
pydantic); its package `__init__`s pull in the whole server, so they are skipped: the
packages are entered as namespaces of the unzipped wheel and only the publisher's module
is loaded. Nothing of SGLang is copied here. Block hashes are SGLang's page hashes
(`BlockHasher("sglang-sha256")`, checked against `sglang_page_hashes.jsonl`) as its events
carry them (the first 8 bytes, signed). Each frame is written base64, as a SUB socket
(`"socket": "pub"`) or a DEALER on the replay socket (`"socket": "replay"`) received it.
"""

from __future__ import annotations

import base64
import json
import socket
import sys
import time
import types
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


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sgl")
