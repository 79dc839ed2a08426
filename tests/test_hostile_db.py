"""Issue 13, items 2 and 4: databases that are not ours are refused unchanged; a newer
schema is refused by version; read commands never write; dead runs are marked aborted;
many processes share one database without "database is locked"."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli import main
from engine.core.errors import InputError
from engine.store.database import Store
from engine.store.schema import APPLICATION_ID, SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "resources" / "sessions" / "mt_bench_81_writing.cachescope.json"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def firefox_like(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT);"
                       "CREATE TABLE moz_bookmarks (id INTEGER PRIMARY KEY, fk INTEGER);"
                       "INSERT INTO moz_places (url) VALUES ('https://example.org');")
    conn.close()
    return path


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cachescope: error: "), err
    return err


@pytest.mark.parametrize("argv", [
    ["sessions", "list"], ["sessions", "show", "1"], ["sessions", "import", str(SESSION)],
    ["semantic", "list"], ["semantic", "remove", "1"],
])
def test_a_foreign_database_is_refused_and_left_byte_for_byte(tmp_path, capsys, argv):
    db = firefox_like(tmp_path / "places.sqlite")
    before = digest(db)
    assert main([*argv, "--db", str(db)]) == 2
    assert "not a Cachescope database" in one_error_line(capsys)
    assert digest(db) == before
    assert not Path(str(db) + "-wal").exists()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0


def test_a_sessions_table_that_is_not_ours_is_refused(tmp_path, capsys):
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE sessions (token TEXT PRIMARY KEY, expires INTEGER)")
    conn.commit()
    conn.close()
    before = digest(db)
    assert main(["sessions", "import", str(SESSION), "--db", str(db)]) == 2
    assert "not made by Cachescope" in one_error_line(capsys)
    assert digest(db) == before


def test_another_programs_application_id_is_refused(tmp_path):
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA application_id=1234")
    conn.execute("CREATE TABLE sessions (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(InputError, match="another program"):
        Store(db)


def test_a_newer_schema_is_refused_naming_its_version(tmp_path, capsys):
    db = tmp_path / "newer.db"
    with Store(db) as store:
        store.create_session("kept", "chat")
        store.db.execute("ALTER TABLE sessions ADD COLUMN colour TEXT")
        store.db.execute("PRAGMA user_version=9")
    before = digest(db)
    for argv in (["sessions", "list"], ["sessions", "import", str(SESSION)]):
        assert main([*argv, "--db", str(db)]) == 2
        err = one_error_line(capsys)
        assert "schema version 9" in err and f"up to version {SCHEMA_VERSION}" in err
    assert digest(db) == before
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 9


def test_a_pre_application_id_database_is_still_ours_and_upgraded(tmp_path):
    db = tmp_path / "old.db"
    with Store(db) as store:
        sid = store.create_session("old", "chat")
        store.db.execute("PRAGMA application_id=0")
        store.db.execute("PRAGMA user_version=1")
    with Store(db) as store:
        assert store.get_session(sid).title == "old"
        assert store.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_an_empty_file_is_initialised(tmp_path):
    db = tmp_path / "empty.db"
    db.touch()
    with Store(db) as store:
        assert store.list_sessions() == []
    assert sqlite3.connect(db).execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


def test_read_commands_create_nothing_and_a_mistyped_folder_is_an_error(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "cachescope.db"
    assert main(["sessions", "list", "--db", str(missing)]) == 0
    assert main(["semantic", "list", "--db", str(missing)]) == 0
    capsys.readouterr()
    assert not missing.parent.exists()
    assert main(["sessions", "import", str(SESSION), "--db", str(missing)]) == 2
    assert "does not exist" in one_error_line(capsys)
    assert not missing.parent.exists()


def test_reads_do_not_change_the_file(tmp_path, capsys):
    db = tmp_path / "c.db"
    assert main(["sessions", "import", str(SESSION), "--db", str(db)]) == 0
    capsys.readouterr()
    with Store(db) as store:
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = digest(db)
    for argv in (["sessions", "list"], ["sessions", "show", "1"], ["sessions", "export", "1"], ["semantic", "list"]):
        assert main([*argv, "--db", str(db)]) == 0
    capsys.readouterr()
    assert digest(db) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_a_read_only_database_is_one_sentence(tmp_path, capsys):
    db = tmp_path / "ro.db"
    Store(db).close()
    db.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        assert main(["sessions", "import", str(SESSION), "--db", str(db)]) == 2
        assert "read-only" in one_error_line(capsys)
        assert main(["sessions", "list", "--db", str(db)]) == 0
    finally:
        tmp_path.chmod(0o755)


def test_a_run_whose_process_died_is_marked_aborted_on_the_next_open(tmp_path):
    db = tmp_path / "runs.db"
    code = ("import os, sys; from engine.store.database import Store\n"
            "s = Store(sys.argv[1]); s.create_run(None, 'replay'); print('ready', flush=True)\n"
            "import time; time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(db)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    with Store(db) as store:
        assert [r.status for r in store.runs()] == ["running"]  # its process is alive
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with Store(db) as store:
        assert [r.status for r in store.runs()] == ["aborted"]
        mine = store.create_run(None, "replay")
    with Store(db) as store:
        assert store.runs()[-1].id == mine and store.runs()[-1].status == "running"  # this process is alive


# ---------------------------------------------------------------------------- processes
def _spawn(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app", *argv], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_parallel_imports_into_a_new_database_all_succeed(tmp_path):
    db = tmp_path / "new.db"
    procs = [_spawn("sessions", "import", str(SESSION), "--db", str(db), "--title", f"p{i}") for i in range(8)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert [rc for rc, _ in results] == [0] * 8, [err for rc, err in results if rc]
    assert all("locked" not in err for _, err in results)
    with Store(db, read_only=True) as store:
        assert sorted(s.title for s in store.list_sessions()) == sorted(f"p{i}" for i in range(8))
        assert store.integrity_check() == "ok"


class _OpenedWhileAnotherCreates(sqlite3.Connection):
    """A connection that, right after its first read of the header, lets another process's
    first commit in (the `schema_migrations` table with the application id): the moment a
    second `cachescope sessions import` reaches a new database that the first is creating."""

    interloper: Path | None = None

    def execute(self, sql, *args):
        cursor = super().execute(sql, *args)
        if sql == "PRAGMA application_id" and self.interloper is not None:
            other, self.interloper = sqlite3.connect(self.interloper, isolation_level=None, timeout=0.5), None
            other.execute("BEGIN IMMEDIATE")
            other.execute("CREATE TABLE schema_migrations (name TEXT PRIMARY KEY, applied TEXT NOT NULL)")
            other.execute(f"PRAGMA application_id={APPLICATION_ID}")
            other.execute("COMMIT")
            other.close()
        return cursor


def test_a_database_read_while_another_process_makes_it_is_read_whole(tmp_path, monkeypatch):
    """The header and the tables are read in one snapshot: read apart, the other process's
    first commit between them showed its table under no header, and the file was refused
    as "not a Cachescope database" (one of eight parallel imports exited 2 in CI)."""
    db = tmp_path / "new.db"
    first = sqlite3.connect(db, isolation_level=None)
    first.execute("PRAGMA journal_mode=WAL")  # what the first process does before its first commit
    first.close()
    connect = sqlite3.connect

    def interleaved(target, *args, **kw):
        conn = connect(target, *args, factory=_OpenedWhileAnotherCreates, **kw)
        conn.interloper = db
        return conn

    monkeypatch.setattr("engine.store.database.sqlite3.connect", interleaved)
    with Store(db) as store:
        store.create_session("after", "chat")
    monkeypatch.undo()
    with Store(db, read_only=True) as store:
        assert [s.title for s in store.list_sessions()] == ["after"]
        assert store.integrity_check() == "ok"


def test_parallel_edits_of_one_session_all_succeed(tmp_path):
    db = tmp_path / "edits.db"
    with Store(db) as store:
        sid = store.create_session("chat", "chat")
        for role, text in (("system", "Be brief."), ("user", "Hello"), ("assistant", "Hi")):
            store.add_message(sid, role, text)
    code = ("import sys; from engine.store.database import Store\n"
            "with Store(sys.argv[1]) as s:\n"
            "    for k in range(20):\n"
            "        s.add_message(1, 'user', f'{sys.argv[2]}-{k}')\n"
            "        s.edit_message(1, 1, f'edit {sys.argv[2]}-{k}')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db), str(i)], env=ENV, stderr=subprocess.PIPE, text=True)
             for i in range(6)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert [rc for rc, _ in results] == [0] * 6, results
    with Store(db, read_only=True) as store:
        history = store.messages(sid, include_history=True)
        assert len([m for m in history if m.position == 1]) == 1 + 6 * 20
        assert len(store.messages(sid)) == 3 + 6 * 20


def test_a_reader_does_not_wait_for_a_writer(tmp_path, capsys):
    db = tmp_path / "busy.db"
    with Store(db) as store:
        store.create_session("there", "chat")
    # Another process holds the write lock (an open IMMEDIATE transaction) until told to stop.
    code = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE'); c.execute(\"UPDATE sessions SET title = 'x'\")\n"
            "print('holding', flush=True); sys.stdin.readline(); c.execute('ROLLBACK')\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert main(["sessions", "list", "--db", str(db), "--json"]) == 0
        assert [s["title"] for s in json.loads(capsys.readouterr().out)["sessions"]] == ["there"]
        # A writer waits for the lock instead of failing; release it from a timer.
        import threading

        threading.Timer(0.5, lambda: (holder.stdin.write("\n"), holder.stdin.flush())).start()
        with Store(db) as store:
            store.create_session("after", "chat")
            assert [s.title for s in store.list_sessions()] == ["there", "after"]
    finally:
        holder.wait(timeout=60)


def test_the_store_owns_every_sql_statement():
    """No module outside engine/store talks to SQLite (so every statement runs under the
    store's lock, in its transactions, and with its checks)."""
    import re

    pattern = re.compile(r"import sqlite3|\.execute\(|\.executemany\(|\.executescript\(")
    offenders = [str(p.relative_to(ROOT)) for folder in ("engine", "app") for p in (ROOT / folder).rglob("*.py")
                 if "engine/store" not in p.as_posix() and pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
