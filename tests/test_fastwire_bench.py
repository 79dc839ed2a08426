"""bench attach's machinery (not its speed): the loopback fleet delivers every batch it sent
into one Attachment, read through the app's bridge on a Qt event loop, and the JSON names
every figure with its target."""

from __future__ import annotations

from engine.bench.attach import BridgeLike, fleet_streams


def test_a_small_loopback_fleet_is_received_whole_through_the_qt_loop(qapp):
    # qapp: qt_loop makes a QCoreApplication when there is no application, and a GUI test
    # later in the same worker then aborted the process making its first widget ("Must
    # construct a QApplication before a QWidget"; found 2026-12-04 running the pool's test
    # files in one process)
    from app.commands._bench_attach import qt_loop

    out = fleet_streams(num_streams=3, rate=500, seconds=1.0, event_loop=qt_loop)
    assert out["streams"] == 3 and out["batches_sent"] > 0
    assert out["batches_received"] == out["batches_sent"] and out["missed_batches"] == 0 and out["malformed"] == 0
    assert out["events_drained"] > 0 and out["longest_stall_ms"] >= 0
    assert out["event_loop"].startswith("Qt")


def test_the_bridge_stand_in_counts_what_it_was_handed():
    sink = BridgeLike()
    for i in range(5):
        sink(i)
    assert sink.drain() == 5 and sink.drain() == 0
