"""Bookmarks and notes: saved with the session, reopened, stepped through, exported with the
session file and imported back; bad rows refused naming the field; the table is created
only on first use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from engine.core.errors import InputError, TraceError
from engine.store.bookmarks import TABLE, Bookmarks
from engine.store.database import Store
from engine.store.sessions import export_session, import_file, replay_session

ROOT = Path(__file__).resolve().parents[1]
DEMO_TRACE = ROOT / "resources" / "traces" / "demo_tokens.jsonl"
CHAT = ROOT / "resources" / "sessions" / "mt_bench_81_writing.cachescope.json"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "walk.db"


def test_saved_and_reopened(db):
    with Store(db) as store:
        (sid,) = import_file(store, DEMO_TRACE)
        run = replay_session(store, sid).config["run_id"]
        evicted = store.event_dicts(run)[10]
        marks = Bookmarks(store)
        a = marks.add(sid, event_seq=evicted["seq"], run_id=run, title="the first lookup", note="look at the hashes")
        b = marks.add(sid, request_id="q81-t1", title="bob's first turn")
        c = marks.add(sid, event_seq=3, title="")
        assert [m.position for m in (a, b, c)] == [0, 1, 2]
        assert c.label == "event 3" and b.label == "request q81-t1: bob's first turn"
    with Store(db, read_only=True) as store:  # reopened, as the app reads it
        got = Bookmarks(store).list(sid)
        assert [(m.target, m.event_seq, m.request_id, m.title, m.note, m.run_id) for m in got] == [
            ("event", evicted["seq"], None, "the first lookup", "look at the hashes", run),
            ("request", None, "q81-t1", "bob's first turn", "", None),
            ("event", 3, None, "", "", None)]


def test_stepped_through_moved_edited_removed(db):
    with Store(db) as store:
        (sid,) = import_file(store, DEMO_TRACE)
        marks = Bookmarks(store)
        ids = [marks.add(sid, event_seq=s).id for s in (5, 1, 9)]
        assert marks.step(sid, None).id == ids[0] and marks.step(sid, None, forward=False).id == ids[2]
        assert marks.step(sid, ids[0]).id == ids[1] and marks.step(sid, ids[2]).id == ids[0]  # wraps
        assert marks.step(sid, ids[0], forward=False).id == ids[2]
        assert [m.id for m in marks.move(ids[2], 0)] == [ids[2], ids[0], ids[1]]
        assert marks.update(ids[1], note="why 1 matters").note == "why 1 matters"
        marks.remove(ids[0])
        assert [m.event_seq for m in marks.list(sid)] == [9, 1]
        with pytest.raises(InputError, match="no bookmark"):
            marks.remove(ids[0])
        store.delete_session(sid)
        assert marks.list(sid) == []  # they go with their session


def test_exported_and_imported_with_the_session_file(db, tmp_path):
    out = tmp_path / "walk.cachescope.json"
    with Store(db) as store:
        (sid,) = import_file(store, CHAT)
        Bookmarks(store).add(sid, request_id="turn-1", title="the second turn", note="block 0 is shared")
        Bookmarks(store).add(sid, event_seq=0, note="start here")
        export_session(store, sid, out)
    doc = json.loads(out.read_text())
    assert [b["title"] for b in doc["bookmarks"]] == ["the second turn", ""]
    assert doc["bookmarks"][1] == {"target": "event", "event_seq": 0, "request_id": None, "position": 1,
                                   "title": "", "note": "start here", "created": doc["bookmarks"][1]["created"]}
    other = tmp_path / "class.db"
    code = main(["sessions", "import", str(out), "--db", str(other)])
    assert code == 0
    with Store(other, read_only=True) as store:
        (info,) = store.list_sessions()
        got = Bookmarks(store).list(info.id)
        assert [(m.request_id, m.event_seq, m.note) for m in got] == [("turn-1", None, "block 0 is shared"),
                                                                     (None, 0, "start here")]
        again = json.loads(export_session(store, info.id, None))
    assert again["bookmarks"] == doc["bookmarks"]  # the round trip keeps them exactly


def test_a_session_without_bookmarks_is_unchanged(db, tmp_path):
    with Store(db) as store:
        (sid,) = import_file(store, CHAT)
        doc = json.loads(export_session(store, sid, None))
        assert "bookmarks" not in doc
        assert not store.has_table(TABLE)  # created on first use only
        Bookmarks(store)
        assert store.has_table(TABLE)


@pytest.mark.parametrize("rows, field, words", [
    ("no", "bookmarks", "expected a list"),
    ([5], "bookmarks[0]", "expected an object"),
    ([{"event_seq": 1, "request_id": "r"}], "bookmarks[0]", "one of the two"),
    ([{}], "bookmarks[0]", "one of the two"),
    ([{"event_seq": 1}, {"event_seq": -2}], "bookmarks[1]", "whole number from 0"),
    ([{"request_id": "r", "target": "event"}], "bookmarks[0]", "does not match"),
    ([{"request_id": "r", "note": 7}], "bookmarks[0]", "note is text"),
])
def test_bad_bookmarks_refuse_the_whole_import(db, tmp_path, rows, field, words):
    doc = json.loads(CHAT.read_text())
    doc["bookmarks"] = rows
    bad = tmp_path / "bad.cachescope.json"
    bad.write_text(json.dumps(doc))
    with Store(db) as store:
        with pytest.raises(TraceError) as info:
            import_file(store, bad)
        assert info.value.field == field and words in str(info.value)
        assert store.list_sessions() == []  # nothing half-imported


def test_add_refuses_bad_arguments(db):
    with Store(db) as store:
        (sid,) = import_file(store, DEMO_TRACE)
        marks = Bookmarks(store)
        with pytest.raises(InputError, match="one of the two"):
            marks.add(sid)
        with pytest.raises(InputError, match="no session|not found|session"):
            marks.add(sid + 99, event_seq=1)
        with pytest.raises(InputError, match="at most"):
            marks.add(sid, event_seq=1, note="x" * 100_001)
        assert marks.list(sid) == []
