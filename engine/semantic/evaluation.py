"""Quality of the semantic cache on labelled prompt pairs: precision and false-hit rate.

A pairs file is JSONL of `{"a", "b", "same", "category"}`. A pair is a hit when the cosine
of its embeddings reaches the threshold; guarded mode also requires no risk flag. The
command line lives in `app.commands.semantic`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from engine.core import validation
from engine.core.errors import InputError, TraceError
from engine.semantic.risk import RiskFlag, risk_flags

DEFAULT_THRESHOLDS = (0.70, 0.75, 0.80, 0.85, 0.90, 0.95)
CATEGORIES = ("paraphrase", "negation", "changed_number", "changed_entity", "unrelated")


@dataclass(slots=True, frozen=True)
class LabelledPair:
    a: str
    b: str
    same: bool  # True: one answer serves both prompts
    category: str
    line: int


def load_pairs(path: str | Path) -> list[LabelledPair]:
    """Read a pairs file; a bad line raises `TraceError` naming the file, line and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a pairs file") from None
    except UnicodeDecodeError:
        raise TraceError(path, None, None, "not UTF-8 text; a pairs file is JSONL") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    pairs: list[LabelledPair] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        obj = validation.loads(raw, str(path), number)
        if not isinstance(obj, dict):
            raise TraceError(path, number, None, 'expected an object {"a", "b", "same", "category"}')
        for key in ("a", "b"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise TraceError(path, number, key, "missing or not a non-empty string")
        if not isinstance(obj.get("same"), bool):
            raise TraceError(path, number, "same", "missing or not true/false")
        category = obj.get("category", "uncategorised")
        if not isinstance(category, str) or not category:
            raise TraceError(path, number, "category", "not a non-empty string")
        pairs.append(LabelledPair(obj["a"], obj["b"], obj["same"], category, number))
    if not pairs:
        raise TraceError(path, None, None, "holds no pairs")
    return pairs


def parse_thresholds(text: str) -> list[float]:
    """'0.75,0.8,0.9' -> [0.75, 0.8, 0.9]; each must lie in [0, 1]."""
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise InputError(f"threshold {part!r} is not a number; give a list such as 0.75,0.8,0.9") from None
        if not 0.0 <= value <= 1.0:
            raise InputError(f"threshold {value} is outside 0..1")
        values.append(value)
    if not values:
        raise InputError("give at least one threshold")
    return sorted(set(values))


def pair_scores(pairs: Sequence[LabelledPair], embedder: Any) -> np.ndarray:
    """Cosine of each pair, embedding every distinct text once in one batch."""
    texts = list(dict.fromkeys(t for p in pairs for t in (p.a, p.b)))
    rows = {t: i for i, t in enumerate(texts)}
    vecs = embedder.encode(texts)
    a = vecs[[rows[p.a] for p in pairs]]
    b = vecs[[rows[p.b] for p in pairs]]
    return np.einsum("ij,ij->i", a, b).astype(np.float64)


def pair_flags(pairs: Sequence[LabelledPair]) -> list[list[RiskFlag]]:
    return [risk_flags(p.a, p.b) for p in pairs]


def _rates(hits: np.ndarray, same: np.ndarray) -> dict[str, Any]:
    num_hits = int(hits.sum())
    true_hits = int((hits & same).sum())
    num_same = int(same.sum())
    return {
        "hits": num_hits,
        "precision": true_hits / num_hits if num_hits else None,
        "recall": true_hits / num_same if num_same else None,
        "false_hit_rate": (num_hits - true_hits) / num_hits if num_hits else None,
    }


def evaluate(pairs: Sequence[LabelledPair], scores: Sequence[float], flags: Sequence[Sequence[RiskFlag]],
             thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """The eval JSON: per threshold precision, recall, false-hit rate, per category, guarded."""
    if not (len(pairs) == len(scores) == len(flags)):
        raise ValueError("pairs, scores and flags must have the same length")
    scores_arr = np.asarray(scores, dtype=np.float64)
    same = np.array([p.same for p in pairs], dtype=bool)
    flagged = np.array([bool(f) for f in flags], dtype=bool)
    categories = list(dict.fromkeys(p.category for p in pairs))
    cat_of = np.array([p.category for p in pairs])
    rows = []
    for t in thresholds:
        hits = scores_arr >= t
        guarded_hits = hits & ~flagged
        row = {"threshold": t, **_rates(hits, same)}
        by_category = {}
        for c in categories:
            mask = cat_of == c
            n = int(mask.sum())
            by_category[c] = {"pairs": n, "hits": int(hits[mask].sum()), "hit_rate": float(hits[mask].mean()),
                              "guarded_hits": int(guarded_hits[mask].sum()),
                              "guarded_hit_rate": float(guarded_hits[mask].mean())}
        row["by_category"] = by_category
        guarded = _rates(guarded_hits, same)
        guarded["flagged_hits"] = int((hits & flagged).sum())
        row["guarded"] = guarded
        rows.append(row)
    per_category_flagged = {c: float(flagged[cat_of == c].mean()) for c in categories}
    return {
        "pairs": len(pairs),
        "categories": {c: int((cat_of == c).sum()) for c in categories},
        "flagged_share": per_category_flagged,
        "thresholds": rows,
        "scores": [round(float(s), 6) for s in scores_arr],
        "flags": [[str(f) for f in fl] for fl in flags],
    }


def evaluate_file(path: str | Path, embedder: Any, thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    pairs = load_pairs(path)
    return evaluate(pairs, pair_scores(pairs, embedder), pair_flags(pairs), thresholds)
