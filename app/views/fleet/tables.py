"""The fleet's tables: servers side by side, every block coloured by its server, the blocks
held by more than one server, and a grid of where a prefix lives (block x server).

Each draws a `engine.remote.fleet_view.FleetSnapshot` (or `PrefixPlace`s) and nothing
else: no pools, no locks here.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QBrush, QFont
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView, QTableWidget, QTableWidgetItem, QWidget

from app.ui import theme
from app.views.fleet.palette import server_color, server_tint
from engine.remote.fleet_view import FleetBlock, FleetSnapshot, PrefixPlace, ServerRow


def short_hash(key: bytes | None) -> str:
    """A hash as the other views write it: 16 hex digits (a 32-byte digest's first 16)."""
    return "—" if key is None else key.hex()[:16]


def ago(seconds_since_epoch: float | None, now: float | None = None) -> str:
    """When a server's last batch was sent, as its own clock said."""
    if seconds_since_epoch is None:
        return "never"
    t = time.strftime("%H:%M:%S", time.localtime(seconds_since_epoch))
    age = (time.time() if now is None else now) - seconds_since_epoch
    if age < 0 or age > 86_400:
        return t
    return f"{t} ({age:,.0f} s ago)" if age >= 1 else f"{t} (now)"


def lag_text(lag_s: float | None) -> str:
    """A stream's lag as the status bar writes it: milliseconds below 10 s, else seconds."""
    if lag_s is None:
        return "—"
    return f"{lag_s * 1000:,.0f} ms" if lag_s < 10 else f"{lag_s:,.0f} s"


def _item(text: str, align_right: bool = False) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    it.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
    if align_right:
        it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return it


class ServersTable(QTableWidget):
    """Servers side by side: one column per server, one row per count (blocks, tiers with
    their raw media names, placeholders, tenants, health)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fleet_servers")
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.setWordWrap(True)
        self.rows: list[str] = []

    def show_snapshot(self, snap: FleetSnapshot) -> None:
        servers = snap.servers
        tiers = list(dict.fromkeys(t.tier for s in servers for t in s.tiers))
        self.rows = ["Server", "Ranks", "Blocks", "Hashes", *[f"{t} blocks" for t in tiers], "No token ids", "Held elsewhere too",
                     "Tenants", "Block size", "Batches", "Refilled", "Missed", "Malformed", "Restarts", "Last seen",
                     "Lag"]
        self.setRowCount(len(self.rows))
        self.setColumnCount(len(servers))
        self.setVerticalHeaderLabels(self.rows)
        bold = QFont(self.font())
        bold.setBold(True)
        for c, s in enumerate(servers):
            head = QTableWidgetItem(s.server)
            head.setForeground(QBrush(server_color(s.index)))
            head.setFont(bold)
            head.setToolTip(f"{s.server}: ranks {', '.join(map(str, s.ranks))}")
            self.setHorizontalHeaderItem(c, head)
            for r, text in enumerate(self._column(s, tiers)):
                it = _item(text)
                if r == 0:  # the server's colour, as every fleet view gives it
                    it.setBackground(QBrush(server_tint(s.index, 130)))
                    it.setFont(bold)
                if self.rows[r] in ("Missed", "Malformed", "Restarts") and text not in ("0", ""):
                    it.setForeground(QBrush(theme.color("warn")))
                self.setItem(r, c, it)

    @staticmethod
    def _column(s: ServerRow, tiers: Sequence[str]) -> list[str]:
        h = s.health
        by_tier = {t.tier: t for t in s.tiers}
        out = [s.server, ", ".join(map(str, s.ranks)), f"{s.num_blocks:,}", f"{s.num_hashes:,}"]
        for t in tiers:
            tc = by_tier.get(t)
            if tc is None:
                out.append("0")
            else:
                names = f"  ({tc.raw_names})" if tc.raw_names != t else ""
                out.append(f"{tc.num_blocks:,}{names}")
        out += [f"{sum(t.num_without_tokens for t in s.tiers):,}", f"{s.num_shared:,}",
                ", ".join(s.tenants) or "—", str(s.block_size or "—"),
                f"{h.batches:,}", f"{h.refilled:,}", f"{h.missed:,}", f"{h.malformed:,}", f"{h.restarts:,}",
                ago(s.last_seen), lag_text(h.lag_s)]
        return out

    def cell(self, row: str, server: str) -> str:
        """The text at (`row` label, server column): what a test reads."""
        r = self.rows.index(row)
        for c in range(self.columnCount()):
            if self.horizontalHeaderItem(c).text() == server:
                return self.item(r, c).text()
        raise KeyError(server)


BLOCK_COLUMNS = ("Server", "Rank", "Tier", "Hash", "Parent", "Copies", "Servers", "Tenant", "Tokens", "Batch")


class FleetBlockModel(QAbstractTableModel):
    """Every hash the fleet holds, one row per (server, rank, tier), its background the
    server's colour; `Servers` > 1 marks memory spent twice."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.blocks: tuple[FleetBlock, ...] = ()

    def set_blocks(self, blocks: tuple[FleetBlock, ...]) -> None:
        self.beginResetModel()
        self.blocks = blocks
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008, N802 - Qt's signature
        return 0 if parent.isValid() else len(self.blocks)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(BLOCK_COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:  # noqa: N802
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return BLOCK_COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        b = self.blocks[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return (b.server, b.rank, b.tier, short_hash(b.key), short_hash(b.parent), b.num_copies, b.num_servers,
                    b.tenant or "—", b.num_tokens if b.num_tokens else "no token ids", b.stored_seq)[col]
        if role == Qt.ItemDataRole.UserRole:  # the sort key: numbers as numbers
            return (b.server, b.rank, b.tier, b.key, b.parent or b"", b.num_copies, b.num_servers, b.tenant or "",
                    b.num_tokens, b.stored_seq)[col]
        if role == Qt.ItemDataRole.BackgroundRole:
            return QBrush(server_tint(b.index, 110 if col == 0 else 45))
        if role == Qt.ItemDataRole.ForegroundRole and col == 6 and b.num_servers > 1:
            return QBrush(theme.color("warn"))
        if role == Qt.ItemDataRole.ToolTipRole:
            held = f"held by {b.num_servers} servers" if b.num_servers > 1 else "held by this server only"
            return f"{b.key.hex()}\n{b.server} rank {b.rank}, {b.tier}, {b.num_copies} copies; {held}"
        return None


class FleetBlockTable(QTableView):
    """The combined block table; `block_at(row)` is the block a (sorted) row shows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fleet_blocks")
        self.source = FleetBlockModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.source)
        self.proxy.setSortRole(Qt.ItemDataRole.UserRole)
        self.proxy.setFilterKeyColumn(0)
        self.setModel(self.proxy)
        self.setSortingEnabled(True)
        self.sortByColumn(-1, Qt.SortOrder.AscendingOrder)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.verticalHeader().setDefaultSectionSize(22)
        self.verticalHeader().hide()
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.horizontalHeader().setStretchLastSection(True)
        for col, width in enumerate((150, 44, 70, 150, 150, 56, 64, 90, 90)):
            self.setColumnWidth(col, width)

    def set_server_filter(self, server: str | None) -> None:
        """Only `server`'s rows (None: every server)."""
        from PySide6.QtCore import QRegularExpression

        self.proxy.setFilterRegularExpression(
            QRegularExpression(f"^{QRegularExpression.escape(server)}$") if server else QRegularExpression())

    def block_at(self, row: int) -> FleetBlock:
        return self.source.blocks[self.proxy.mapToSource(self.proxy.index(row, 0)).row()]

    def rows_shown(self) -> list[FleetBlock]:
        return [self.block_at(r) for r in range(self.proxy.rowCount())]


class SharedTable(QTableWidget):
    """Hashes more than one server holds: which servers, on which tiers, how many copies."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, 4, parent)
        self.setObjectName("fleet_shared")
        self.setHorizontalHeaderLabels(["Hash", "Servers", "Copies", "Where (server: rank, tier × copies)"])
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.verticalHeader().hide()
        self.horizontalHeader().setStretchLastSection(True)
        for col, width in enumerate((150, 64, 64)):
            self.setColumnWidth(col, width)

    def show_snapshot(self, snap: FleetSnapshot) -> None:
        self.setRowCount(len(snap.shared))
        for r, sb in enumerate(snap.shared):
            where = "  ·  ".join(f"{h.server}: r{h.rank} {h.tier} ×{h.num_copies}" for h in sb.holdings)
            items = [_item(short_hash(sb.key)), _item(str(len(sb.servers)), True), _item(str(sb.num_copies), True),
                     _item(where)]
            items[0].setToolTip(sb.key.hex())
            items[0].setData(Qt.ItemDataRole.UserRole, sb.key)
            items[1].setForeground(QBrush(theme.color("warn")))
            items[3].setToolTip("\n".join(f"{h.server}: rank {h.rank}, {h.tier}, {h.num_copies} copies"
                                          for h in sb.holdings))
            for c, it in enumerate(items):
                self.setItem(r, c, it)


class LocationGrid(QTableWidget):
    """Where a prefix lives: one row per block of the prefix, one column per server; a cell
    names the tiers holding the block there and takes the server's colour, an empty cell is
    a block the server does not hold."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fleet_location")
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.verticalHeader().setDefaultSectionSize(22)
        self.places: list[PrefixPlace] = []

    def show_places(self, places: Sequence[PrefixPlace], servers: Sequence[ServerRow]) -> None:
        self.places = list(places)
        self.setColumnCount(1 + len(servers))
        self.setRowCount(len(places))
        self.setHorizontalHeaderItem(0, QTableWidgetItem("Block hash"))
        for c, s in enumerate(servers, 1):
            head = QTableWidgetItem(s.server)
            head.setForeground(QBrush(server_color(s.index)))
            self.setHorizontalHeaderItem(c, head)
        self.setVerticalHeaderLabels([f"block {p.index}" for p in places])
        for r, p in enumerate(places):
            key = _item(short_hash(p.key))
            key.setToolTip(p.key.hex())
            self.setItem(r, 0, key)
            for c, (s, tiers) in enumerate(zip(servers, p.tiers), 1):
                it = _item(" · ".join(tiers) if tiers else "")
                if tiers:
                    it.setBackground(QBrush(server_tint(s.index, 120)))
                self.setItem(r, c, it)
        self.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)

    def held(self) -> list[list[str]]:
        """Per block, the servers holding it (what a test reads)."""
        names = [self.horizontalHeaderItem(c).text() for c in range(1, self.columnCount())]
        return [[n for n, t in zip(names, p.tiers) if t] for p in self.places]
