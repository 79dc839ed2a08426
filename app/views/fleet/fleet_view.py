"""The Fleet panel: every server of an attach (or a recorded capture) at once.

Tabs: Servers (side by side: blocks, tiers with their raw media names, health), Blocks
(every block of the fleet coloured by its server; pick one to see where its prefix lives),
Shared (blocks held by more than one server: memory spent twice) and Router (a probe
prompt scored the way a KV-aware router scores it). It redraws at most every REFRESH_MS
while the pools change, from one `FleetSnapshot` read through `ctx.remote`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QSplitter, QTabWidget, QVBoxLayout, QWidget

from app.ui import theme
from app.ui.widgets import PanelView
from app.views.fleet.router import RouterPanel
from app.views.fleet.tables import FleetBlockTable, LocationGrid, ServersTable, SharedTable, short_hash
from engine.remote.fleet_view import FleetSnapshot, locate, prefix_of

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

REFRESH_MS = 250  # at most this often while the pools change
# A fleet's snapshot costs time in its number of blocks (read under the attachment's lock):
# the next refresh waits this many times as long as the last one took, so a big fleet
# never keeps the GUI thread (or the subscribers) busy most of the time.
BACKOFF = 4
ALL_SERVERS = "every server"


class FleetView(PanelView):
    """The fleet panel. `snapshot` is what it last drew; `tabs` holds the four views."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("fleet_view")
        self.snapshot = FleetSnapshot()
        self.chosen: tuple[str, bytes] | None = None  # (server, hash) whose prefix is located

        self.summary = QLabel()
        self.summary.setObjectName("fleet_summary")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)

        self.servers = ServersTable()

        self.blocks = FleetBlockTable()
        self.server_filter = QComboBox()
        self.server_filter.addItem(ALL_SERVERS)
        self.server_filter.currentTextChanged.connect(self._filter)
        self.shared_only = QCheckBox("held by more than one server")
        self.shared_only.toggled.connect(lambda _on: self._fill_blocks())
        self.blocks_label = QLabel()
        self.blocks_label.setObjectName("fleet_blocks_label")
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(QLabel("show"))
        bar.addWidget(self.server_filter)
        bar.addWidget(self.shared_only)
        bar.addStretch(1)
        bar.addWidget(self.blocks_label)
        self.location = LocationGrid()
        self.location_label = QLabel("Pick a block: where its prefix (block 0 up to it) lives across the fleet.")
        self.location_label.setObjectName("fleet_location_label")
        self.location_label.setWordWrap(True)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addLayout(bar)
        top_layout.addWidget(self.blocks, 1)
        bottom = QWidget()
        bottom_layout = QVBoxLayout(bottom)
        bottom_layout.setContentsMargins(0, 0, 0, 0)
        bottom_layout.addWidget(self.location_label)
        bottom_layout.addWidget(self.location, 1)
        blocks_tab = QSplitter(Qt.Orientation.Vertical)
        blocks_tab.addWidget(top)
        blocks_tab.addWidget(bottom)
        blocks_tab.setStretchFactor(0, 3)
        blocks_tab.setStretchFactor(1, 2)
        self.blocks.selectionModel().currentRowChanged.connect(lambda cur, _prev: self._choose_row(cur.row()))

        self.shared = SharedTable()
        self.shared_label = QLabel()
        self.shared_label.setObjectName("fleet_shared_label")
        self.shared_label.setWordWrap(True)
        shared_tab = QWidget()
        shared_layout = QVBoxLayout(shared_tab)
        shared_layout.setContentsMargins(0, 0, 0, 0)
        shared_layout.addWidget(self.shared_label)
        shared_layout.addWidget(self.shared, 1)
        self.shared.cellClicked.connect(self._choose_shared)

        self.router = RouterPanel(ctx)

        self.tabs = QTabWidget()
        self.tabs.setObjectName("fleet_tabs")
        self.tabs.addTab(self.servers, "Servers")
        self.tabs.addTab(blocks_tab, "Blocks")
        self.tabs.addTab(shared_tab, "Shared")
        self.tabs.addTab(self.router, "Router")
        self.tabs.currentChanged.connect(lambda _i: self.refresh())

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.summary)
        layout.addWidget(self.tabs, 1)

        self._stale = False
        self._timer = QTimer(self, singleShot=True, interval=REFRESH_MS)
        self._timer.timeout.connect(self.refresh)
        self.state.sigChanged.connect(self._schedule)
        remote = ctx.remote
        remote.sigHealth.connect(self._schedule)
        remote.sigFleet.connect(self._on_fleet)
        self.refresh()

    # ------------------------------------------------------------------ updates
    def _schedule(self, *_args: object) -> None:
        """Redraw soon; a hidden panel only notes that it is stale and redraws when shown."""
        if not self.isVisible():
            self._stale = True
        elif not self._timer.isActive():
            self._timer.start()

    def showEvent(self, event: object) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._stale:
            self.refresh()

    def _on_fleet(self) -> None:
        """Another fleet: forget the chosen block, hash the probe for its servers."""
        self.chosen = None
        self.router.rebuild()
        self.refresh()

    def show_subject(self, subject: Subject) -> None:  # noqa: D102 - PanelView hook
        self._schedule()

    def apply_theme(self, name: str) -> None:  # noqa: D102 - server colours are per theme
        self.refresh()

    def refresh(self) -> None:
        """Read the fleet once and redraw every tab from it (the block rows only when the
        Blocks tab is up: a big fleet's rows cost the most)."""
        self._timer.stop()
        self._stale = False
        started = time.perf_counter()
        want_rows = self.tabs.currentIndex() == 1
        snap = self.ctx.remote.fleet_snapshot(max_rows=None if want_rows else 0)
        self.snapshot = snap
        self._show_summary(snap)
        self.servers.show_snapshot(snap)
        if want_rows:
            self._fill_blocks()
        self._show_shared(snap)
        self._locate()
        self.router.refresh(snap)
        took_ms = (time.perf_counter() - started) * 1000
        self._timer.setInterval(max(REFRESH_MS, int(BACKOFF * took_ms)))

    def _show_summary(self, snap: FleetSnapshot) -> None:
        p = theme.palette()
        if not snap.servers:
            self.summary.setText(f"<span style='color:{p['text_dim']}'>No fleet: attach to one or more servers "
                                 "(File &gt; Attach to vLLM…), or open a recorded attach.</span>")
            return
        recorded = " (recorded, offline)" if self.ctx.remote.recorded_fleet is not None else \
            "" if self.ctx.remote.is_attached else " (detached)"
        blocks = sum(s.num_blocks for s in snap.servers)
        missed = sum(s.health.missed for s in snap.servers)
        self.summary.setText(
            f"<b>{len(snap.servers)}</b> server(s){recorded} · <b>{blocks:,}</b> blocks · "
            f"<b>{len(snap.shared):,}</b> hashes held by more than one server "
            f"({snap.num_duplicate_copies:,} copies beyond one each) · {missed:,} batch(es) missed")

    def _fill_blocks(self) -> None:
        snap = self.snapshot
        names = snap.server_names
        current = self.server_filter.currentText()
        self.server_filter.blockSignals(True)
        self.server_filter.clear()
        self.server_filter.addItems([ALL_SERVERS, *names])
        self.server_filter.setCurrentText(current if current in names else ALL_SERVERS)
        self.server_filter.blockSignals(False)
        rows = tuple(b for b in snap.blocks if b.num_servers > 1) if self.shared_only.isChecked() else snap.blocks
        self.blocks.source.set_blocks(rows)
        self._filter(self.server_filter.currentText())
        cut = f" (the first {len(snap.blocks):,} of {snap.num_blocks:,})" if snap.is_cut else ""
        self.blocks_label.setText(f"{self.blocks.proxy.rowCount():,} rows{cut}")

    def _filter(self, text: str) -> None:
        self.blocks.set_server_filter(None if text in ("", ALL_SERVERS) else text)
        self.blocks_label.setText(f"{self.blocks.proxy.rowCount():,} rows")

    def _show_shared(self, snap: FleetSnapshot) -> None:
        self.shared.show_snapshot(snap)
        bs = next((s.block_size for s in snap.servers if s.block_size), None)
        tokens = f" ({snap.num_duplicate_copies * bs:,} tokens of KV)" if bs else ""
        self.shared_label.setText(
            f"{len(snap.shared):,} hashes are held by more than one server: {sum(s.num_copies for s in snap.shared):,} "
            f"physical copies, {snap.num_duplicate_copies:,} beyond one each{tokens}, memory the fleet spends more "
            "than once. Click one to see where its prefix lives (Blocks tab).")

    # ------------------------------------------------------------------ where a prefix lives
    def choose(self, server: str, key: bytes) -> None:
        """Model to view: locate the prefix ending at `key` as `server` holds it."""
        self.chosen = (server, key)
        self._locate()

    def _choose_row(self, row: int) -> None:
        if row >= 0:
            b = self.blocks.block_at(row)
            self.choose(b.server, b.key)

    def _choose_shared(self, row: int, _col: int) -> None:
        item = self.shared.item(row, 0)
        if item is None:
            return
        key = item.data(Qt.ItemDataRole.UserRole)
        sb = next((s for s in self.snapshot.shared if s.key == key), None)
        if sb is not None:
            self.choose(sb.servers[0], key)
            self.tabs.setCurrentIndex(1)

    def _locate(self) -> None:
        if self.chosen is None:
            self.location.show_places([], [])
            return
        server, key = self.chosen
        places = self.ctx.remote.with_fleet(lambda fleet: locate(fleet, prefix_of(fleet, server, key)), [])
        self.location.show_places(places, self.snapshot.servers)
        everywhere = sum(1 for p in places if p.num_servers == len(self.snapshot.servers))
        self.location_label.setText(
            f"The prefix of {short_hash(key)} on {server}: {len(places)} block(s) from block 0, "
            f"{everywhere} of them on every server.")
