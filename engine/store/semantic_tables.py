"""The SQL of the semantic cache (`semantic_entries`) and the exact response cache
(`response_entries`): the store owns every statement, so these run under its lock and in
its transactions; `engine.semantic` keeps the indexes and the policy.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, Sequence

import sqlite_utils

from engine.core.errors import InputError


class _Statements(Protocol):
    """What the tables need of `engine.store.database.Store` (named here, not imported: the
    store imports this module)."""

    def has_table(self, name: str) -> bool: ...
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...
    def atomic(self) -> AbstractContextManager[sqlite_utils.Database]: ...

SEMANTIC_MIGRATION = "semantic-0001-entries"
RESPONSE_MIGRATION = "response-cache-0001-entries"
SEMANTIC_V1 = (
    """CREATE TABLE IF NOT EXISTS semantic_entries (
        id INTEGER PRIMARY KEY, prompt TEXT NOT NULL, response TEXT NOT NULL,
        embedding BLOB NOT NULL, dim INTEGER NOT NULL, embedding_model TEXT NOT NULL,
        model TEXT NOT NULL DEFAULT '', tenant TEXT, created REAL NOT NULL,
        last_hit REAL, hits INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS semantic_entries_by_model ON semantic_entries(embedding_model, model, tenant)",
)
RESPONSE_V1 = (
    """CREATE TABLE IF NOT EXISTS response_entries (
        key TEXT PRIMARY KEY, model TEXT NOT NULL, request TEXT NOT NULL, response TEXT NOT NULL,
        created REAL NOT NULL, last_hit REAL, hits INTEGER NOT NULL DEFAULT 0)""",
)
_ENTRY_COLUMNS = "id, prompt, response, model, tenant, created, last_hit, hits"


class SemanticTables:
    """Reads and writes of the two response caches' tables through one `Store`.

    A store opened read-only (or a file from before the tables existed, opened read-only)
    reads as empty tables, and writes are refused by the store.
    """

    __slots__ = ("store",)

    def __init__(self, store: _Statements) -> None:
        self.store = store

    def _has(self, table: str) -> bool:
        return self.store.has_table(table)

    # -- semantic_entries
    def semantic_rows(self, embedding_model: str) -> list[tuple[Any, ...]]:
        """(id, prompt, response, embedding, dim, model, tenant, created, last_hit, hits), LRU first."""
        if not self._has("semantic_entries"):
            return []
        return self.store.query(
            "SELECT id, prompt, response, embedding, dim, model, tenant, created, last_hit, hits FROM semantic_entries"
            " WHERE embedding_model = ? ORDER BY COALESCE(last_hit, created), id", [embedding_model])

    def max_semantic_id(self) -> int:
        if not self._has("semantic_entries"):
            return 0
        return self.store.query("SELECT MAX(id) FROM semantic_entries")[0][0] or 0

    def add_semantic(self, prompt: str, response: str, embedding: bytes, dim: int, embedding_model: str,
                     model: str, tenant: str | None, created: float) -> int:
        with self.store.atomic() as db:
            cur = db.execute(
                "INSERT INTO semantic_entries (prompt, response, embedding, dim, embedding_model, model, "
                "tenant, created, last_hit, hits) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, 0)",
                [prompt, response, embedding, dim, embedding_model, model, tenant, created])
            return int(cur.lastrowid)

    def touch_semantic(self, entry_id: int, now: float) -> None:
        with self.store.atomic() as db:
            db.execute("UPDATE semantic_entries SET last_hit = ?, hits = hits + 1 WHERE id = ?", [now, entry_id])

    def remove_semantic(self, entry_id: int) -> None:
        with self.store.atomic() as db:
            db.execute("DELETE FROM semantic_entries WHERE id = ?", [entry_id])

    def list_semantic(self, tenant: str | None = None, all_tenants: bool = False,
                      model: str | None = None) -> list[tuple[Any, ...]]:
        """Rows (id, prompt, response, model, tenant, created, last_hit, hits) by id."""
        if not self._has("semantic_entries"):
            return []
        sql = f"SELECT {_ENTRY_COLUMNS} FROM semantic_entries"
        where, params = [], []
        if not all_tenants:
            where.append("tenant IS ?")
            params.append(tenant)
        if model is not None:
            where.append("model = ?")
            params.append(model)
        if where:
            sql += " WHERE " + " AND ".join(where)
        return self.store.query(sql + " ORDER BY id", params)

    def delete_semantic(self, entry_ids: Sequence[int]) -> int:
        """All or nothing: an unknown id raises and deletes none."""
        marks = ",".join("?" * len(entry_ids))
        with self.store.atomic() as db:
            found = {r[0] for r in db.execute(f"SELECT id FROM semantic_entries WHERE id IN ({marks})", list(entry_ids))}
            missing = [i for i in entry_ids if i not in found]
            if missing:
                raise InputError(f"no semantic-cache entry with id {', '.join(map(str, missing))}; nothing was removed")
            db.execute(f"DELETE FROM semantic_entries WHERE id IN ({marks})", list(entry_ids))
        return len(entry_ids)

    # -- response_entries
    def response_rows(self) -> list[tuple[Any, ...]]:
        """(key, model, response, created, last_hit, hits), least recently used first."""
        if not self._has("response_entries"):
            return []
        return self.store.query("SELECT key, model, response, created, last_hit, hits FROM response_entries "
                                "ORDER BY COALESCE(last_hit, created)")

    def touch_response(self, key: str, now: float) -> None:
        with self.store.atomic() as db:
            db.execute("UPDATE response_entries SET last_hit = ?, hits = hits + 1 WHERE key = ?", [now, key])

    def put_response(self, key: str, model: str, request: str, response: str, created: float) -> None:
        with self.store.atomic() as db:
            db.execute("INSERT OR REPLACE INTO response_entries (key, model, request, response, created, last_hit, hits) "
                       "VALUES (?, ?, ?, ?, ?, NULL, 0)", [key, model, request, response, created])

    def remove_response(self, key: str) -> None:
        with self.store.atomic() as db:
            db.execute("DELETE FROM response_entries WHERE key = ?", [key])
