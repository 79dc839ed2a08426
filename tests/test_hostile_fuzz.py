"""Issue 13: property-based fuzzing of every reader and of the subcommands' arguments.

Whatever the input, a reader returns or raises `InputError` (never anything else), and a
command exits 0 or 2, with exactly one stderr line on 2 and no change to the database.
Runs in-process (`app.cli.main` with capsys): the "hostile-ci" profile is derandomized so
CI sees the same examples every run; set CACHESCOPE_FUZZ_EXAMPLES to search harder.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.cli import main
from engine.core import validation
from engine.core.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "resources" / "sessions" / "mt_bench_81_writing.cachescope.json"
DEMO_TRACE = ROOT / "resources" / "traces" / "demo_tokens.jsonl"
MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"

settings.register_profile(
    "hostile-ci", max_examples=int(os.environ.get("CACHESCOPE_FUZZ_EXAMPLES", "80")), derandomize=True,
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                          HealthCheck.data_too_large])
FUZZ = settings.get_profile("hostile-ci")

# ---------------------------------------------------------------------------- strategies
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, -1, 2**31, 2**32, 2**63, 2**64, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none())
SCALARS = st.one_of(NUMBERS, st.text(max_size=12))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)
KEYS = ("tokens", "output_tokens", "hash_ids", "input_length", "output_length", "timestamp", "tenant", "id",
        "messages", "role", "content", "conversations", "from", "value", "turns", "format", "version", "session",
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim", "a", "b", "same")
# Objects with the keys the readers look for, so the fuzz reaches past "unknown format".
LOOKALIKES = st.dictionaries(st.sampled_from(KEYS), JSON_VALUES, min_size=1, max_size=6)


def _dump(value) -> str:
    return json.dumps(value, allow_nan=True)


def _mutations(data: bytes):
    """Byte-level damage to a valid file: truncation, a flipped byte, brackets stacked deep."""
    return st.one_of(
        st.integers(0, len(data)).map(lambda n: data[:n]),
        st.tuples(st.integers(0, max(0, len(data) - 1)), st.integers(0, 255)).map(
            lambda t: data[:t[0]] + bytes([t[1]]) + data[t[0] + 1:]),
        st.integers(60, 5000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(4300, 6000).map(lambda n: b'{"tokens": [' + b"9" * n + b"]}"),
        st.just(b"\xef\xbb\xbf" + data), st.just(b"\xff\xfe" + data[:50]), st.just(b""),
    )


FILES = st.one_of(
    st.lists(LOOKALIKES, min_size=1, max_size=3).map(lambda objs: "\n".join(_dump(o) for o in objs).encode()),
    JSON_VALUES.map(lambda v: _dump(v).encode()),
    _mutations(DEMO_TRACE.read_bytes()[:600]),
    _mutations(SESSION.read_bytes()),
    _mutations(b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'),
    _mutations(b'{"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}'),
)
ARG_NUMBERS = st.one_of(
    st.integers(-5, 5_000).map(str), st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e3", "1TiB", "512MiB",
                                                      "9" * 400, "9" * 5000, "", " ", "0x10", "2.5", "1,2",
                                                      str(2**63), str(2**64), "1" * 25 + "GiB"]),
    st.text(max_size=8))


def _write(tmp: Path, name: str, data: bytes) -> str:
    path = tmp / name
    path.write_bytes(data)
    return str(path)


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's refusals
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _check_exit(code: int, err: str, argv) -> None:
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("cachescope: error: "), (argv, err)
        assert "Traceback" not in err


def _dump_db(path: Path) -> list[str]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


# ---------------------------------------------------------------------------- readers
def _readers():
    from engine.analysis.billing import load_rules
    from engine.core.trace import load_trace
    from engine.model.kv_memory import shape_from_config_file
    from engine.semantic.evaluation import load_pairs
    from engine.store.formats import load_conversations

    return {"trace": load_trace, "conversations": load_conversations, "config": shape_from_config_file,
            "rules": load_rules, "pairs": load_pairs,
            "json": lambda p: validation.load_json_file(p)}


@FUZZ
@given(data=FILES)
@example(data=b"[]")  # once an IndexError in format detection
@example(data=b"[" * 100_000)
def test_every_reader_returns_or_says_why(tmp_path_factory, data):
    path = _write(tmp_path_factory.mktemp("reader"), "input.json", data)
    for name, read in _readers().items():
        try:
            read(path)
        except InputError as exc:
            assert str(exc) and "\n" not in str(exc), (name, str(exc))


# ---------------------------------------------------------------------------- commands on files
@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzzdb") / "c.db"
    for source in (SESSION, DEMO_TRACE):
        assert main(["sessions", "import", str(source), "--db", str(path)]) == 0
    (path.parent / "tokens.json").write_text(json.dumps(list(range(1, 40))))
    return path


FILE_COMMANDS = [
    lambda f, db: ["replay", f, "--no-model", "--capacity-blocks", "64"],
    lambda f, db: ["replay", f, "--no-model", "--capacity-blocks", "64", "--concurrency", "3", "--block-size", "4"],
    lambda f, db: ["sweep", f, "--block-sizes", "4,16", "--capacities", "8,64"],
    lambda f, db: ["billing", f, "--totals-only"],
    lambda f, db: ["kv-memory", "--config", f, "--tokens", "100"],
    lambda f, db: ["semantic", "eval", f, "--thresholds", "0.9"],  # a bad file fails before the model loads
    lambda f, db: ["sessions", "import", f, "--db", db],
    lambda f, db: ["hash", "--tokens", f, "--block-size", "2", "--hash", "sha256"],
]


@FUZZ
@given(data=FILES, which=st.integers(0, len(FILE_COMMANDS) - 1))
def test_commands_on_hostile_files_exit_0_or_2_and_change_nothing_on_failure(tmp_path_factory, capsys, db, data, which):
    path = _write(tmp_path_factory.mktemp("cmd"), "input.jsonl", data)
    argv = FILE_COMMANDS[which](path, str(db))
    if argv[:2] == ["semantic", "eval"]:
        from engine.semantic.evaluation import load_pairs

        try:
            load_pairs(path)
        except InputError:
            pass
        else:
            return  # a valid pairs file would load the embedding model; the reader test covers it
    before = _dump_db(db)
    code, out, err = _run(capsys, argv)
    _check_exit(code, err, argv)
    if code == 2:
        assert _dump_db(db) == before, argv
    else:
        assert out.strip()


# ---------------------------------------------------------------------------- arguments
ARG_COMMANDS = [
    lambda n, db: ["replay", str(DEMO_TRACE), "--no-model", "--capacity-blocks", n],
    lambda n, db: ["replay", str(DEMO_TRACE), "--no-model", "--capacity-tokens", n],
    lambda n, db: ["replay", str(DEMO_TRACE), "--no-model", "--capacity-blocks", "64", "--block-size", n],
    lambda n, db: ["replay", str(DEMO_TRACE), "--no-model", "--capacity-blocks", "64", "--seed", n],
    lambda n, db: ["replay", str(DEMO_TRACE), "--no-model", "--capacity-blocks", "64", "--concurrency", n],
    lambda n, db: ["replay", str(DEMO_TRACE), "--no-model", "--kv-memory", n],
    lambda n, db: ["sweep", str(DEMO_TRACE), "--capacities", f"8,{n}"],
    lambda n, db: ["sweep", str(DEMO_TRACE), "--block-sizes", n],
    lambda n, db: ["sweep", str(DEMO_TRACE), "--limit", n],
    lambda n, db: ["billing", str(DEMO_TRACE), "--price-per-mtok", n, "--totals-only"],
    lambda n, db: ["billing", str(DEMO_TRACE), "--turn-gap", n, "--totals-only"],
    lambda n, db: ["billing", str(DEMO_TRACE), "--breakpoints", n, "--totals-only"],
    lambda n, db: ["kv-memory", "--preset", "llama-3.1-8b", "--tokens", n],
    lambda n, db: ["sessions", "show", n, "--db", db],
    lambda n, db: ["sessions", "export", n, "--db", db],
    lambda n, db: ["sessions", "replay", "2", "--db", db, "--capacity-blocks", n, "--no-record"],
    lambda n, db: ["sessions", "replay", "2", "--db", db, "--concurrency", n, "--no-record"],
    lambda n, db: ["sessions", "delete", n, "--db", db + ".scratch"],  # keeps the fixture's sessions
    lambda n, db: ["sessions", "import", str(DEMO_TRACE), "--db", db, "--capacity-blocks", n],
    lambda n, db: ["sessions", "import", str(DEMO_TRACE), "--db", db, "--seed", n],
    lambda n, db: ["semantic", "list", "--db", db, "--ttl", n],
    lambda n, db: ["semantic", "remove", n, "--db", db],
    lambda n, db: ["hash", "--tokens", str(Path(db).parent / "tokens.json"), "--block-size", "4", "--hash", "sha256",
                   "--seed", n],
    lambda n, db: ["hash", "--tokens", str(Path(db).parent / "tokens.json"), "--block-size", n, "--hash", "xxh3"],
]


@FUZZ
@given(value=ARG_NUMBERS, which=st.integers(0, len(ARG_COMMANDS) - 1))
def test_every_number_argument_exits_0_or_2(tmp_path_factory, capsys, db, value, which):
    argv = ARG_COMMANDS[which](value, str(db))
    before = _dump_db(db)
    code, out, err = _run(capsys, argv)
    _check_exit(code, err, argv)
    if code == 2:
        assert _dump_db(db) == before, argv
    if argv[:2] == ["sessions", "import"] and code == 0:
        from engine.store.database import Store

        with Store(db) as store:  # back to the fixture's two sessions for the next example
            for info in store.list_sessions()[2:]:
                store.delete_session(info.id)


@FUZZ
@given(path=st.sampled_from(["/", "/dev/null", "/etc/passwd", "/proc/version", "/nonexistent/x.db", "", "."]))
def test_odd_database_paths_are_one_sentence(capsys, path):
    for argv in (["sessions", "list", "--db", path], ["semantic", "list", "--db", path],
                 ["sessions", "import", str(DEMO_TRACE), "--db", path]):
        code, _, err = _run(capsys, argv)
        _check_exit(code, err, argv)
