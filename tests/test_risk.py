"""Risk flags: each names the words that triggered it; paraphrases stay unflagged."""

from __future__ import annotations

import pytest

from engine.semantic.risk import risk_flags


def kinds(a, b):
    return {f.kind: f.words for f in risk_flags(a, b)}


@pytest.mark.parametrize("a,b,kind,words", [
    ("How do I reverse a list in Python?", "How do I not reverse a list in Python?", "negation", {"not"}),
    ("Why doesn't my code compile?", "Why does my code compile?", "negation", {"not"}),
    ("Is it safe to take ibuprofen with alcohol?", "Is it unsafe to take ibuprofen with alcohol?", "negation", {"safe", "unsafe"}),
    ("Does coffee raise blood pressure?", "Does coffee lower blood pressure?", "negation", {"raise", "lower"}),
    ("What's the cheapest flight to Tokyo?", "What's the most expensive flight to Tokyo?", "negation", {"cheapest", "most expensive"}),
    ("The price increased by 10%", "The price decreases by 10 percent", "negation", {"increased", "decreases"}),
    ("Convert 5 miles to kilometers", "Convert 50 miles to kilometers", "number", {"5 miles", "50 miles"}),
    ("Convert 5 miles to kilometers", "Convert 5 km to miles", "number", {"5 miles", "5 km"}),
    ("Book a table for 2 at 7pm", "Book a table for two at 8pm", "number", {"7 pm", "8 pm"}),
    ("How much RAM does a 16GB laptop need?", "How much RAM does a 32 GB laptop need?", "number", {"16 GB", "32 GB"}),
    ("Give me one reason to learn Rust", "Give me two reasons to learn Rust", "number", {"one", "two"}),
    ("What is the capital of France?", "What is the capital of Germany?", "entity", {"France", "Germany"}),
    ("Paris or London: which is bigger?", "Berlin or London: which is bigger?", "entity", {"Paris", "Berlin"}),
    ('Translate "good morning" into Spanish', 'Translate "good night" into Spanish', "entity", {'"good morning"', '"good night"'}),
    ("Use os.path.join to build the path", "Use pathlib.Path to build the path", "entity", {"os.path.join", "pathlib.Path"}),
    ("Who wrote Pride and Prejudice?", "Who wrote War and Peace?", "entity", {"Pride", "Prejudice", "War", "Peace"}),
])
def test_flag_names_the_trigger_words(a, b, kind, words):
    flags = kinds(a, b)
    assert kind in flags, flags
    assert words <= set(flags[kind]), flags
    # Symmetric: the same flag from either side.
    assert kind in kinds(b, a)


@pytest.mark.parametrize("a,b", [
    ("How do I reverse a list in Python?", "What is the way to reverse a Python list?"),
    ("Convert 5 miles to kilometers", "Convert five miles into km"),
    ("France: what is its capital?", "What is the capital city of France?"),
    ("Write a haiku about autumn leaves", "Compose a short haiku on falling autumn leaves"),
    ("Summarize this article in 3 sentences", "Give me a three-sentence summary of this article"),
    ("Explain the difference between TCP and UDP", "What distinguishes UDP from TCP?"),
    ("Which one is better for beginners, Java or C#?", "For a beginner, which is better: Java or C#?"),
    ("Why isn't my Docker container starting?", "My Docker container won't start, why?"),
    ("What's 15% of 80?", "Calculate fifteen percent of 80."),
])
def test_paraphrases_are_not_flagged(a, b):
    assert risk_flags(a, b) == []


def test_flag_renders_kind_and_words():
    (flag,) = risk_flags("Is it legal to fish here?", "Is it illegal to fish here?")
    assert str(flag) == "negation: legal, illegal"
    assert flag.to_dict()["kind"] == "negation"


def test_identical_prompts_have_no_flags():
    text = 'Don\'t use "eval" in Python 3.12 on 2 GB of data from NASA.'
    assert risk_flags(text, text) == []
