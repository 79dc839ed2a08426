"""The event log: every engine event in a table, filterable by kind, request and text, and
by the filter language (`kind:evicted and tier:CPU and tenant:b`) in the filter bar above.

The filter bar and a timeline's range selection set the app's shared `EventFilter`
(`app.runtime.selection`), which the block table and the timelines show too; the log keeps
the rows that pass it and the kind/request/text boxes at once.

A QTableView over a QAbstractTableModel that indexes `ctx.state.log` (no widget per row,
details formatted only for rows shown or filtered). Selecting a row scrubs to its event;
the line under the table repeats the shown event's details with its "event N" as links.
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt, QTimer, Signal
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QComboBox, QHBoxLayout, QHeaderView,
                               QLabel, QLineEdit, QSizePolicy, QTableView, QVBoxLayout, QWidget)

from app.runtime.selection import EventFilter, shared_filter
from app.runtime.state import PoolState
from app.ui import theme
from app.ui.filter_bar import FilterBar
from app.ui.widgets import EventLinkLabel, PanelView, event_link, eviction_phrase
from engine.core.events import EVENT_TYPES, Event
from engine.core.projection import EventLog

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

COLUMNS = ("seq", "time (s)", "kind", "request", "details")
_MAX_LISTED = 8
_SEARCH_SPAN = 4096  # candidate rows a free-text search builds the events of at once
SEARCH_PAUSE_MS = 300  # the search box applies once typing pauses this long
ASYNC_SEARCH = 2_000  # candidates searched on the GUI thread at most (~40 ms); more, on the worker
SEARCH_JOB = 50_000  # candidates one worker job searches (about a second)


def _ids(values: tuple[int, ...]) -> str:
    head = ", ".join(str(v) for v in values[:_MAX_LISTED])
    return head + (f", … ({len(values)} in all)" if len(values) > _MAX_LISTED else "")


def _hex(digest: bytes | None) -> str:
    return digest.hex()[:10] if digest is not None else "none"


def request_of(event: Event) -> str:
    rid = getattr(event, "request_id", None)
    if rid is None:
        rid = getattr(event, "by_request_id", None)
    return "" if rid is None else str(rid)


_TAG = re.compile(r"<[^>]+>")


def describe(event: Event, state: PoolState | None = None, rich: bool = False) -> str:
    """One line saying what the event did, in the words the views use.

    With `state`, an eviction a miss names is checked against the log (never an event the
    log lacks); with `rich`, the line is HTML whose "event N" are links.
    """
    text = _describe(event, state)
    if rich:
        return text
    return html.unescape(_TAG.sub("", text))


def _describe(event: Event, state: PoolState | None) -> str:
    k = event.kind
    e: Any = event
    info = getattr(e, "remote", None)
    if info is not None:  # a vLLM event: no block id, but a tier, a rank and a batch
        where = f"{info.medium}, rank {info.rank}, batch {info.batch_seq}"
        if k == "block_stored":
            salt = f", tenant {e.salt}" if e.salt is not None else ""
            return f"stored {_hex(e.block_hash)} on {where}, parent {_hex(e.parent_hash)}, {len(e.token_ids)} tokens{salt}"
        if k == "block_evicted":
            return f"removed {_hex(e.block_hash)} from {where}"
        if k == "cache_reset":
            return f"{e.num_blocks_cleared} blocks cleared ({where})"
    if k == "request_started":
        salt = f", tenant {e.salt}" if e.salt is not None else ""
        return f"{e.num_prompt_tokens} prompt tokens{salt}"
    if k == "lookup":
        miss = e.miss
        where = f"miss at block {miss.first_miss_block}: {miss.reason.replace('_', ' ')}"
        if miss.divergence_token is not None:
            where += f" (diverges at token {miss.divergence_token})"
        if miss.reason == "evicted":
            where += f" ({eviction_phrase(miss.evicted_by_seq, state)})"
        if miss.other_salt is not None:
            where += f" (cached under tenant {miss.other_salt or 'none'})"
        return f"hit {e.num_hit_blocks} blocks, {e.num_cached_tokens} of {e.num_prompt_tokens} tokens cached; {where}"
    if k == "blocks_allocated":
        return f"blocks {_ids(e.block_ids)} ({e.num_hit_blocks} hits)"
    if k == "block_stored":
        ext = f", external id {e.external_id}" if e.external_id is not None else ""
        return f"block {e.block_id} ← {_hex(e.block_hash)}, parent {_hex(e.parent_hash)}, {len(e.token_ids)} tokens{ext}"
    if k == "ref_counts_changed":
        pairs = [f"{b}→{r}" for b, r in zip(e.block_ids, e.ref_counts)]
        more = f", … ({len(pairs)} in all)" if len(pairs) > _MAX_LISTED else ""
        return "ref counts " + ", ".join(pairs[:_MAX_LISTED]) + more
    if k == "blocks_freed":
        return f"blocks {_ids(e.block_ids)} to the free queue"
    if k == "block_evicted":
        return f"block {e.block_id} lost {_hex(e.block_hash)}"
    if k == "request_refused":
        return f"needs {e.num_blocks_needed} blocks, {e.num_blocks_available} available"
    if k == "request_finished":
        return f"{e.num_tokens_with_kv} tokens with KV" + (", aborted" if e.aborted else "")
    if k == "cache_reset":
        return f"{e.num_blocks_cleared} blocks cleared"
    if k == "semantic_lookup":
        best = f", best {e.neighbours[0][1]:.3f}" if e.neighbours else ""
        return f"{e.decision} (threshold {e.threshold}{best}): {html.escape(repr(e.prompt[:60]))}"
    if k == "semantic_stored":
        return f"entry {e.entry_id}: {html.escape(repr(e.prompt[:60]))}"
    if k == "semantic_evicted":
        return f"entry {e.entry_id} ({e.reason})"
    return ""


def _joined(rows: Any, found: Any) -> Any:
    """`found` appended to `rows`; two runs of consecutive positions that meet stay one run
    (an unfiltered log that grows keeps no array), anything else becomes an array."""
    if not len(rows):
        return found
    if not len(found):
        return rows
    from engine.core.columnar import Consecutive  # a columnar log's module: loaded with the log

    if isinstance(rows, Consecutive) and isinstance(found, Consecutive) and rows.first + rows.n == found.first:
        return Consecutive(rows.first, rows.n + found.n, np.promote_types(rows.dtype, found.dtype))
    return np.concatenate([np.asarray(rows), np.asarray(found)])


class _LogOnly:
    """What `describe` reads of a `PoolState` (`contains`, `log`), over a log a worker may read
    (a live log's `snapshot`): its "evicted at event N" as the view's, with no state touched."""

    contains = PoolState.contains

    def __init__(self, log: Any) -> None:
        self.log = log


class _EventList:
    """A Python log (`engine.core.projection.EventLog`) as far as a search reads it: its first
    `n` events and their seqs, lists taken on the GUI thread while the log goes on growing
    there, and its own `event_at_seq` over them, what `_LogOnly` asks of a log."""

    event_at_seq = EventLog.event_at_seq

    def __init__(self, log: EventLog, n: int) -> None:
        self.events, self.seqs = log.events[:n], log.seqs[:n]


def search_events(events: Any, positions: np.ndarray, text: str, state: Any = None,
                  cancelled: Callable[[], bool] | None = None) -> np.ndarray | None:
    """The `positions` (ascending, into `events`) whose event's kind, request or details
    (`describe`, with `state` for its eviction phrases) contain `text`, lowercase. The events
    are built a span at a time (one built alone read every column for its row: 145 us an
    event, 13 s for a 91,505-event attach). None if `cancelled()` turned true on the way."""
    found: list[int] = []
    for a in range(0, len(positions), _SEARCH_SPAN):
        if cancelled is not None and cancelled():
            return None
        part = positions[a:a + _SEARCH_SPAN].tolist()
        lo, hi = part[0], part[-1] + 1
        # dense: the span's events built together; sparse: each alone
        built = list(events[lo:hi]) if hi - lo <= 4 * len(part) else None
        for i in part:
            e = events[i] if built is None else built[i - lo]
            if text in f"{e.kind} {request_of(e)} {describe(e, state)}".lower():
                found.append(i)
    return np.array(found, np.int64)


def _search_job(log: Any, positions: np.ndarray, text: str, cancelled: Callable[[], bool]) -> np.ndarray | None:
    """`search_events` over `log` (what the worker reads: a trace's log, a live log's snapshot,
    or a Python log's events so far, `_EventList`)."""
    return search_events(log.events, positions, text, _LogOnly(log), cancelled)


class EventTableModel(QAbstractTableModel):
    """Rows are positions in the log that pass the filter (an int64 array; with no filter on
    a columnar log, an `engine.core.columnar.Consecutive` read as 0..n-1); grows as the
    log grows. On a columnar log the kind and request boxes and the shared filter are
    matched on its columns, and an `Event` is built only for a row the table shows.

    A search of the details reads each candidate's event. More than ASYNC_SEARCH candidates
    are searched on `worker` (`app.runtime.worker.ModelWorker`), SEARCH_JOB at a time, so
    the window stays live and the worker's other jobs wait no longer than one of them; rows
    found are added as each job answers (`searching` says how far it is, `sigSearched`
    when it moves), and the events that arrive meanwhile are searched after them."""

    sigSearched = Signal()
    sigSearchFailed = Signal(str)  # one sentence: a worker's search raised

    def __init__(self, state: Any, parent: Any = None, shared: EventFilter | None = None, worker: Any = None) -> None:
        super().__init__(parent)
        self.state = state
        self.shared = shared
        self.worker = worker
        self.kind = ""
        self.request = ""
        self.text = ""
        self.rows = np.zeros(0, np.int64)
        self._scanned = 0  # log positions already filtered
        self._details: dict[int, str] = {}
        self._t0: float | None = None
        # a search on the worker: the candidates still to search, the log the worker reads,
        # and how many of them its jobs have searched
        self._job = 0
        self._cancel = threading.Event()
        self._todo: np.ndarray | None = None
        self._todo_log: Any = None
        self._done = 0

    # ------------------------------------------------------------------ filtering
    def set_filter(self, kind: str = "", request: str = "", text: str = "") -> None:
        self.beginResetModel()
        self.kind, self.request, self.text = kind, request.strip(), text.strip().lower()
        self._restart()
        self.rows = self._scan()
        self.endResetModel()

    @property
    def searching(self) -> tuple[int, int] | None:
        """(candidates searched, candidates in all) while the worker searches; else None."""
        if self._todo is None:
            return None
        return self._done, self._done + len(self._todo)

    def _restart(self) -> None:
        """No rows, nothing scanned, and a search on the worker dropped."""
        self.rows = np.zeros(0, np.int64)
        self._scanned = 0
        self._job += 1
        self._cancel.set()  # the job in hand stops at its next span
        self._cancel = threading.Event()
        self._todo, self._todo_log, self._done = None, None, 0

    def _shared_mask(self) -> Any:
        return self.shared.match_mask() if self.shared is not None and self.shared.active else None

    def _candidates(self, start: int, stop: int) -> np.ndarray | Any:
        """Positions in [start, stop) that pass the kind and request boxes and the shared
        filter: what the search of the details (if any) reads."""
        log = self.state.log
        mask = self._shared_mask()
        if getattr(log, "columnar_log", False):
            if mask is None and not (self.kind or self.request or self.text):
                # every event: the rows are start, start + 1, ... kept as their first and count
                # (1.9 MB as int32 over the Mooncake trace), read as the array they stand for
                from engine.core.columnar import Consecutive

                return Consecutive(start, stop - start, np.int32 if stop <= np.iinfo(np.int32).max else np.int64)
            keep = np.ones(stop - start, bool) if mask is None else np.asarray(mask[start:stop], bool).copy()
            if self.kind:
                keep &= log.kind_names()[start:stop] == self.kind
            if self.request:
                ids = log.request_ids()
                hit = np.char.find(ids, self.request) >= 0  # per request occurrence, then per event
                keep &= hit[log.request_of_events()[start:stop]]
            return (np.flatnonzero(keep) + start).astype(np.int64)
        events = log.events
        return np.array([i for i in range(start, stop)
                         if (mask is None or mask[i]) and (not self.kind or events[i].kind == self.kind)
                         and (not self.request or self.request in request_of(events[i]))], np.int64)

    def _scan(self) -> np.ndarray:
        """Rows for the events past those scanned: found here, or (a long search) asked of
        the worker, whose answers add them (`_searched`); the rows found here."""
        if self._todo is not None:
            return np.zeros(0, np.int64)  # the worker's answers come first, in order
        n = len(self.state.log.events)
        start, self._scanned = self._scanned, n
        found = self._candidates(start, n)
        if not self.text or not len(found):
            return found
        if self.worker is None or len(found) <= ASYNC_SEARCH:
            return search_events(self.state.log.events, found, self.text, self.state)
        log = self.state.log
        if getattr(log, "live_log", False):
            log = log.snapshot()  # (read while the log goes on growing here)
        elif not getattr(log, "columnar_log", False):
            log = _EventList(log, n)
        self._todo, self._todo_log, self._done = found, log, 0
        self._submit()
        return np.zeros(0, np.int64)

    def _submit(self) -> None:
        job, cancel, part = self._job, self._cancel, self._todo[:SEARCH_JOB]
        self.worker.submit(_search_job, self._todo_log, part, self.text, cancel.is_set,
                           on_done=lambda found: self._searched(job, len(part), found),
                           on_error=lambda exc: self._search_failed(job, exc))

    def _searched(self, job: int, num: int, found: np.ndarray | None) -> None:
        if job != self._job or found is None:
            return  # another search was set since, or the log was replaced
        if len(found):
            first = len(self.rows)
            self.beginInsertRows(QModelIndex(), first, first + len(found) - 1)
            self.rows = _joined(self.rows, found)
            self.endInsertRows()
        self._todo, self._done = self._todo[num:], self._done + num
        if len(self._todo):
            self._submit()
        else:
            self._todo = self._todo_log = None
            self._done = 0
            self.catch_up()  # the events that came in meanwhile
        self.sigSearched.emit()

    def _search_failed(self, job: int, exc: BaseException) -> None:
        if job != self._job:
            return
        self._todo = self._todo_log = None  # the rows found so far stay; the rest is not searched
        self._done = 0
        self.sigSearched.emit()
        self.sigSearchFailed.emit(f"The search of the event log stopped: {exc}")

    def reset_log(self) -> None:
        self.beginResetModel()
        self._restart()
        self._details = {}
        self._t0 = None
        self.rows = self._scan()
        self.endResetModel()

    def catch_up(self) -> None:
        """Append rows for events added to the log since the last call."""
        n = len(self.state.log.events)
        if self._scanned > n:  # the log was replaced
            self.reset_log()
            return
        if self._scanned == n:
            return
        first = len(self.rows)
        found = self._scan()
        if len(found):
            self.beginInsertRows(QModelIndex(), first, first + len(found) - 1)
            self.rows = _joined(self.rows, found)
            self.endInsertRows()

    def details(self, i: int) -> str:
        text = self._details.get(i)
        if text is None:
            text = describe(self.state.log.events[i], self.state)
            self._details[i] = text
        return text

    def row_of_seq(self, seq: int) -> int | None:
        """The last row whose event seq is <= `seq` (the event the pool is shown after)."""
        pos = self.state.log.count_upto(seq) - 1
        r = int(np.searchsorted(self.rows, pos, side="right")) - 1
        return r if r >= 0 else None

    def event(self, row: int) -> Event:
        return self.state.log.events[int(self.rows[row])]

    # ------------------------------------------------------------------ Qt model
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        i = int(self.rows[index.row()])
        event = self.state.log.events[i]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return str(event.seq)
            if col == 1:
                if self._t0 is None:
                    self._t0 = self.state.log.events[0].time
                return f"{event.time - self._t0:.3f}"
            if col == 2:
                return event.kind.replace("_", " ")
            if col == 3:
                return request_of(event)
            return self.details(i)
        if role == Qt.ItemDataRole.ToolTipRole and col == 4:
            return self.details(i)  # the column elides long details; the tooltip has them whole
        if role == Qt.ItemDataRole.ForegroundRole and col == 2:
            key = _KIND_COLORS.get(event.kind)
            return theme.color(key) if key else None
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (0, 1):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


_KIND_COLORS = {"block_evicted": "evicted", "request_refused": "miss", "cache_reset": "warn",
                "block_stored": "cached", "lookup": "accent", "blocks_freed": "text_dim"}


class EventLogView(PanelView):
    """The filterable log; follows live events and scrubs the pool to a selected row."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("event_log_view")
        self.shared = shared_filter(ctx)
        self.model = EventTableModel(self.state, self, self.shared, getattr(ctx, "worker", None))
        self.model.sigSearched.connect(self._on_searched)
        self.model.sigSearchFailed.connect(ctx.show_error)
        self.filter_bar = FilterBar(ctx.settings, self, "kind:evicted and tier:CPU and tenant:b")
        self.filter_bar.setObjectName("event_filter_bar")
        self.filter_bar.sigFilterChanged.connect(self.shared.set_filter)
        self.range_label = QLabel()
        self.range_label.setObjectName("event_range")
        self.range_label.setToolTip("a timeline's range selection (Esc on the timeline clears it)")
        self.range_label.hide()
        self.kind_box = QComboBox()
        self.kind_box.setObjectName("event_kind_filter")
        self.kind_box.addItem("all kinds", "")
        for kind in EVENT_TYPES:
            self.kind_box.addItem(kind.replace("_", " "), kind)
        self.request_edit = QLineEdit()
        self.request_edit.setObjectName("event_request_filter")
        self.request_edit.setPlaceholderText("request id")
        self.request_edit.setClearButtonEnabled(True)
        self.text_edit = QLineEdit()
        self.text_edit.setObjectName("event_text_filter")
        self.text_edit.setPlaceholderText("search details")
        self.text_edit.setClearButtonEnabled(True)
        self.follow = QCheckBox("follow")
        self.follow.setChecked(True)
        self.follow.setToolTip("scroll to new events as they arrive")
        self.count_label = QLabel()
        self.count_label.setObjectName("event_count")

        self.table = QTableView()
        self.table.setObjectName("event_table")
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        # narrow fixed columns leave the details most of a dock's width
        for col, width in enumerate((58, 66, 136, 84)):
            header.resizeSection(col, width)
        header.setMinimumSectionSize(40)
        header.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)

        bar = QHBoxLayout()
        bar.addWidget(self.kind_box)
        bar.addWidget(self.request_edit)
        bar.addWidget(self.text_edit, 1)
        bar.addWidget(self.follow)
        bar.addWidget(self.count_label)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        language = QHBoxLayout()
        language.addWidget(self.filter_bar, 1)
        language.addWidget(self.range_label)
        layout.addLayout(language)
        layout.addLayout(bar)
        layout.addWidget(self.table, 1)
        self.detail = EventLinkLabel(self.state, "", self)
        self.detail.setObjectName("event_detail")
        self.detail.setWordWrap(True)
        self.detail.setToolTip("the shown event; click an \u201cevent N\u201d to scrub there")
        # A short dock (1280x800) keeps the line: the table gives up rows, not the details.
        self.table.setMinimumHeight(66)
        self.table.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.detail.setMaximumHeight(self.detail.fontMetrics().lineSpacing() * 3 + 4)
        layout.addWidget(self.detail)

        self._syncing = False
        self.kind_box.currentIndexChanged.connect(self._apply_filter)
        self.request_edit.textChanged.connect(self._apply_filter)
        # a search of the details reads every event's: once typing pauses, not a keystroke
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_PAUSE_MS)
        self._search_timer.timeout.connect(self._apply_filter)
        self.text_edit.textChanged.connect(self._search_timer.start)
        self.table.selectionModel().currentRowChanged.connect(self._on_row)
        # Qt lays out new rows (and a resized dock) after scrollToBottom ran: follow the end
        # whenever the scroll range grows or shrinks while live
        self.table.verticalScrollBar().rangeChanged.connect(self._on_scroll_range)
        self.state.sigChanged.connect(self.refresh)
        self.state.sigReset.connect(self.model.reset_log)
        self.shared.sigChanged.connect(self._on_shared)
        self.model.reset_log()
        self._on_shared()
        self.refresh()

    def apply_theme(self, name: str) -> None:
        self._update_detail()  # its links carry the theme's colour

    def show_subject(self, subject: Subject) -> None:
        # A filter typed for the last file would hide most of the next one.
        self.set_filter()
        self.shared.clear()

    def _on_shared(self) -> None:
        """The shared filter or range changed (here, in the block table or on a timeline)."""
        if self.filter_bar.error is None and self.filter_bar.filter.text != self.shared.filter.text:
            self.filter_bar.edit.blockSignals(True)
            self.filter_bar.edit.setText(self.shared.filter.text)
            self.filter_bar.edit.blockSignals(False)
            self.filter_bar.filter = self.shared.filter
        rng = self.shared.range
        self.range_label.setText("" if rng is None else f"range: events {rng[0]:,}\u2013{rng[1]:,}")
        self.range_label.setVisible(rng is not None)
        self._apply_filter()

    def set_filter(self, kind: str = "", request: str = "", text: str = "") -> None:
        """Set the filter widgets, and refilter the table now."""
        i = self.kind_box.findData(kind)
        self.kind_box.setCurrentIndex(max(0, i))
        self.request_edit.setText(request)
        self.text_edit.setText(text)
        self._apply_filter()

    def _apply_filter(self) -> None:
        self._search_timer.stop()  # (what a pending search would apply: applied now)
        self.model.set_filter(self.kind_box.currentData() or "", self.request_edit.text(), self.text_edit.text())
        self._update_count()
        self._select_current()

    def _update_count(self) -> None:
        searching = self.model.searching
        if searching is not None:  # a long search, on the worker: how far (short: a 1280x800 dock)
            done, total = searching
            self.count_label.setText(f"searching {done / max(total, 1):.0%}\u2026")
            self.count_label.setToolTip(f"{len(self.model.rows):,} rows found in {done:,} of the {total:,} "
                                        "events searched so far")
        else:
            self.count_label.setText(f"{len(self.model.rows):,} of {len(self.state.log):,}")
            self.count_label.setToolTip("")
        if self.shared.pending:
            self.filter_bar.count.setText("matching\u2026")
        elif self.shared.filter.root is not None:
            self.filter_bar.set_count(int(self.shared.match_mask().sum()), len(self.state.log))
        else:
            self.filter_bar.set_count(0, 0)

    def _on_searched(self) -> None:
        self._update_count()
        self._select_current()

    def refresh(self) -> None:
        self.model.catch_up()
        self._update_count()
        self._select_current()
        self._update_detail()

    def _update_detail(self) -> None:
        seq = self.state.current_seq
        event = self.state.log.event_at_seq(seq) if seq is not None else None
        if event is None:
            self.detail.setText("")
            return
        rid = request_of(event)
        who = f" · request {html.escape(rid)}" if rid else ""
        self.detail.setText(f"{event_link(seq, self.state)} · {event.kind.replace('_', ' ')}{who}: "
                            f"{describe(event, self.state, rich=True)}")

    def _select_current(self) -> None:
        """Model to view: the row of the event the pool is shown at (last row when live)."""
        if not len(self.model.rows):
            return
        self._syncing = True
        try:
            if self.state.is_live:
                if self.follow.isChecked():
                    self.table.clearSelection()
                    self.table.scrollToBottom()
                return
            row = self.model.row_of_seq(self.state.current_seq if self.state.current_seq is not None else -1)
            if row is not None:
                index = self.model.index(row, 0)
                self.table.setCurrentIndex(index)
                self.table.scrollTo(index)
        finally:
            self._syncing = False

    def _on_scroll_range(self, _low: int, high: int) -> None:
        if self.state.is_live and self.follow.isChecked():
            self.table.verticalScrollBar().setValue(high)

    def _on_row(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if self._syncing or not current.isValid():
            return
        self.state.scrub_to(self.model.event(current.row()).seq)

    def selected_event(self) -> Event | None:
        index = self.table.currentIndex()
        return self.model.event(index.row()) if index.isValid() else None

