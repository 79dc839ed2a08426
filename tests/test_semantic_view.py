"""The Semantic cache panel, both directions: cache to view (events, results) and view to cache."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("pytestqt")

from app.runtime.context import engine_info, make_test_context  # noqa: E402
from app.views.tools.semantic_view import SemanticView  # noqa: E402
from engine.semantic.cache import Embedder, SemanticCache  # noqa: E402

STORED = [
    ("How do I reverse a list in Python?", "Use lst[::-1] or lst.reverse()."),
    ("How do I remove duplicates from a list in Python?", "list(dict.fromkeys(lst)) keeps the order."),
    ("Convert 5 miles to kilometers.", "5 miles is about 8.05 km."),
    ("Is it safe to take ibuprofen with alcohol?", "It raises the risk of stomach bleeding; ask a pharmacist."),
    ("What is the capital of Australia?", "Canberra."),
    ("Why is the sky blue?", "Rayleigh scattering of sunlight."),
    ("How do I sort a list of dictionaries by a key in Python?", "sorted(rows, key=lambda r: r['k'])."),
    ("Write a haiku about autumn leaves.", "Red leaves drift and fall..."),
]


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture
def cache(embedder):
    c = SemanticCache(embedder, threshold=0.9)
    for prompt, response in STORED:
        c.add(prompt, response)
    return c


def test_view_to_model_lookup_slider_and_guard(qtbot, tmp_path, cache):
    ctx = make_test_context(tmp_path)
    view = SemanticView(ctx, cache)
    qtbot.addWidget(view)
    try:
        assert view.threshold == 0.9 and not view.guard.isChecked()
        view.prompt.setText("How do I not reverse a list in Python?")
        with qtbot.waitSignal(view.sigLookedUp, timeout=30_000):
            view.lookup_button.click()
        assert view.table.rowCount() == 5
        assert view.table.item(0, 1).text() == STORED[0][0]
        assert "negation: not" in view.table.item(0, 2).text()
        assert view.decision == "hit" and view.served_id == 1  # ~0.95 passes a plain 0.90 threshold

        view.guard.setChecked(True)  # view -> model
        assert cache.guard is True
        assert view.decision == "guarded_miss" and "GUARDED" in view.decision_label.text()

        view.guard.setChecked(False)
        view.slider.setValue(97)  # the decision is replayed live for the new threshold
        assert cache.threshold == pytest.approx(0.97)
        assert view.decision == "miss" and view.served_id is None
        assert view.threshold_label.text() == "0.97"
    finally:
        ctx.shutdown()


def test_model_to_view_through_the_bridge(qtbot, tmp_path, embedder):
    ctx = make_test_context(tmp_path)
    bus = ctx.new_event_bus(engine_info(block_size=16, num_blocks=64))
    cache = SemanticCache(embedder, threshold=0.85, events=bus)
    for prompt, response in STORED:
        cache.add(prompt, response)
    view = SemanticView(ctx, cache)
    qtbot.addWidget(view)
    try:
        cache.set_guard(True)
        cache.lookup("Convert 50 miles to kilometers.")  # the engine side, as a worker would
        qtbot.waitUntil(lambda: view.result is not None, timeout=10_000)
        assert view.prompt.text() == "Convert 50 miles to kilometers."
        assert view.threshold == 0.85 and view.guard.isChecked()
        assert view.table.item(0, 1).text() == "Convert 5 miles to kilometers."
        assert "number" in view.table.item(0, 2).text()
        assert view.decision in ("miss", "guarded_miss")
        # Stored entries are drawn once per change, via setData on the same item.
        assert len(view.entries_item.data) == len(STORED)
        cache.add("How many cups are in a gallon?", "16 cups.")
        qtbot.waitUntil(lambda: len(view.entries_item.data) == len(STORED) + 1, timeout=10_000)
    finally:
        ctx.shutdown()


def test_worker_lookup_quality_and_screenshot(qtbot, tmp_path, embedder, cache):
    ctx = make_test_context(tmp_path)
    view = SemanticView(ctx, cache)
    qtbot.addWidget(view)
    view.resize(760, 640)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in [
        {"a": "How do I reverse a list in Python?", "b": "What's the easiest way to reverse a Python list?", "same": True, "category": "paraphrase"},
        {"a": "How do I reverse a list in Python?", "b": "How do I not reverse a list in Python?", "same": False, "category": "negation"},
        {"a": "Convert 5 miles to kilometers.", "b": "Convert 50 miles to kilometers.", "same": False, "category": "changed_number"},
    ]))
    try:
        with qtbot.waitSignal(view.sigQualityReady, timeout=60_000):
            view.measure_quality(pairs)
        view.set_threshold(0.92)
        text = view.quality_label.text()
        assert "plain: precision 0.50" in text and "guarded: precision 1.00" in text
        view.prompt.setText("What's the easiest way to reverse a Python list?")
        with qtbot.waitSignal(view.sigLookedUp, timeout=60_000):
            view.look_up()
        assert view.decision == "hit" and view.served_id == 1
        path = os.environ.get("CACHESCOPE_SCREENSHOT_DIR")
        target = (tmp_path if not path else __import__("pathlib").Path(path)) / "semantic.png"
        assert view.grab().save(str(target))
        assert target.stat().st_size > 10_000
    finally:
        ctx.shutdown()


def test_empty_prompt_is_reported_not_raised(qtbot, tmp_path, cache):
    ctx = make_test_context(tmp_path)
    view = SemanticView(ctx, cache)
    qtbot.addWidget(view)
    try:
        view.look_up()
        assert ctx.errors == ["type a prompt to look up"]
    finally:
        ctx.shutdown()
