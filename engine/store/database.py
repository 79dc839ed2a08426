"""The module that owns Cachescope's SQLite database (sqlite-utils, WAL): `Store`.

Sessions, messages with their edit history, runs, requests, imported trace lines and the
engine's event stream. Every write is one transaction; `StoreWriter` is the single writer
thread the app feeds through a queue. Its helpers: `schema` (tables, migrations, is this
file ours), `transactions`, `rows` and `semantic_tables`; importing and replaying live in
`engine.store.sessions`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import sqlite_utils

from engine.core.errors import InputError, show_path
from engine.core.events import Event, event_from_dict
from engine.core.validation import MAX_HASH_ID, MAX_INT64, MAX_TOKEN_ID, check_block_pool, id_list
from engine.store import schema
from engine.store.rows import REQUEST_FIELDS, MessageRow, RunInfo, SessionInfo, StoredRequest
from engine.store.semantic_tables import SemanticTables
from engine.store.transactions import BUSY_TIMEOUT_S, Atomic, retry_busy, write_error

DB_ENV = "CACHESCOPE_DB"
Migration = Callable[[sqlite_utils.Database], None]


def default_db_path() -> Path:
    """`$CACHESCOPE_DB` if set, else `cachescope.db` in the user data directory."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("cachescope")) / "cachescope.db"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# ---------------------------------------------------------------------------- damaged rows
# A row is checked as it is read, so a file damaged by another program (broken JSON in a
# column, a text where a number belongs) is one sentence naming the row and the column,
# not a traceback in whatever code meets the value first.
class DamagedError(InputError):
    """A stored value that is not what Cachescope wrote: the file is damaged."""


def _damaged(where: str, row: str, column: str, problem: str) -> DamagedError:
    return DamagedError(f"{where}: {row}, field '{column}' {problem}; the database is damaged "
                        f"(fix or delete that row, or import the session again)")


_FRAME_COLUMNS = ("source", "server", "rank", "seq", "time", "payload")
_FRAME_TYPES = (str, str, int, int, (int, float), (bytes, type(None)))


def _kind_of(value: Any) -> str:
    return {int: "an integer", float: "a real number", str: "text", bytes: "a blob",
            type(None): "NULL"}.get(type(value), type(value).__name__)


def _json_column(text: Any, where: str, row: str, column: str, want: type | tuple[type, ...] | None = None,
                 nullable: bool = True) -> Any:
    if text is None:
        if nullable:
            return None
        raise _damaged(where, row, column, "is NULL")
    if not isinstance(text, str):
        raise _damaged(where, row, column, f"holds {_kind_of(text)}, not JSON text")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _damaged(where, row, column, f"is not valid JSON ({str(exc).split(';')[0][:80]})") from None
    if want is not None and not isinstance(value, want):
        names = {dict: "an object", list: "a list"}
        wanted = " or ".join(names.get(t, t.__name__) for t in (want if isinstance(want, tuple) else (want,)))
        raise _damaged(where, row, column, f"holds JSON {type(value).__name__}, not {wanted}")
    return value


def _column(value: Any, where: str, row: str, column: str, want: type, nullable: bool = False,
            lo: int | None = None) -> Any:
    if value is None and nullable:
        return None
    if not isinstance(value, want) or isinstance(value, bool):
        raise _damaged(where, row, column, f"holds {_kind_of(value)}, not {_kind_of(want())}")
    if lo is not None and value < lo:
        raise _damaged(where, row, column, f"is {value}, below {lo}")
    return value


# ---------------------------------------------------------------------------- store
class Store:
    """The Cachescope database. Thread-safe: one lock serialises every statement.

    `path=None` opens the default database (`default_db_path()`); ":memory:" is allowed
    for tests. A file that is not a Cachescope database is refused before anything is
    written to it (`engine.store.schema`). Writes are grouped with `atomic()`: one
    `BEGIN IMMEDIATE` transaction that waits for other processes' writers instead of
    failing; nested calls join it. `read_only=True` (the read commands) never writes and
    never takes the write lock; a missing file then reads as an empty database.
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False) -> None:
        self.read_only = read_only
        self.path = Path(path) if path not in (None, ":memory:") else (None if path == ":memory:" else default_db_path())
        self._lock = threading.RLock()
        self._depth = 0
        conn = self._connect(path is None)
        self.db = sqlite_utils.Database(conn)
        try:
            if self.path is not None and not self._in_memory_stand_in:
                try:
                    state = self._read_state(conn)
                except InputError:
                    if not read_only:
                        raise
                    conn.close()
                    conn = self._connect_immutable()  # a read-only mount: no -shm can be made
                    self.db = sqlite_utils.Database(conn)
                    state = self._read_state(conn)
                schema.check_ours(conn, state, self._where)
                if read_only and state.is_empty:  # an empty file reads as an empty database
                    conn.close()
                    conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                    self.db = sqlite_utils.Database(conn)
                    self._in_memory_stand_in = True
            if read_only and not self._in_memory_stand_in:
                conn.execute("PRAGMA query_only=1")
            else:
                self.read_only = False  # the stand-in of a missing file gets the schema, then reads
                self._initialise()
                self.read_only = read_only
        except BaseException:
            conn.close()
            raise

    # -- opening
    _in_memory_stand_in = False

    def _connect(self, is_default: bool) -> sqlite3.Connection:
        def connect(target: str, **kw: Any) -> sqlite3.Connection:
            return sqlite3.connect(target, check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None, **kw)

        if self.path is None:
            return connect(":memory:")
        where = self.path
        shown = show_path(where)
        if where.is_dir():
            raise InputError(f"{shown} is a directory, not a database file")
        if where.exists() and not where.is_file():
            raise InputError(f"{shown} is not a regular file (a device or a pipe), so it cannot hold a database")
        if not where.exists():
            if self.read_only:
                # Nothing to read: an empty stand-in, so that listing a new database shows
                # nothing instead of creating a file (or a mistyped folder).
                self._in_memory_stand_in = True
                return connect(":memory:")
            if not where.parent.is_dir():
                if not is_default:
                    raise InputError(f"cannot create the database {shown}: the folder {show_path(where.parent)} does not exist")
                where.parent.mkdir(parents=True, exist_ok=True)
        try:
            if self.read_only:
                return connect(f"{where.resolve().as_uri()}?mode=ro", uri=True)
            return connect(str(where))
        except (OSError, sqlite3.Error) as exc:
            raise InputError(f"cannot open the database {shown}: {exc}") from None

    def _connect_immutable(self) -> sqlite3.Connection:
        """A read-only connection to a database in a place nothing can be written (a
        read-only mount, a folder we may not write): SQLite's `mode=ro` still needs to
        create the -shm file of a WAL database there, `immutable=1` does not. It reads
        the main file only, so a write-ahead log still holding commits is refused."""
        assert self.path is not None
        wal = Path(f"{self.path}-wal")
        try:
            pending = wal.stat().st_size > 0
        except OSError:
            pending = False
        if pending:
            raise InputError(f"cannot read the database {show_path(self.path)} here: it cannot be opened for writing "
                             f"(a read-only file system?) and its write-ahead log {show_path(wal)} holds commits not "
                             f"yet in the file; open it once where it can be written, then read it here")
        try:
            return sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1", uri=True,
                                   check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise InputError(f"cannot open the database {show_path(self.path)}: {exc}") from None

    def _read_state(self, conn: sqlite3.Connection) -> schema.FileState:
        try:
            return schema.read_state(conn)
        except sqlite3.OperationalError as exc:  # e.g. a WAL file in a folder we may not write
            raise InputError(f"cannot open the database {self._where}: {exc}; it was not changed") from None
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{self._where} is not a Cachescope database ({exc}); it was not changed") from None

    def _initialise(self) -> None:
        """Schema, WAL and header on a file that is ours (or empty), then sweep dead runs."""
        conn = self.db.conn
        try:
            conn.execute("PRAGMA foreign_keys=ON")
            if self.path is not None:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    retry_busy(lambda: conn.execute("PRAGMA journal_mode=WAL"))
                # NORMAL is durable across process crashes in WAL mode; only a power
                # loss can drop the last commits.
                conn.execute("PRAGMA synchronous=NORMAL")
            if "schema_migrations" not in self._tables():
                with self.atomic() as db:
                    db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied TEXT NOT NULL)")
                    # In the same commit as the first table: another process opening the
                    # file between this commit and the first migration's must see it as
                    # ours (a table without our header or migrations reads as foreign).
                    db.execute(f"PRAGMA application_id={schema.APPLICATION_ID}")
            for name, statements in schema.MIGRATIONS:
                self.register_migration(name, lambda db, statements=statements: [db.execute(s) for s in statements])
            state = schema.read_state(conn)
            if (state.application_id, state.user_version) != (schema.APPLICATION_ID, schema.SCHEMA_VERSION):
                with self.atomic() as db:
                    db.execute(f"PRAGMA application_id={schema.APPLICATION_ID}")
                    db.execute(f"PRAGMA user_version={schema.SCHEMA_VERSION}")
            self._abort_dead_runs()
        except sqlite3.OperationalError as exc:
            error = write_error(exc, self.path)
            if isinstance(error, InputError):
                raise error from None
            raise InputError(f"cannot set up the database {self._where}: {exc}") from None

    def _abort_dead_runs(self) -> None:
        running = self.query("SELECT id, owner FROM runs WHERE status = 'running'")
        dead = [run_id for run_id, owner in running if schema.owner_is_gone(owner)]
        if dead:
            with self.atomic() as db:
                db.execute(f"UPDATE runs SET status = 'aborted' WHERE status = 'running' AND id IN "
                           f"({','.join('?' * len(dead))})", dead)

    # -- plumbing
    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def atomic(self):
        """`with store.atomic() as db:` groups writes into one transaction (holding the lock)."""
        if self.read_only:
            raise RuntimeError("this store was opened read-only")
        return Atomic(self)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one read statement, under the store's lock (no transaction, no write lock)."""
        with self._lock:
            return list(self.db.conn.execute(sql, list(params)))

    def _tables(self) -> set[str]:
        return {r[0] for r in self.query("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def has_table(self, name: str) -> bool:
        return name in self._tables()

    @property
    def semantic(self) -> SemanticTables:
        """The semantic and exact response caches' tables (`engine.store.semantic_tables`)."""
        return SemanticTables(self)

    def register_migration(self, name: str, fn: Migration) -> bool:
        """Run `fn(db)` once per database, in a transaction; returns True if it ran now.

        The check is a plain read first, so opening an up-to-date database never takes
        the write lock; it is repeated inside the transaction, since another process may
        have applied the migration meanwhile.
        """
        if self.read_only:
            return False
        applied = "SELECT 1 FROM schema_migrations WHERE name = ?"
        if self.query(applied, [name]):
            return False
        with self.atomic() as db:
            if db.execute(applied, [name]).fetchone():
                return False
            fn(db)
            db.execute("INSERT INTO schema_migrations (name, applied) VALUES (?, ?)", [name, now_iso()])
            return True

    def applied_migrations(self) -> list[str]:
        if not self.has_table("schema_migrations"):
            return []
        return [r[0] for r in self.query("SELECT name FROM schema_migrations ORDER BY rowid")]

    def integrity_check(self) -> str:
        return self.query("PRAGMA integrity_check")[0][0]

    # -- sessions
    def create_session(self, title: str, kind: str = "chat", *, model: str | None = None,
                       block_size: int = 16, capacity_blocks: int = 4096, seed: int | None = 0,
                       hash: str = "sha256", created: str | None = None, source_path: str | None = None,
                       source_format: str | None = None, settings: dict[str, Any] | None = None) -> int:
        """Add an empty session and return its id."""
        if kind not in ("chat", "trace"):
            raise ValueError(f"a session is 'chat' or 'trace', not {kind!r}")
        if not (1 <= block_size <= MAX_INT64 and 1 <= capacity_blocks <= MAX_INT64):
            raise InputError(f"block size and capacity must be from 1 to {MAX_INT64}")
        if seed is not None and not -MAX_INT64 - 1 <= seed <= MAX_INT64:
            raise InputError(f"the seed must fit in 64 bits, not {seed}")
        check_block_pool(capacity_blocks, "a pool")
        with self.atomic():
            cur = self.db.execute(
                "INSERT INTO sessions (title, kind, model, block_size, capacity_blocks, seed, hash, created,"
                " source_path, source_format, settings) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [title, kind, model, block_size, capacity_blocks, seed, hash, created or now_iso(),
                 source_path, source_format, _dumps(settings or {})])
            return int(cur.lastrowid)

    # Named columns, never s.*: a column added by a later schema must not shift the others.
    _SESSION_SQL = (f"SELECT {', '.join('s.' + c for c in schema.SESSION_COLUMNS)},"
                    " (SELECT COUNT(DISTINCT position) FROM messages m WHERE m.session_id = s.id),"
                    " (SELECT COUNT(*) FROM runs r WHERE r.session_id = s.id) FROM sessions s")

    @property
    def _where(self) -> str:
        return show_path(self.path) if self.path is not None else "the database"

    def _session(self, row: Sequence[Any]) -> SessionInfo:
        w, r = self._where, f"session {row[0]}"
        _column(row[0], w, "a session", "id", int)
        kind = _column(row[2], w, r, "kind", str)
        if kind not in ("chat", "trace"):
            raise _damaged(w, r, "kind", f"is {kind[:40]!r}, not 'chat' or 'trace'")
        for i, name, want, nullable in ((1, "title", str, False), (3, "model", str, True), (7, "hash", str, False),
                                        (8, "created", str, False), (9, "source_path", str, True),
                                        (10, "source_format", str, True)):
            _column(row[i], w, r, name, want, nullable)
        _column(row[4], w, r, "block_size", int, lo=1)
        _column(row[5], w, r, "capacity_blocks", int, lo=1)
        _column(row[6], w, r, "seed", int, nullable=True)
        settings = _json_column(row[11], w, r, "settings", dict)
        return SessionInfo(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8],
                           row[9], row[10], settings or {}, row[12], row[13])

    def list_sessions(self) -> list[SessionInfo]:
        """Every session, oldest first, with its message and run counts."""
        with self._lock:
            return [self._session(r) for r in self.db.execute(self._SESSION_SQL + " ORDER BY s.id")]

    def get_session(self, session_id: int) -> SessionInfo:
        """The session `session_id`; raises `InputError` when there is none."""
        with self._lock:
            row = self.db.execute(self._SESSION_SQL + " WHERE s.id = ?", [session_id]).fetchone()
        if row is None:
            raise InputError(f"there is no session {session_id} in {self._where if self.path else 'this database'}")
        return self._session(row)

    def update_session(self, session_id: int, **fields: Any) -> None:
        """Change settings columns of a session (title, capacity_blocks, seed, settings, ...)."""
        allowed = {"title", "model", "block_size", "capacity_blocks", "seed", "hash", "settings"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"cannot update {', '.join(sorted(bad))} of a session")
        self.get_session(session_id)
        if "settings" in fields:
            fields["settings"] = _dumps(fields["settings"])
        with self.atomic():
            sets = ", ".join(f"{k} = ?" for k in fields)
            self.db.execute(f"UPDATE sessions SET {sets} WHERE id = ?", [*fields.values(), session_id])

    def delete_session(self, session_id: int) -> None:
        """Delete a session with its messages, runs, requests and events."""
        self.get_session(session_id)
        with self.atomic():
            for table in ("events", "requests"):
                self.db.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT id FROM runs WHERE session_id = ?)",
                                [session_id])
            self.db.execute("DELETE FROM runs WHERE session_id = ?", [session_id])
            for table in ("messages", "trace_requests"):
                self.db.execute(f"DELETE FROM {table} WHERE session_id = ?", [session_id])
            self.db.execute("DELETE FROM sessions WHERE id = ?", [session_id])

    # -- messages
    def _message(self, row: Sequence[Any], current: bool) -> MessageRow:
        w, r = self._where, f"session {row[1]}, message {row[2]} version {row[3]}"
        for i, name in ((4, "role"), (5, "content"), (7, "created")):
            _column(row[i], w, r, name, str)
        extra = _json_column(row[6], w, r, "extra", dict)
        return MessageRow(row[0], row[1], row[2], row[3], row[4], row[5], extra, row[7], current)

    def messages(self, session_id: int, include_history: bool = False) -> list[MessageRow]:
        """The current version of every message in position order; with `include_history`,
        every version (ordered by position, then version) with `is_current` marking the latest."""
        with self._lock:
            rows = list(self.db.execute(
                "SELECT id, session_id, position, version, role, content, extra, created FROM messages"
                " WHERE session_id = ? ORDER BY position, version", [session_id]))
        latest: dict[int, int] = {}
        for r in rows:
            _column(r[2], self._where, f"session {session_id}, a message", "position", int, lo=0)
            _column(r[3], self._where, f"session {session_id}, message {r[2]}", "version", int, lo=1)
            latest[r[2]] = r[3]
        out = [self._message(r, latest[r[2]] == r[3]) for r in rows]
        return out if include_history else [m for m in out if m.is_current]

    def add_message(self, session_id: int, role: str, content: str, extra: dict[str, Any] | None = None,
                    *, position: int | None = None, version: int = 1, created: str | None = None) -> MessageRow:
        """Append a message (or, with `position`/`version`, store one version as given)."""
        if not isinstance(content, str):
            raise ValueError("message content must be text")
        with self.atomic():
            if position is None:
                position = self.db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE session_id = ?",
                                            [session_id]).fetchone()[0]
            created = created or now_iso()
            cur = self.db.execute(
                "INSERT INTO messages (session_id, position, version, role, content, extra, created)"
                " VALUES (?,?,?,?,?,?,?)", [session_id, position, version, role, content, _dumps(extra), created])
            return MessageRow(int(cur.lastrowid), session_id, position, version, role, content, extra, created, True)

    def edit_message(self, session_id: int, position: int, content: str, role: str | None = None) -> MessageRow:
        """Store a new version of message `position`; the older versions are kept."""
        with self.atomic():  # read the latest version and write the next one under one write lock
            current = {m.position: m for m in self.messages(session_id)}
            if position not in current:
                n = len(current)
                raise InputError(f"session {session_id} has no message {position}; messages are numbered 0 to {n - 1}")
            old = current[position]
            extra = old.extra if content == old.content else _edited_extra(old.extra)
            return self.add_message(session_id, role or old.role, content, extra,
                                    position=position, version=old.version + 1)

    # -- trace lines of a trace session
    def add_trace_requests(self, session_id: int, requests: Iterable[Any]) -> int:
        """Store `engine.core.trace.TraceRequest`s of a trace session; returns how many."""
        count = 0

        def rows() -> Iterable[tuple[Any, ...]]:
            # One row at a time: the JSON text of a 50 MB line exists only while it is written.
            nonlocal count
            for r in requests:
                count += 1
                yield (session_id, r.index, r.line, r.id, r.tenant, _dumps(list(r.tokens) if r.tokens is not None else None),
                       _dumps(list(r.output_tokens) if r.output_tokens is not None else None),
                       _dumps(list(r.hash_ids) if r.hash_ids is not None else None), r.input_length, r.output_length,
                       r.timestamp)

        with self.atomic():
            self.db.conn.executemany("INSERT INTO trace_requests VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows())
        return count

    def num_trace_requests(self, session_id: int) -> int:
        with self._lock:
            return self.db.execute("SELECT COUNT(*) FROM trace_requests WHERE session_id = ?", [session_id]).fetchone()[0]

    def trace_requests(self, session_id: int) -> list[Any]:
        """The `TraceRequest`s of a trace session, in file order."""
        from engine.core.trace import TraceRequest

        w = self._where

        def tup(r: Sequence[Any], i: int, name: str, hi: int) -> tuple[int, ...] | None:
            row = f"session {session_id}, trace line {r[0]}"
            ids = _json_column(r[i], w, row, name, list)
            if ids is None:
                return None
            try:
                return id_list(ids, w, None, name, hi)
            except InputError as exc:
                raise _damaged(w, row, name, str(exc).split(": ", 1)[-1]) from None

        def request(r: Sequence[Any]) -> Any:
            row = f"session {session_id}, trace line {r[0]}"
            _column(r[1], w, row, "line", int, nullable=True)
            _column(r[2], w, row, "request_id", str)
            _column(r[3], w, row, "tenant", str, nullable=True)
            for i, name in ((7, "input_length"), (8, "output_length")):
                _column(r[i], w, row, name, int, lo=0)
            if r[9] is not None and not isinstance(r[9], (int, float)):
                raise _damaged(w, row, "timestamp", f"holds {_kind_of(r[9])}, not a number")
            tokens, hash_ids = tup(r, 4, "tokens", MAX_TOKEN_ID), tup(r, 6, "hash_ids", MAX_HASH_ID)
            if (tokens is None) == (hash_ids is None):
                raise _damaged(w, row, "tokens", "and 'hash_ids' are both set or both NULL")
            return TraceRequest(r[0], r[1], r[2], r[3], tokens, tup(r, 5, "output_tokens", MAX_TOKEN_ID), hash_ids,
                                r[7], r[8], r[9])

        with self._lock:
            rows = self.db.execute("SELECT idx, line, request_id, tenant, tokens, output_tokens, hash_ids,"
                                   " input_length, output_length, timestamp FROM trace_requests"
                                   " WHERE session_id = ? ORDER BY idx", [session_id])
            # One row's JSON at a time: a trace of 50 MB lines is never held twice as text.
            return [request(r) for r in rows]

    # -- runs, requests, events
    def create_run(self, session_id: int | None, kind: str = "replay", config: dict[str, Any] | None = None) -> int:
        """Open a run (a replay, an edit re-run or a live chat) and return its id."""
        with self.atomic():
            cur = self.db.execute("INSERT INTO runs (session_id, kind, created, config, owner) VALUES (?,?,?,?,?)",
                                  [session_id, kind, now_iso(), _dumps(config or {}), schema.process_owner()])
            return int(cur.lastrowid)

    def finish_run(self, run_id: int, totals: dict[str, Any] | None = None) -> None:
        with self.atomic():
            self.db.execute("UPDATE runs SET status = 'done', totals = ? WHERE id = ?", [_dumps(totals), run_id])

    def runs(self, session_id: int | None = None) -> list[RunInfo]:
        """Runs of one session (or all), oldest first."""
        sql = "SELECT id, session_id, kind, created, config, totals, status FROM runs"
        with self._lock:
            rows = list(self.db.execute(sql + (" WHERE session_id = ?" if session_id is not None else "") + " ORDER BY id",
                                        [session_id] if session_id is not None else []))
        w = self._where
        return [RunInfo(r[0], r[1], r[2], r[3], _json_column(r[4], w, f"run {r[0]}", "config", dict) or {},
                        _json_column(r[5], w, f"run {r[0]}", "totals", dict), r[6]) for r in rows]

    def record_request(self, run_id: int, idx: int, **fields: Any) -> int:
        """Persist one served request of a run (fields: see `REQUEST_FIELDS`); returns its row id."""
        bad = set(fields) - set(REQUEST_FIELDS)
        if bad:
            raise ValueError(f"unknown request fields: {', '.join(sorted(bad))}")
        values = {k: fields.get(k) for k in REQUEST_FIELDS}
        for k in ("prompt_token_ids", "output_token_ids"):
            if values[k] is not None:
                values[k] = _dumps(list(values[k]))
        values["request_id"] = str(values["request_id"] if values["request_id"] is not None else idx)
        values["refused"] = int(bool(values["refused"]))
        for k in ("prompt_tokens", "cached_tokens", "computed_tokens"):
            values[k] = int(values[k] or 0)
        cols = ", ".join(("run_id", "idx", *REQUEST_FIELDS, "created"))
        marks = ", ".join("?" * (len(REQUEST_FIELDS) + 3))
        with self.atomic():
            cur = self.db.execute(f"INSERT INTO requests ({cols}) VALUES ({marks})",
                                  [run_id, idx, *values.values(), now_iso()])
            return int(cur.lastrowid)

    def requests(self, run_id: int) -> list[StoredRequest]:
        """The requests of a run, in request order."""
        cols = ", ".join(("id", "run_id", "idx", *REQUEST_FIELDS, "created"))
        with self._lock:
            rows = list(self.db.execute(f"SELECT {cols} FROM requests WHERE run_id = ? ORDER BY idx", [run_id]))
        out = []
        for r in rows:
            r = list(r)
            row = f"run {run_id}, request {r[2]}"
            r[5] = _json_column(r[5], self._where, row, "prompt_token_ids", list)
            r[6] = _json_column(r[6], self._where, row, "output_token_ids", list)
            r[18] = bool(r[18])
            out.append(StoredRequest(*r))
        return out

    def record_events(self, run_id: int, events: Iterable[Event | dict[str, Any]]) -> int:
        """Append engine events (objects or `to_dict()` dicts) to a run; returns how many."""
        rows = []
        for e in events:
            d = e.to_dict() if isinstance(e, Event) else e
            rows.append((run_id, d["seq"], d["kind"], d["time"], _dumps(d)))
        with self.atomic():
            self.db.conn.executemany("INSERT INTO events (run_id, seq, kind, time, payload) VALUES (?,?,?,?,?)", rows)
        return len(rows)

    def event_dicts(self, run_id: int, since_seq: int = -1, limit: int | None = None) -> list[dict[str, Any]]:
        """Events of a run as `Event.to_dict()` dicts, in sequence order, after `since_seq`."""
        sql = "SELECT payload FROM events WHERE run_id = ? AND seq > ? ORDER BY seq"
        params: list[Any] = [run_id, since_seq]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._lock:
            return [_json_column(r[0], self._where, f"run {run_id}, an event", "payload", dict, nullable=False)
                    for r in self.db.execute(sql, params)]

    def events(self, run_id: int, since_seq: int = -1, limit: int | None = None) -> list[Event]:
        """Events of a run rebuilt as engine `Event` objects, in sequence order."""
        return [event_from_dict(d) for d in self.event_dicts(run_id, since_seq, limit)]

    def record_frames(self, run_id: int, frames: Iterable[tuple[int, str, str, int, int, float, bytes | None]]) -> int:
        """Append a recorded attach's frames to a run: rows of (idx, source, server, rank,
        seq, time, payload), payload None for a restart (the `frames` table); how many."""
        rows = [(run_id, *f) for f in frames]
        with self.atomic():
            self.db.conn.executemany("INSERT INTO frames (run_id, idx, source, server, rank, seq, time, payload) "
                                     "VALUES (?,?,?,?,?,?,?,?)", rows)
        return len(rows)

    def num_frames(self, run_id: int) -> int:
        """How many frames (restarts included) a run recorded; 0 for a file from before frames."""
        if not self.has_table("frames"):
            return 0
        return self.query("SELECT COUNT(*) FROM frames WHERE run_id = ?", [run_id])[0][0]

    def frames(self, run_id: int, chunk: int = 4096) -> Iterator[list[tuple[str, str, int, int, float, bytes | None]]]:
        """A run's frames in the order they were recorded, `chunk` rows at a time: lists of
        (source, server, rank, seq, time, payload); a payload that is not bytes (a damaged
        file) raises InputError naming the run and the frame."""
        last = -1
        while True:
            with self._lock:
                rows = self.db.execute("SELECT idx, source, server, rank, seq, time, payload FROM frames "
                                       "WHERE run_id = ? AND idx > ? ORDER BY idx LIMIT ?", [run_id, last, chunk]).fetchall()
            if not rows:
                return
            for row in rows:
                for column, value, want in zip(_FRAME_COLUMNS, row[1:], _FRAME_TYPES):
                    if not isinstance(value, want) or isinstance(value, bool):
                        raise _damaged(self._where, f"run {run_id}, frame {row[0]}", column, f"holds {_kind_of(value)}")
            last = rows[-1][0]
            yield [r[1:] for r in rows]

    def count(self, table: str) -> int:
        """Rows in one of the store's tables (used by tests and `sessions show`)."""
        if not self.has_table(table):
            if table in schema.OUR_TABLES:
                return 0  # a file from before that table, opened read-only
            raise ValueError(f"no table {table!r}")
        return self.query(f"SELECT COUNT(*) FROM [{table}]")[0][0]

    def abort_run(self, run_id: int) -> None:
        """Mark a run that failed in this process as aborted (its committed requests stay)."""
        with self.atomic():
            self.db.execute("UPDATE runs SET status = 'aborted' WHERE id = ? AND status = 'running'", [run_id])


def _edited_extra(extra: dict[str, Any] | None) -> dict[str, Any] | None:
    # Structured content (tool calls, content blocks) no longer matches edited text.
    if not extra:
        return extra
    kept = {k: v for k, v in extra.items() if k not in ("blocks", "tool_calls", "parts")}
    return kept or None


__all__ = ["Store", "SessionInfo", "MessageRow", "RunInfo", "StoredRequest", "default_db_path"]
