"""The app attached to a vLLM server: the recorded vLLM 0.33 frames, byte for byte, over
real ZMQ sockets on 127.0.0.1, into every view; stream health; detach; the dialog.

`RecordedServer` plays one data-parallel rank of the server the fixture was recorded
from: its PUB socket sends the recorded PUB frames unchanged and its ROUTER replay socket
answers a replay request with the recorded replay frames (from the asked seq) and the
recorded end marker.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zmq
from PySide6.QtWidgets import QDialogButtonBox

from app.dialogs.attach_dialog import AttachDialog
from app.runtime.context import make_test_context
from app.window.main_window import MainWindow
from app.runtime.remote import AttachSettings
from engine.remote.attachment import AttachOptions
from _publishers import attach_window, recorded_frames
from test_vllm_attach import free_ports, wait_for  # the one loopback port finder of the vLLM tests

ROOT = Path(__file__).resolve().parents[1]
FRAMES = ROOT / "tests" / "data" / "vllm" / "vllm_zmq_frames.jsonl"
# The longest wait for what the attached window shows. A wait ends as soon as its condition
# holds (a second or two on an idle machine), so this only bounds a loaded one: on 2 cores
# busy with other work, a late join's or a gap refill's wait took 4-6.4 s, twice 8.3-8.6 s
# (2026-12-04), the attach's tokenizer load and the window's redraws sharing what CPU was left.
WAIT_MS = 60_000


def recorded(rank: int, kind: str) -> list[list[bytes]]:
    return recorded_frames(FRAMES, rank=rank, socket=kind)


class RecordedServer:
    """One rank of the recorded vLLM server on loopback (PUB + ROUTER replay).

    Like the server, its replay socket holds only what it has published: batch 0 (sent
    before the subscriber joined, as in the recording) and every batch `publish` was given.
    """

    def __init__(self, rank: int, port: int, replay_port: int) -> None:
        self.pub_frames = recorded(rank, "pub")
        self.replay_frames = recorded(rank, "replay")
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{port}")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(f"tcp://127.0.0.1:{replay_port}")
        self.num_replay_requests = 0
        self.buffered = {0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def send(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def publish(self, seq: int, drop: bool = False) -> None:
        """Buffer batch `seq` for replay and send its recorded PUB frames (unless `drop`:
        a batch the subscriber never sees on the PUB socket, a gap)."""
        self.buffered.add(seq)
        if not drop:
            self.send(next(f for f in self.pub_frames if int.from_bytes(f[1], "big") == seq))

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(30):
                continue
            client, _empty, start = self.router.recv_multipart()
            self.num_replay_requests += 1
            start_seq = int.from_bytes(start, "big")
            for frames in self.replay_frames:
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if (seq >= start_seq and seq in self.buffered) or seq == -1:
                    self.router.send_multipart([client, *frames])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.pub.close(linger=0)
        self.router.close(linger=0)


@pytest.fixture
def win(qtbot, tmp_path):
    with attach_window(qtbot, tmp_path) as w:
        yield w


@pytest.fixture
def servers():
    made: list[RecordedServer] = []

    def make(ranks: int = 1) -> tuple[list[RecordedServer], int, int]:
        port, replay = free_ports(ranks), free_ports(ranks)
        for r in range(ranks):
            made.append(RecordedServer(r, port + r, replay + r))
        return made, port, replay

    yield make
    for s in made:
        s.close()


def attach(win, port: int, replay: int, **kw) -> AttachSettings:
    opts = AttachOptions((f"tcp://127.0.0.1:{port}",), (f"tcp://127.0.0.1:{replay}",), **kw)
    return win.attach_remote(AttachSettings(opts))


def join(qtbot, win, server: RecordedServer, seq: int = 1) -> None:
    """Send batch `seq` until the subscriber has it (a SUB socket joins after a moment);
    the repeats are the same seq, which the subscriber drops as already seen."""

    def delivered() -> bool:
        server.publish(seq)
        qtbot.wait(20)
        return win.remote.health().batches >= seq + 1  # batches 0..seq, one rank

    qtbot.waitUntil(delivered, timeout=WAIT_MS)


def tiers(win) -> dict[str, int]:
    state = win.ctx.state
    return {c.tier: c.num_blocks for c in state.remote.tier_counts(state.projection)}


def settle(qtbot, win, condition) -> None:
    def done() -> bool:
        win.ctx.bridge.flush(everything=True)
        return condition()

    qtbot.waitUntil(done, timeout=WAIT_MS)


def test_late_join_gap_and_garbage_reach_every_view(qtbot, win, servers):
    (server,), port, replay = servers(1)
    attach(win, port, replay, topic="kv-events")
    state = win.ctx.state
    assert state.remote is not None and state.engine_info["remote"]
    join(qtbot, win, server, seq=1)
    # Joined at batch 1: batch 0 (published before we joined) comes from the replay socket.
    settle(qtbot, win, lambda: state.projection.num_hashed == 2)
    assert server.num_replay_requests >= 1
    assert win.remote.health().refilled >= 1
    assert tiers(win)["GPU"] == 2

    # A gap: batch 2 never reaches the PUB socket; batch 3 makes the subscriber refill it.
    server.publish(2, drop=True)
    server.publish(3)
    settle(qtbot, win, lambda: win.remote.health().batches >= 4)
    # batch 2 stored two salted blocks; batch 3 moved block 1 from the GPU to the CPU tier
    settle(qtbot, win, lambda: tiers(win) == {"GPU": 3, "CPU": 1, "STORAGE": 0})
    h = win.remote.health()
    assert h.missed == 0 and h.malformed == 0

    # Garbage: a seq frame that is not 8 bytes, and a payload that is not msgpack.
    server.send([b"kv-events", b"\x00\x04", b"\x93"])
    server.send([b"kv-events", (4).to_bytes(8, "big"), b"\xc1 not msgpack"])
    settle(qtbot, win, lambda: win.remote.health().malformed == 2)
    assert state.projection.num_hashed == 4  # nothing applied, the sequence did not move on
    server.publish(4)  # the real batch 4 still applies: AllBlocksCleared
    settle(qtbot, win, lambda: state.projection.num_hashed == 0)
    assert win.remote.health().missed == 0

    # The views, after the real flow.
    qtbot.wait(300)  # the status bar and remote plots refresh on their timers
    table = win.panels["block_table"]
    assert "vLLM pool" in table.summary.text()
    assert "GPU" in table.legend.text() and "CPU" in table.legend.text()
    log = win.panels["event_log"]
    stored = [e for e in state.log.events if e.kind == "block_stored"]
    assert len(stored) == 5 and {e.remote.medium for e in stored} == {"GPU", "CPU"}
    qtbot.waitUntil(lambda: log.model.rowCount() == len(state.log.events), timeout=WAIT_MS)
    details = [log.model.data(log.model.index(r, 4)) for r in range(log.model.rowCount())]
    assert sum("on CPU, rank 0, batch 3" in d for d in details) == 1
    timeline = win.panels["timeline"]
    assert timeline.remote_view.isVisible() and not timeline.glw.isVisible()
    # the dock is named for what it shows: a vLLM pool has no ref counts
    assert win.docks["timeline"].windowTitle() == "Cached blocks and rates"
    qtbot.waitUntil(lambda: timeline.remote_view.stored_per_s.sum() == 5, timeout=WAIT_MS)
    # removed: block 1 from the GPU (batch 3), then the 4 cleared by AllBlocksCleared
    assert timeline.remote_view.removed_per_s.sum() == 5
    metrics = win.panels["metrics"]
    qtbot.waitUntil(lambda: metrics.remote_view.lifetime_counts.sum() == 1, timeout=WAIT_MS)
    # block 1 was stored at server time 248.1 and left the GPU at 248.3 (for the CPU tier:
    # an offload, which is not a block computed twice)
    assert abs(state.remote.lifetimes[0] - 0.2) < 1e-3 and state.remote.num_stored_again == 0
    assert "stored again" in metrics.remote_view.summary.text()
    qtbot.waitUntil(lambda: "5 batches" in win.remote_label.text(), timeout=WAIT_MS)
    label = win.remote_label.text()
    assert "2 malformed" in label and "0 missed" in label and "refilled" in label


def test_block_table_colours_blocks_by_tier(qtbot, win, servers):
    (server,), port, replay = servers(1)
    attach(win, port, replay)
    join(qtbot, win, server, seq=1)
    server.publish(2, drop=True)
    server.publish(3)  # refills batch 2
    state = win.ctx.state
    settle(qtbot, win, lambda: tiers(win).get("CPU") == 1 and tiers(win)["GPU"] == 3)
    table = win.panels["block_table"]
    table.redraw()
    p = state.projection
    gpu = table.tiers["GPU"]
    cpu = table.tiers["CPU"]
    colours = {b: table.color_of(b) for b in range(p.num_blocks) if p.hashes[b] is not None}
    assert len(colours) == 4
    # each block is drawn in its tier's hue (all were stored within 10 s: full colour)
    num_gpu = sum(c == gpu for c in colours.values())
    num_cpu = sum(c == cpu for c in colours.values())
    assert (num_gpu, num_cpu) == (3, 1)
    cpu_block = next(b for b, c in colours.items() if c == cpu)
    assert "cached on CPU" in table.tooltip_for(cpu_block)


def test_two_data_parallel_ranks_make_one_combined_pool(qtbot, win, servers):
    made, port, replay = servers(2)
    attach(win, port, replay, topic="", data_parallel_size=2)
    join(qtbot, win, made[0], seq=1)

    def both() -> bool:
        made[1].publish(1)
        qtbot.wait(20)
        win.ctx.bridge.flush(everything=True)
        # every block of both ranks: the journal's rows reach the log a placing thread and a
        # tick after the pool has them, so rank 1's first block can show before its second
        return win.ctx.state.remote.ranks(win.ctx.state.projection) == {0: 2, 1: 2}

    qtbot.waitUntil(both, timeout=WAIT_MS)
    state = win.ctx.state
    by_rank = state.remote.ranks(state.projection)
    assert by_rank == {0: 2, 1: 2}  # rank 1's 32-byte hashes, joined late too
    assert any(len(h) == 32 for h in state.projection.by_hash) and any(len(h) == 8 for h in state.projection.by_hash)
    assert win.remote.num_streams == 2
    win.panels["block_table"].redraw()
    summary = win.panels["block_table"].summary.text()
    assert "rank 0 <b>2</b>" in summary and "rank 1 <b>2</b>" in summary


def test_restart_starts_a_fresh_pool_and_says_so(qtbot, win, servers):
    (server,), port, replay = servers(1)
    attach(win, port, replay)
    join(qtbot, win, server, seq=1)
    state = win.ctx.state
    settle(qtbot, win, lambda: state.projection.num_hashed == 2)
    server.publish(2)  # a batch seen live (a restart is judged by what the PUB socket sent)
    settle(qtbot, win, lambda: state.projection.num_hashed == 4)
    # The server restarts: its first batch is seq 0 again (the recorded batch 0, as PUB frames).
    server.buffered = {0}
    first = recorded(0, "replay")[0]
    server.send([first[1], first[2], first[3]])
    qtbot.waitUntil(lambda: any("restarted" in m for m in win.remote_messages), timeout=WAIT_MS)
    settle(qtbot, win, lambda: state.projection.num_hashed == 1)
    assert state.projection.num_resets >= 1
    assert win.remote.health().restarts == 1


def test_detach_stops_following_and_keeps_the_pool(qtbot, win, servers):
    (server,), port, replay = servers(1)
    attach(win, port, replay)
    join(qtbot, win, server, seq=1)
    state = win.ctx.state
    settle(qtbot, win, lambda: state.projection.num_hashed == 2)
    assert win.act_detach.isEnabled()
    win.detach_remote()
    assert not win.remote.is_attached and not win.act_detach.isEnabled()
    assert "detached" in win.remote_label.text()
    server.publish(3)
    qtbot.wait(300)
    win.ctx.bridge.flush(everything=True)
    assert state.projection.num_hashed == 2  # the last pool stays on screen, unchanged


@pytest.mark.parametrize("field, value, words", [
    ("endpoint", "localhost:5557", "not a ZMQ endpoint"),
    ("endpoint", "tcp://127.0.0.1:99999", "from 1 to 65535"),
    ("endpoint", "tcp://*:5557", "wildcard"),
    ("replay", "tcp://127.0.0.1:5557", "must differ"),
    ("tokenizer", "/nonexistent/tokenizer", "does not exist"),
])
def test_dialog_refuses_bad_fields_in_one_sentence(qtbot, field, value, words):
    dlg = AttachDialog(AttachSettings())
    qtbot.addWidget(dlg)
    getattr(dlg, field).setText(value)
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert dlg.options() is None and not dlg.error.isHidden()
    text = dlg.error.text()
    assert words in text and text.count(". ") == 0 and text.endswith(".")


def test_dialog_accepts_and_the_options_are_remembered(qtbot, tmp_path):
    ctx = make_test_context(tmp_path)
    dlg = AttachDialog(AttachSettings.load(ctx.settings))
    qtbot.addWidget(dlg)
    dlg.endpoint.setText(" tcp://10.0.0.7:6000 ")
    dlg.replay.setText("tcp://10.0.0.7:6001")
    dlg.ranks.setValue(4)
    dlg.hash_scheme.setCurrentText("vllm-sha256-cbor")
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    opts = dlg.options()
    assert opts is not None and opts.endpoint == "tcp://10.0.0.7:6000"
    assert opts.options.streams()[-1].endpoint == "tcp://10.0.0.7:6003"
    opts.save(ctx.settings)
    other = make_test_context(tmp_path)
    assert AttachSettings.load(other.settings) == opts
    other.shutdown()
    ctx.shutdown()


def test_dialog_takes_ipc_endpoints_for_every_rank(qtbot):
    """The engine's rule for data-parallel ipc endpoints (vLLM appends _dp<rank>), not a refusal."""
    dlg = AttachDialog(AttachSettings())
    qtbot.addWidget(dlg)
    dlg.endpoint.setText("ipc:///tmp/kv-events")
    dlg.replay.setText("")
    dlg.ranks.setValue(2)
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert dlg.error.isHidden() and dlg.options() is not None
    assert [s.endpoint for s in dlg.options().options.streams()] == ["ipc:///tmp/kv-events", "ipc:///tmp/kv-events_dp1"]


def test_attach_failure_is_one_sentence_and_leaves_no_pool(qtbot, win):
    with socket.socket() as s:  # a port in use: binding there fails
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match="Could not attach"):
            win.attach_remote(AttachSettings(AttachOptions((f"tcp://127.0.0.1:{port}",), bind=True)))
    assert not win.remote.is_attached and not win.act_detach.isEnabled()


def test_a_million_block_remote_pool_draws_aggregated(qtbot, win):
    """The grid of a huge remote pool is bounded (cells aggregate runs of blocks)."""
    from engine.remote.overlay import MAX_CELLS
    from engine.core.events import BlockStored, RemoteInfo

    state = win.ctx.state
    win.ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "model": "vLLM bench"})
    n = 300_000
    info_gpu = RemoteInfo(source="bench", medium="GPU")
    info_cpu = RemoteInfo(source="bench", medium="CPU")
    events = [BlockStored(seq=i, time=1000.0, request_id="r", block_id=-1,
                          block_hash=i.to_bytes(8, "big"), parent_hash=None, token_ids=(), salt=None,
                          remote=info_gpu if i % 3 else info_cpu) for i in range(n)]
    state.apply_events(events)
    table = win.panels["block_table"]
    table.redraw()
    assert table.blocks_per_cell == 2 and len(table.cell_colors) <= MAX_CELLS
    assert tiers(win) == {"GPU": n - n // 3, "CPU": n // 3, "STORAGE": 0}
    # an aggregated cell shows its hottest block: with a GPU block in every pair, all GPU
    assert np.all(table.cell_colors[: n // 2] == table.cell_colors[0])


def test_probe_follows_the_pool(qtbot, win, servers, tmp_path):
    """Tokens 1..40 against the recorded pool: two blocks held, then removed."""
    (server,), port, replay = servers(1)
    attach(win, port, replay)
    probe = win.panels["remote_probe"]
    prompt = tmp_path / "prompt.jsonl"
    prompt.write_text(json.dumps({"tokens": list(range(1, 41))}) + "\n")
    qtbot.waitUntil(lambda: win.remote.tokenizer is not None, timeout=30000)
    probe.open_file(prompt)
    # attaching fetched batch 0 from the replay socket: the first block only
    qtbot.waitUntil(lambda: probe.result is not None and probe.result.cached_tokens == 16, timeout=WAIT_MS)
    assert probe.result.first_missing_block == 1 and probe.result.reason == "never stored"
    join(qtbot, win, server, seq=1)
    qtbot.waitUntil(lambda: probe.result.cached_tokens == 32, timeout=WAIT_MS)
    assert probe.result.first_missing_block == 2 and "partial last block" in probe.result.reason
    assert "32 of 40 tokens cached" == probe.meter.format()
    server.publish(2, drop=True)
    server.publish(3, drop=True)
    server.publish(4)  # AllBlocksCleared (batches 2 and 3 are refilled first)
    qtbot.waitUntil(lambda: probe.result.cached_tokens == 0, timeout=WAIT_MS)
    assert probe.result.first_missing_block == 0 and "removed" in probe.result.reason
    assert "why: stored, then removed" in probe.answer.text()


def test_another_subject_ends_the_attach(qtbot, win, servers):
    from app.runtime.context import Subject

    (server,), port, replay = servers(1)
    attach(win, port, replay)
    assert win.ctx.subject.kind == "server" and "vLLM" in win.windowTitle()
    win.panels["timeline"].refresh(force=True)
    assert win.docks["timeline"].windowTitle() == "Cached blocks and rates"
    win.ctx.open_subject(Subject("trace", "a trace"), ask=False)
    assert not win.remote.is_attached and not win.act_detach.isEnabled()
    # the dock's title follows what it shows (the views keep the last pool until a new one)
    timeline = win.panels["timeline"]
    timeline.refresh(force=True)
    shows = "Cached blocks and rates" if timeline.remote_view.isVisible() else "Ref counts and evictions"
    assert win.docks["timeline"].windowTitle() == shows


def test_a_recorded_attach_opens_offline_and_scrubs(qtbot, win, servers, tmp_path):
    """`attach --record`'s capture (the engine's Recorder over the recorded frames) opened
    with File > Open: the same remote pool, offline, and scrubbing shows an earlier one."""
    from engine.analysis.remote_capture import Recorder
    from engine.remote.attachment import Attachment

    (server,), port, replay = servers(1)
    att = Attachment(AttachOptions(endpoints=(f"tcp://127.0.0.1:{port}",),
                                   replay_endpoints=(f"tcp://127.0.0.1:{replay}",), topic="kv-events"))
    db = tmp_path / "capture.db"
    rec = Recorder(str(db), att.options).start(att)
    att.start()

    def joined() -> bool:
        server.publish(1)
        return sum(h.batches for h in att.health()) >= 2

    wait_for(joined, timeout=WAIT_MS / 1000)
    server.publish(2, drop=True)
    server.publish(3)  # refills 2: GPU 3, CPU 1
    wait_for(lambda: sum(h.batches for h in att.health()) >= 4, timeout=WAIT_MS / 1000)
    att.stop()
    rec.finish({"streams": []})

    done: list = []
    assert win.open_file(db, on_done=done.append)  # its frames replayed a slice at a time
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)
    state = win.ctx.state
    assert state.remote is not None and win.ctx.subject.kind == "server" and not win.remote.is_attached
    assert tiers(win) == {"GPU": 3, "CPU": 1, "STORAGE": 0}
    assert "recorded" in win.windowTitle()
    stored = [e for e in state.log.events if e.kind == "block_stored"]
    state.scrub_to(stored[1].seq)  # after batches 0 and 1: two blocks
    assert state.projection.num_hashed == 2
    state.scrub_to(None)
    assert state.projection.num_hashed == 4


def test_an_attach_recorded_from_the_window_opens_again_as_it_was_shown(qtbot, win, servers, tmp_path):
    """File > Attach with "Record" keeps the frames in the open database until detach; File >
    Open of that database shows the same pool, offline, through the same columnar route."""
    from tests.test_live_journal import _said

    (server,), port, replay = servers(1)
    win.ctx.open_store(tmp_path / "sessions.db")
    opts = AttachOptions((f"tcp://127.0.0.1:{port}",), (f"tcp://127.0.0.1:{replay}",), topic="kv-events")
    win.attach_remote(AttachSettings(opts, record=True))
    assert win.remote.recorder is not None
    join(qtbot, win, server)
    server.publish(2, drop=True)
    server.publish(3)  # refills 2: GPU 3, CPU 1
    qtbot.waitUntil(lambda: win.remote.health().batches >= 4, timeout=WAIT_MS)
    settle(qtbot, win, lambda: tiers(win) == {"GPU": 3, "CPU": 1, "STORAGE": 0})
    shown = [_said(e) for e in win.ctx.state.log.events]
    win.detach_remote()
    assert win.remote.recorder is None
    assert win.remote_messages[-1].startswith("Recorded 4 batches as session ")
    done: list = []
    assert win.open_file(tmp_path / "sessions.db", on_done=done.append)  # its frames replayed a slice at a time
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)
    assert "recorded" in win.windowTitle() and not win.remote.is_attached
    assert tiers(win) == {"GPU": 3, "CPU": 1, "STORAGE": 0}
    assert [_said(e) for e in win.ctx.state.log.events] == shown


def test_recording_without_a_database_is_one_sentence_and_no_attach(qtbot, win, servers):
    (server,), port, replay = servers(1)
    win.ctx.close_store()
    opts = AttachOptions((f"tcp://127.0.0.1:{port}",), (f"tcp://127.0.0.1:{replay}",))
    with pytest.raises(ValueError) as err:
        win.attach_remote(AttachSettings(opts, record=True))
    assert str(err.value) == "Could not record the attach: no session database is open (File > Open a .db first)."
    assert not win.remote.is_attached and win.remote.recorder is None


def test_probe_of_typed_text_and_before_attaching(qtbot, win, servers, default_tokenizer):
    probe = win.panels["remote_probe"]
    probe.set_prompt("What is a prefix cache?")
    assert probe.result is None and "Attach to a vLLM server first" in probe.answer.text()
    (server,), port, replay = servers(1)
    attach(win, port, replay)
    qtbot.waitUntil(lambda: win.remote.tokenizer is not None, timeout=30000)
    probe.set_prompt("What is a prefix cache?")
    from engine.analysis.diff import request_from_text

    ids = request_from_text(default_tokenizer, "What is a prefix cache?").token_ids  # the chat template
    assert probe.result.prompt_tokens == len(ids) > 10 and probe.result.cached_tokens == 0
    probe.chat.setChecked(False)
    probe.rebuild()
    raw = default_tokenizer.encode("What is a prefix cache?", add_special_tokens=False)
    assert probe.result.prompt_tokens == len(raw)


def test_one_rank_clearing_keeps_the_other_ranks_blocks(qtbot, win, servers):
    made, port, replay = servers(2)
    attach(win, port, replay, topic="", data_parallel_size=2)
    state = win.ctx.state

    def both() -> bool:
        for s in made:
            s.publish(1)
        qtbot.wait(20)
        win.ctx.bridge.flush(everything=True)
        return state.remote.ranks(state.projection) == {0: 2, 1: 2}

    qtbot.waitUntil(both, timeout=WAIT_MS)
    made[0].publish(2, drop=True)
    made[0].publish(3, drop=True)
    made[0].publish(4)  # rank 0's AllBlocksCleared
    settle(qtbot, win, lambda: state.projection.num_resets == 1)
    assert state.remote.ranks(state.projection) == {1: 2} and state.projection.num_hashed == 2
    assert tiers(win)["GPU"] == 2


ORDER = (False, True)


def _drawn(qtbot, win) -> dict:
    """What the views show of the attached pool: block table colours per tier, counts, the
    event log's rows, the timelines' and metrics' series, and the pool scrubbed back."""
    state = win.ctx.state
    table = win.panels["block_table"]
    table.redraw()
    p = state.projection
    names = {table.tiers[t].name(): t for t in table.tiers}
    colours = Counter(names.get(table.color_of(b).name(), table.color_of(b).name())
                      for b in range(p.num_blocks) if p.hashes[b] is not None)
    log = win.panels["event_log"]
    qtbot.waitUntil(lambda: log.model.rowCount() == len(state.log), timeout=WAIT_MS)
    remote = win.panels["timeline"].remote_view
    stored, removed = len(state.remote.stored_times), len(state.remote.removed_times)
    qtbot.waitUntil(lambda: remote.stored_per_s.sum() == stored and remote.removed_per_s.sum() == removed,
                    timeout=WAIT_MS)
    events = [(e.kind, getattr(e, "block_hash", None), e.remote.medium if e.remote else None,
               e.remote.rank if e.remote else None) for e in state.log.events]
    scrubbed = []
    for seq in [int(s) for s in state.log.seqs]:
        state.scrub_to(seq)
        q = state.projection
        scrubbed.append(Counter(q.hashes[b] for b in range(q.num_blocks) if q.hashes[b] is not None))
    state.scrub_to(None)
    return {"colours": colours, "tiers": tiers(win), "ranks": state.remote.ranks(state.projection),
            "num_hashed": p.num_hashed, "resets": p.num_resets, "events": events,
            "rows": log.model.rowCount(), "stored_per_s": remote.stored_per_s.tolist(),
            "removed_per_s": remote.removed_per_s.tolist(), "lifetimes": sorted(state.remote.lifetimes),
            "stored_again": state.remote.num_stored_again, "scrubbed": scrubbed,
            "event_counts": (state.projection.counters.num_stored_blocks, state.projection.counters.num_evicted_blocks)}


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_journal_route_draws_what_the_event_route_draws(qtbot, win, servers, ranks):
    """The same recorded server (a late join, a refilled gap, a tier move, garbage, a
    restart; two data-parallel ranks too) attached through the pools' journal (the
    default) and through the reference RemotePool's events: the views show the same."""
    drawn = {}
    for journal in ORDER:
        win.remote.journal = journal
        made, port, replay = servers(ranks)
        made = made[-ranks:]  # this attach's servers (the fixture keeps every one it made)
        attach(win, port, replay, topic="" if ranks > 1 else "kv-events", data_parallel_size=ranks)
        state = win.ctx.state
        assert win.remote.journalling is journal and state.journal_fed is journal
        join(qtbot, win, made[0], seq=1)
        made[0].publish(2, drop=True)
        made[0].publish(3)  # refills batch 2; batch 3 moves a block to the CPU tier
        made[0].send([b"kv-events", (4).to_bytes(8, "big"), b"\xc1 not msgpack"])
        settle(qtbot, win, lambda: win.remote.health().batches >= 4 and tiers(win).get("CPU") == 1)
        if ranks > 1:
            def rank1() -> bool:
                made[1].publish(1)
                qtbot.wait(20)
                win.ctx.bridge.flush(everything=True)
                return state.remote.ranks(state.projection).get(1) == 2
            qtbot.waitUntil(rank1, timeout=WAIT_MS)
        else:  # the server restarts: its first batch is seq 0 again
            made[0].buffered = {0}
            first = recorded(0, "replay")[0]
            made[0].send([first[1], first[2], first[3]])
            qtbot.waitUntil(lambda: win.remote.health().restarts == 1, timeout=WAIT_MS)
            settle(qtbot, win, lambda: state.projection.num_hashed == 1)
        qtbot.wait(100)
        settle(qtbot, win, lambda: True)
        win.remote.detach()
        drawn[journal] = _drawn(qtbot, win)
    win.remote.journal = True
    got, ref = drawn[True], drawn[False]
    assert got["colours"] and got["events"]
    if ranks > 1:  # two ranks' batches interleave as they arrive, on either route
        for d in (got, ref):
            d["events"], d["scrubbed"] = Counter(d["events"]), d["scrubbed"][-1]
            # and the timeline's seconds start at the first block either rank's rows bring, which
            # the arrival order decides too (seen once under load: [7] on one route, [5, 2] on the
            # other): the same stores and removals, however the seconds cut them
            d["stored_per_s"], d["removed_per_s"] = sum(d["stored_per_s"]), sum(d["removed_per_s"])
    assert got == ref


def test_a_second_attach_takes_the_tokenizer_already_loaded(qtbot, win, servers, monkeypatch):
    """The tokenizer is loaded once per folder: loading it held the GIL for up to 290 ms at
    a time, and each attach froze the window that long to load the same one again."""
    import engine.model.loader as loader

    loads = []
    real = loader.load_tokenizer
    monkeypatch.setattr(loader, "load_tokenizer", lambda folder=None: loads.append(folder) or real(folder))
    (server,), port, replay = servers(1)
    attach(win, port, replay)
    qtbot.waitUntil(lambda: win.remote.tokenizer is not None, timeout=30000)
    first = win.remote.tokenizer
    win.detach_remote()
    heard = []
    win.remote.sigTokenizer.connect(heard.append)
    attach(win, port, replay)
    assert win.remote.tokenizer is None  # told at the next pass of the loop, as a load tells
    qtbot.waitUntil(lambda: win.remote.tokenizer is not None, timeout=5000)
    assert win.remote.tokenizer is first and heard == [first]
    assert loads == [None]
    assert first.decode(first.encode("cached blocks", add_special_tokens=False)) == "cached blocks"


def test_an_earlier_attachs_tokenizer_that_loads_last_is_not_taken(qtbot, win, monkeypatch):
    """Each attach loads its tokenizer on a thread of its own: one chosen by an attach that
    ended, whose load finished after the next attach's, is not the one the views decode with."""
    import threading

    import engine.model.loader as loader

    slow_may_end = threading.Event()
    chosen_before, chosen_now = object(), object()

    from app.runtime import remote

    class Turns:  # app.runtime.imports.BACKGROUND_IMPORTS, and which thread has it
        def __init__(self) -> None:
            self.lock, self.holder = threading.Lock(), None

        def __enter__(self) -> None:
            self.lock.acquire()
            self.holder = threading.get_ident()

        def __exit__(self, *exc) -> None:
            self.holder = None
            self.lock.release()

    turns = Turns()
    monkeypatch.setattr(remote, "BACKGROUND_IMPORTS", turns, raising=False)

    def load(folder=None):
        assert turns.holder == threading.get_ident()  # its imports take turns with a model load's
        if folder == "/tokenizers/before":
            assert slow_may_end.wait(10)
            return chosen_before
        return chosen_now

    monkeypatch.setattr(loader, "load_tokenizer", load)
    heard = []
    win.remote.sigTokenizer.connect(heard.append)
    win.remote._load_tokenizer("/tokenizers/before")  # an attach, detached before it loaded
    win.remote._load_tokenizer("/tokenizers/now")  # the next attach's (it loads after: their turns)
    slow_may_end.set()
    qtbot.waitUntil(lambda: win.remote.tokenizer is chosen_now, timeout=5000)
    qtbot.waitUntil(lambda: "/tokenizers/before" in win.remote._tokenizers, timeout=5000)
    qtbot.wait(50)  # every signal delivered at a pass of the loop
    assert win.remote.tokenizer is chosen_now and heard == [chosen_now]
    win.remote._load_tokenizer("/tokenizers/before")  # chosen again: loaded once, taken now
    qtbot.waitUntil(lambda: win.remote.tokenizer is chosen_before, timeout=5000)


@pytest.mark.model
@pytest.mark.parametrize("model, loads_one", [("default_model", False), ("tiny_model", True)])
def test_an_attach_takes_the_default_models_tokenizer_from_the_window(qtbot, win, servers, monkeypatch, request,
                                                                      model, loads_one):
    """The default model's tokenizer is the window's model's when that model is the default
    one (SmolLM2 loaded by `make run`): not loaded again (a first attach froze the window up
    to 290 ms for it); another model's is not taken for it."""
    import types

    import engine.model.loader as loader

    loaded = request.getfixturevalue(model)
    loads = []
    real = loader.load_tokenizer
    monkeypatch.setattr(loader, "load_tokenizer", lambda folder=None: loads.append(folder) or real(folder))
    monkeypatch.setattr(win.ctx, "runner", types.SimpleNamespace(loaded=loaded, tokenizer=loaded.tokenizer))
    (server,), port, replay = servers(1)
    attach(win, port, replay)
    qtbot.waitUntil(lambda: win.remote.tokenizer is not None, timeout=30000)
    assert loads == ([None] if loads_one else [])
    assert (win.remote.tokenizer is loaded.tokenizer) is not loads_one


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads have their own priority on Linux")
def test_the_attachs_threads_run_below_the_gui_thread(qtbot, win, servers):
    """The subscriber's and the placer's threads give way to the window's passes on a busy
    machine (app.runtime.remote.BACKGROUND_NICE): read back from the kernel."""
    from app.runtime.remote import BACKGROUND_NICE

    (server,), port, replay = servers(1)
    attach(win, port, replay)
    join(qtbot, win, server, seq=1)
    gui = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    names = {}
    for t in threading.enumerate():
        if t.name.startswith(("vllm-sub", "journal-placer")):
            names[t.name.split()[0]] = os.getpriority(os.PRIO_PROCESS, t.native_id)
    want = {"vllm-sub": min(19, gui + BACKGROUND_NICE)}
    if win.remote.journalling and win.remote.placing_thread:
        want["journal-placer"] = min(19, gui + BACKGROUND_NICE)
    assert names == want and "journal-placer" in want  # the window takes the journal route
