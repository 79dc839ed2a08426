"""A fleet on the journal route: several servers' journalling pools (every server rank 0, as
a fleet of single-rank servers and llm-d's pods on one bound endpoint are) into one live
columnar log, against the reference event route (their RemotePools' events into
PoolState(columnar=False)), on the recorded fleet (`three-pods-one-endpoint`, recorded
from vLLM 0.33.0's publisher) and on two servers holding the same hashes (every removal
names a hash the other server holds too: it must free its own server's copy), with a
restart of one server: the same events, slots, colours, counts, series and scrubbed-back
states (tests/test_journal_app's comparison). A restart clears its own server's blocks
only, on both routes."""

from __future__ import annotations

import pytest

from app.runtime.state import PoolState
from engine.bench.attach import recorded_stream
from engine.core.events import EventBus
from engine.remote.overlay import journal_pool_class
from engine.remote.pool import RemotePool
from _publishers import recorded_frames
from test_fleet_app import DATA, PODS
from test_journal_app import _same, feed_both, tick_both


def _fleet_both(servers: list[str], messages: list[tuple[int, int, bytes]], per_tick: int = 1,
                restart: tuple[int, int] | None = None):
    """Both routes fed `messages` ((server, seq, payload), in arrival order), a GUI tick
    every `per_tick` messages, and server `restart[0]` restarting before message
    `restart[1]` (its batches from 0 again). Returns (journal state, reference state)."""
    info = {"remote": True, "block_size": 16, "num_blocks": 0}
    js = PoolState()
    js.set_engine({**info, "journal": True})
    rs = PoolState(columnar=False)
    rs.set_engine(info)
    rs.ticks = []
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    pool_class = journal_pool_class()
    jpools = [pool_class(name, 0, server=name) for name in servers]
    rpools = [RemotePool(name, 0, bus, server=name) for name in servers]

    def tick() -> None:
        tick_both(js, rs, jpools, [0] * len(jpools), events)  # every server is rank 0

    for i, (s, seq, payload) in enumerate(messages):
        if restart is not None and i == restart[1]:
            for pool in (jpools[restart[0]], rpools[restart[0]]):
                pool.reset(0, 7_000.0)
        feed_both(jpools[s], rpools[s], seq, payload)
        if i % per_tick == per_tick - 1:
            tick()
    tick()
    return js, rs, rpools


def _copies(pool: RemotePool) -> int:
    """The copies a reference pool holds (each hash once per tier, and its extra copies)."""
    return sum(len(t) for t in pool.tiers.values()) + sum(pool.num_extra_copies.values())


def _recorded_fleet() -> tuple[list[str], list[tuple[int, int, bytes]]]:
    """The three pods' PUB messages as recorded, each pod its own server."""
    out = []
    for frames in recorded_frames(DATA, case="three-pods-one-endpoint", socket="pub"):
        pod = frames[0].decode().split("@")[1]
        out.append((PODS.index(pod), int.from_bytes(frames[1], "big", signed=True), frames[2]))
    assert len({s for s, _, _ in out}) == 3
    return list(PODS), out


def _twins(num_events: int = 500) -> tuple[list[str], list[tuple[int, int, bytes]]]:
    """Two servers publishing the same stream (the same hashes, stores and removals), the
    second 7 batches behind the first."""
    payloads, _, _ = recorded_stream(num_events, gpu_blocks=300)
    lag = 7
    out = []
    for i in range(len(payloads) + lag):
        if i < len(payloads):
            out.append((0, i, payloads[i]))
        if i >= lag:
            out.append((1, i - lag, payloads[i - lag]))
    return ["tcp://10.0.0.7:5557", "tcp://10.0.0.8:5557"], out


@pytest.mark.parametrize("per_tick", [1, 4])
def test_the_recorded_fleet_shows_what_the_event_route_shows(per_tick):
    servers, messages = _recorded_fleet()
    js, rs, _ = _fleet_both(servers, messages, per_tick)
    assert {e.remote.source for e in rs.log.events} == set(PODS)
    # a message a tick: the same events in the same order; more: the servers' rows come
    # pool by pool within a tick, so as a multiset (and slot by slot where no copy moved)
    _same(js, rs, f"recorded fleet, {per_tick} a tick", in_order=per_tick == 1)


def test_a_server_whose_first_batch_is_lost_removes_what_it_never_stored():
    """Pod .11's batch 0 (its stores) lost: its first journal rows are removals, with no
    store before them (tests/test_fleet_app's lost-batch case, here on both routes)."""
    servers, messages = _recorded_fleet()
    lost = [m for m in messages if not (m[0] == 0 and m[1] == 0)]
    js, rs, _ = _fleet_both(servers, lost, 1)
    _same(js, rs, "pod .11's batch 0 lost", in_order=True)
    js, rs, _ = _fleet_both(servers, lost[:2] + lost[3:4], 1)  # .11's removals before any store of its own
    _same(js, rs, "removals first", in_order=True)


def test_two_servers_with_the_same_hashes_each_free_their_own_copies():
    servers, messages = _twins()
    js, rs, rpools = _fleet_both(servers, messages, 1)
    kinds = {e.kind for e in rs.log.events}
    assert {"block_stored", "block_evicted"} <= kinds
    _same(js, rs, "twins", in_order=True)
    # the log holds what the two pools hold, copy for copy
    assert js.projection.num_hashed == rs.projection.num_hashed == sum(_copies(rp) for rp in rpools)


@pytest.mark.parametrize("per_tick", [1, 5])
def test_a_restart_of_one_server_clears_only_its_own_blocks(per_tick):
    servers, messages = _twins(500)
    restart_at = len(messages) // 2
    js, rs, rpools = _fleet_both(servers, messages, per_tick, restart=(1, restart_at))
    assert rs.projection.num_resets >= 1
    _same(js, rs, f"restart of one server, {per_tick} a tick", in_order=per_tick == 1)
    # the other server kept its blocks through the restart: what both pools hold now
    want = sum(_copies(rp) for rp in rpools)
    assert js.projection.num_hashed == rs.projection.num_hashed == want


def test_the_fleet_comparison_can_fail():
    servers, messages = _twins(300)
    js, rs, _ = _fleet_both(servers, messages, 1)
    _same(js, rs, "whole", in_order=True)
    # the second server's last frames missing from the journal route only
    js2, _, _ = _fleet_both(servers, messages[:-3], 1)
    with pytest.raises(AssertionError):
        _same(js2, rs, "short", in_order=True)
