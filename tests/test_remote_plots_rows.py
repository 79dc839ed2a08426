"""PlotStack's rows in a short dock (the remote timeline's, the pool timeline's at 1280x800):
as many rows as fit MIN_ROW_PX each show, and every shown row's plot is at least that tall,
the last one (which also holds the x axis) too; the room left is shared by stretch."""

from __future__ import annotations

import pytest

from app.ui.plots import MIN_ROW_PX, PlotStack, row_heights


def test_row_heights_share_by_stretch_and_keep_a_floor():
    assert row_heights(140, [3, 2, 2], 42) == [56, 42, 42]  # by stretch 60/40/40, then the floor
    assert row_heights(300, [3, 2, 2], 42) == [130, 85, 85]  # 128.6, 85.7, 85.7: whole pixels, the rest on top
    assert row_heights(90, [3, 2, 2], 42) == [30, 30, 30]  # short of the floor: equal shares
    assert row_heights(0, [1], 42) == [0] and row_heights(50, [], 42) == []
    for room in range(0, 400, 7):
        got = row_heights(room, [3, 2, 2, 2], MIN_ROW_PX)
        assert sum(got) == room and min(got) >= min(MIN_ROW_PX, room // 4)


@pytest.mark.parametrize("height", [148, 196, 211, 258, 318, 418])
def test_every_shown_row_is_at_least_a_row_tall(qtbot, height):
    stack = PlotStack("event seq", events_on_x=False)
    qtbot.addWidget(stack)  # closed at teardown: GraphicsView.close resizes after its scene is gone
    plots = [stack.add(stretch=s)[1] for s in (3, 2, 2, 2)]
    stack.priority = [0, 3, 1, 2]
    stack.resize(640, height)
    stack.show()
    qtbot.waitExposed(stack)
    qtbot.waitUntil(lambda: stack.height() == height)
    qtbot.wait(50)  # the layout settles
    shown = [p for p, on in zip(plots, stack.shown) if on]
    assert shown and stack.shown[0]  # the first in priority always stays
    # 211 px held four rows with the last (and its x axis) squeezed to a 23 px plot
    heights = [p.vb.height() for p in shown]
    assert min(heights) >= MIN_ROW_PX, (height, stack.shown, heights)
    # a row more would not have fitted: rows step out only when they must
    if len(shown) < len(plots):
        assert sum(heights) + MIN_ROW_PX + 8 * len(shown) + 40 > height, (height, heights)
