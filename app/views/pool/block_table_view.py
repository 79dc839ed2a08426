"""The block table: every physical block of the pool as one cell of a grid, coloured by state.

One pyqtgraph ImageItem holds the whole grid as an RGBA array (16K blocks redraw in a few
milliseconds); hovering shows a block's details, clicking selects its hash chain.

The filter bar above the grid sets the app's shared `EventFilter` (the event log's, in the
filter language); the blocks that the events it keeps (up to the event shown, inside a
timeline's range selection) touched are emphasised with a mark in their cell.
"""

from __future__ import annotations

import functools
import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer
from PySide6.QtGui import QColor, QCursor
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolTip, QVBoxLayout, QWidget

from app.runtime.selection import shared_filter
from app.ui import theme
from app.ui.filter_bar import FilterBar
from app.ui.colors import block_colors, legend_line, swatch, tier_colors
from app.ui.export import export_button, header_row
from app.runtime.remote import decode_tokens
from engine.remote.overlay import NUM_AGES, TIERS
from engine.core.projection import PoolProjection
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext

FLASH_SECONDS = 0.6
FRAME_MS = 16  # redraws of a stream of changes to a pool this large are coalesced to at most
COALESCE_BLOCKS = 100_000  # one per frame (a smaller one redraws in a millisecond or two, at once)
MAX_CELL_PX = 44  # a small pool is not drawn as giant tiles
MAX_TOOLTIP_TOKENS = 48


def _rgba(c: QColor) -> np.ndarray:
    return np.array([c.red(), c.green(), c.blue(), 255], dtype=np.uint8)


def compute_colors(p: PoolProjection, colors: dict[str, QColor], flash_since_seq: int | None) -> np.ndarray:
    """An (num_blocks, 4) uint8 RGBA array: one colour per block, vectorised."""
    n = p.num_blocks
    out = np.empty((n, 4), dtype=np.uint8)
    out[:] = _rgba(colors["empty"])
    if n == 0:
        return out
    ref = np.asarray(p.ref_counts, dtype=np.int32)
    hashed = np.asarray(p.hashed, dtype=np.uint8).view(bool)
    if p.free:
        free_order = getattr(p, "free_order", None)  # a columnar state has the queue as an array
        free_ids = free_order() if free_order is not None else np.fromiter(p.free, dtype=np.int64, count=len(p.free))
        cached_free = free_ids[hashed[free_ids] & (ref[free_ids] == 0)]
        if len(cached_free):
            # position among cached free blocks in queue order: 0 = evicted next, darkest
            t = np.linspace(0.0, 1.0, len(cached_free)) if len(cached_free) > 1 else np.ones(1)
            old, new = _rgba(colors["cached_old"]).astype(np.float32), _rgba(colors["cached_new"]).astype(np.float32)
            out[cached_free] = (old + (new - old) * t[:, None]).astype(np.uint8)
    out[ref == 1] = _rgba(colors["ref1"])
    out[ref == 2] = _rgba(colors["ref2"])
    out[ref >= 3] = _rgba(colors["ref3"])
    if flash_since_seq is not None and p.last_eviction_seq >= flash_since_seq:
        ev = np.asarray(p.evicted_seq, dtype=np.int64)
        out[(ev >= max(flash_since_seq, 0)) & (ev <= p.seq)] = _rgba(colors["evicted"])
    return out


def remote_lut(colors: dict[str, QColor], tiers: dict[str, QColor], tier_codes: dict[str, int]) -> np.ndarray:
    """RGBA per `RemoteOverlay.codes` value: tier hue, faded toward the background with age."""
    num_tiers = max(len(tier_codes), len(TIERS))
    lut = np.empty((1 + num_tiers * NUM_AGES, 4), dtype=np.uint8)
    lut[:] = _rgba(colors["empty"])
    bg = _rgba(colors["background"]).astype(np.float32)
    for name, code in tier_codes.items():
        base = _rgba(tiers.get(name, colors["cached_new"])).astype(np.float32)
        for fresh in range(NUM_AGES):
            keep = 0.35 + 0.65 * fresh / (NUM_AGES - 1)  # the oldest keeps a third of its colour
            lut[1 + (num_tiers - code) * NUM_AGES + fresh] = (bg + (base - bg) * keep).astype(np.uint8)
    return lut


@functools.lru_cache(maxsize=64)  # a redraw asks twice per frame; a million cells cost a millisecond
def grid_shape(num_blocks: int, aspect: float = 1.8) -> tuple[int, int]:
    """(columns, rows) that give `num_blocks` square cells the most room in an area `aspect`
    times wider than tall; columns come in multiples of 8 so block ids are easy to count."""
    if num_blocks <= 8:
        return max(1, num_blocks), 1
    cols = np.arange(8, 8 * math.ceil(num_blocks / 8) + 1, 8)
    rows = np.ceil(num_blocks / cols)
    cell = np.minimum(max(aspect, 1e-3) / cols, 1.0 / rows)  # cell side, the area's height = 1
    best = int(np.argmax(cell >= cell.max() * (1 - 1e-9)))  # the narrowest of the best
    return int(cols[best]), int(rows[best])


def shown_pixels(cols: int, rows: int, width: float, height: float) -> float:
    """Screen pixels a cell of a `cols` x `rows` grid is shown at when the grid fits a view of
    `width` x `height` (0.0 while the view has no size yet)."""
    return min(width / cols, height / rows) if width > 1 and height > 1 else 0.0


def cell_pixels(num_blocks: int, shown: float = 0.0) -> int:
    """Image pixels a cell of a grid of `num_blocks` takes (its last one a gap between cells
    from 3 on), at most the screen pixels a cell is `shown` at (0: not known yet). An image
    drawn smaller than it is loses rows and columns of pixels unevenly (pyqtgraph's ImageItem
    draws without smoothing), so cells of 4 image pixels shown at about 2 made their gaps a
    moire of stripes and tiles across the grid; below 3 pixels a cell is one image pixel, no gap."""
    px = 8 if num_blocks <= 4096 else 4 if num_blocks <= 65536 else 1
    if shown > 0:
        px = min(px, int(shown))
    return px if px >= 3 else 1


class BlockTableView(PanelView):
    """Every physical block as a grid cell; hover for details, click to select a chain.

    `selected_chain` holds the block ids of the selected chain (root first); `select_block`
    and `select_request` set it from code (tests, other views).
    """

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("block_table_view")
        self.colors = block_colors()
        self.selected_chain: list[int] = []
        self._selected_block: int | None = None
        self._selected_request: str | None = None
        self._hover_block: int | None = None
        self._drawn_version = -1
        self._flash_until = 0.0
        self.flash_seconds = FLASH_SECONDS  # how long live evictions stay red
        self._last_batch: tuple[int, int] | None = None
        self.cols = 1
        self.rows = 1
        self.cell_px = 8
        self.cell_colors = np.zeros((0, 4), dtype=np.uint8)
        self.blocks_per_cell = 1  # a remote pool of more than MAX_CELLS blocks is aggregated
        self._legend_key: tuple[bool, int] = (False, 1)
        self._img = np.zeros((1, 1, 4), dtype=np.uint8)
        self._rect_dirty = True

        self.summary = QLabel()
        self.summary.setObjectName("block_table_summary")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)
        self.glw = pg.GraphicsLayoutWidget()
        self.glw.ci.setContentsMargins(4, 4, 4, 4)
        # The grid takes the room the labels leave and never asks for more: in a dock's
        # scroll area a preferred height would force a vertical scroll bar.
        self.glw.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.glw.setMinimumHeight(120)
        self.vb = self.glw.addViewBox(lockAspect=True, invertY=True, enableMenu=False)
        self.vb.setMouseEnabled(x=False, y=False)  # every block is always in view
        self.vb.sigResized.connect(self._on_resized)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.vb.addItem(self.image)
        self.outline = pg.ScatterPlotItem(symbol="s", size=1.0, pxMode=False, brush=None)
        self.vb.addItem(self.outline)
        self.matched = pg.ScatterPlotItem(symbol="o", size=0.42, pxMode=False)
        self.matched.setZValue(5)
        self.vb.addItem(self.matched)
        self.matched_blocks = np.zeros(0, dtype=np.int64)  # blocks the shared filter's events touched
        self._matched_key: tuple[Any, ...] | None = None
        self.shared = shared_filter(ctx)
        self.filter_bar = FilterBar(ctx.settings, self, "kind:stored and tenant:alice")
        self.filter_bar.setObjectName("block_filter_bar")
        self.filter_bar.sigFilterChanged.connect(self.shared.set_filter)
        self.shared.sigChanged.connect(self._on_shared)
        self.glw.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.glw.scene().sigMouseClicked.connect(self._on_mouse_clicked)
        self.legend = QLabel()  # rich text that wraps between entries: never wider than the dock
        self.legend.setObjectName("block_table_legend")
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.export = export_button(self, plots={"Block table": lambda: self.glw},
                                    tables={"Blocks": self.blocks_table})
        layout.addLayout(header_row(self.summary, self.export))
        layout.addWidget(self.filter_bar)
        layout.addWidget(self.glw, 1)
        layout.addWidget(self.legend)

        self._flash_timer = QTimer(self)
        self._flash_timer.setSingleShot(True)
        self._flash_timer.timeout.connect(self._end_flash)
        self._frame_timer = QTimer(self)  # the redraw a change within the last frame waits for
        self._frame_timer.setSingleShot(True)
        self._frame_timer.timeout.connect(self.refresh)
        self._last_redraw = -1.0
        self._lut = np.zeros((1, 4), np.uint8)  # a remote pool's colour per cell code, and what it was made for
        self._lut_key: tuple[Any, ...] | None = None
        self._stale = False  # a change came while the view was off screen: redraw when shown
        self.state.sigChanged.connect(self.refresh)
        self.state.sigReset.connect(self._on_reset)
        self.apply_theme()

    # ------------------------------------------------------------------ appearance
    def apply_theme(self, name: str | None = None) -> None:
        self.colors = block_colors(name)
        self.tiers = tier_colors(name)
        self._lut_key = None  # a remote pool's colour table is made again for the new theme
        self._palette = theme.palette(name)
        self.glw.setBackground(self.colors["background"])
        self.outline.setPen(pg.mkPen(self.colors["selected"], width=2))
        self.matched.setPen(pg.mkPen(self.colors["background"], width=1))
        self.matched.setBrush(pg.mkBrush(self.colors["selected"]))
        self._build_legend()
        self._resize_grid(force=True)
        self.redraw()

    def _remote_live(self) -> bool:
        return getattr(self.state, "remote", None) is not None and self.state.is_live

    def _build_legend(self) -> None:
        c = self.colors
        if self._remote_live():
            items = [(swatch(c["empty"]), "empty")]
            items += [(swatch(self.tiers[t]), t) for t in TIERS]
            items.append(("", "bright = stored recently, faded = stored over 10 min ago"))
            if self.blocks_per_cell > 1:
                items.append(("", f"one cell = {self.blocks_per_cell} blocks (its hottest)"))
            self.legend.setText(legend_line(items))
            return
        entries = [("empty", "empty"), ("cached_old", "cached, free: evicted next"),
                   ("cached_new", "cached, free: freed last"), ("ref1", "in use, ref 1"),
                   ("ref2", "ref 2"), ("ref3", "ref 3+"), ("evicted", "just evicted")]
        items = [(swatch(c[key]), text) for key, text in entries]
        hint = "click a block to outline its chain".replace(" ", "&nbsp;")
        hint = f"<span style='color:{self._palette['text_dim']}'>{hint}</span>"
        self.legend.setText(legend_line(items) + "&nbsp;&nbsp;·&nbsp; " + hint)

    # ------------------------------------------------------------------ drawing
    def _on_reset(self) -> None:
        self.clear_selection(redraw=False)
        self._resize_grid(force=True)

    def _view_aspect(self) -> float:
        w, h = self.vb.width(), self.vb.height()
        return w / h if w > 1 and h > 1 else 1.8

    def _on_resized(self) -> None:
        if self._layout() != (self.cols, self.rows, self.cell_px):
            self._resize_grid()
            self.redraw()
        else:
            self._fit_view()

    def _num_cells(self) -> int:
        n = self.state.projection.num_blocks
        return math.ceil(n / self.blocks_per_cell) if self.blocks_per_cell > 1 else n

    def _layout(self) -> tuple[int, int, int]:
        """The grid's columns, rows and image pixels a cell for the view's size now."""
        n = self._num_cells()
        cols, rows = grid_shape(n, self._view_aspect())
        if self.blocks_per_cell > 1:  # an aggregate has no gaps to show
            return cols, rows, 1
        w, h = self.vb.width(), self.vb.height()
        return cols, rows, cell_pixels(n, shown_pixels(cols, rows, w, h))

    def _resize_grid(self, force: bool = False) -> None:
        cols, rows, px = self._layout()
        if not force and (cols, rows, px) == (self.cols, self.rows, self.cell_px):
            return
        self.cols, self.rows, self.cell_px = cols, rows, px
        img = np.empty((rows * px, cols * px, 4), dtype=np.uint8)
        img.view(np.uint32).fill(_rgba(self.colors["background"]).view(np.uint32)[0])  # gaps stay background
        self._img = img
        self._rect_dirty = True  # the rect maps image pixels to cells once the image is set
        self._fit_view()

    def _fit_view(self) -> None:
        """Every cell in view; a small pool gets cells of at most MAX_CELL_PX, centred."""
        cols, rows = self.cols, self.rows
        w, h = self.vb.width(), self.vb.height()
        scale = shown_pixels(cols, rows, w, h)
        if scale > MAX_CELL_PX:
            vw, vh = w / MAX_CELL_PX, h / MAX_CELL_PX
            self.vb.setRange(QRectF(cols / 2 - vw / 2, rows / 2 - vh / 2, vw, vh), padding=0)
        else:
            self.vb.setRange(QRectF(0, 0, cols, rows), padding=0.02)

    def refresh(self) -> None:
        """Redraw if the projection changed since the last frame. A pool of more than
        `COALESCE_BLOCKS` blocks redraws at most once a frame (a change within the frame
        waits for its end), and not while the window is up but this view is off screen (a
        dock tab behind another): it redraws when shown."""
        if self.state.version == self._drawn_version:
            return
        batch = self.state.last_batch
        if self.state.is_live and batch != self._last_batch:
            self._flash_until = time.monotonic() + self.flash_seconds
            self._flash_timer.start(int(self.flash_seconds * 1000) + 20)
        self._last_batch = batch
        if self.state.projection.num_blocks <= COALESCE_BLOCKS:  # a millisecond or two: at once, shown or not
            self.redraw()
            return
        if self.window().isVisible() and not self.is_shown():
            self._stale = True
            return
        wait_ms = FRAME_MS - (time.monotonic() - self._last_redraw) * 1000
        if wait_ms > 0:
            if not self._frame_timer.isActive():
                self._frame_timer.start(int(wait_ms) + 1)
            return
        self.redraw()

    def is_shown(self) -> bool:
        """True if some of the view is on screen (Qt calls a dock tab behind another visible)."""
        return self.isVisible() and not self.visibleRegion().isEmpty()

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._stale:
            self._stale = False
            QTimer.singleShot(0, self.refresh)

    def paintEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        super().paintEvent(event)
        if self._stale:  # its tab came forward
            self._stale = False
            QTimer.singleShot(0, self.refresh)

    def _end_flash(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        p = self.state.projection
        self._drawn_version = self.state.version
        self._last_redraw = time.monotonic()
        self._draw(p)

    def _draw(self, p: PoolProjection) -> None:
        if self._remote_live():
            colors, per_cell = self._remote_cells(p)
        else:
            flash = None
            if not self.state.is_live or time.monotonic() < self._flash_until:
                flash = self.state.flash_since_seq
            colors, per_cell = compute_colors(p, self.colors, flash), 1
        legend_key = (self._remote_live(), per_cell)
        if legend_key != self._legend_key:
            self.blocks_per_cell = per_cell
            self._legend_key = legend_key
            self._build_legend()
        self._resize_grid()
        self.cell_colors = colors
        n, cols, rows, px = len(colors), self.cols, self.rows, self.cell_px
        # a pixel is one 32-bit word (RGBA bytes): the image is filled a word at a time
        background = _rgba(self.colors["background"]).view(np.uint32)[0]
        words = colors.view(np.uint32).reshape(-1)
        if px == 1:  # one pixel per cell
            flat = self._img.view(np.uint32).reshape(-1)
            flat[:n] = words
            flat[n:] = background
            self._finish_redraw(p)
            return
        cells = np.empty(rows * cols, dtype=np.uint32)
        cells[:n] = words
        cells[n:] = background
        cells = cells.reshape(rows, cols)
        inner = px - 1 if px >= 3 else px  # one pixel of gap when cells are big enough to show it
        view = self._img.view(np.uint32).reshape(rows, px, cols, px)
        view[:, :inner, :, :inner] = cells[:, None, :, None]
        self._finish_redraw(p)

    def _finish_redraw(self, p: PoolProjection) -> None:
        cols, rows = self.cols, self.rows
        # no levels: pyqtgraph shows the RGBA bytes as they are (a QImage over _img); levels of
        # (0, 255), the same picture, made it copy the image into a buffer of its own (1 MB
        # for a 16K-block pool's cells of 4x4 pixels) at each paint
        self.image.setImage(self._img, autoLevels=False, levels=None)
        if self._rect_dirty:
            self.image.setRect(QRectF(0, 0, cols, rows))
            self._rect_dirty = False
        self._refresh_selection(p)
        self._refresh_matched()
        self._update_summary(p)

    def _remote_cells(self, p: PoolProjection) -> tuple[np.ndarray, int]:
        """Cell colours of a live remote pool (tier and age), aggregated past MAX_CELLS."""
        remote = self.state.remote
        codes, per_cell = remote.cell_codes(p)  # kept between redraws: only what changed is taken again
        key = (id(self.colors), id(self.tiers), tuple(remote.tier_names.items()))
        if key != self._lut_key:  # made again for a new theme or tier, not per redraw
            self._lut, self._lut_key = remote_lut(self.colors, self.tiers, remote.tier_names), key
        lut = self._lut
        # a gather of 32-bit words is several times quicker than of (n, 4) rows
        words = np.take(lut.view(np.uint32).reshape(-1), codes, mode="clip")
        return words.view(np.uint8).reshape(-1, 4), per_cell

    def _refresh_selection(self, p: PoolProjection) -> None:
        chain: list[int] = []
        if self._selected_block is not None and self._selected_block < p.num_blocks:
            b = self._selected_block
            chain = p.chain_of(b) if p.hashes[b] is not None else [b]
        elif self._selected_request is not None:
            chain = self._request_blocks(p, self._selected_request)
        self.selected_chain = chain
        if chain:
            ids = np.unique(np.array(chain) // self.blocks_per_cell)
            self.outline.setData(x=ids % self.cols + 0.5, y=ids // self.cols + 0.5)
        elif self.outline.data.size:  # an empty outline is not set again at every redraw
            self.outline.setData(x=[], y=[])

    # ------------------------------------------------------------------ the shared filter
    def _on_shared(self) -> None:
        if self.filter_bar.error is None and self.filter_bar.filter.text != self.shared.filter.text:
            self.filter_bar.edit.blockSignals(True)
            self.filter_bar.edit.setText(self.shared.filter.text)
            self.filter_bar.edit.blockSignals(False)
            self.filter_bar.filter = self.shared.filter
        self._refresh_matched()

    def _refresh_matched(self) -> None:
        """Emphasise the blocks that the events the shared filter keeps touched, up to the
        event shown (a block id of an allocation, a store, an eviction, a ref count)."""
        shared, log = self.shared, self.state.log
        upto = log.count_upto(self.state.current_seq) if not self.state.is_live else len(log.events)
        key = (shared.filter.text, shared.range, shared.pending, upto, len(log.events), self.blocks_per_cell,
               self.cols)
        if key == self._matched_key:
            return
        self._matched_key = key
        ids: set[int] = set()
        n = self.state.projection.num_blocks
        if shared.active and getattr(log, "columnar_log", False):
            # the rows of the matching events, read from the block column at once
            blocks = log.touched_blocks(shared.matching_positions(), upto)
            blocks = blocks[blocks < n]
        elif shared.active:
            events = log.events
            for i in shared.matching_positions():
                if i >= upto:
                    break
                e = events[i]
                many = getattr(e, "block_ids", None)
                if many is not None:
                    ids.update(b for b in many if b >= 0)
                else:
                    b = getattr(e, "block_id", None)
                    if b is not None and b >= 0:
                        ids.add(b)
        if not (shared.active and getattr(log, "columnar_log", False)):
            blocks = np.array(sorted(b for b in ids if b < n), dtype=np.int64)
        self.matched_blocks = blocks
        if shared.pending:
            self.filter_bar.count.setText("matching\u2026")
        elif shared.filter.root is not None or shared.range is not None:
            self.filter_bar.count.setText(f"{len(blocks):,} of {n:,} blocks")
        else:
            self.filter_bar.count.setText("")
        if len(blocks):
            cells = np.unique(blocks // self.blocks_per_cell)
            self.matched.setData(x=cells % self.cols + 0.5, y=cells // self.cols + 0.5)
        else:
            self.matched.setData(x=[], y=[])

    @staticmethod
    def _request_blocks(p: PoolProjection, request_id: str) -> list[int]:
        if request_id in p.running:
            return list(p.running[request_id])
        rec = p.requests.get(request_id)
        if rec is None:
            return []
        found = (p.block_of_hash(h) for h in rec.block_hashes)
        return [b for b in found if b is not None]

    def _update_summary(self, p: PoolProjection) -> None:
        c = p.counters
        remote = getattr(self.state, "remote", None)
        if remote is not None:
            tiers = " &nbsp;·&nbsp; ".join(f"{t.tier} <b>{t.num_blocks:,}</b>" for t in remote.tier_counts(p)
                                           if t.num_blocks or t.tier == "GPU")
            if self.state.engine_info.get("data_parallel_size", 1) > 1:  # one pool per rank, combined here
                tiers += "".join(f" &nbsp;·&nbsp; rank {r} <b>{n:,}</b>" for r, n in remote.ranks(p).items())
            where = "live" if self.state.is_live else "<b>scrubbed</b> (tiers show live only)"
            seq = "no events yet" if p.seq < 0 else f"event {p.seq} ({where})"
            self.summary.setText(f"vLLM pool: <b>{p.num_hashed:,}</b> cached blocks × {p.block_size} tokens"
                                 f" &nbsp;·&nbsp; {tiers} &nbsp;·&nbsp; {seq}")
            return
        where = "live" if self.state.is_live else "<b>scrubbed</b>"
        seq = "no events yet" if p.seq < 0 else f"event {p.seq} ({where})"
        self.summary.setText(
            f"<b>{p.num_blocks:,}</b> blocks × {p.block_size} tokens &nbsp;·&nbsp; in use <b>{p.num_in_use:,}</b>"
            f" &nbsp;·&nbsp; cached free <b>{p.num_cached_free:,}</b> &nbsp;·&nbsp; empty <b>{p.num_empty:,}</b>"
            f" &nbsp;·&nbsp; max ref {p.max_ref_count} &nbsp;·&nbsp; hit rate {100 * c.hit_rate:.1f}%"
            f" &nbsp;·&nbsp; {seq}")

    # ------------------------------------------------------------------ selection
    def select_block(self, block_id: int | None) -> list[int]:
        """Select the chain of `block_id` (its cached ancestors and itself); returns it."""
        self._selected_request = None
        p = self.state.projection
        if block_id is None or not 0 <= block_id < p.num_blocks:
            self._selected_block = None
        else:
            self._selected_block = int(block_id)
        self._refresh_selection(p)
        return self.selected_chain

    def clear_selection(self, redraw: bool = True) -> None:
        self._selected_block = None
        self._selected_request = None
        self.selected_chain = []
        if redraw:
            self.outline.setData(x=[], y=[])

    # ------------------------------------------------------------------ mouse
    def block_at(self, x: float, y: float) -> int | None:
        """The block under view coordinates (x, y), or None."""
        if x < 0 or y < 0:
            return None
        col, row = int(x), int(y)
        if col >= self.cols:
            return None
        b = (row * self.cols + col) * self.blocks_per_cell
        return b if b < self.state.projection.num_blocks else None

    def view_point_of(self, block_id: int) -> QPointF:
        """The centre of a block's cell in view coordinates."""
        cell = block_id // self.blocks_per_cell
        return QPointF(cell % self.cols + 0.5, cell // self.cols + 0.5)

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        if not self.vb.sceneBoundingRect().contains(scene_pos):
            return
        pt = self.vb.mapSceneToView(scene_pos)
        b = self.block_at(pt.x(), pt.y())
        if b == self._hover_block:
            return
        self._hover_block = b
        if b is None:
            QToolTip.hideText()
        else:
            QToolTip.showText(QCursor.pos(), self.tooltip_for(b), self.glw)

    def _on_mouse_clicked(self, ev: Any) -> None:
        if ev.button() != Qt.MouseButton.LeftButton:
            return
        pt = self.vb.mapSceneToView(ev.scenePos())
        block = self.block_at(pt.x(), pt.y())
        self.select_block(block)
        if block is not None:
            self.ctx.selection.select(block)  # the details pane shows it

    def _decode(self, token_ids: tuple[int, ...]) -> str:
        shown = list(token_ids[:MAX_TOOLTIP_TOKENS])
        more = " …" if len(token_ids) > MAX_TOOLTIP_TOKENS else ""
        text = decode_tokens(self.ctx, shown)  # the attached server's tokenizer, else the model's
        if text is not None:
            return f"“{text.replace(chr(10), '⏎')}”{more}"
        return str(shown)[1:-1] + more

    def tooltip_for(self, block_id: int) -> str:
        """The hover text of a block: id, digest, parent, tokens, ref count, tenant, last use."""
        p = self.state.projection
        info = p.block_info(block_id)
        if info.ref_count > 0:
            state = f"in use, ref count {info.ref_count}"
        elif info.block_hash is not None:
            state = "cached, free"
        else:
            state = "empty"
        remote = getattr(self.state, "remote", None)
        if remote is not None and info.block_hash is not None:
            state = f"cached on {remote.tier_name(block_id)}"
            if block_id < len(remote.rank) and self.state.engine_info.get("data_parallel_size", 1) > 1:
                state += f", rank {int(remote.rank[block_id])}"
        lines = [f"Block {block_id} · {state}"]
        if info.block_hash is not None:
            parent = info.parent_hash.hex()[:12] if info.parent_hash is not None else "none (first block)"
            lines.append(f"digest {info.block_hash.hex()[:12]}… · parent {parent}")
            tenant = info.tenant if info.tenant is not None else "none"
            lines.append(f"tenant: {tenant}")
            if info.token_ids:
                lines.append(f"tokens: {self._decode(info.token_ids)}")
            elif info.external_id is not None:
                lines.append(f"external block id {info.external_id}")
        if info.free_rank is not None:
            lines.append(f"free queue position {info.free_rank} of {p.num_free_blocks} (0 = evicted next)")
        if info.owners:
            lines.append("used by: " + ", ".join(info.owners[:6]) + (" …" if len(info.owners) > 6 else ""))
        if info.last_use_seq is not None:
            lines.append(f"last use: event {info.last_use_seq} (use clock {info.last_used})")
        if info.evicted_seq is not None:
            lines.append(f"last evicted at event {info.evicted_seq}")
        return "\n".join(lines)

    def blocks_table(self) -> tuple[list[str], list[list[Any]]]:
        """Every block of the shown pool as a row (for the CSV export)."""
        p = self.state.projection
        ranks = p.free_ranks()
        rows = []
        for b in range(p.num_blocks):
            h, parent = p.hashes[b], p.parents[b]
            state = "in use" if p.ref_counts[b] > 0 else "cached, free" if h is not None else "empty"
            rows.append([b, state, p.ref_counts[b], h.hex() if h else "", parent.hex() if parent else "",
                         ranks.get(b, ""), p.tenants[b] or "", len(p.token_ids[b])])
        return (["block_id", "state", "ref_count", "hash", "parent_hash", "lru_position", "tenant", "num_tokens"],
                rows)

    def color_of(self, block_id: int) -> QColor:
        """The colour the grid currently shows for `block_id` (for tests)."""
        r, g, b, a = (int(v) for v in self.cell_colors[block_id])
        return QColor(r, g, b, a)
