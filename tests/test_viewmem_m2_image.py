"""The block table's image: pyqtgraph shows its RGBA bytes as they are (no levels), so it
keeps no rendered copy of its own, and the picture is the one levels of (0, 255) drew."""

from __future__ import annotations


import numpy as np
from PySide6.QtGui import QImage

from app.runtime.context import make_test_context
from app.runtime.jobs import trace_block_size
from app.runtime.replays import kernel_replay_job
from tests._traces import trace_head

NUM_BLOCKS = 6000  # cells of 4x4 pixels with a gap, the Mooncake trace's 16K-block pool's layout


def _pixels(view) -> np.ndarray:
    img = view.grab().toImage().convertToFormat(QImage.Format.Format_RGBA8888)
    return np.frombuffer(img.constBits(), np.uint8, img.sizeInBytes()).reshape(img.height(), -1).copy()


def test_the_grid_is_drawn_without_a_copy_and_as_with_levels(qtbot, tmp_path):
    from app.views.pool.block_table_view import BlockTableView

    path = trace_head(tmp_path, 1500)
    ctx = make_test_context(tmp_path / "ctx")
    try:
        view = BlockTableView(ctx)
        qtbot.addWidget(view)
        view.resize(900, 600)
        view.show()
        qtbot.waitExposed(view)
        bs = trace_block_size(path)
        _, log = kernel_replay_job(str(path), bs, NUM_BLOCKS)
        ctx.state.set_engine({"block_size": bs, "num_blocks": NUM_BLOCKS})
        ctx.state.adopt_log(log)
        view.redraw()
        assert view.cell_px == 4
        colors = {tuple(c) for c in view.cell_colors.tolist()}
        assert len(colors) >= 3  # a pool in use, cached and free: several colours drawn
        now = _pixels(view)
        item = view.image
        assert np.shares_memory(item.image, view._img)
        assert item._processingBuffer is None and item._displayBuffer is None
        assert item.qimage is not None and item.qimage.sizeInBytes() == view._img.nbytes
        # the same picture as pyqtgraph's own conversion with levels (0, 255) gave
        item.setImage(view._img, autoLevels=False, levels=(0, 255))
        assert item.levels is not None
        before = _pixels(view)
        assert item._processingBuffer is not None  # that path keeps a copy
        assert now.shape == before.shape and np.array_equal(now, before)
    finally:
        ctx.shutdown()
