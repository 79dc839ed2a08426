"""The app attached to a fleet: three loopback publishers play the three pods of
`three-pods-one-endpoint` (tests/data/vllm_connector/README.md, recorded from vLLM 0.33.0's
own publisher), and the Fleet panel shows what those frames say.

Each pod publishes its recorded frames byte for byte (topic `kv@<pod>@<model>`, its own
sequence from 0) on its own PUB socket, in the order they were recorded. Pod .11 stores A
then removes A's last two blocks; pod .12 stores A's first two on GPU, then on CPU; pod .13
stores C (A's first two blocks, then two of its own). The views are read back: counts per
server, the duplicates, where a prefix lives, the router's scores and its best server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zmq
from PySide6.QtWidgets import QDialogButtonBox

from app.dialogs.attach_dialog import CENTRAL, FLEET, AttachDialog
from app.runtime.remote import AttachSettings
from engine.remote.attachment import AttachOptions
from engine.remote.wire import canonical_hash, decode_batch, parse_pub
from _publishers import attach_window, recorded_frames
from test_vllm_attach import free_ports, wait_for, wait_for_subscriber

DATA = Path(__file__).resolve().parent / "data" / "vllm_connector" / "vllm_connector_frames.jsonl"
PODS = ("10.0.0.11:8000", "10.0.0.12:8000", "10.0.0.13:8000")
A = [canonical_hash(int(x, 16)) for x in ("d1ecdf87c874fd55", "2e94951059393917", "144e9e182eba6c69",
                                          "6c7227160ecd624a")]
C = A[:2] + [canonical_hash(int(x, 16)) for x in ("f75a7a8ae8906883", "6ef4ef4f48e20601")]
# The longest wait for what the attached window shows; a wait ends as soon as its condition
# holds, so this only bounds a loaded machine (test_remote_app: 8.6 s once for a step that
# takes a second or two on an idle one).
WAIT_MS = 60_000


def recorded() -> list[tuple[str, list[bytes]]]:
    """(pod, frames) of every recorded PUB message, in the order they were recorded."""
    out = [(frames[0].decode().split("@")[1], frames)
           for frames in recorded_frames(DATA, case="three-pods-one-endpoint", socket="pub")]
    assert [p for p, _f in out] == [PODS[1], PODS[2], PODS[0], PODS[1], PODS[0]]
    return out


def tokens_of(pod: str) -> tuple[int, ...]:
    """The token ids of a pod's first store (A for .11, C for .13), as its frame carries them."""
    frames = next(f for p, f in recorded() if p == pod)
    return decode_batch(parse_pub(frames)[1], frames[2]).events[0].token_ids


class Pod:
    """One pod on loopback: an XPUB socket (a PUB that hears its subscribers) sending its
    recorded frames unchanged, bound to its own port or, as in llm-d's centralized mode,
    connected to one endpoint the subscriber binds."""

    def __init__(self, name: str, port: int, connect: bool = False) -> None:
        self.name = name
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.sock = zmq.Context.instance().socket(zmq.XPUB)
        if connect:
            self.sock.connect(self.endpoint)
        else:
            self.sock.bind(self.endpoint)

    def close(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture
def win(qtbot, tmp_path):
    with attach_window(qtbot, tmp_path) as w:
        yield w


@pytest.fixture
def pods():
    base = free_ports(3)
    made = [Pod(name, base + i) for i, name in enumerate(PODS)]
    yield {p.name: p for p in made}
    for p in made:
        p.close()


def attach_fleet(win, pods) -> None:
    opts = AttachOptions(tuple(pods[n].endpoint for n in PODS), servers=PODS)
    win.attach_remote(AttachSettings(opts))
    for n in PODS:
        wait_for_subscriber(pods[n].sock)


def publish(qtbot, win, pods, messages) -> None:
    """Send recorded messages, each from its pod, and wait until the fleet has them all."""
    want = len(messages) + sum(s.health.batches for s in win.remote.fleet_snapshot(0).servers)
    for pod, frames in messages:
        pods[pod].sock.send_multipart(frames)

    def arrived() -> bool:
        return sum(s.health.batches for s in win.remote.fleet_snapshot(0).servers) >= want

    def applied() -> bool:  # a stream holds a batch up to HOLD_SECONDS before its pool applies it
        return win.remote.with_fleet(lambda f: sum(p.num_batches for ps in f.servers.values() for p in ps), 0) \
            >= sum(s.health.batches for s in win.remote.fleet_snapshot(0).servers)

    qtbot.waitUntil(arrived, timeout=WAIT_MS)
    qtbot.waitUntil(applied, timeout=WAIT_MS)
    fleet = win.panels["fleet"]
    fleet.refresh()


def test_three_pods_side_by_side(qtbot, win, pods):
    attach_fleet(win, pods)
    fleet = win.panels["fleet"]
    publish(qtbot, win, pods, recorded())
    # the fleet goes through the pools' journal: the window's pool holds every pod's blocks
    assert win.remote.journalling and win.ctx.state.journal_fed
    qtbot.waitUntil(lambda: win.ctx.state.projection.num_hashed == 10, timeout=WAIT_MS)
    t = fleet.servers
    assert [t.cell("Blocks", p) for p in PODS] == ["2", "4", "4"]
    assert [t.cell("GPU blocks", p) for p in PODS] == ["2", "2", "4"]
    assert [t.cell("CPU blocks", p) for p in PODS] == ["0", "2", "0"]
    assert [t.cell("Batches", p) for p in PODS] == ["2", "2", "1"]
    assert [t.cell("Missed", p) for p in PODS] == ["0", "0", "0"]
    assert [t.cell("Held elsewhere too", p) for p in PODS] == ["2", "2", "2"]
    assert all(t.cell("Last seen", p) != "never" for p in PODS)
    assert "<b>3</b> server(s)" in fleet.summary.text() and "<b>10</b> blocks" in fleet.summary.text()


def test_health_per_server_counts_a_lost_batch_on_its_own_server(qtbot, win, pods):
    """Pod .11's batch 0 never arrives (no replay socket to refill it): only .11 misses a
    batch, and its removal of blocks it was never seen to store leaves it empty."""
    attach_fleet(win, pods)
    assert win.docks["fleet"].isVisible()  # a fleet's attach brings the panel forward
    fleet = win.panels["fleet"]
    lost = [m for m in recorded() if not (m[0] == PODS[0] and parse_pub(m[1])[1] == 0)]
    publish(qtbot, win, pods, lost)
    t = fleet.servers
    assert [t.cell("Missed", p) for p in PODS] == ["1", "0", "0"]
    assert [t.cell("Batches", p) for p in PODS] == ["1", "2", "1"]
    assert [t.cell("Blocks", p) for p in PODS] == ["0", "4", "4"]
    assert "1 batch(es) missed" in fleet.summary.text()


def test_tiers_keep_their_raw_media_names_per_server(qtbot, win):
    """A vLLM server with offload connectors (`one-server`: `cpu` from MooncakeStore,
    `cuda:0` from LMCache, STORAGE chunks, a placeholder store) beside SGLang's rank 1 (its
    `EXTERNAL` pool): each tier is counted once, the producers' raw names beside it."""
    base = free_ports(2)
    vllm, sglang = Pod("vllm-offload", base), Pod("sglang-r1", base + 1)
    try:
        opts = AttachOptions((vllm.endpoint, sglang.endpoint), servers=(vllm.name, sglang.name))
        win.attach_remote(AttachSettings(opts))
        wait_for_subscriber(vllm.sock)
        wait_for_subscriber(sglang.sock)
        one = recorded_frames(DATA, case="one-server", socket="pub")
        r1 = recorded_frames(DATA.parents[1] / "sglang" / "sglang_zmq_frames.jsonl", rank=1, socket="pub")
        publish(qtbot, win, {vllm.name: vllm, sglang.name: sglang},
                [(vllm.name, f) for f in one] + [(sglang.name, f) for f in r1])
        t = win.panels["fleet"].servers
        assert t.cell("GPU blocks", vllm.name) == "8  (GPU, cuda:0)"
        assert t.cell("CPU blocks", vllm.name) == "4  (CPU, cpu)"
        assert t.cell("STORAGE blocks", vllm.name) == "4"  # chunk A's eviction keeps what chunk C holds
        assert t.cell("No token ids", vllm.name) == "2"  # the OffloadingConnector's placeholder store
        assert t.cell("REMOTE blocks", sglang.name) == "1  (EXTERNAL)"
        assert t.cell("GPU blocks", sglang.name) == "0"
    finally:
        vllm.close()
        sglang.close()


def test_combined_blocks_duplicates_and_where_a_prefix_lives(qtbot, win, pods):
    attach_fleet(win, pods)
    fleet = win.panels["fleet"]
    fleet.tabs.setCurrentIndex(1)
    publish(qtbot, win, pods, recorded())
    rows = fleet.blocks.rows_shown()
    assert len(rows) == 10
    assert sorted((b.server, b.tier, b.key) for b in rows if b.server == PODS[0]) == sorted(
        (PODS[0], "GPU", k) for k in A[:2])  # .11 removed A's last two
    fleet.server_filter.setCurrentText(PODS[2])
    assert {b.key for b in fleet.blocks.rows_shown()} == set(C)
    fleet.server_filter.setCurrentText("every server")
    fleet.shared_only.setChecked(True)
    dup = fleet.blocks.rows_shown()
    assert len(dup) == 8 and {b.key for b in dup} == set(A[:2]) and all(b.num_servers == 3 for b in dup)
    # (A's two blocks on .11's GPU, .12's GPU and CPU, .13's GPU); rows are coloured by their server: one colour per server, three in all
    colors = {fleet.blocks.model().data(fleet.blocks.model().index(r, 0), 8).color().name()  # BackgroundRole
              for r in range(fleet.blocks.model().rowCount())}
    assert len(colors) == 3

    shared = fleet.shared
    assert shared.rowCount() == 2
    assert {shared.item(r, 0).data(256) for r in range(2)} == set(A[:2])  # UserRole: the hash
    assert [shared.item(r, 1).text() for r in range(2)] == ["3", "3"]
    assert [shared.item(r, 2).text() for r in range(2)] == ["4", "4"]  # .12 holds it on GPU and CPU
    assert "6 beyond one each" in fleet.shared_label.text()

    fleet.choose(PODS[2], C[3])  # C's last block, as .13 holds it: its prefix is C
    assert [p.key for p in fleet.location.places] == C
    assert fleet.location.held() == [list(PODS), list(PODS), [PODS[2]], [PODS[2]]]
    assert "2 of them on every server" in fleet.location_label.text()


def test_the_router_picks_a_server_live_and_by_tier_weight(qtbot, win, pods, tmp_path):
    attach_fleet(win, pods)
    fleet = win.panels["fleet"]
    fleet.tabs.setCurrentIndex(3)
    router = fleet.router
    prompt = tmp_path / "c.jsonl"  # a token trace: C's token ids as pod .13's frame carries them
    prompt.write_text(json.dumps({"id": "c", "tokens": list(tokens_of(PODS[2]))}) + "\n")
    router.open_file(prompt)
    assert router.keys and [k[-8:] for k in router.keys] == C  # vLLM's digests; the events carry their tail
    assert router.view.best_server is None and "No server holds block 0" in router.best.text()

    messages = recorded()
    publish(qtbot, win, pods, messages[:1])  # only .12's A[:2] on GPU so far
    assert router.view.best_server == PODS[1]
    assert router.scores()[PODS[1]] == {"server": PODS[1], "matched_blocks": 2, "cached_tokens": 32,
                                        "score": 2.0, "overlap_blocks": 2}

    for pod, frames in messages[1:]:  # then .13 stores C: the panel follows by itself (no refresh asked)
        pods[pod].sock.send_multipart(frames)
    qtbot.waitUntil(lambda: router.view is not None and router.view.best_server == PODS[2], timeout=WAIT_MS)
    qtbot.waitUntil(lambda: [router.scores()[p]["matched_blocks"] for p in PODS] == [2, 2, 4], timeout=WAIT_MS)
    assert [router.scores()[p]["matched_blocks"] for p in PODS] == [2, 2, 4]
    assert [router.scores()[p]["cached_tokens"] for p in PODS] == [32, 32, 64]
    assert router.table.item(2, 0).text() == PODS[2] and router.table.item(2, 1).text() == "4 of 4"
    assert PODS[2] in router.best.text() and "llm-d score 4" in router.best.text()
    assert router.location.held() == [list(PODS), list(PODS), [PODS[2]], [PODS[2]]]

    router.set_token_ids(tokens_of(PODS[0]))  # A: every pod holds its first two blocks
    assert [router.scores()[p]["score"] for p in PODS] == [2.0, 2.0, 2.0]
    assert router.view.best_server == PODS[0]  # a tie goes to the server listed first
    assert router.set_weights("GPU=0.5,CPU=1")  # .12 holds A[:2] on CPU too: now it weighs most
    assert [router.scores()[p]["score"] for p in PODS] == [1.0, 2.0, 1.0]
    assert router.view.best_server == PODS[1]
    assert not router.set_weights("GPU=fast")
    assert router.view is None and "TIER=WEIGHT" in router.best.text()


def test_centralized_mode_three_pods_connect_to_one_bound_endpoint(qtbot, win):
    """llm-d's centralized mode: every pod's PUB socket connects to the address the app binds;
    each topic `kv@<pod>@<model>` is a server of its own, named by its pod."""
    port = free_ports(1)
    win.attach_remote(AttachSettings(AttachOptions((f"tcp://127.0.0.1:{port}",), bind=True)))
    made = [Pod(name, port, connect=True) for name in PODS]
    try:
        for p in made:
            wait_for_subscriber(p.sock)
        by_name = {p.name: p for p in made}
        fleet = win.panels["fleet"]
        publish(qtbot, win, by_name, recorded())
        # in the order their first frames came (ZMQ queues the pods' connections fairly, so any order)
        assert sorted(fleet.snapshot.server_names) == list(PODS)
        assert [fleet.servers.cell("Blocks", p) for p in PODS] == ["2", "4", "4"]
        assert [fleet.servers.cell("Batches", p) for p in PODS] == ["2", "2", "1"]
        assert [fleet.servers.cell("Missed", p) for p in PODS] == ["0", "0", "0"]
        assert {s.key for s in fleet.snapshot.shared} == set(A[:2])
        fleet.router.set_token_ids(tokens_of(PODS[2]))
        assert fleet.router.view.best_server == PODS[2]
        # the pods' pools journal into the window's log: 2 + 4 + 4 blocks held, each pod's own
        assert win.remote.journalling and win.ctx.state.journal_fed
        qtbot.waitUntil(lambda: win.ctx.state.projection.num_hashed == 10, timeout=WAIT_MS)
        assert {e.remote.source for e in win.ctx.state.log.events} == set(PODS)
    finally:
        for p in made:
            p.close()


def test_a_recorded_fleet_opens_offline(qtbot, win, pods, tmp_path):
    from engine.analysis.remote_capture import Recorder
    from engine.remote.attachment import Attachment

    att = Attachment(AttachOptions(tuple(pods[n].endpoint for n in PODS), servers=PODS))
    db = tmp_path / "fleet.db"
    rec = Recorder(str(db), att.options).start(att)
    att.start()
    for n in PODS:
        wait_for_subscriber(pods[n].sock)
    for pod, frames in recorded():
        pods[pod].sock.send_multipart(frames)
    wait_for(lambda: sum(h.batches for h in att.health()) >= 5, timeout=WAIT_MS / 1000)
    att.stop()
    rec.finish({"streams": []})

    done: list = []
    assert win.open_file(db, on_done=done.append)  # its frames replayed a slice at a time
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)
    assert not win.remote.is_attached and win.remote.recorded_fleet is not None
    fleet = win.panels["fleet"]
    fleet.refresh()
    snap = fleet.snapshot
    endpoint = {n: n for n in PODS}  # the capture's events name their servers
    assert sorted(snap.server_names) == sorted(PODS)
    assert {n: snap.server(endpoint[n]).num_blocks for n in PODS} == {PODS[0]: 2, PODS[1]: 4, PODS[2]: 4}
    assert snap.server(endpoint[PODS[1]]).blocks_in("CPU") == 2
    assert {s.key for s in snap.shared} == set(A[:2])
    assert "recorded, offline" in fleet.summary.text()
    router = fleet.router
    router.set_token_ids(tokens_of(PODS[2]))
    assert router.view.best_server == endpoint[PODS[2]]


def test_the_dialog_reads_a_servers_file_and_a_bind_address(qtbot, tmp_path):
    dlg = AttachDialog(AttachSettings())
    qtbot.addWidget(dlg)
    servers = tmp_path / "servers.txt"
    servers.write_text("# the pods\npod-a tcp://10.0.0.11:5557 tcp://10.0.0.11:5558\n"
                       "pod-b tcp://10.0.0.12:5557 tcp://10.0.0.12:5558\n\ntcp://10.0.0.13:5557\n")
    assert dlg.load_servers_file(servers) and dlg.mode.currentText() == FLEET
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    got = dlg.options()
    assert got is not None and got.options.servers == ("pod-a", "pod-b", "tcp://10.0.0.13:5557")
    assert got.options.endpoints == ("tcp://10.0.0.11:5557", "tcp://10.0.0.12:5557", "tcp://10.0.0.13:5557")
    assert got.options.replay_endpoints == ("tcp://10.0.0.11:5558", "tcp://10.0.0.12:5558")
    assert [s.server for s in got.options.streams()] == ["pod-a", "pod-b", "tcp://10.0.0.13:5557"]
    assert AttachSettings.from_dict(got.to_dict()) == got

    again = AttachDialog(got)  # remembered settings come back as the list
    qtbot.addWidget(again)
    assert again.mode.currentText() == FLEET and again.servers.toPlainText().splitlines()[0].startswith("pod-a ")

    binary = tmp_path / "servers.bin"
    binary.write_bytes(b"\xff\xfe pod tcp://")
    assert not dlg.load_servers_file(binary) and "not UTF-8 text" in dlg.error.text()
    assert not dlg.load_servers_file(tmp_path / "missing.txt") and "cannot be read" in dlg.error.text()

    dlg.mode.setCurrentText(CENTRAL)
    dlg.bind_address.setText("tcp://*:5557")
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    central = dlg.options()
    assert central.options.bind and central.options.endpoints == ("tcp://*:5557",) and central.options.servers == ()


@pytest.mark.parametrize("text, words", [
    ("pod-a 10.0.0.11:5557", "is not 'name endpoint [replay]'"),
    ("pod-a tcp://10.0.0.11:99999", "Line 1"),
    ("pod-a tcp://10.0.0.11:5557\npod-a tcp://10.0.0.12:5557", "a second time"),
    ("pod-a tcp://10.0.0.11:5557 tcp://10.0.0.11:5557", "must differ"),
    ("# nothing", "at least one server"),
])
def test_the_dialog_refuses_a_bad_servers_list_in_one_sentence(qtbot, text, words):
    dlg = AttachDialog(AttachSettings())
    qtbot.addWidget(dlg)
    dlg.mode.setCurrentText(FLEET)
    dlg.servers.setPlainText(text)
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert dlg.options() is None and not dlg.error.isHidden()
    msg = dlg.error.text()
    assert words in msg and msg.endswith(".") and msg.count(". ") == 0, msg
