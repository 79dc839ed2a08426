"""The engine bridge: events from other threads reach the GUI thread in order, per frame."""

from __future__ import annotations

import threading

import pytest

from app.runtime.bridge import MAX_BATCH, EngineBridge
from engine.core.events import BlockEvicted, EventBus, RequestStarted
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import TraceRequest


@pytest.fixture
def bridge(qtbot):
    b = EngineBridge()
    batches: list[list] = []
    b.sigEvents.connect(batches.append)
    b.batches = batches
    yield b
    b.stop()


def _emit_many(bus: EventBus, n: int) -> None:
    for i in range(n):
        bus.emit(RequestStarted, request_id=f"r{i}", num_prompt_tokens=i + 1, salt=None)


def test_events_from_another_thread_arrive_in_order_in_few_batches(qtbot, bridge):
    # The batch size adapts to measured listener time (tested below with slow listeners);
    # a generous budget keeps this test about ordering and coalescing, not machine speed.
    bridge.batch_budget_s = 1.0
    bus = EventBus()
    bridge.attach(bus)
    n = 20_000
    t = threading.Thread(target=_emit_many, args=(bus, n))
    t.start()
    t.join()
    qtbot.waitUntil(lambda: sum(len(b) for b in bridge.batches) == n, timeout=5000)
    events = [e for b in bridge.batches for e in b]
    assert [e.seq for e in events] == list(range(n))
    assert [e.request_id for e in events[:3]] == ["r0", "r1", "r2"]
    # A burst emitted while the GUI thread was busy arrives in a handful of batches, not 20K.
    assert len(bridge.batches) <= 3
    assert bridge.num_events == n


def test_two_emitting_threads_are_merged_in_seq_order(qtbot, bridge):
    bus = EventBus()
    bridge.attach(bus)
    threads = [threading.Thread(target=_emit_many, args=(bus, 5000)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bridge.flush(everything=True)
    for batch in bridge.batches:
        seqs = [e.seq for e in batch]
        assert seqs == sorted(seqs)
    assert sorted(e.seq for b in bridge.batches for e in b) == list(range(10_000))


def test_huge_burst_is_split_into_frames(qtbot, bridge):
    bus = EventBus()
    bridge.attach(bus)
    _emit_many(bus, 2500)
    bridge.batch_limit = 1000
    assert bridge.flush() == 1000  # one frame's worth; the rest follows right behind
    assert bridge.num_pending == 1500
    qtbot.waitUntil(lambda: bridge.num_pending == 0, timeout=2000)
    assert len(bridge.batches[0]) == 1000 and len(bridge.batches) >= 2
    seqs = [e.seq for b in bridge.batches for e in b]
    assert seqs == list(range(2500))
    # Cheap listeners let the batch grow; it never exceeds MAX_BATCH.
    assert 1000 < bridge.batch_limit <= MAX_BATCH


def test_slow_listeners_shrink_the_batch_to_the_frame_budget(qtbot, bridge):
    import time as _time

    bus = EventBus()
    bridge.attach(bus)
    bridge.sigEvents.connect(lambda batch: _time.sleep(len(batch) * 20e-6))  # 20 us per event
    _emit_many(bus, 12_000)
    qtbot.waitUntil(lambda: bridge.num_pending == 0, timeout=10_000)
    # 18 ms at 20 us per event is about 900 events per batch.
    assert 500 <= bridge.batch_limit <= 2000
    assert max(len(b) for b in bridge.batches[2:]) <= 3000


def test_detach_stops_delivery_and_attach_switches_bus(qtbot, bridge):
    first, second = EventBus(), EventBus()
    bridge.attach(first)
    _emit_many(first, 3)
    bridge.attach(second)  # replaces the first bus
    assert not first.active
    _emit_many(first, 5)
    _emit_many(second, 2)
    bridge.detach()
    assert not second.active
    _emit_many(second, 4)
    bridge.flush(everything=True)
    assert sum(len(b) for b in bridge.batches) == 5


def test_engine_changed_flushes_old_events_first(qtbot, bridge):
    bus = EventBus()
    bridge.attach(bus)
    order: list[str] = []
    bridge.sigEvents.connect(lambda batch: order.append(f"events:{len(batch)}"))
    bridge.sigEngineChanged.connect(lambda info: order.append(f"engine:{info['num_blocks']}"))
    bus.emit(BlockEvicted, block_id=1, block_hash=b"\x01" * 32, by_request_id="x")
    with qtbot.waitSignal(bridge.sigEngineChanged, timeout=1000):
        bridge.set_engine({"block_size": 16, "num_blocks": 64})
    assert order == ["events:1", "engine:64"]
    assert bridge.engine_info["num_blocks"] == 64


def test_a_real_replay_on_a_worker_thread_reaches_the_gui(qtbot, bridge):
    bus = EventBus()
    bridge.attach(bus)
    shared = tuple(range(100, 148))
    reqs = [TraceRequest(i, i + 1, f"r{i}", None, shared + (i,) * 5, (7, 8, 9), None, 53, 3) for i in range(6)]
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(replay(reqs, ReplayConfig(block_size=16, capacity_blocks=32), events=bus).to_dict()))
    t.start()
    t.join()
    qtbot.waitUntil(lambda: bridge.num_pending == 0 and bool(bridge.batches), timeout=3000)
    events = [e for b in bridge.batches for e in b]
    kinds = [e.kind for e in events]
    assert kinds.count("request_started") == 6 and kinds.count("request_finished") == 6
    lookups = [e for e in events if e.kind == "lookup"]
    # The shared 48-token prefix (3 blocks) is cached after the first request.
    assert [e.num_cached_tokens for e in lookups] == [0] + [48] * 5
    assert result["totals"]["cached_tokens"] == 240


def test_flush_bulk_hands_a_backlog_over_in_big_batches_in_order(qtbot, bridge):
    bridge._timer.stop()  # only the bulk flush delivers here
    bus = EventBus()
    bridge.attach(bus)
    got: list = []
    sizes: list = []
    bridge.sigEvents.connect(lambda batch: (got.extend(batch), sizes.append(len(batch))))
    _emit_many(bus, 2 * MAX_BATCH + 7)
    assert bridge.flush_bulk(MAX_BATCH + 3) == MAX_BATCH + 3
    assert sizes == [MAX_BATCH, 3]
    assert bridge.flush_bulk(10 * MAX_BATCH) == MAX_BATCH + 4
    assert bridge.flush_bulk(10) == 0 and bridge.num_pending == 0
    assert [e.seq for e in got] == list(range(2 * MAX_BATCH + 7))


def test_a_trace_opened_in_the_app_gets_the_python_engines_events(qtbot, tmp_path):
    """File > Open replays on the kernel: the state's log holds the reference's very events."""
    from pathlib import Path

    from app.runtime.context import make_test_context
    from app.runtime.replays import TraceReplays
    from app.runtime.jobs import trace_block_size, trace_capacity
    from engine.core.trace import load_trace

    trace = Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
    path = tmp_path / "slice.jsonl"
    with trace.open("rb") as src:
        path.write_bytes(b"".join(line for _, line in zip(range(300), src)))
    ctx = make_test_context(tmp_path)
    try:
        replays = TraceReplays(ctx)
        with qtbot.waitSignal(replays.sigShown, timeout=120_000):
            replays.start(path, num_blocks=400)
        expected: list = []
        bus = EventBus()
        bus.subscribe(expected.append)
        bs = trace_block_size(path)
        replay(load_trace(path, bs), ReplayConfig(block_size=bs, capacity_blocks=400, seed=0), bus)
        strip = lambda e: {k: v for k, v in e.to_dict().items() if k != "time"}  # noqa: E731
        assert [strip(e) for e in ctx.state.log.events] == [strip(e) for e in expected]
        assert trace_capacity(path, bs) > 0
    finally:
        ctx.shutdown()


def test_an_engine_thread_waits_while_the_gui_thread_applies_a_batch(qtbot, bridge):
    # The gate: an event emitted on another thread during a batch is appended after it.
    bridge.gate_wait_s = 10.0
    bus = EventBus()
    bridge.attach(bus)
    order: list[str] = []
    started = threading.Event()

    def produce() -> None:
        started.wait(10)
        bus.emit(RequestStarted, request_id="late", num_prompt_tokens=1, salt=None)
        order.append("emitted")

    def listener(batch: list) -> None:
        if batch[0].request_id == "r0":
            started.set()
            import time as _time
            _time.sleep(0.1)
            order.append("batch applied")

    bridge.sigEvents.connect(listener)
    producer = threading.Thread(target=produce)
    producer.start()
    _emit_many(bus, 3)
    bridge.flush()
    producer.join(10)
    assert order == ["batch applied", "emitted"]
    bridge.flush(everything=True)
    assert [e.request_id for b in bridge.batches for e in b] == ["r0", "r1", "r2", "late"]


def test_the_gate_is_bounded_and_skips_the_gui_thread(qtbot, bridge):
    # A listener that waits for an engine thread's event does not deadlock (the engine
    # thread goes on after gate_wait_s), and the GUI thread's own events never wait.
    import time as _time

    bridge.gate_wait_s = 0.05
    bus = EventBus()
    bridge.attach(bus)
    produced = threading.Event()
    seen: dict[str, float] = {}

    def listener(batch: list) -> None:
        if seen:
            return
        seen["first batch"] = 1.0
        producer = threading.Thread(target=lambda: (_emit_many(bus, 1), produced.set()))
        producer.start()
        seen["engine thread went on"] = produced.wait(10)
        producer.join(10)
        bridge.gate_wait_s = 10.0
        t = _time.perf_counter()
        bus.emit(RequestStarted, request_id="gui", num_prompt_tokens=1, salt=None)  # on the GUI thread
        seen["gui emit s"] = _time.perf_counter() - t

    bridge.sigEvents.connect(listener)
    _emit_many(bus, 2)
    bridge.flush()
    assert seen["engine thread went on"] is True
    assert seen["gui emit s"] < 5.0  # it would be 10 s had it waited at the gate
    bridge.flush(everything=True)
    assert sorted(e.seq for b in bridge.batches for e in b) == list(range(4))


def test_interleaved_threads_and_a_waiting_backlog_come_out_in_seq_order(qtbot, bridge):
    # Events taken while an older part still waits, and events pushed out of order, are
    # merged: every batch handed over is in seq order and nothing is lost or repeated.
    bridge._timer.stop()
    bus = EventBus()
    bridge.attach(bus)
    _emit_many(bus, 1000)
    assert len(bridge._take(300)) == 300  # 700 wait
    early = [RequestStarted(seq=s, time=0.0, request_id=f"x{s}", num_prompt_tokens=1, salt=None)
             for s in (5000, 4000, 4500)]
    bridge.push(early)
    _emit_many(bus, 10)  # seqs 1000..1009, below the pushed ones
    got = []
    while (batch := bridge._take(256)):
        got.extend(e.seq for e in batch)
    assert got == list(range(300, 1010)) + [4000, 4500, 5000]
    assert bridge.num_pending == 0


def test_a_live_logs_rows_are_made_on_the_engine_thread_and_equal_the_reference(qtbot, tmp_path, monkeypatch):
    """The pool state's live log gets its rows made where the events are emitted: the GUI
    thread only writes them (`extend_prepared`), and the log equals the reference."""
    from app.runtime.context import engine_info, make_test_context
    from engine.core.live_log import LiveColumnarLog
    from engine.core.projection import EventLog
    from tests.test_live_log import MOONCAKE, _check_projection, _check_same, _events_of_trace

    events = _events_of_trace(MOONCAKE, 150, 200, 512)
    made_on: dict[str, int] = {}
    prepare = LiveColumnarLog.prepare

    def counted(log, batch):
        got = prepare(log, batch)
        name = threading.current_thread().name
        made_on[name] = made_on.get(name, 0) + len(got)
        return got

    monkeypatch.setattr(LiveColumnarLog, "prepare", counted)
    ctx = make_test_context(tmp_path)
    try:
        bus = ctx.new_event_bus(engine_info(block_size=512, num_blocks=200))
        deliver = ctx.bridge._on_event  # what the bus calls for each event, on the engine thread
        producer = threading.Thread(target=lambda: [deliver(e) for e in events], name="engine")
        producer.start()
        producer.join()
        qtbot.waitUntil(lambda: len(ctx.state.log) == len(events), timeout=10_000)
        assert made_on.get("engine", 0) >= len(events) - 1024  # at most a leftover made on the GUI thread
        assert sum(made_on.values()) == len(events)
        ref = EventLog(200, 512)
        ref.extend(events)
        _check_same(ctx.state.log, ref, "through the bridge")
        for seq in (events[0].seq, events[len(events) // 3].seq, events[-1].seq):
            _check_projection(ctx.state.log.state_at(seq), ref.state_at(seq), f"scrubbed to {seq}")
        del bus
    finally:
        ctx.shutdown()


def test_a_log_that_stops_preparing_gets_the_rest_the_plain_way(qtbot, tmp_path):
    """A pool that grows past its announced size needs the GUI thread: from that event on
    the bridge hands plain events over, and nothing is lost or doubled."""
    from app.runtime.context import engine_info, make_test_context
    from engine.core.projection import EventLog
    from tests.test_live_log import MOONCAKE, _check_same, _events_of_trace

    events = _events_of_trace(MOONCAKE, 60, 4096, 512)
    ctx = make_test_context(tmp_path)
    try:
        ctx.new_event_bus(engine_info(block_size=512, num_blocks=8))
        ctx.bridge.push(events)
        ctx.bridge.flush(everything=True)
        assert ctx.bridge._preparer is None and not ctx.state.log.can_prepare
        ref = EventLog(8, 512)
        ref.extend(events)
        _check_same(ctx.state.log, ref, "grown")
    finally:
        ctx.shutdown()
