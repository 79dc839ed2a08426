"""Labelled pairs, the eval metrics, the shipped sets' results and `cachescope semantic`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.cli import main
from engine.core.errors import TraceError
from engine.semantic.cache import Embedder
from engine.resources import resource_path
from engine.semantic.evaluation import (
    CATEGORIES, LabelledPair, evaluate, evaluate_file, load_pairs, pair_flags,
)


@pytest.fixture(scope="session")
def embedder():
    return Embedder()


@pytest.fixture(scope="session")
def heldout(embedder):
    return evaluate_file(resource_path("semantic_pairs_heldout.jsonl"), embedder,
                         thresholds=[0.7, 0.75, 0.8, 0.85, 0.9, 0.95])


def test_shipped_sets_are_large_labelled_and_disjoint():
    dev = load_pairs(resource_path("semantic_pairs.jsonl"))
    held = load_pairs(resource_path("semantic_pairs_heldout.jsonl"))
    assert len(dev) >= 300 and len(held) >= 120
    for pairs in (dev, held):
        assert {p.category for p in pairs} == set(CATEGORIES)
        assert all(p.same == (p.category == "paraphrase") for p in pairs)
        assert len({(p.a, p.b) for p in pairs}) == len(pairs)
    dev_texts = {t for p in dev for t in (p.a, p.b)}
    assert not dev_texts & {t for p in held for t in (p.a, p.b)}


def test_metrics_by_hand():
    pairs = [LabelledPair("a", "b", True, "paraphrase", 1), LabelledPair("c", "d", True, "paraphrase", 2),
             LabelledPair("e", "f", False, "negation", 3), LabelledPair("g", "h", False, "unrelated", 4)]
    flags = [[], [], ["negation: not"], []]
    out = evaluate(pairs, [0.95, 0.80, 0.92, 0.10], flags, thresholds=[0.85, 0.5])
    hi, lo = out["thresholds"]
    assert (hi["precision"], hi["recall"], hi["false_hit_rate"]) == (0.5, 0.5, 0.5)
    assert hi["guarded"]["precision"] == 1.0 and hi["guarded"]["recall"] == 0.5
    assert lo["precision"] == pytest.approx(2 / 3) and lo["recall"] == 1.0
    assert lo["by_category"]["negation"] == {"pairs": 1, "hits": 1, "hit_rate": 1.0, "guarded_hits": 0, "guarded_hit_rate": 0.0}
    assert out["scores"] == [0.95, 0.8, 0.92, 0.1] and out["pairs"] == 4
    none = evaluate(pairs, [0.1] * 4, flags, thresholds=[0.9])["thresholds"][0]
    assert none["precision"] is None and none["recall"] == 0.0


def test_heldout_guarded_target_and_plain_threshold_failure(heldout):
    rows = heldout["thresholds"]
    # No threshold fixes negations and changed numbers: plain precision stays under 0.5.
    assert all(r["precision"] is None or r["precision"] < 0.5 for r in rows), [r["precision"] for r in rows]
    # The risk flags as a gate do: precision >= 0.9 with recall >= 0.6 at some threshold.
    met = [r["threshold"] for r in rows if r["guarded"]["precision"] and r["guarded"]["precision"] >= 0.9
           and r["guarded"]["recall"] >= 0.6]
    assert met, [(r["threshold"], r["guarded"]) for r in rows]
    # Negations and changed numbers really do score like paraphrases on this model.
    pairs = load_pairs(resource_path("semantic_pairs_heldout.jsonl"))
    scores = np.array(heldout["scores"])
    by_cat = {c: np.median(scores[[p.category == c for p in pairs]]) for c in ("paraphrase", "negation", "changed_number")}
    assert by_cat["negation"] > by_cat["paraphrase"] - 0.05 and by_cat["changed_number"] > 0.8


def test_flags_catch_the_hard_negatives_of_the_dev_set():
    pairs = load_pairs(resource_path("semantic_pairs.jsonl"))
    flags = pair_flags(pairs)
    share = {c: np.mean([bool(f) for p, f in zip(pairs, flags) if p.category == c]) for c in CATEGORIES}
    assert share["negation"] >= 0.9 and share["changed_number"] >= 0.9 and share["changed_entity"] >= 0.75
    assert share["paraphrase"] <= 0.1


@pytest.mark.parametrize("line,where", [
    ('{"a": "x", "b": "y"}', "line 1, field 'same'"),
    ('{"a": "", "b": "y", "same": true}', "line 1, field 'a'"),
    ('not json', "line 1: not valid JSON"),
    ('["a", "b"]', "line 1: expected an object"),
])
def test_bad_pairs_files_name_line_and_field(tmp_path, line, where):
    path = tmp_path / "pairs.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TraceError, match=where.replace("(", r"\(")):
        load_pairs(path)


def test_cli_eval_json(tmp_path, capsys, embedder):
    path = tmp_path / "pairs.jsonl"
    rows = [{"a": "How do I reverse a list in Python?", "b": "What's the easiest way to reverse a Python list?", "same": True, "category": "paraphrase"},
            {"a": "Convert 5 miles to kilometers.", "b": "Convert 50 miles to kilometers.", "same": False, "category": "changed_number"},
            {"a": "Who painted the Mona Lisa?", "b": "How do I make pancakes?", "same": False, "category": "unrelated"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["semantic", "eval", str(path), "--thresholds", "0.8,0.95", "--guard", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pairs"] == 3 and [t["threshold"] for t in out["thresholds"]] == [0.8, 0.95]
    first = out["thresholds"][0]
    assert set(first) >= {"threshold", "precision", "recall", "false_hit_rate", "by_category", "guarded"}
    assert set(first["guarded"]) >= {"precision", "recall", "false_hit_rate"}
    expected = embedder.encode([rows[0]["a"], rows[0]["b"]])
    assert out["scores"][0] == pytest.approx(float(expected[0] @ expected[1]), abs=1e-4)
    assert first["precision"] == 0.5 and first["guarded"]["precision"] == 1.0


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": "x", "b": "y", "same": "yes"}\n')
    assert main(["semantic", "eval", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 1" in err and "'same'" in err
    assert main(["semantic", "eval", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["semantic", "eval", "heldout", "--thresholds", "0.8,2"]) == 2


@pytest.mark.model
def test_cli_store_round_trip(tmp_path, capsys):
    db = str(tmp_path / "c.db")
    assert main(["semantic", "add", "Why is the sky blue?", "Rayleigh scattering.", "--db", db, "--tenant", "t1"]) == 0
    assert main(["semantic", "query", "What makes the sky look blue?", "--db", db, "--tenant", "t1", "--json"]) == 0
    capsys.readouterr()
    assert main(["semantic", "query", "What makes the sky look blue?", "--db", db, "--tenant", "t1",
                 "--threshold", "0.8", "--guard", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["decision"] == "hit" and result["response"] == "Rayleigh scattering."
    assert main(["semantic", "list", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"entries": []}  # tenant None sees nothing of t1
    assert main(["semantic", "list", "--db", db, "--tenant", "t1", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["entries"]
    # `semantic query` reads without the write lock (issue 13), so it does not count its hits.
    assert entry["hits"] == 0 and entry["tenant"] == "t1"
    assert main(["semantic", "remove", str(entry["id"] + 1), "--db", db]) == 2
    assert main(["semantic", "remove", str(entry["id"]), "--db", db]) == 0
