"""Bookmarks and notes on the events and requests of a session: a guided walk through a capture.

A bookmark belongs to a session and points at an event (by its `seq`, which repeats
exactly on every seeded replay of the session) or at a request (by its id), optionally
of one run. Its table is created on first use through the store's migrations
(`Store.register_migration`), so a database that never had a bookmark stays as it was.
Bookmarks travel in the session file under "bookmarks" (`session_file_bookmarks`,
`import_bookmarks`). No Qt here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from engine.core.errors import InputError, TraceError
from engine.store.database import Store, now_iso

MIGRATION = "bookmarks-0001"
TABLE = "bookmarks"
_CREATE = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id INTEGER PRIMARY KEY,
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
        target TEXT NOT NULL CHECK (target IN ('event', 'request')),
        event_seq INTEGER, request_id TEXT, position INTEGER NOT NULL,
        title TEXT NOT NULL, note TEXT NOT NULL DEFAULT '', created TEXT NOT NULL)""",
    f"CREATE INDEX IF NOT EXISTS bookmarks_by_session ON {TABLE}(session_id, position)",
)
TARGETS = ("event", "request")
MAX_TEXT = 100_000  # characters of a title or note: a walk's notes, not a document store
_COLUMNS = "id, session_id, run_id, target, event_seq, request_id, position, title, note, created"


@dataclass(slots=True, frozen=True)
class Bookmark:
    id: int
    session_id: int
    run_id: int | None
    target: str  # event | request
    event_seq: int | None
    request_id: str | None
    position: int  # the order of the walk
    title: str
    note: str
    created: str

    @property
    def label(self) -> str:
        where = f"event {self.event_seq}" if self.target == "event" else f"request {self.request_id}"
        return f"{where}: {self.title}" if self.title else where

    def to_dict(self) -> dict[str, Any]:
        """The session file's form: no database ids (a run id means nothing elsewhere)."""
        return {"target": self.target, "event_seq": self.event_seq, "request_id": self.request_id,
                "position": self.position, "title": self.title, "note": self.note, "created": self.created}


class Bookmarks:
    """The bookmarks of a store. Creating one creates the table if the store is writable."""

    def __init__(self, store: Store) -> None:
        self.store = store
        if not store.read_only:
            store.register_migration(MIGRATION, lambda db: [db.execute(s) for s in _CREATE])

    def _exists(self) -> bool:
        return self.store.has_table(TABLE)

    def list(self, session_id: int) -> list[Bookmark]:
        """The session's bookmarks in walk order."""
        if not self._exists():
            return []
        rows = self.store.query(f"SELECT {_COLUMNS} FROM {TABLE} WHERE session_id = ? ORDER BY position, id",
                                [session_id])
        return [Bookmark(*r) for r in rows]

    def get(self, bookmark_id: int) -> Bookmark:
        rows = self.store.query(f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = ?", [bookmark_id]) if self._exists() else []
        if not rows:
            raise InputError(f"there is no bookmark {bookmark_id}")
        return Bookmark(*rows[0])

    def add(self, session_id: int, *, event_seq: int | None = None, request_id: str | None = None,
            run_id: int | None = None, title: str = "", note: str = "", position: int | None = None,
            created: str | None = None) -> Bookmark:
        """Bookmark an event (`event_seq`) or a request (`request_id`) of a session; it goes
        at the end of the walk unless `position` says where."""
        target = _target(event_seq, request_id)
        _check_text(title, "title")
        _check_text(note, "note")
        self.store.get_session(session_id)  # a clear error for a session that is not there
        with self.store.atomic() as db:
            if position is None:
                position = db.execute(f"SELECT COALESCE(MAX(position) + 1, 0) FROM {TABLE} WHERE session_id = ?",
                                      [session_id]).fetchone()[0]
            cur = db.execute(f"INSERT INTO {TABLE} (session_id, run_id, target, event_seq, request_id, position, "
                             f"title, note, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             [session_id, run_id, target, event_seq, request_id, position, title, note,
                              created or now_iso()])
            new_id = cur.lastrowid
        return self.get(new_id)

    def update(self, bookmark_id: int, *, title: str | None = None, note: str | None = None) -> Bookmark:
        self.get(bookmark_id)
        for text, name in ((title, "title"), (note, "note")):
            if text is not None:
                _check_text(text, name)
        with self.store.atomic() as db:
            if title is not None:
                db.execute(f"UPDATE {TABLE} SET title = ? WHERE id = ?", [title, bookmark_id])
            if note is not None:
                db.execute(f"UPDATE {TABLE} SET note = ? WHERE id = ?", [note, bookmark_id])
        return self.get(bookmark_id)

    def remove(self, bookmark_id: int) -> None:
        self.get(bookmark_id)
        with self.store.atomic() as db:
            db.execute(f"DELETE FROM {TABLE} WHERE id = ?", [bookmark_id])

    def move(self, bookmark_id: int, to_index: int) -> list[Bookmark]:
        """Put a bookmark at `to_index` of its session's walk; returns the new order."""
        mark = self.get(bookmark_id)
        order = [b for b in self.list(mark.session_id) if b.id != bookmark_id]
        order.insert(max(0, min(to_index, len(order))), mark)
        with self.store.atomic() as db:
            for i, b in enumerate(order):
                db.execute(f"UPDATE {TABLE} SET position = ? WHERE id = ?", [i, b.id])
        return self.list(mark.session_id)

    def step(self, session_id: int, current_id: int | None, forward: bool = True) -> Bookmark | None:
        """The next (or previous) bookmark of the walk after `current_id`, wrapping around;
        the first (or last) when nothing is current; None when there are none."""
        marks = self.list(session_id)
        if not marks:
            return None
        ids = [b.id for b in marks]
        if current_id not in ids:
            return marks[0] if forward else marks[-1]
        i = ids.index(current_id) + (1 if forward else -1)
        return marks[i % len(marks)]

    def import_rows(self, session_id: int, rows: Any, where: str = "the session file") -> int:
        """Add the bookmarks of a session file's "bookmarks" list, checked first: a bad one
        is refused naming its index and field, and none is added."""
        checked = check_rows(rows, where)
        with self.store.atomic():
            for r in checked:
                self.add(session_id, **r)
        return len(checked)


def _target(event_seq: int | None, request_id: str | None) -> str:
    if (event_seq is None) == (request_id is None):
        raise InputError("a bookmark points at an event (its seq) or at a request (its id), one of the two")
    if event_seq is not None and (isinstance(event_seq, bool) or not isinstance(event_seq, int) or event_seq < 0):
        raise InputError(f"an event's seq is a whole number from 0, not {event_seq!r}")
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise InputError(f"a request id is non-empty text, not {request_id!r}")
    return "event" if event_seq is not None else "request"


def _check_text(text: Any, name: str) -> None:
    if not isinstance(text, str):
        raise InputError(f"a bookmark's {name} is text, not {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise InputError(f"a bookmark's {name} is at most {MAX_TEXT} characters, not {len(text)}")


def check_rows(rows: Any, where: str) -> list[dict[str, Any]]:
    """The "bookmarks" list of a session file as `Bookmarks.add` arguments."""
    if not isinstance(rows, list):
        raise TraceError(where, None, "bookmarks", f"expected a list, got {type(rows).__name__}")
    out = []
    for i, r in enumerate(rows):
        field = f"bookmarks[{i}]"
        if not isinstance(r, dict):
            raise TraceError(where, None, field, f"expected an object, got {type(r).__name__}")
        args = {"event_seq": r.get("event_seq"), "request_id": r.get("request_id"),
                "title": r.get("title", ""), "note": r.get("note", ""), "created": r.get("created")}
        target = r.get("target")
        try:
            got = _target(args["event_seq"], args["request_id"])
            if target is not None and target != got:
                raise InputError(f"target {target!r} does not match what it points at ({got})")
            _check_text(args["title"], "title")
            _check_text(args["note"], "note")
            if args["created"] is not None and not isinstance(args["created"], str):
                raise InputError("created is a date as text")
        except InputError as exc:
            raise TraceError(where, None, field, str(exc)) from None
        out.append(args)
    return out


def session_file_bookmarks(store: Store, session_id: int) -> list[dict[str, Any]]:
    """The "bookmarks" list a session file carries (empty when there are none)."""
    return [b.to_dict() for b in Bookmarks(store).list(session_id)] if store.has_table(TABLE) else []


def import_bookmarks(store: Store, path: str | Path, session_ids: Sequence[int]) -> int:
    """After the session file `path` was imported as `session_ids`, add its bookmarks (a
    file of one session document; the file was read and checked by the import already)."""
    if len(session_ids) != 1:
        return 0
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return 0  # not one JSON document (a JSONL of sessions): nothing to walk
    if not isinstance(doc, dict) or "bookmarks" not in doc:
        return 0
    return Bookmarks(store).import_rows(session_ids[0], doc["bookmarks"], str(path))
