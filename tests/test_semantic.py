"""The semantic cache on the real all-MiniLM-L6-v2: index, decisions, flags, persistence, events."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.errors import InputError
from engine.core.events import EventBus, event_from_dict
from engine.semantic.cache import Embedder, Neighbour, SemanticCache, VectorIndex, decide, list_entries
from engine.store.database import Store
from engine.semantic.risk import RiskFlag


@pytest.fixture(scope="session")
def embedder():
    return Embedder()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_embeddings_are_unit_length_and_paraphrases_are_close(embedder):
    v = embedder.encode(["How do I reverse a list in Python?", "What's the easiest way to reverse a Python list?",
                         "Who painted the Mona Lisa?"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > 0.85 > 0.3 > v[0] @ v[2]


@pytest.mark.parametrize("exact_below", [1, 10_000])
def test_index_add_remove_search_matches_numpy(exact_below):
    rng = np.random.default_rng(7)
    vecs = rng.standard_normal((600, 32)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = VectorIndex(32, exact_below=exact_below)
    index.add(np.arange(100, 700), vecs)
    assert index.uses_ann == (exact_below == 1)
    for k in range(100, 700, 3):
        index.remove(k)
    kept = np.array([k for k in range(100, 700) if (k - 100) % 3])
    assert len(index) == len(kept) and 100 not in index and 101 in index
    correct = 0
    for q in vecs[:50]:
        scores = vecs[kept - 100] @ q
        best = int(kept[np.argmax(scores)])
        (key, score), *_ = index.search(q, 3)
        correct += key == best
        assert score == pytest.approx(float(scores.max()), abs=1e-4) or key != best
    assert correct >= 49
    with pytest.raises(ValueError, match="already"):
        index.add([101], vecs[:1])


def test_decide_serves_best_unflagged_in_guarded_mode():
    flag = RiskFlag("negation", ("not",), "")
    ns = [Neighbour(1, 0.95, "a", "A", (flag,)), Neighbour(2, 0.91, "b", "B"), Neighbour(3, 0.5, "c", "C")]
    assert decide(ns, 0.9, guard=False) == ("hit", ns[0])
    assert decide(ns, 0.9, guard=True) == ("hit", ns[1])
    assert decide(ns, 0.93, guard=True) == ("guarded_miss", None)
    assert decide(ns, 0.96, guard=True) == ("miss", None)


def test_lookup_flags_negation_and_guard_refuses_it(embedder):
    bus = EventBus()
    events = []
    bus.subscribe(events.append)
    cache = SemanticCache(embedder, threshold=0.85, events=bus)
    kept = cache.add("How do I reverse a list in Python?", "Use lst[::-1] or lst.reverse().")
    cache.add("Convert 5 miles to kilometers.", "5 miles is about 8.05 km.")

    para = cache.lookup("What's the easiest way to reverse a Python list?")
    assert para.hit and para.served.entry_id == kept and para.served.flags == ()

    neg = cache.lookup("How do I not reverse a list in Python?")
    assert neg.decision == "hit"  # plain threshold: the negation scores ~0.95
    assert [f.kind for f in neg.served.flags] == ["negation"] and neg.served.flags[0].words == ("not",)
    cache.set_guard(True)
    guarded = cache.lookup("How do I not reverse a list in Python?")
    assert guarded.decision == "guarded_miss" and guarded.response is None

    number = cache.lookup("Convert 50 miles to kilometers.")
    assert number.neighbours[0].flags and number.neighbours[0].flags[0].kind == "number"
    assert number.decision in ("miss", "guarded_miss")

    kinds = [e.kind for e in events]
    assert kinds.count("semantic_stored") == 2 and kinds.count("semantic_lookup") == 4
    lookup = [e for e in events if e.kind == "semantic_lookup"][2]
    assert lookup.decision == "guarded_miss" and lookup.guard and lookup.flags == ("negation: not",)
    assert event_from_dict(lookup.to_dict()) == lookup


def test_miss_reuses_the_lookup_embedding(embedder):
    class CountingEmbedder:
        def __init__(self, inner):
            self.inner, self.calls, self.name, self.dim = inner, 0, inner.name, inner.dim

        def encode_one(self, text):
            self.calls += 1
            return self.inner.encode_one(text)

    counting = CountingEmbedder(embedder)
    cache = SemanticCache(counting, threshold=0.8)
    answer, result = cache.get_or_compute("What causes the seasons on Earth?", lambda p: "Axial tilt.")
    assert not result.hit and answer == "Axial tilt." and counting.calls == 1
    answer, result = cache.get_or_compute("Why does Earth have seasons?", lambda p: pytest.fail("computed"))
    assert result.hit and answer == "Axial tilt." and counting.calls == 2


def test_threshold_is_live_and_validated(embedder):
    cache = SemanticCache(embedder)
    cache.add("Why is the sky blue?", "Rayleigh scattering.")
    assert cache.lookup("What makes the sky look blue?").hit  # ~0.95
    cache.set_threshold(0.99)
    assert not cache.lookup("What makes the sky look blue?").hit
    with pytest.raises(InputError, match="between 0 and 1"):
        cache.set_threshold(1.5)
    with pytest.raises(InputError):
        cache.lookup("   ")


def test_tenants_and_models_are_isolated(embedder):
    cache = SemanticCache(embedder, threshold=0.8)
    cache.add("What is the capital of Australia?", "Canberra.", tenant="acme")
    assert cache.lookup("What is the capital of Australia?", tenant="acme").hit
    assert cache.lookup("What is the capital of Australia?", tenant="globex").neighbours == ()
    assert cache.lookup("What is the capital of Australia?").neighbours == ()


def test_persistence_ttl_and_lru(tmp_path, embedder):
    path = tmp_path / "cache.db"
    clock = Clock()
    bus = EventBus()
    evicted = []
    bus.subscribe(lambda e: evicted.append((e.entry_id, e.reason)) if e.kind == "semantic_evicted" else None)
    cache = SemanticCache(embedder, Store(path), model="smollm2", max_entries=3, ttl_seconds=3600, clock=clock, events=bus)
    ids = [cache.add(p, r) for p, r in [("Why is the sky blue?", "Scattering."),
                                        ("Who painted the Mona Lisa?", "Leonardo da Vinci."),
                                        ("What is the speed of light?", "299,792 km/s.")]]
    clock.now += 10
    assert cache.lookup("Which artist painted the Mona Lisa?").hit  # refreshes entry 2
    cache.add("How many cups are in a gallon?", "16.")  # evicts the least recently used: entry 1
    assert evicted == [(ids[0], "lru")]
    assert [e.id for e in cache.entries()] == ids[1:] + [ids[2] + 1]

    again = SemanticCache(embedder, Store(path), model="smollm2", clock=clock)
    assert len(again) == 3
    hit = again.lookup("Which artist painted the Mona Lisa?")
    assert hit.hit and hit.response == "Leonardo da Vinci."
    stored = {e.id: e for e in list_entries(Store(path))}
    assert stored[ids[1]].hits == 2 and stored[ids[1]].last_hit == clock.now
    assert np.allclose(again.embedding(ids[1]), embedder.encode_one("Who painted the Mona Lisa?"), atol=1e-5)

    clock.now += 4000  # past the time to live
    expiring = SemanticCache(embedder, Store(path), model="smollm2", ttl_seconds=3600, clock=clock, events=bus)
    assert len(expiring) == 0 and list_entries(Store(path)) == []
    assert sorted(i for i, r in evicted if r == "ttl") == ids[1:] + [ids[2] + 1]


def test_bench_measure_compares_graph_with_brute_force():
    from engine.bench.semantic import DIM, measure, random_dataset

    rng = np.random.default_rng(3)
    vectors, queries = random_dataset(3000, rng)
    assert vectors.shape == (3000, DIM)
    out = measure(vectors, queries)
    assert out["entries"] == 3000 and out["queries"] == len(queries)
    assert out["recall_at_1"] >= 0.99  # near-duplicate queries: the graph finds the original
    assert out["ann"]["p50_ms"] > 0 and out["numpy_brute_force"]["p50_ms"] > 0
