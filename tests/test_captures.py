"""Recorded attaches (`attach --record`) keep the frames their servers sent and open through
the live attach's columnar route (`app.runtime.captures.replay_frames`): every recorded vLLM
0.33 and SGLang 0.5.23 fixture, recorded and opened, shows what the reference pools make of the
same frames, restarts included; a capture written before frames (converted events) still
opens; a damaged frame is one sentence. (Before: a capture held one JSON event per block, 11x
the frames' bytes, and opened through one Python event each: 15 s and 1.7 GB for 465K events.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.analysis.remote_capture import SOURCE, Recorder, recorded_events
from engine.core.events import EventBus
from engine.remote.attachment import AttachOptions
from engine.remote.wire import MalformedFrame
from tests.test_live_journal import _fixtures, _said, _same
from tests.test_live_log import _feed, _remote_events

ENDPOINT = "tcp://10.0.0.5:5557"  # `_remote_events`' first pool


def record(db, frames: list[tuple[int, bytes]], reset_every: int = 0, per_call: int = 5) -> Recorder:
    """`frames` recorded as a subscriber hands them over: the well-formed ones (a malformed
    frame is never delivered), `per_call` at a time while they number on, a restart every
    `reset_every` frames (as `_remote_events` restarts its pool)."""
    from engine.remote.fastwire import decode_batch

    att = SimpleNamespace(started=False, recorder=None)
    rec = Recorder(str(db), AttachOptions((ENDPOINT,))).start(att)
    assert att.recorder is rec
    pool = SimpleNamespace(source=ENDPOINT, server="", rank=0)
    run: list[tuple[int, bytes]] = []

    def hand_over() -> None:
        if run:
            rec.frames(pool, run[0][0], [p for _, p in run])
            run.clear()

    for i, (seq, payload) in enumerate(frames):
        if reset_every and i and i % reset_every == 0:
            hand_over()
            rec.restart(pool, seq)
        try:
            decode_batch(seq, payload)
        except MalformedFrame:
            hand_over()
            continue
        if run and (run[-1][0] + 1 != seq or len(run) >= per_call):
            hand_over()
        run.append((seq, payload))
    hand_over()
    rec.finish({"streams": []}, 16)
    return rec


@pytest.fixture
def ctx(qtbot, tmp_path):
    from app.runtime.context import make_test_context

    c = make_test_context(tmp_path / "app")
    yield c
    c.shutdown()


def _reference(frames, reset_every: int = 0):
    events = _remote_events(frames, 1, reset_every)
    ref, _ = _feed(events, 0, 16, [len(events)], every_batch=False)
    return ref


@pytest.mark.parametrize("name", sorted(_fixtures()))
def test_a_recorded_fixture_opens_as_the_reference_pools_show_it(ctx, tmp_path, name):
    from app.runtime.captures import open_capture
    from engine.store.database import Store

    frames = _fixtures()[name]
    ref = _reference(frames)
    if not len(ref):
        pytest.skip("the fixture's frames carry no block event")
    rec = record(tmp_path / "c.db", frames)
    with Store(tmp_path / "c.db") as store:
        run = store.runs(rec.session_id)[0].id
        assert store.num_frames(run) == rec.num_frames > 0
        assert [_said(e) for e in recorded_events(store, run)] == [_said(e) for e in ref.events]
    assert open_capture(ctx, tmp_path / "c.db") == len(ref)
    got = ctx.state.log
    assert ctx.state.journal_fed and ctx.remote.recorded_fleet is not None
    _same(got, ref, name)
    assert [_said(e) for e in got.events] == [_said(e) for e in ref.events]


@pytest.mark.parametrize("seed", [0, 1])
def test_restarts_recorded_open_as_fresh_pools(ctx, tmp_path, seed):
    from app.runtime.captures import open_capture
    from tests.test_colpool import _synthetic

    frames = _synthetic(180, seed)
    ref = _reference(frames, reset_every=41)
    rec = record(tmp_path / "c.db", frames, reset_every=41, per_call=7)
    assert rec.num_restarts == 4
    assert open_capture(ctx, tmp_path / "c.db") == len(ref)
    _same(ctx.state.log, ref, f"seed {seed}")
    assert [_said(e) for e in ctx.state.log.events] == [_said(e) for e in ref.events]
    assert sum(e.kind == "cache_reset" for e in ref.events) >= 4


def test_a_capture_of_events_from_before_frames_still_opens(ctx, tmp_path):
    from app.runtime.captures import open_capture
    from engine.store.database import Store
    from tests.test_colpool import _synthetic

    frames = _synthetic(60, 2)
    ref = _reference(frames)
    with Store(tmp_path / "old.db") as store:
        session = store.create_session("an old capture", "trace", hash="vllm-sha256", source_format=SOURCE,
                                       settings={"source": SOURCE, "endpoints": [ENDPOINT]})
        run = store.create_run(session, "attach", {})
        store.record_events(run, _remote_events(frames, 1, 0))
        store.finish_run(run, {})
    assert open_capture(ctx, tmp_path / "old.db") == len(ref)
    assert not ctx.state.journal_fed  # the events' route
    assert [_said(e) for e in ctx.state.log.events] == [_said(e) for e in ref.events]


def test_a_damaged_frame_is_one_sentence_in_a_dialog(qtbot, tmp_path):
    """A payload overwritten by another program: File > Open says which batch, the window stays."""
    import sqlite3

    from app.runtime.context import make_test_context
    from app.window.main_window import MainWindow
    from tests.test_colpool import _synthetic

    record(tmp_path / "c.db", _synthetic(40, 0))
    conn = sqlite3.connect(tmp_path / "c.db")
    conn.execute("UPDATE frames SET payload = x'c1c1c1' WHERE idx = 7")
    conn.commit()
    conn.close()
    win = MainWindow(make_test_context(tmp_path / "app"), load_model=False)
    qtbot.addWidget(win)
    try:
        done: list = []
        assert win.open_file(tmp_path / "c.db", on_done=done.append)  # the views reset, the frames come
        qtbot.waitUntil(lambda: bool(done), timeout=30_000)
        assert win.ctx.errors[-1] == (f"{ENDPOINT}'s recorded batch 7 is not valid msgpack (FormatError); "
                                      "the views show the batches before it")
        assert {e.remote.batch_seq for e in win.ctx.state.log.events} == set(range(7))
    finally:
        win.ctx.shutdown()


def test_a_frame_of_the_wrong_type_names_the_run_frame_and_field(tmp_path):
    import sqlite3

    from engine.core.errors import InputError
    from engine.store.database import Store
    from tests.test_colpool import _synthetic

    rec = record(tmp_path / "c.db", _synthetic(20, 0))
    conn = sqlite3.connect(tmp_path / "c.db")
    conn.execute("UPDATE frames SET payload = 'text' WHERE idx = 3")
    conn.commit()
    conn.close()
    with Store(tmp_path / "c.db") as store, pytest.raises(InputError) as err:
        for _ in store.frames(store.runs(rec.session_id)[0].id):
            pass
    assert f"run {rec.run_id}, frame 3, field 'payload' holds text" in str(err.value)


@pytest.fixture
def window(qtbot, tmp_path):
    from app.runtime.context import make_test_context
    from app.window.main_window import MainWindow

    win = MainWindow(make_test_context(tmp_path / "app"), load_model=False)
    qtbot.addWidget(win)
    yield win
    win.ctx.shutdown()


def test_the_window_fills_the_views_a_slice_at_a_time_and_says_how_far(qtbot, tmp_path, window, monkeypatch):
    """File > Open replays a capture between the window's passes (a tick a slice here), the
    status bar says how far, and the end shows what the reference pools make of the frames."""
    from app.window import files
    from tests.test_colpool import _synthetic

    from app.runtime import captures

    monkeypatch.setattr(files, "CAPTURE_SLICE_S", 0.0)
    monkeypatch.setattr(captures, "TAKE_ROWS", 2048)  # a take a slice: five of the 10,048 rows
    frames = _synthetic(1100, 1)
    ref = _reference(frames)
    record(tmp_path / "c.db", frames, per_call=64)
    sizes, said = [], []
    done: list = []
    assert window.open_file(tmp_path / "c.db", on_done=done.append)
    while not done:
        qtbot.wait(1)
        sizes.append(len(window.ctx.state.log))
        said.append(window.statusBar().currentMessage())
    assert len(set(sizes)) >= 3 and sizes == sorted(sizes)  # filled over several passes
    assert any(m.startswith("Opening c.db: ") and m.endswith("%\u2026") for m in said)
    assert window.statusBar().currentMessage() == (f"Opened c.db: {len(ref):,} events from {len(frames):,} "
                                                   "recorded batches.")
    assert [_said(e) for e in window.ctx.state.log.events] == [_said(e) for e in ref.events]
    assert window.remote.recorded_fleet is not None


def test_another_subject_stops_a_capture_being_opened(qtbot, tmp_path, window, monkeypatch):
    from app.runtime.context import Subject
    from app.window import files
    from tests.test_colpool import _synthetic

    monkeypatch.setattr(files, "CAPTURE_SLICE_S", 0.0)
    record(tmp_path / "c.db", _synthetic(2000, 1), per_call=64)  # eight ticks of 256 frames
    done: list = []
    assert window.open_file(tmp_path / "c.db", on_done=done.append)
    while not len(window.ctx.state.log):
        qtbot.wait(1)
    assert not done
    window.ctx.open_subject(Subject("trace", "another file"), ask=False)
    assert done == [None]
    assert window.statusBar().currentMessage() == "Stopped opening c.db."
    shown = len(window.ctx.state.log)
    qtbot.wait(50)
    assert len(window.ctx.state.log) == shown and window.remote.recorded_fleet is None
    (tmp_path / "c.db").unlink()  # the capture's database is closed


def test_a_replay_that_fails_part_way_is_one_sentence_and_stops(qtbot, tmp_path, window, monkeypatch):
    """Whatever stops a capture's replay (here the disk, part way): one sentence, said once;
    the slices stop and the window goes on."""
    import sqlite3

    from app.runtime import captures
    from app.window import files
    from tests.test_colpool import _synthetic

    monkeypatch.setattr(files, "CAPTURE_SLICE_S", 0.0)
    record(tmp_path / "c.db", _synthetic(1100, 1), per_call=64)
    real, calls = captures.FrameReader._run, []

    def failing(self):
        calls.append(1)
        if self.num_read > 300:
            raise sqlite3.OperationalError("disk I/O error")
        real(self)

    monkeypatch.setattr(captures.FrameReader, "_run", failing)
    done: list = []
    assert window.open_file(tmp_path / "c.db", on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=30_000)
    made = len(calls)
    qtbot.wait(50)
    assert len(calls) == made  # no slice after it
    assert window.ctx.errors == ["c.db could not be opened: OperationalError: disk I/O error."]
    assert 0 < len(window.ctx.state.log)


@pytest.mark.parametrize("side", ["run:{run}", "run:{run}@10.0.0.5:5557"])
def test_the_command_line_says_a_damaged_capture_in_one_line_and_exits_2(tmp_path, capsys, side):
    import sqlite3

    from app.cli import main
    from tests.test_colpool import _synthetic

    rec = record(tmp_path / "c.db", _synthetic(40, 0))
    conn = sqlite3.connect(tmp_path / "c.db")
    conn.execute("UPDATE frames SET payload = x'c1c1c1' WHERE idx = 7")
    conn.commit()
    conn.close()
    spec = side.format(run=rec.run_id)
    assert main(["compare", spec, spec, "--db", str(tmp_path / "c.db")]) == 2
    err = capsys.readouterr().err
    assert err == (f"cachescope: error: run {rec.run_id}: {ENDPOINT}'s recorded batch 7 is not valid msgpack (FormatError); "
                   "the database is damaged\n")


def _reads(monkeypatch, log, slow_s: float = 0.0) -> list[tuple[int, int, int]]:
    """Each run of frames the capture's reader applies: (its thread, the rows not yet taken
    as it starts, the length of `log` then); `slow_s` a sleep before each."""
    import threading
    import time

    from app.runtime import captures

    real, seen = captures.FrameReader._run, []

    def run(self):
        seen.append((threading.get_ident(), captures.untaken_rows(self.streams, self.taken), len(log())))
        time.sleep(slow_s)
        real(self)

    monkeypatch.setattr(captures.FrameReader, "_run", run)
    return seen


def test_the_frames_are_read_on_a_thread_of_their_own_while_the_views_fill(ctx, tmp_path, monkeypatch):
    """The capture's reader (the recorded stream's subscriber) applies the frames on a thread
    of its own while the state's thread writes the rows it applied: the log grows before the
    last frame is read, and ends as the reference pools show the frames."""
    import threading

    from app.runtime import captures
    from tests.test_colpool import _synthetic

    monkeypatch.setattr(captures, "MIN_TAKE_ROWS", 1)
    frames = _synthetic(1100, 1)
    ref = _reference(frames)
    record(tmp_path / "c.db", frames, per_call=64)
    seen = _reads(monkeypatch, lambda: ctx.state.log, slow_s=0.003)
    job = captures.begin_capture(ctx, tmp_path / "c.db")
    job.replay.reader.frames_per_run = 16  # 69 runs, 3 ms apart at least: the window writes between
    while not job.step():
        pass
    readers = {who for who, _, _ in seen}
    assert len(readers) == 1 and threading.get_ident() not in readers
    assert seen[0][2] == 0 and any(shown > 0 for _, _, shown in seen)  # written while the reading went on
    _same(ctx.state.log, ref, "read on a thread")
    assert [_said(e) for e in ctx.state.log.events] == [_said(e) for e in ref.events]


def test_the_reader_stays_at_most_AHEAD_ROWS_ahead_of_the_writes(ctx, tmp_path, monkeypatch):
    """A window that writes slowly is not handed an unbounded backlog: the reader waits while
    AHEAD_ROWS journal rows wait to be taken, and goes on as they are."""
    import time

    from app.runtime import captures
    from tests.test_colpool import _synthetic

    monkeypatch.setattr(captures, "AHEAD_ROWS", 400)
    monkeypatch.setattr(captures, "TAKE_ROWS", 100)
    frames = _synthetic(600, 1)
    ref = _reference(frames)
    record(tmp_path / "c.db", frames, per_call=64)
    seen = _reads(monkeypatch, lambda: ctx.state.log)
    job = captures.begin_capture(ctx, tmp_path / "c.db")
    job.replay.reader.frames_per_run = 8  # runs of ~60 rows: the reader meets the limit between two
    while not job.step(0.0):
        time.sleep(0.005)  # a slow window: the reader catches up with the limit
    assert max(waiting for _, waiting, _ in seen) < 400  # no run starts at the limit
    assert len(ctx.state.log) == len(ref) and len(seen) >= 10
    assert max(waiting for _, waiting, _ in seen) >= 200  # it came near it: the limit was what held it


@pytest.mark.parametrize("how", ["cancelled", "dropped"])
def test_a_capture_stopped_part_way_ends_its_reading_thread(ctx, tmp_path, monkeypatch, how):
    """Another subject (`cancel`) stops the reader before the database closes; a replay no one
    steps any more (its window closed mid-open) ends it too, as it is dropped."""
    import gc

    from app.runtime import captures
    from tests.test_colpool import _synthetic

    monkeypatch.setattr(captures, "AHEAD_ROWS", 100)  # the reader waits for room after a run or two
    record(tmp_path / "c.db", _synthetic(600, 1), per_call=64)
    job = captures.begin_capture(ctx, tmp_path / "c.db")
    assert not job.step(0.0)
    reader = job.replay.reader._thread
    assert reader.is_alive()
    if how == "cancelled":
        job.cancel()
        assert not reader.is_alive() and job._store is None
    else:
        del job
        gc.collect()
        reader.join(5)
        assert not reader.is_alive()
