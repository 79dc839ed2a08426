"""The timelines and metrics of a remote vLLM pool, over the server's clock.

A vLLM pool has no requests and no ref counts in its events, so the timeline and metrics
docks show these instead while attached (or while a capture is open): cached blocks per
tier, blocks stored and removed per second, and how long blocks lived from stored to
removed. They read `PoolState.remote` (`engine.remote.overlay.RemoteOverlay`) only;
`show_remote` swaps a view's own plots for them. A range selected on the timeline (R, or
Shift+drag) is a window of server time: it filters the other views to the events published
in it, through the shared filter, as the main timeline's range does. While a stream is busy
they redraw at most every REFRESH_MS, from counts kept between redraws (`_Rates`,
`_Lifetimes`: only the times that came since are binned) and curves reduced to the pixels
the plot has.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QDockWidget, QLabel, QVBoxLayout, QWidget

from app.runtime.remote import duration_text
from app.ui import theme
from app.ui.colors import legend_line, swatch, tier_colors
from app.ui.plots import PlotStack, peak_reduce
from engine.remote.overlay import time_of

# A redraw of the remote plots at most this often while events stream (the counts it draws
# are kept up to date from the new times alone, but pyqtgraph's layout and paint are not free).
REFRESH_MS = 250
# Lifetime bins, seconds: log-spaced from 10 ms to a day.
LIFETIME_EDGES = np.concatenate(([0.0], np.logspace(-2, np.log10(86400), 29)))
EXACT_QUANTILES = 500_000  # lifetimes up to which the median is taken again at every redraw
MAX_SECONDS = 24 * 3600  # seconds of rates kept (`RemoteOverlay.per_second`'s bound)


LIFETIME_TICKS = [(float(np.log10(s)), text) for s, text in (
    (0.01, "10 ms"), (0.1, "100 ms"), (1, "1 s"), (10, "10 s"), (60, "1 min"), (600, "10 min"),
    (3600, "1 h"), (86400, "1 day"))]
# The lifetime axis in log10 seconds: the first bin (0-10 ms, drawn from 5 ms) to a day, and
# room past both for half an end label ("10 ms", "1 day"): pyqtgraph drops a label that
# would reach past the plot ("1 day" showed at no size, "10 ms" not in a 1280x800 window).
LIFETIME_X = (-2.5, float(np.log10(86400)) + 0.4)
# the empty plot's hint, at its middle (log10 seconds, removed blocks of a 0 to 1.1 range)
LIFETIME_HINT_AT = (sum(LIFETIME_X) / 2, 0.55)


def show_remote(view: Any) -> bool:
    """Swap `view`'s own plots for its `remote_view` while the pool is a remote one; True then.
    A view with a `REMOTE_TITLE` gives its dock that title meanwhile (its own plots' title
    names what a remote pool does not have)."""
    remote = getattr(view.state, "remote", None) is not None
    if view.remote_view.isHidden() == remote:
        # the view's own export saves its own plots, which a remote pool does not fill
        for w in (view.glw, getattr(view, "title", None), getattr(view, "summary", None),
                  getattr(view, "export", None)):
            if w is not None:
                w.setVisible(not remote)
        view.remote_view.setVisible(remote)
    # each time, not at the swap alone: a panel may swap before it is put in its dock
    _retitle_dock(view, getattr(view, "REMOTE_TITLE", None) if remote else None)
    if remote:
        view.remote_view.schedule()
    return remote


def _retitle_dock(view: QWidget, title: str | None) -> None:
    """The title of the dock `view` sits in: `title`, or the dock's own again for None."""
    dock = view.parentWidget()
    while dock is not None and not isinstance(dock, QDockWidget):
        dock = dock.parentWidget()
    if dock is None:
        return
    own = dock.property("ownTitle")
    if own is None:
        own = dock.windowTitle()
        dock.setProperty("ownTitle", own)
    if dock.windowTitle() != (title or own):
        dock.setWindowTitle(title or own)


class _Rates:
    """Stored and removed blocks per whole second of server time, as `RemoteOverlay.per_second`
    counts them, kept between redraws: a redraw bins only the runs of times (`stored_runs`,
    `removed_runs`) appended since the last, and what the newest run it read gained since
    (the overlay's runs only grow; another overlay, or another x = 0, counts again)."""

    __slots__ = ("owner", "start", "read", "stored", "removed")

    def __init__(self) -> None:
        self.owner: Any = None
        self.start = 0.0
        # per kind (stored, removed): (runs read, the number the last of them had then)
        self.read = [(0, 0), (0, 0)]
        self.stored = np.zeros(0, np.int64)
        self.removed = np.zeros(0, np.int64)

    def update(self, remote: Any, start: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(second since `start`, stored, removed) per second: `remote.per_second(start)`."""
        kinds = (remote.stored_runs, remote.removed_runs)
        if remote is not self.owner or start != self.start \
                or any(len(times) < read for (times, _), (read, _) in zip(kinds, self.read)):
            self.owner, self.start = remote, start
            self.read = [(0, 0), (0, 0)]
            self.stored, self.removed = np.zeros(0, np.int64), np.zeros(0, np.int64)
        new = []
        for i, ((times, counts), (read, last)) in enumerate(zip(kinds, self.read)):
            # from the last run read on: it may have gained values since
            at = max(0, read - 1)
            t, c = times[at:], counts[at:].copy()
            if read and len(c):
                c[0] -= last
            new.append((t, c))
            self.read[i] = (len(times), int(counts[-1]) if len(counts) else 0)
        (new_s, num_s), (new_r, num_r) = new
        if num_s.any() or num_r.any():
            both = np.concatenate((new_s, new_r))
            # as per_second: a day of seconds at most, older and later times in the end bins
            n = max(len(self.stored), min(MAX_SECONDS, int(math.floor(both.max() - start)) + 1), 1)
            self.stored = _binned(self.stored, new_s, num_s, start, n)
            self.removed = _binned(self.removed, new_r, num_r, start, n)
        return np.arange(len(self.stored), dtype=float), self.stored.astype(float), self.removed.astype(float)


def _binned(counts: np.ndarray, times: np.ndarray, num: np.ndarray, start: float, n: int) -> np.ndarray:
    """`counts` grown to `n` seconds with `num[i]` values at `times[i]` added, each to its
    whole second since `start`."""
    if len(counts) < n:
        counts = np.concatenate((counts, np.zeros(n - len(counts), np.int64)))
    if len(times):
        second = np.clip((times - start).astype(np.int64), 0, n - 1)
        counts += np.bincount(second, weights=num, minlength=n).astype(np.int64)
    return counts


class _Lifetimes:
    """The histogram of block lifetimes (LIFETIME_EDGES), kept between redraws as `_Rates` is."""

    __slots__ = ("owner", "num", "counts")

    def __init__(self) -> None:
        self.owner: Any = None
        self.num = 0
        self.counts = np.zeros(len(LIFETIME_EDGES) - 1, np.int64)

    def update(self, remote: Any) -> np.ndarray:
        """`np.histogram(remote.lifetimes, LIFETIME_EDGES)[0]`."""
        life = np.frombuffer(remote.lifetimes, dtype=np.float64) if remote.lifetimes else np.zeros(0)
        if remote is not self.owner or len(life) < self.num:
            self.owner, self.num = remote, 0
            self.counts = np.zeros(len(LIFETIME_EDGES) - 1, np.int64)
        if len(life) > self.num:
            self.counts = self.counts + np.histogram(life[self.num:], bins=LIFETIME_EDGES)[0]
            self.num = len(life)
        return self.counts


def bar_bins(secs: np.ndarray, heights: np.ndarray, pixels: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-second bars as at most `pixels` bars: (left edges, heights, width in seconds); past
    a bar a pixel, each bar is the busiest second of its run (the peak, as the timelines'
    curves keep each bin's highest sample), so a burst still shows at its height."""
    n = len(secs)
    if n <= pixels:
        return secs, heights, 1.0
    k = int(math.ceil(n / max(1, pixels)))
    starts = np.arange(0, n, k)
    return secs[starts], np.maximum.reduceat(heights, starts), float(k)


def event_times(log: Any, start: int, stop: int, seqs: np.ndarray) -> np.ndarray:
    """`time_of` of the log's events `start` to `stop` (their seqs `seqs`): from a columnar
    log's rows where each event has one (its first row's `RemoteInfo`, one per vLLM batch
    and tier), so no Event is made per event; from the events themselves otherwise, and
    for an event whose info has no batch time (it stands for its own time)."""
    col = getattr(log, "columnar", None)
    times = np.zeros(len(seqs), np.float64)
    pending = np.arange(len(seqs))
    if col is not None and getattr(col, "has_remote_rows", False) and len(seqs):
        row_seq = col.seq_runs()  # searched and read at the rows found, not made whole (seq may be runs)
        first = np.clip(np.searchsorted(row_seq, seqs), 0, max(0, len(row_seq) - 1))
        found = row_seq[first] == seqs if len(row_seq) else np.zeros(len(seqs), bool)
        numbers = np.where(found, col.values_at("b", first), 0).astype(np.int64)  # only those rows (b may be runs)
        uniq, inv = np.unique(numbers, return_inverse=True)
        batch = np.zeros(len(uniq), np.float64)
        for i, u in enumerate(uniq.tolist()):
            info = col.remote_info(u) if u > 0 else None
            batch[i] = float(getattr(info, "batch_time", 0.0) or 0.0)
        times = batch[inv.reshape(-1)]
        pending = np.flatnonzero(times == 0.0)
    events = log.events
    for i in pending.tolist():
        times[i] = time_of(events[start + i])
    return times


class _Throttled(QWidget):
    """A widget whose `refresh` runs at most every `interval` ms, however often `schedule` is called."""

    def _init_throttle(self, interval: int = REFRESH_MS) -> None:
        self._throttle = QTimer(self, singleShot=True, interval=interval)
        self._throttle.timeout.connect(self.refresh)

    def schedule(self) -> None:
        if not self._throttle.isActive():
            self._throttle.start()

    def refresh(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class RemoteTimeline(_Throttled):
    """Cached blocks per tier, and blocks stored and removed per second of server time."""

    def __init__(self, state: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self._init_throttle()
        self.setObjectName("remote_timeline")
        self.title = QLabel()
        self.title.setObjectName("remote_timeline_summary")
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)
        self.glw = PlotStack("seconds since the first event (server clock)")
        self.start = 0.0  # the server time at x = 0
        self._times: tuple[Any, int, np.ndarray, np.ndarray] | None = None  # (log, n, run starts, run times)
        self.glw.map_x(self.seqs_in, self.x_of_seqs)
        h_cached, self.p_cached = self.glw.add(stretch=3)
        # another attach (or engine) starts its clock again: a zoom into the last hides it
        reset = getattr(state, "sigReset", None)
        if reset is not None:
            reset.connect(self.glw.show_all)
        h_stored, self.p_stored = self.glw.add(stretch=2)
        h_removed, self.p_removed = self.glw.add(stretch=2)
        self.headers = [h_cached, h_stored, h_removed]
        self.glw.priority = [0, 1, 2]
        self.glw.show_rows([True, True, True])
        for p in (self.p_cached, self.p_stored, self.p_removed):
            p.showGrid(x=True, y=True, alpha=0.15)
            p.setMouseEnabled(x=True, y=False)
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.b_stored = pg.BarGraphItem(x=[], height=[], width=0.9)
        self.b_removed = pg.BarGraphItem(x=[], height=[], width=0.9)
        self.p_stored.addItem(self.b_stored)
        self.p_removed.addItem(self.b_removed)
        self.stored_per_s = np.zeros(0)
        self.removed_per_s = np.zeros(0)
        self._rates = _Rates()
        self._drawn: tuple | None = None  # what the items were last set from
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.glw, 1)
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.palette, self.tiers = p, tier_colors(name)
        self.glw.setBackground(p["panel"])
        for tier, curve in self.curves.items():
            curve.setPen(pg.mkPen(self.tiers.get(tier, p["accent"]), width=2))
        self.b_stored.setOpts(brush=pg.mkBrush(p["cached"]), pen=pg.mkPen(None))
        self.b_removed.setOpts(brush=pg.mkBrush(p["evicted"]), pen=pg.mkPen(None))
        for plot in (self.p_cached, self.p_stored, self.p_removed):
            for side in ("left", "bottom"):
                plot.getAxis(side).setTextPen(p["text_dim"])
                plot.getAxis(side).setPen(p["text_dim"])
        for header, text in zip(self.headers, ("cached<br>blocks", "stored<br>per s", "removed<br>per s")):
            header.setText(text, color=p["text_dim"], size="9pt")
        self._drawn = None
        self.refresh()

    def refresh(self) -> None:
        remote = self.state.remote
        if remote is None:
            return
        t = np.frombuffer(remote.sample_times, dtype=np.float64) if remote.sample_times else np.zeros(0)
        start = float(np.floor(min(remote.stored_runs[0][0] if remote.num_stored else np.inf,
                                   t[0] if len(t) else np.inf))) if len(t) else 0.0
        self.start = start
        secs, stored, removed = self._rates.update(remote, start if len(t) else 0.0) if len(t) else \
            remote.per_second(None)
        self.stored_per_s, self.removed_per_s = stored, removed
        drawn = (remote, remote.revision, start, len(t), self._pixels())
        if drawn == self._drawn:  # nothing new since the last redraw: the items keep what they show
            return
        self._drawn = drawn
        right = max(float(t[-1] - start) if len(t) else 0.0, float(len(secs)))
        top = 1.0
        x = t - start
        for name, code in remote.tier_names.items():
            counts = remote.sample_counts[code - 1] if code - 1 < len(remote.sample_counts) else None
            if counts is None or not len(counts) or not np.frombuffer(counts, dtype=np.int64).any():
                if name in self.curves:
                    self.curves[name].setData([], [])
                continue
            curve = self.curves.get(name)
            if curve is None:
                curve = self.curves[name] = self.p_cached.plot(stepMode=None)
                curve.setPen(pg.mkPen(self.tiers.get(name, self.palette["accent"]), width=2))
            y = np.frombuffer(counts, dtype=np.int64)
            top = max(top, float(y.max()))
            # one sample per applied tick: an hour's stream is tens of thousands, drawn as
            # each pixel's lowest and highest
            xs, ys = self._reduce(x, y, right)
            curve.setData(xs, ys.astype(float))
            # A burst (a late join's refill) arrives in one frame: one sample, which a line cannot show.
            curve.setSymbol("o" if len(y) == 1 else None)
            curve.setSymbolBrush(self.tiers.get(name, self.palette["accent"]))
            curve.setSymbolPen(None)
        self.p_cached.setYRange(0, top * 1.1, padding=0)
        pixels = self._pixels()
        for bars, heights in ((self.b_stored, stored), (self.b_removed, removed)):
            left, h, width = bar_bins(secs, heights, pixels)
            bars.setOpts(x=left + width / 2, height=h, width=0.9 * width)
        self.p_stored.setYRange(0, max(1.0, float(stored.max()) if len(stored) else 1.0) * 1.1, padding=0)
        self.p_removed.setYRange(0, max(1.0, float(removed.max()) if len(removed) else 1.0) * 1.1, padding=0)
        self.p_cached.setXRange(0, max(1.0, right), padding=0.02)
        p = self.state.projection
        counts = remote.tier_counts(p)
        items = [(swatch(self.tiers.get(c.tier, self.palette["accent"]), "▬"), f"{c.tier} <b>{c.num_blocks:,}</b>")
                 for c in counts if c.num_blocks or c.tier == "GPU"]
        items += [(swatch(self.palette["cached"]), f"stored <b>{remote.num_stored:,}</b>"),
                  (swatch(self.palette["evicted"]), f"removed <b>{remote.num_removed:,}</b>"),
                  ("", f"resets {p.num_resets}")]
        self.title.setText(legend_line(items))

    def _pixels(self) -> int:
        """Device pixels across the plots (a floor, so a hidden or tiny view still draws some)."""
        return max(200, int(self.p_cached.vb.width() * max(1.0, self.devicePixelRatioF())))

    def _reduce(self, x: np.ndarray, y: np.ndarray, right: float) -> tuple[np.ndarray, np.ndarray]:
        return peak_reduce(x, y, 0.0, max(1.0, right), bins=self._pixels())

    # ---- the x axis as event seqs, for the shared range
    def _time_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The log's event seqs (its own array, not a copy) and their server times as runs
        (the event each run starts at, its time: a vLLM batch's events share one), kept as
        the log grows (only the new events' times are read: a range held while a stream runs
        maps every redraw); a few bytes a batch where a seq and a time were 16 an event."""
        log = self.state.log
        n = len(log.seqs)
        kept = self._times
        if kept is None or kept[0] is not log or kept[1] > n:
            kept = (log, 0, np.zeros(0, np.int64), np.zeros(0, np.float64))
        if kept[1] < n:
            times = event_times(log, kept[1], n, np.asarray(log.seqs[kept[1]:n], dtype=np.int64))
            bits = times.view(np.int64)  # the bits compared, so -0.0 and NaN come back as read
            change = np.ones(len(times), bool)
            np.not_equal(bits[1:], bits[:-1], out=change[1:])
            if len(kept[3]):
                change[0] = bool(kept[3][-1:].view(np.int64)[0] != bits[0])
            at = np.flatnonzero(change)
            kept = (log, n, np.concatenate((kept[2], kept[1] + at)), np.concatenate((kept[3], times[at])))
        self._times = kept
        return np.asarray(log.seqs)[:n], kept[2], kept[3]

    def _event_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Seqs and server times of the log's events, one each (the runs spread out)."""
        seqs, at, values = self._time_runs()
        return seqs, np.repeat(values, np.diff(np.append(at, len(seqs))))

    def seqs_in(self, lo: float, hi: float) -> tuple[int, int] | None:
        """First and last seq of the events published from `lo` to `hi` seconds after x = 0."""
        seqs, at, values = self._time_runs()
        inside = np.flatnonzero((values >= self.start + lo) & (values <= self.start + hi))
        if not len(inside):
            return None
        last = int(at[inside[-1] + 1]) - 1 if inside[-1] + 1 < len(at) else len(seqs) - 1
        return int(seqs[int(at[inside[0]])]), int(seqs[last])

    def x_of_seqs(self, wanted: np.ndarray) -> np.ndarray:
        """Seconds after x = 0 at which the events `wanted` were published."""
        seqs, at, values = self._time_runs()
        if not len(seqs):
            return np.zeros(len(wanted))
        pos = np.clip(np.searchsorted(seqs, wanted), 0, len(seqs) - 1)
        return values[np.searchsorted(at, pos, side="right") - 1] - self.start


class RemoteMetrics(_Throttled):
    """Block lifetime from stored to removed, and what the server reports of reuse."""

    def __init__(self, state: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        # not the timeline's period: the two redraw in passes of their own, not both in one
        self._init_throttle(REFRESH_MS * 3 // 2)
        self.setObjectName("remote_metrics")
        self.summary = QLabel()
        self.summary.setObjectName("remote_metrics_summary")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)
        self.glw = PlotStack("block lifetime, stored to removed (log scale)", header_width=92)
        h_life, self.p_life = self.glw.add(stretch=1)
        self.headers = [h_life]
        self.glw.show_rows([True])
        self.p_life.showGrid(x=True, y=True, alpha=0.15)
        self.p_life.setMouseEnabled(x=False, y=False)
        self.p_life.setLogMode(x=True, y=False)
        # log10 seconds as words: the axis would otherwise read -2, -1, 0, 1 ...
        self.p_life.getAxis("bottom").setTicks([LIFETIME_TICKS, []])
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.1)
        self.p_life.addItem(self.bars)
        # (two lines: on one it was as wide as the plot of a 1280x800 window's dock, wider with
        # some fonts)
        self.hint = pg.TextItem(html="<div align='center'>no block removed yet:<br>lifetimes appear when the "
                                     "server removes blocks</div>", anchor=(0.5, 0.5))
        self.p_life.addItem(self.hint, ignoreBounds=True)
        # the axes and the hint where `refresh` keeps them with no lifetime yet, from the start:
        # a view shown before its first refresh (a capture opening) had the hint on the x axis
        self.p_life.setXRange(*LIFETIME_X, padding=0)
        self.p_life.setYRange(0, 1.1, padding=0)
        self.hint.setPos(*LIFETIME_HINT_AT)
        self.lifetime_counts = np.zeros(0)
        self._life = _Lifetimes()
        self._drawn: tuple | None = None  # what the items were last set from
        self._q: tuple | None = None  # (overlay, lifetimes, median, p90) last taken
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.summary)
        layout.addWidget(self.glw, 1)
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.palette = p
        self.glw.setBackground(p["panel"])
        self.bars.setOpts(brush=pg.mkBrush(p["accent"]), pen=pg.mkPen(None))
        self.hint.setColor(p["text_dim"])
        text = self.hint.textItem  # its lines centred within its widest one, in the font it has now
        text.setTextWidth(-1)
        text.setTextWidth(text.document().idealWidth())
        for side in ("left", "bottom"):
            self.p_life.getAxis(side).setTextPen(p["text_dim"])
            self.p_life.getAxis(side).setPen(p["text_dim"])
        self.headers[0].setText("removed<br>blocks", color=p["text_dim"], size="9pt")
        self._drawn = None
        self.refresh()

    def refresh(self) -> None:
        remote = self.state.remote
        if remote is None:
            return
        p = self.state.projection
        drawn = (remote, remote.revision, self.state.version)
        if drawn == self._drawn:
            return
        self._drawn = drawn
        counts = self._life.update(remote)
        self.lifetime_counts = counts
        num_life = self._life.num
        # log-x bars: centres and widths in log10 units; the first bin (0-10 ms) sits at 5 ms
        edges = LIFETIME_EDGES
        lo = np.log10(np.maximum(edges[:-1], 0.005))
        hi = np.log10(edges[1:])
        self.bars.setOpts(x=(lo + hi) / 2, height=counts.astype(float), width=(hi - lo) * 0.9)
        self.p_life.setYRange(0, max(1.0, float(counts.max()) if len(counts) else 1.0) * 1.1, padding=0)
        self.p_life.setXRange(*LIFETIME_X, padding=0)
        self.hint.setVisible(num_life == 0)
        items = [("", f"<b>{remote.num_stored:,}</b> blocks stored"),
                 ("", f"<b>{remote.num_removed:,}</b> removed")]
        if num_life:
            q50, q90 = self._quantiles(remote, num_life)
            items.append((swatch(self.palette["accent"]), f"lifetime median <b>{duration_text(q50)}</b>, p90 {duration_text(q90)}"))
        items.append(("", f"cached now <b>{p.num_hashed:,}</b>"))
        tenants = self._tenants(p)
        if tenants:
            items.append(("", f"tenants {', '.join(tenants[:4])}{' …' if len(tenants) > 4 else ''}"))
        if remote.num_restarts:
            items.append(("", f"server restarts <b>{remote.num_restarts}</b>"))
        # vLLM's KV events carry stores and removals, never prefix hits: say so rather than show 0 %.
        reuse = ("reuse: vLLM's KV events do not publish prefix hits; "
                 f"<b>{remote.num_stored_again:,}</b> blocks were stored again after the server removed them "
                 "(computed twice)")
        self.summary.setText(legend_line(items) + "<br>" + reuse)

    def _quantiles(self, remote: Any, num: int) -> tuple[float, float]:
        """Median and p90 of the lifetimes, exact; past EXACT_QUANTILES lifetimes (a pass
        over them all costs tens of ms) taken again only once their number grew by a tenth."""
        q = self._q
        if q is None or q[0] is not remote or num < q[1] or (num != q[1] and num <= EXACT_QUANTILES) \
                or num > q[1] * 1.1:
            life = np.frombuffer(remote.lifetimes, dtype=np.float64, count=num)
            q50, q90 = np.percentile(life, [50, 90])
            self._q = (remote, num, float(q50), float(q90))
        return self._q[2], self._q[3]

    def _tenants(self, p: Any) -> list[str]:
        """The tenants of the held blocks, sorted: none when no pool of the journal route names
        one (its tenants come from the pools' names), else a pass over every slot, skipped
        for a huge pool."""
        pools = getattr(getattr(self.state.log, "columnar", None), "keys", None)
        pools = getattr(pools, "pools", None)
        if pools is not None and not any(getattr(pool, "tenant_names", ()) for pool in pools):
            return []
        if p.num_blocks > 200_000:
            return []
        held = np.flatnonzero(np.asarray(p.hashed) > 0)  # the held slots' tenants, read at once
        return sorted({t for t in p.tenants_of(held) if t is not None})
