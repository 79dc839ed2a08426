"""One colour per server, in both themes: the fleet views colour a server's column, rows and
cells alike, so a server is one colour everywhere."""

from __future__ import annotations

from PySide6.QtGui import QColor

from app.ui import theme

# Categorical, colour-blind-safe hues (Okabe-Ito), a shade for each theme's background.
_DARK = ("#56b4e9", "#e69f00", "#009e73", "#cc79a7", "#f0e442", "#d55e00", "#0072b2", "#bbbbbb")
_LIGHT = ("#1f78b4", "#c77c00", "#00875f", "#b5508f", "#9a8c00", "#c24e00", "#00508a", "#6f6a68")


def server_color(index: int, name: str | None = None) -> QColor:
    """The colour of the server at `index` in the fleet's order (the palette repeats)."""
    colors = _DARK if (name or theme.current_theme()) == "dark" else _LIGHT
    return QColor(colors[index % len(colors)])


def server_tint(index: int, alpha: int = 70, name: str | None = None) -> QColor:
    """The server's colour, see-through: a row or cell background that keeps text readable."""
    c = server_color(index, name)
    c.setAlpha(alpha)
    return c
