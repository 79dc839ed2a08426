"""The block table draws a cell with a gap of background only where the screen shows the
gap: a grid of 4-pixel cells shown at about 2 screen pixels a cell lost rows and columns of
pixels unevenly (pyqtgraph draws an image without smoothing), and its gaps came out as a moire
of stripes and tiles across a pool of one colour."""

from __future__ import annotations

import numpy as np
from PySide6.QtGui import QImage

from app.runtime.context import make_test_context
from app.views.pool.block_table_view import BlockTableView, cell_pixels
from tests.test_engine_views import deliver, make_engine


def test_a_cells_image_pixels_are_at_most_what_the_screen_shows():
    assert cell_pixels(20_000) == 4 and cell_pixels(1_000) == 8 and cell_pixels(200_000) == 1
    assert cell_pixels(20_000, 9.5) == 4 and cell_pixels(1_000, 5.2) == 5
    assert cell_pixels(20_000, 3.0) == 3  # a gap of one pixel still shows
    assert cell_pixels(20_000, 2.4) == 1 and cell_pixels(1_000, 1.2) == 1  # no gap to show: none drawn


def _grid_pixels(view: BlockTableView) -> np.ndarray:
    """The grid's middle, as the screen shows it (RGB)."""
    img = view.glw.grab().toImage().convertToFormat(QImage.Format.Format_RGBA8888)
    w, h = img.width(), img.height()
    ptr = img.constBits()
    rgba = np.frombuffer(ptr, np.uint8, img.sizeInBytes()).reshape(h, img.bytesPerLine() // 4, 4)[:, :w]
    return rgba[h // 4:3 * h // 4, w // 4:3 * w // 4, :3].copy()


def test_a_pool_of_empty_blocks_shows_no_gaps_where_its_cells_are_small(qtbot, tmp_path):
    ctx = make_test_context(tmp_path)
    try:
        make_engine(ctx, num_blocks=20_000, block_size=4)
        deliver(ctx)
        view = BlockTableView(ctx)
        qtbot.addWidget(view)
        view.resize(620, 240)  # a short dock: ~2.4 screen pixels a cell
        view.show()
        qtbot.waitExposed(view)
        view.redraw()
        qtbot.wait(50)
        shown = min(view.vb.width() / view.cols, view.vb.height() / view.rows)
        assert shown < 3 and view.cell_px == 1
        bg = view.colors["background"]
        background = np.array([bg.red(), bg.green(), bg.blue()], np.uint8)
        small = _grid_pixels(view)
        # every cell empty, none a gap: not a pixel of the background between them
        assert not (small == background).all(axis=2).any()
        view.resize(1600, 1000)  # room for cells of 4 pixels and their gaps
        qtbot.waitUntil(lambda: view.cell_px == 4)
        assert view._img.shape[:2] == (view.rows * 4, view.cols * 4)
        big = _grid_pixels(view)
        assert (big == background).all(axis=2).mean() > 0.2  # the gaps, a pixel in four each way
    finally:
        ctx.shutdown()
