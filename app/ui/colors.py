"""The colours cache states are drawn in, shared by every view so a state reads the same
everywhere, and the rich-text legends that name them (`swatch`, `legend_line`).

The palettes themselves live in `theme`; this module only derives from them.
"""

from __future__ import annotations

from PySide6.QtGui import QColor

from app.ui import theme


def block_colors(name: str | None = None) -> dict[str, QColor]:
    """The grid's colours for a theme; other views reuse them so states read the same."""
    p = theme.palette(name)
    dark = (name or theme.current_theme()) == "dark"
    return {
        "background": QColor(p["bg"]),
        "empty": QColor(p["empty"]),
        # cached & free: LRU age from the next to be evicted (dim) to the last freed (bright)
        "cached_old": QColor("#1d4a3b" if dark else "#b9dccb"),
        "cached_new": QColor(p["cached"]),
        "ref1": QColor("#3d8fd6" if dark else "#2f7fc4"),
        "ref2": QColor("#8f7cf0" if dark else "#6a55d6"),
        "ref3": QColor("#f2b134" if dark else "#d08a00"),
        "evicted": QColor(p["miss"]),
        "selected": QColor("#ffffff" if dark else "#111111"),
    }


def swatch(color: QColor | str, glyph: str = "■") -> str:
    """A coloured glyph for rich-text legends."""
    return f"<span style='color:{QColor(color).name()}'>{glyph}</span>"


def legend_line(items: list[tuple[str, str]]) -> str:
    """(swatch, text) items joined by dots; a line wraps only between items, never inside one
    (so `text` may hold <b> but no tag with attributes)."""
    parts = [(f"{mark}&nbsp;" if mark else "") + text.replace(" ", "&nbsp;") for mark, text in items]
    return "&nbsp;&nbsp;·&nbsp; ".join(parts)


def tier_colors(name: str | None = None) -> dict[str, QColor]:
    """A remote pool's tiers: GPU in the cached colour, host memory and storage apart."""
    p = theme.palette(name)
    dark = (name or theme.current_theme()) == "dark"
    return {"GPU": QColor(p["cached"]), "CPU": QColor("#e0a84f" if dark else "#c07a10"),
            "STORAGE": QColor("#9b7cf0" if dark else "#6a4fd0")}
