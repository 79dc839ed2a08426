"""Crash safety: a child replaying into the database is killed with SIGKILL at
random moments; every request it reported committed is intact, with exactly its events,
and `PRAGMA integrity_check` stays ok."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

from engine.core.events import EventBus
from engine.store.sessions import import_file, replay_session
from engine.store.database import Store

MOONCAKE = Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
NUM_KILLS = 24


def token_trace(path: Path, num_requests: int) -> None:
    """A token-level trace with the prefix structure of the real Mooncake workload: each of
    the first 8 hash ids of a request becomes one 16-token block of distinct token ids."""
    with MOONCAKE.open() as src, path.open("w") as out:
        for _ in range(num_requests):
            row = json.loads(next(src))
            tokens = [hid * 16 + j for hid in row["hash_ids"][:8] for j in range(16)]
            out.write(json.dumps({"tokens": tokens[:-3], "output_tokens": list(range(1, 1 + row["output_length"] % 40))})
                      + "\n")


def start_child(db: Path, sid: int):
    """Fork a child that replays session `sid` into a new run of `db`, writing one line per
    committed request to a pipe. Forking (no database connection is open at that moment)
    spares each of the many children an interpreter start."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_fd)
            out = os.fdopen(write_fd, "w", buffering=1)
            store = Store(db)
            replay_session(store, sid, on_request=lambda row: out.write(f"{row.index} {row.cached_tokens}\n"))
            out.write("done\n")
            out.flush()
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, os.fdopen(read_fd, "r")


def without_time(dicts):
    return [{k: v for k, v in d.items() if k != "time"} for d in dicts]


def test_sigkill_never_loses_a_committed_turn(tmp_path):
    trace = tmp_path / "trace.jsonl"
    token_trace(trace, 100)
    db = tmp_path / "crash.db"
    with Store(db) as store:
        [sid] = import_file(store, trace, capacity_blocks=200)
        # The reference: the same replay, not recorded, with its event stream cut per request.
        bus, seen, boundaries = EventBus(), [], []
        bus.subscribe(seen.append)
        reference = replay_session(store, sid, persist=False, events=bus,
                                   on_request=lambda row: boundaries.append(len(seen))).to_dict()
    reference_events = without_time(e.to_dict() for e in seen)
    rng = random.Random(4)
    acked_by_run: dict[int, int] = {}
    num_killed = 0
    for attempt in range(NUM_KILLS):
        child, acks = start_child(db, sid)
        # Kill after a random number of acknowledged commits, a random sliver of time later,
        # so that kills land before, inside and between transactions.
        target = rng.randrange(0, len(boundaries))
        acked = 0
        while acked < target:
            line = acks.readline()
            if not line or line.startswith("done"):
                break
            acked += 1
        time.sleep(rng.random() * 0.004)
        os.kill(child, signal.SIGKILL)
        _, status = os.waitpid(child, 0)
        for line in acks:  # acks already written to the pipe before the kill
            acked += 0 if line.startswith("done") else 1
        acks.close()
        num_killed += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        with Store(db) as store:
            assert store.integrity_check() == "ok"
            run = store.runs(sid)[-1]
            acked_by_run[run.id] = acked
            check_run(store, run.id, acked, reference, reference_events, boundaries)
    assert num_killed >= 20
    with Store(db) as store:  # later writes never damaged earlier runs
        assert store.integrity_check() == "ok"
        for run_id, acked in acked_by_run.items():
            check_run(store, run_id, acked, reference, reference_events, boundaries)


def check_run(store, run_id, acked, reference, reference_events, boundaries):
    rows = store.requests(run_id)
    n = len(rows)
    assert n >= acked, f"run {run_id}: {acked} requests were acknowledged but only {n} are stored"
    assert [r.idx for r in rows] == list(range(n))
    for stored, ref in zip(rows, reference["requests"]):
        assert (stored.request_id, stored.prompt_tokens, stored.cached_tokens, stored.miss_reason) == \
               (ref["id"], ref["prompt_tokens"], ref["cached_tokens"], ref["miss_reason"])
    events = store.event_dicts(run_id)
    # a request and its events commit together: never a partial turn
    assert len(events) == (boundaries[n - 1] if n else 0)
    assert without_time(events) == reference_events[:len(events)]
