"""The store's schema, its migrations, and the check that a database file is ours.

A Cachescope database says so in its SQLite header (`PRAGMA application_id`) and carries
its schema version in `PRAGMA user_version`. A file that is neither empty nor ours is
refused before anything writes to it; a newer schema is refused naming the version it has.
The semantic tables' statements live in `engine.store.semantic_tables`.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from dataclasses import dataclass

from engine.core.errors import InputError
from engine.store import semantic_tables

APPLICATION_ID = 0x43534350  # "CSCP" in the header's application id field
SCHEMA_VERSION = 3

CORE_V1 = (
    """CREATE TABLE IF NOT EXISTS sessions (
        id INTEGER PRIMARY KEY, title TEXT NOT NULL, kind TEXT NOT NULL,
        model TEXT, block_size INTEGER NOT NULL, capacity_blocks INTEGER NOT NULL,
        seed INTEGER, hash TEXT NOT NULL, created TEXT NOT NULL,
        source_path TEXT, source_format TEXT, settings TEXT NOT NULL DEFAULT '{}')""",
    """CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY,
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        position INTEGER NOT NULL, version INTEGER NOT NULL, role TEXT NOT NULL,
        content TEXT NOT NULL, extra TEXT, created TEXT NOT NULL,
        UNIQUE (session_id, position, version))""",
    """CREATE TABLE IF NOT EXISTS trace_requests (
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL, line INTEGER, request_id TEXT NOT NULL, tenant TEXT,
        tokens TEXT, output_tokens TEXT, hash_ids TEXT, input_length INTEGER NOT NULL,
        output_length INTEGER NOT NULL, timestamp REAL, PRIMARY KEY (session_id, idx))""",
    """CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY,
        session_id INTEGER REFERENCES sessions(id) ON DELETE CASCADE,
        kind TEXT NOT NULL, created TEXT NOT NULL, config TEXT NOT NULL DEFAULT '{}',
        totals TEXT, status TEXT NOT NULL DEFAULT 'running')""",
    """CREATE TABLE IF NOT EXISTS requests (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL, request_id TEXT NOT NULL, tenant TEXT,
        prompt_token_ids TEXT, output_token_ids TEXT, prompt_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL, computed_tokens INTEGER NOT NULL,
        miss_reason TEXT, first_miss_block INTEGER, divergence_token INTEGER,
        message_position INTEGER, ttft_ms REAL, prefill_ms REAL, decode_ms REAL,
        output_text TEXT, refused INTEGER NOT NULL DEFAULT 0, created TEXT NOT NULL,
        UNIQUE (run_id, idx))""",
    """CREATE TABLE IF NOT EXISTS events (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL, kind TEXT NOT NULL, time REAL NOT NULL, payload TEXT NOT NULL,
        PRIMARY KEY (run_id, seq))""",
    "CREATE INDEX IF NOT EXISTS messages_by_session ON messages(session_id, position)",
    "CREATE INDEX IF NOT EXISTS runs_by_session ON runs(session_id)",
)
# Which process runs a run ("host:pid:start time"), so a run whose process died can be
# told from one still going and marked aborted.
CORE_V2 = ("ALTER TABLE runs ADD COLUMN owner TEXT",)
# A recorded attach's frames as its servers sent them (`attach --record`): each delivered
# batch's msgpack payload, in the order the streams delivered them (`idx`), with the stream
# it came on (its pool's source, server and rank), its batch number and when it came; a
# row with no payload says the stream's server restarted there (a fresh pool from `seq`).
CORE_V3 = (
    """CREATE TABLE IF NOT EXISTS frames (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL, source TEXT NOT NULL, server TEXT NOT NULL, rank INTEGER NOT NULL,
        seq INTEGER NOT NULL, time REAL NOT NULL, payload BLOB, PRIMARY KEY (run_id, idx))""",
)

# (name, statements) in order; a name is recorded once applied and never runs twice. The
# semantic tables keep the names their modules registered before the store owned them.
MIGRATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core-0001-initial", CORE_V1),
    (semantic_tables.SEMANTIC_MIGRATION, semantic_tables.SEMANTIC_V1),
    (semantic_tables.RESPONSE_MIGRATION, semantic_tables.RESPONSE_V1),
    ("core-0002-run-owner", CORE_V2),
    ("core-0003-frames", CORE_V3),
)
OUR_TABLES = frozenset({"schema_migrations", "sessions", "messages", "trace_requests", "runs", "requests", "events",
                        "semantic_entries", "response_entries", "frames"})
SESSION_COLUMNS = ("id", "title", "kind", "model", "block_size", "capacity_blocks", "seed", "hash", "created",
                   "source_path", "source_format", "settings")


@dataclass(slots=True, frozen=True)
class FileState:
    """What the header and catalogue of a database file say, read without writing."""

    application_id: int
    user_version: int
    tables: frozenset[str]

    @property
    def is_empty(self) -> bool:
        return not self.tables and self.application_id == 0 and self.user_version == 0


def read_state(conn: sqlite3.Connection) -> FileState:
    """The header and the tables, read in one transaction so that they are one snapshot:
    read apart, another process's first commit (its `schema_migrations` table with our
    application id) could fall between them and show a table under no header, which reads
    as a file that is not ours."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = frozenset(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                           if not r[0].startswith("sqlite_"))
    finally:
        if own:
            conn.execute("COMMIT")
    return FileState(app_id, version, tables)


def check_ours(conn: sqlite3.Connection, state: FileState, where: str) -> None:
    """Refuse a database that is not a Cachescope one, or is from a newer Cachescope.

    Files written before the application id existed are recognised by their tables: only
    ours, with our `sessions` columns and our first migration recorded.
    """
    unchanged = "it was not changed"
    if state.application_id not in (0, APPLICATION_ID):
        raise InputError(f"{where} belongs to another program (SQLite application id {state.application_id:#x}), "
                         f"not Cachescope; {unchanged}")
    if state.application_id == 0 and not state.is_empty:
        foreign = sorted(state.tables - OUR_TABLES)
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise InputError(f"{where} is not a Cachescope database (it has tables {shown}); {unchanged}")
        if "schema_migrations" not in state.tables or not _has_first_migration(conn):
            raise InputError(f"{where} is not a Cachescope database (its tables were not made by Cachescope); "
                             f"{unchanged}")
        if "sessions" in state.tables:
            columns = tuple(r[1] for r in conn.execute("PRAGMA table_info(sessions)"))
            if columns[:len(SESSION_COLUMNS)] != SESSION_COLUMNS and state.user_version <= SCHEMA_VERSION:
                raise InputError(f"{where} has a 'sessions' table that is not Cachescope's; {unchanged}")
    if state.user_version > SCHEMA_VERSION:
        raise InputError(f"{where} was written by a newer Cachescope (schema version {state.user_version}); "
                         f"this one reads up to version {SCHEMA_VERSION}: update Cachescope to open it")


def _has_first_migration(conn: sqlite3.Connection) -> bool:
    try:
        return conn.execute("SELECT 1 FROM schema_migrations WHERE name = 'core-0001-initial'").fetchone() is not None
    except sqlite3.DatabaseError:
        return False


def process_owner() -> str:
    """'host:pid:start' for this process; the start time tells a reused pid apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _start_time(pid: int) -> str:
    try:
        import psutil

        return f"{psutil.Process(pid).create_time():.3f}"
    except Exception:  # noqa: BLE001 - gone, or no psutil: compared as text only
        return "?"


def owner_is_gone(owner: str | None) -> bool:
    """True when the process that owned a run no longer runs (on this host)."""
    if not owner:
        return True  # runs from before owners were recorded cannot still be running here
    host, _, rest = owner.partition(":")
    pid_text, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False  # another machine's run (a shared folder): not ours to judge
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return start not in ("?", _start_time(pid))

