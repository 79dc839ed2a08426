"""Dark and light themes: palettes, the style sheet built from them, and pyqtgraph colours.

The style sheet is one template (`app/styles/base.qss`) filled from a palette, so the
two themes cannot drift apart. Views read colours with `color(key)` and listen to
`AppContext.sigThemeChanged` to restyle what a style sheet cannot reach (plots, painters).
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication

STYLES_DIR = Path(__file__).with_name("styles")
THEME_NAMES = ("dark", "light")

# Dark follows napari's palette: a slate background, lighter panels, one blue accent.
_DARK = {
    "bg": "#262930", "panel": "#2d3039", "card": "#343843", "card_user": "#2b3a4d",
    "card_user_border": "#3d5a7a", "field": "#1f2128", "control": "#414851", "hover": "#4a525c",
    "pressed": "#5a626c", "border": "#3d424d", "text": "#f0f1f2", "text_dim": "#a3a9b3",
    "accent": "#1f8ad1", "on_accent": "#ffffff", "tooltip": "#343843", "warn": "#e0a84f",
    # cache states, shared by every view
    "cached": "#3fb68b", "computed": "#e0884f", "partial": "#b5a04a", "generated": "#7b8cde",
    "pending": "#5a626c", "miss": "#ff5c5c", "evicted": "#c2557a", "free": "#4d5563", "empty": "#30343c",
}
_LIGHT = {
    "bg": "#efebe9", "panel": "#f7f5f4", "card": "#ffffff", "card_user": "#e4eef8",
    "card_user_border": "#a9c6e3", "field": "#ffffff", "control": "#d6d0ce", "hover": "#e2dcda",
    "pressed": "#c6bebb", "border": "#cfc8c5", "text": "#3b3a39", "text_dim": "#6f6a68",
    "accent": "#007acc", "on_accent": "#ffffff", "tooltip": "#ffffff", "warn": "#b7791f",
    "cached": "#2e9e74", "computed": "#d9702b", "partial": "#a48c21", "generated": "#5468c8",
    "pending": "#b9b2af", "miss": "#d62d2d", "evicted": "#a8365f", "free": "#c9c3c0", "empty": "#e6e1df",
}
PALETTES = {"dark": _DARK, "light": _LIGHT}


_THEME_PROPERTY = "cachescopeTheme"  # the theme lives on the QApplication, like its style sheet


def current_theme() -> str:
    app = QApplication.instance()
    name = app.property(_THEME_PROPERTY) if app is not None else None
    return name if name in PALETTES else "dark"


def palette(name: str | None = None) -> dict[str, str]:
    return dict(PALETTES[name or current_theme()])


def color(key: str, name: str | None = None) -> QColor:
    """A theme colour as a QColor, e.g. color("cached")."""
    return QColor(PALETTES[name or current_theme()][key])


def style_sheet(name: str) -> str:
    if name not in PALETTES:
        raise ValueError(f"unknown theme {name!r}; choose one of {', '.join(THEME_NAMES)}")
    text = (STYLES_DIR / "base.qss").read_text(encoding="utf-8")
    for key, value in PALETTES[name].items():
        text = text.replace("{" + key + "}", value)
    return text


def apply_theme(app: QApplication, name: str) -> None:
    """Style the whole application (widgets, Qt palette, pyqtgraph defaults) as `name`."""
    p = PALETTES.get(name)
    if p is None:
        raise ValueError(f"unknown theme {name!r}; choose one of {', '.join(THEME_NAMES)}")
    app.setProperty(_THEME_PROPERTY, name)
    app.setStyle("Fusion")
    font = QFont(app.font())
    font.setFamilies(["Inter", "Segoe UI", "Noto Sans", "DejaVu Sans", "Sans Serif"])
    font.setPointSizeF(10)
    app.setFont(font)
    qp = QPalette()
    for role, key in ((QPalette.ColorRole.Window, "bg"), (QPalette.ColorRole.WindowText, "text"),
                      (QPalette.ColorRole.Base, "field"), (QPalette.ColorRole.AlternateBase, "panel"),
                      (QPalette.ColorRole.Text, "text"), (QPalette.ColorRole.Button, "control"),
                      (QPalette.ColorRole.ButtonText, "text"), (QPalette.ColorRole.Highlight, "accent"),
                      (QPalette.ColorRole.HighlightedText, "on_accent"), (QPalette.ColorRole.ToolTipBase, "tooltip"),
                      (QPalette.ColorRole.ToolTipText, "text"), (QPalette.ColorRole.PlaceholderText, "text_dim")):
        qp.setColor(role, QColor(p[key]))
    app.setPalette(qp)
    app.setStyleSheet(style_sheet(name))
    if "pyqtgraph" in sys.modules:  # else `apply_plot_defaults` before the first plot is built
        apply_plot_defaults()


def apply_plot_defaults() -> None:
    """pyqtgraph's defaults (background, foreground) for the current theme. `apply_theme`
    sets them only once pyqtgraph is imported, so that the window's first paint does not
    wait for it (half a second); whoever builds the first plot calls this first."""
    try:
        import pyqtgraph as pg
    except ImportError:  # pyqtgraph is a dependency; a broken install must not stop the shell
        return
    p = PALETTES[current_theme()]
    pg.setConfigOptions(background=p["panel"], foreground=p["text_dim"], antialias=True)
