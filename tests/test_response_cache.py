"""The exact response cache: canonical keys, zero-work hits, persistence and the repeat rate."""

from __future__ import annotations

import hashlib

import pytest

from engine.core.errors import InputError
from engine.semantic.response_cache import (
    ResponseCache, canonical_json, canonical_request, repeat_rate, request_key,
)
from engine.store.database import Store

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is KV caching?"}]


def test_key_is_sha256_of_canonical_json():
    req = canonical_request("smollm2", MSGS, sampling={"temperature": 0})
    assert request_key("smollm2", MSGS, sampling={"temperature": 0}) == hashlib.sha256(canonical_json(req)).hexdigest()
    # Key order, 0 vs 0.0 and defaults spelled out do not change the request.
    same = [{"content": m["content"], "role": m["role"]} for m in MSGS]
    assert request_key("smollm2", same, sampling={"temperature": 0.0, "top_p": 1}) == request_key("smollm2", MSGS)


@pytest.mark.parametrize("change", [
    dict(model="other"),
    dict(messages=MSGS[:1] + [{"role": "user", "content": "What is KV caching? "}]),
    dict(sampling={"max_new_tokens": 64}),
    dict(sampling={"temperature": 0.7, "seed": 1}),
])
def test_any_difference_changes_the_key(change):
    base = dict(model="smollm2", messages=MSGS, sampling=None)
    other = {**base, **change}
    assert request_key(other["model"], other["messages"], sampling=other["sampling"]) != \
        request_key(base["model"], base["messages"])


def test_hit_does_no_model_work_and_counts_repeat_rate():
    cache = ResponseCache()
    calls = []

    def compute():
        calls.append(1)
        return "It keeps attention keys and values."

    first, hit1 = cache.get_or_compute("smollm2", MSGS, compute)
    second, hit2 = cache.get_or_compute("smollm2", [dict(m) for m in MSGS], compute)
    assert (hit1, hit2) == (False, True)
    assert first == second and len(calls) == 1
    assert cache.repeat_rate == 0.5
    assert cache.entries()[0].hits == 1


def test_sampled_requests_are_not_stored_unless_asked():
    cache = ResponseCache()
    assert cache.put("m", "x", MSGS, sampling={"temperature": 0.8}) is None
    assert cache.put("m", "x", MSGS, sampling={"temperature": 0.8, "seed": 3}) is not None
    assert ResponseCache(cache_sampled=True).put("m", "x", MSGS, sampling={"temperature": 0.8}) is not None


def test_persists_in_the_store_and_evicts_lru(tmp_path):
    path = tmp_path / "c.db"
    store = Store(path)
    cache = ResponseCache(store, max_entries=2)
    cache.put("m", "a", [{"role": "user", "content": "a"}])
    cache.put("m", "b", [{"role": "user", "content": "b"}])
    assert cache.lookup("m", [{"role": "user", "content": "a"}]).hit  # a is now most recent
    cache.put("m", "c", [{"role": "user", "content": "c"}])  # evicts b
    store.close()
    again = ResponseCache(Store(path))
    assert sorted(e.response for e in again.entries()) == ["a", "c"]
    assert again.lookup("m", [{"role": "user", "content": "c"}]).response == "c"
    assert not again.lookup("m", [{"role": "user", "content": "b"}]).hit


def test_bad_requests_are_input_errors():
    with pytest.raises(InputError, match="role"):
        request_key("m", [{"content": "x"}])
    with pytest.raises(InputError, match="unknown sampling setting"):
        request_key("m", MSGS, sampling={"temprature": 0})
    with pytest.raises(InputError):
        request_key("m")


def test_repeat_rate_on_real_questions():
    import json
    from pathlib import Path

    rows = [json.loads(line) for line in (Path(__file__).resolve().parents[1] / "resources" / "traces" / "mt_bench_question.jsonl").read_text().splitlines()]
    stream = [{"model": "smollm2", "messages": [{"role": "user", "content": r["turns"][0]}]} for r in rows]
    stream += stream[:10]  # ten users ask an MT-bench question again, byte for byte
    stream += [{"model": "smollm2", "messages": [{"role": "user", "content": rows[0]["turns"][0] + " "}]}]
    out = repeat_rate(stream)
    assert out == {"requests": 91, "unique": 81, "repeats": 10, "repeat_rate": 10 / 91}


def test_repeats_command_on_a_conversation_file(tmp_path, capsys):
    import json

    from app.cli import main

    chat = {"messages": [{"role": "user", "content": "What is a KV cache?"}]}
    path = tmp_path / "chats.jsonl"
    # Three users send the same first question; one asks it with different wording.
    rows = [chat, chat, {"messages": [{"role": "user", "content": "What's a KV cache?"}]}, chat]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["semantic", "repeats", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["requests"], out["unique"], out["repeats"]) == (4, 2, 2) and out["repeat_rate"] == 0.5
    assert main(["semantic", "repeats", str(tmp_path / "none.jsonl")]) == 2


def test_conversation_requests_send_every_prefix_up_to_each_user_turn():
    from engine.store.formats import Conversation, Message
    from engine.semantic.response_cache import conversation_requests

    conv = Conversation("t", "openai", messages=[Message("system", "Be brief."), Message("user", "Hi"),
                                                  Message("assistant", "Hello."), Message("user", "Bye")],
                        settings={"temperature": 0, "max_tokens": 64})
    reqs = conversation_requests([conv], model="smollm2")
    assert [len(r["messages"]) for r in reqs] == [2, 4]
    assert reqs[0]["sampling"] == {"temperature": 0, "max_new_tokens": 64} and reqs[0]["model"] == "smollm2"
