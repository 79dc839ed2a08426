"""The keys every timeline (`app.ui.plots.PlotStack`) takes, as the shortcuts dialog lists
them. Kept apart from `app.ui.plots` so that listing them does not import pyqtgraph
before the window's first paint."""

from __future__ import annotations

# (action, keys): what every timeline does with the keyboard.
TIMELINE_KEYS: tuple[tuple[str, str], ...] = (
    ("Timeline: zoom in", "W, +"),
    ("Timeline: zoom out", "S, -"),
    ("Timeline: pan left", "A, Left"),
    ("Timeline: pan right", "D, Right"),
    ("Timeline: show everything", "Home"),
    ("Timeline: select the range in view (filters the other views)", "R"),
    ("Timeline: select a range with the mouse (filters the other views)", "Shift+drag"),
    ("Timeline: clear the range selection", "Esc"),
)
