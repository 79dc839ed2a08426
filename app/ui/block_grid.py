"""A pool's cells as one RGBA image: the layout the main block table draws, for any view
that shows a pool as a grid (the Compare window's two pools side by side).

`grid_image` lays out per-block colours (from `app.views.pool.block_table_view.compute_colors`)
in `cols` x `rows` cells of `px` pixels with a one-pixel gap once cells are 3 pixels or more,
as the block table does; pure numpy, no widgets.
"""

from __future__ import annotations

import numpy as np


def grid_image(colors: np.ndarray, cols: int, rows: int, px: int, background: np.ndarray) -> np.ndarray:
    """An image (rows * px, cols * px, 4) of `colors` (n, 4) uint8, row by row; cells past
    the last block and the gaps between cells are `background` (4,) uint8."""
    n = len(colors)
    if n > cols * rows:
        raise ValueError(f"{n} blocks do not fit a grid of {cols} x {rows} cells")
    cells = np.empty((rows * cols, 4), dtype=np.uint8)
    cells[:] = background
    cells[:n] = colors
    img = np.empty((rows * px, cols * px, 4), dtype=np.uint8)
    img[:] = background
    inner = px - 1 if px >= 3 else px
    view = img.reshape(rows, px, cols, px, 4)
    view[:, :inner, :, :inner, :] = cells.reshape(rows, cols, 4)[:, None, :, None, :]
    return img
