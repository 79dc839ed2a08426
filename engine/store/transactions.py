"""Transactions of the store: `BEGIN IMMEDIATE` under the store's lock, waiting for other
processes' writers instead of failing, and SQLite's lock and read-only errors said as one
sentence. Only `engine.store.database` uses this module.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
import threading
from typing import Any, Callable, Protocol

import sqlite_utils

from engine.core.errors import InputError


class _Transactional(Protocol):
    """What `Atomic` needs of `engine.store.database.Store` (named here, not imported: the
    store imports this module)."""

    db: sqlite_utils.Database
    path: Path | None
    _lock: threading.RLock
    _depth: int


class Atomic:
    """The store's lock plus one `BEGIN IMMEDIATE` transaction (savepoints when nested).

    IMMEDIATE takes the write lock at the start, waiting (busy timeout, then retries) for
    another process's writer; a deferred transaction that reads and then writes could
    instead fail at once with "database is locked" when the other writer commits first.
    """

    __slots__ = ("store", "_savepoint")

    def __init__(self, store: _Transactional) -> None:
        self.store = store
        self._savepoint: str | None = None

    def __enter__(self) -> sqlite_utils.Database:
        store = self.store
        store._lock.acquire()
        try:
            conn = store.db.conn
            if store._depth == 0:
                retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
            else:
                self._savepoint = f"cachescope_{store._depth}"
                conn.execute(f"SAVEPOINT {self._savepoint}")
            store._depth += 1
            return store.db
        except sqlite3.OperationalError as exc:
            store._lock.release()
            raise write_error(exc, store.path) from None
        except BaseException:
            store._lock.release()
            raise

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        store = self.store
        conn = store.db.conn
        try:
            store._depth -= 1
            if exc_type is None:
                if self._savepoint:
                    conn.execute(f"RELEASE SAVEPOINT {self._savepoint}")
                else:
                    try:
                        conn.execute("COMMIT")
                    except sqlite3.OperationalError as error:
                        conn.rollback()
                        raise write_error(error, store.path) from None
            elif conn.in_transaction:
                if self._savepoint:
                    conn.execute(f"ROLLBACK TO SAVEPOINT {self._savepoint}")
                    conn.execute(f"RELEASE SAVEPOINT {self._savepoint}")
                else:
                    conn.rollback()
        finally:
            store._lock.release()


BUSY_TIMEOUT_S = 30.0  # SQLite waits this long for another process's write lock...
LOCK_WAIT_S = 300.0    # ...and the store retries that wait until this much time has passed


def retry_busy(statement: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.01
    while True:
        try:
            return statement()
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if ("locked" not in text and "busy" not in text) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def write_error(exc: sqlite3.OperationalError, path: Path | None) -> BaseException:
    text = str(exc)
    if "readonly" in text or "read-only" in text:
        return InputError(f"cannot write to the database {path}: the file (or its folder) is read-only")
    if "locked" in text or "busy" in text:
        return InputError(f"the database {path} stayed locked by another process for {LOCK_WAIT_S:.0f} s; "
                          "nothing was written")
    return exc
