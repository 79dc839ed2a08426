"""engine.core.sniff: the one sniffer, and every reader agreeing with it (replay, import,
File > Open)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from app.runtime.jobs import classify_file, trace_block_size
from engine.core.sniff import document_format, file_kind, is_request_trace, trace_format
from engine.store.formats import detect_format, read_documents


def write(path, text: str):
    path.write_bytes(text.encode())
    return path


@pytest.mark.parametrize("name, text, fmt, kind", [
    ("t.jsonl", '{"tokens": [1, 2, 3]}\n{"tokens": [1, 2]}\n', "tokens", "trace"),
    ("m.jsonl", '\ufeff{"hash_ids": [1], "input_length": 10}\n', "mooncake", "trace"),
    ("o.json", json.dumps({"messages": [{"role": "user", "content": "hi"}]}), "openai", "conversation"),
    ("a.json", json.dumps({"system": "s", "messages": [{"role": "user", "content": "hi"}]}), "anthropic",
     "conversation"),
    ("s.json", json.dumps({"conversations": [{"from": "human", "value": "hi"}]}), "sharegpt", "conversation"),
    ("q.jsonl", json.dumps({"turns": ["hi"]}) + "\n", "mt-bench", "conversation"),
    ("c.json", json.dumps({"format": "cachescope-session", "version": 1, "messages": []}), "cachescope",
     "conversation"),
])
def test_every_reader_tells_a_file_the_same_way(tmp_path, name, text, fmt, kind):
    path = write(tmp_path / name, text)
    docs = read_documents(path.read_bytes(), str(path))
    assert detect_format(docs, str(path)) == fmt == document_format(docs[0][1], [d for _, d in docs])
    assert file_kind(path) == classify_file(path) == kind
    assert is_request_trace(path) == (kind == "trace")
    assert trace_format(path) == (fmt if kind == "trace" else None)


def test_a_trace_as_one_json_array_is_imported_but_not_replayed(tmp_path):
    # `replay` reads JSONL, one request a line; `sessions import` reads any JSON layout.
    path = write(tmp_path / "t.json", '[{"tokens": [1, 2, 3]}]')
    assert detect_format(read_documents(path.read_bytes(), str(path)), str(path)) == "tokens"
    assert not is_request_trace(path) and file_kind(path) == "conversation"


def test_databases_unreadable_and_odd_files(tmp_path):
    db = tmp_path / "store"
    sqlite3.connect(db).execute("create table t (x)").connection.close()
    assert file_kind(db) == "session" and file_kind(tmp_path / "x.cachescope") == "session"
    assert file_kind(tmp_path / "missing.jsonl") == "conversation" and not is_request_trace(tmp_path / "missing.jsonl")
    assert file_kind(write(tmp_path / "b.jsonl", "not json\n")) == "conversation"
    assert file_kind(tmp_path) == "conversation"  # a directory
    assert document_format([1, 2]) is None and document_format({"x": 1}) is None


def test_the_app_picks_the_block_size_from_the_same_sniff(tmp_path):
    assert trace_block_size(write(tmp_path / "m.jsonl", '{"hash_ids": [1], "input_length": 10}\n')) == 512
    assert trace_block_size(write(tmp_path / "t.jsonl", '{"tokens": [1], "note": "hash_ids"}\n')) == 16
