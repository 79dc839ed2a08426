"""The store: schema and migrations, message versions, runs with requests and events,
deletion, and the writer thread that persists event bursts without blocking."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from engine.core.errors import InputError
from engine.core.events import EventBus
from engine.core.replay import ReplayConfig, make_manager, replay
from engine.store.database import Store
from engine.store.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from engine.store.writer import StoreWriter
from engine.core.trace import load_trace

MOONCAKE = Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl"


@pytest.fixture()
def store(tmp_path):
    s = Store(tmp_path / "cachescope.db")
    yield s
    s.close()


@pytest.fixture(scope="module")
def mooncake_slice(tmp_path_factory):
    path = tmp_path_factory.mktemp("mooncake") / "slice.jsonl"
    with MOONCAKE.open() as src:
        path.write_text("".join(next(src) for _ in range(200)))
    return path


def recorded_replay(path):
    """A real block-level replay of the Mooncake slice with its event stream."""
    bus = EventBus()
    seen = []
    bus.subscribe(seen.append)
    config = ReplayConfig(block_size=512, capacity_blocks=400, seed=0)
    result = replay(load_trace(path, 512), config, manager=make_manager(config, bus)).to_dict()
    return result, seen


def test_file_database_is_wal_with_versioned_schema(store, tmp_path):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert {"sessions", "messages", "runs", "requests", "events", "trace_requests"} <= set(store.db.table_names())
    assert store.applied_migrations() == [name for name, _ in MIGRATIONS]
    assert store.integrity_check() == "ok"


def test_other_modules_register_migrations_that_run_once(store, tmp_path):
    def plugin_v1(db):
        db.execute("CREATE TABLE plugin_notes (id INTEGER PRIMARY KEY, prompt TEXT)")

    assert store.register_migration("plugin-0001", plugin_v1) is True
    assert store.register_migration("plugin-0001", plugin_v1) is False
    store.db.execute("INSERT INTO plugin_notes (prompt) VALUES ('hi')")
    store.close()
    again = Store(tmp_path / "cachescope.db")
    assert again.register_migration("plugin-0001", plugin_v1) is False
    assert again.applied_migrations() == [name for name, _ in MIGRATIONS] + ["plugin-0001"]
    assert again.count("plugin_notes") == 1

    def broken(db):
        db.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("migration bug")

    with pytest.raises(RuntimeError):
        again.register_migration("broken-0001", broken)
    assert "half_done" not in again.db.table_names()  # rolled back with the migration record
    assert "broken-0001" not in again.applied_migrations()
    again.close()


def test_edits_make_versions_and_keep_the_old_ones(store):
    sid = store.create_session("chat", model=None, block_size=16, capacity_blocks=64, seed=3)
    store.add_message(sid, "system", "Be brief.")
    store.add_message(sid, "user", "What is 2+2?")
    store.add_message(sid, "assistant", "4")
    edited = store.edit_message(sid, 1, "What is 3+3?")
    assert (edited.position, edited.version, edited.role) == (1, 2, "user")
    current = store.messages(sid)
    assert [(m.position, m.version, m.content) for m in current] == [(0, 1, "Be brief."), (1, 2, "What is 3+3?"),
                                                                     (2, 1, "4")]
    history = store.messages(sid, include_history=True)
    assert [(m.position, m.version, m.is_current) for m in history] == [(0, 1, True), (1, 1, False), (1, 2, True),
                                                                        (2, 1, True)]
    assert history[1].content == "What is 2+2?"
    info = store.get_session(sid)
    assert (info.num_messages, info.seed, info.capacity_blocks) == (3, 3, 64)
    with pytest.raises(InputError, match="no message 5"):
        store.edit_message(sid, 5, "x")
    with pytest.raises(InputError, match="no session 99"):
        store.get_session(99)


def test_runs_keep_requests_and_the_exact_event_stream(store, mooncake_slice):
    result, seen = recorded_replay(mooncake_slice)
    sid = store.create_session("mooncake", "trace", block_size=512, capacity_blocks=400)
    run = store.create_run(sid, "replay", result["config"])
    for row in result["requests"]:
        store.record_request(run, row["index"], request_id=row["id"], prompt_tokens=row["prompt_tokens"],
                             cached_tokens=row["cached_tokens"], computed_tokens=row["computed_tokens"],
                             miss_reason=row["miss_reason"], first_miss_block=row["first_miss_block"])
    assert store.record_events(run, seen) == len(seen) > 1000
    store.finish_run(run, result["totals"])
    assert store.events(run) == seen  # rebuilt events equal the originals, field for field
    assert [e.seq for e in store.events(run, since_seq=100, limit=5)] == [101, 102, 103, 104, 105]
    rows = store.requests(run)
    assert [r.cached_tokens for r in rows] == [r["cached_tokens"] for r in result["requests"]]
    assert sum(r.cached_tokens for r in rows) == result["totals"]["cached_tokens"] > 0
    [info] = store.runs(sid)
    assert info.status == "done" and info.totals == result["totals"]
    store.delete_session(sid)
    assert all(store.count(t) == 0 for t in ("sessions", "runs", "requests", "events"))


def test_writer_thread_persists_an_event_burst_in_order(store, mooncake_slice):
    sid = store.create_session("burst", "trace", block_size=512, capacity_blocks=400)
    run = store.create_run(sid)
    writer = StoreWriter(store)
    bus = EventBus()
    seen = []
    bus.subscribe(seen.append)
    bus.subscribe(writer.listener(run))
    config = ReplayConfig(block_size=512, capacity_blocks=400, seed=0)
    replay(load_trace(mooncake_slice, 512), config, manager=make_manager(config, bus))
    writer.record_request(run, 0, request_id="r0", prompt_tokens=5, cached_tokens=0, computed_tokens=5)
    writer.flush()
    assert store.events(run) == seen
    assert store.requests(run)[0].request_id == "r0"
    # coalescing: thousands of events went in far fewer transactions
    assert writer.num_committed_batches < len(seen)
    writer.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        writer.record_events(run, seen[:1])


def test_writer_reports_a_failed_batch_and_applies_none_of_it(store):
    writer = StoreWriter(store)
    sid = store.create_session("s")
    run = store.create_run(sid)
    gate = threading.Event()
    writer.call(lambda s: gate.wait())  # hold the writer so the next two land in one batch
    writer.record_request(run, 0, request_id="a", prompt_tokens=1, cached_tokens=0, computed_tokens=1)
    writer.record_request(run, 0, request_id="duplicate index", prompt_tokens=1, cached_tokens=0, computed_tokens=1)
    gate.set()
    with pytest.raises(sqlite3.IntegrityError):
        writer.flush()
    assert store.requests(run) == []
    with pytest.raises(sqlite3.IntegrityError):
        writer.stop()


def test_headless_writer_writes_at_once(store):
    writer = StoreWriter(store, threaded=False)
    sid = store.create_session("s")
    run = store.create_run(sid)
    writer.record_request(run, 0, request_id="a", prompt_tokens=3, cached_tokens=2, computed_tokens=1)
    assert store.requests(run)[0].cached_tokens == 2
    writer.stop()


def test_bad_database_paths_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="directory"):
        Store(tmp_path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InputError, match="not a Cachescope database"):
        Store(junk)


def test_default_path_is_in_the_user_data_dir(monkeypatch, tmp_path):
    from engine.store.database import default_db_path

    monkeypatch.delenv("CACHESCOPE_DB", raising=False)
    assert default_db_path().name == "cachescope.db" and "cachescope" in str(default_db_path().parent).lower()
    monkeypatch.setenv("CACHESCOPE_DB", str(tmp_path / "x.db"))
    with Store() as s:
        assert s.path == tmp_path / "x.db" and (tmp_path / "x.db").exists()
