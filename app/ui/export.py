"""Saving what a view shows: any plot as PNG or SVG, any table as CSV.

Plots go through pyqtgraph's own exporters (`ImageExporter`, `SVGExporter`), tables through
the csv module. `export_button` is the one widget every view adds to offer both; the views
only say which plots and tables they have.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyqtgraph as pg
import pyqtgraph.exporters  # noqa: F401 - makes pg.exporters available
from PySide6.QtCore import QAbstractItemModel, Qt
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QMenu, QToolButton, QWidget

PLOT_FORMATS = ("png", "svg")

# A table is (header, rows); a view hands over a function that builds it when asked, so a
# 195K-row table costs nothing until someone exports it.
Table = tuple[Sequence[str], Iterable[Sequence[Any]]]


def _scene_item(plot: Any) -> Any:
    """The graphics item or scene pyqtgraph's exporters take, for any plot-like object."""
    if isinstance(plot, pg.PlotWidget):
        return plot.getPlotItem()
    if isinstance(plot, pg.GraphicsView):  # GraphicsLayoutWidget and friends: the whole scene
        return plot.scene()
    if isinstance(plot, (pg.GraphicsItem, pg.GraphicsScene)):
        return plot
    raise ValueError(f"cannot export a {type(plot).__name__} as a plot; pass a pyqtgraph plot or layout")


def export_plot(plot: Any, path: str | Path, width: int | None = None) -> Path:
    """Write `plot` to `path` as PNG or SVG (chosen by the suffix); returns the path."""
    path = Path(path)
    kind = path.suffix.lower().lstrip(".")
    if kind not in PLOT_FORMATS:
        raise ValueError(f"{path.name}: a plot is saved as .png or .svg, not {path.suffix or 'no suffix'}")
    item = _scene_item(plot)
    if kind == "png":
        exporter = pg.exporters.ImageExporter(item)
        if width:
            exporter.parameters()["width"] = int(width)
        exporter.export(str(path))
    else:
        try:
            pg.exporters.SVGExporter(item).export(str(path))
        except (ValueError, IndexError):
            # pyqtgraph's SVG clean-up cannot parse some paths (a curve broken by NaN gaps);
            # Qt's own SVG writer renders the same scene without that step.
            _qt_svg(item, path)
    if not path.is_file():
        raise ValueError(f"{path.name} could not be written (the plot has no size yet?)")
    return path


def _qt_svg(item: Any, path: Path) -> None:
    from PySide6.QtCore import QRectF, QSize
    from PySide6.QtGui import QPainter
    from PySide6.QtSvg import QSvgGenerator

    scene = item if isinstance(item, pg.GraphicsScene) else item.scene()
    source = scene.sceneRect() if item is scene else item.sceneBoundingRect()
    gen = QSvgGenerator()
    gen.setFileName(str(path))
    gen.setSize(QSize(int(source.width()), int(source.height())))
    gen.setViewBox(QRectF(0, 0, source.width(), source.height()))
    painter = QPainter(gen)
    try:
        scene.render(painter, QRectF(0, 0, source.width(), source.height()), source)
    finally:
        painter.end()


def model_table(model: QAbstractItemModel) -> Table:
    """A Qt table model as (header, rows) of display strings."""
    cols, rows = model.columnCount(), model.rowCount()
    header = [str(model.headerData(c, Qt.Orientation.Horizontal) or "") for c in range(cols)]
    data = ([model.index(r, c).data() for c in range(cols)] for r in range(rows))
    return header, ([("" if v is None else v) for v in row] for row in data)


def export_table(table: Table, path: str | Path) -> Path:
    """Write (header, rows) to `path` as CSV (UTF-8, one header line); returns the path."""
    path = Path(path)
    if path.suffix.lower() != ".csv":
        raise ValueError(f"{path.name}: a table is saved as .csv, not {path.suffix or 'no suffix'}")
    header, rows = table
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(list(header))
        for row in rows:
            writer.writerow(list(row))
    return path


def header_row(label: QWidget, button: QWidget) -> QHBoxLayout:
    """A view's summary line with its Export button at the right (the label wraps, the button does not)."""
    row = QHBoxLayout()
    row.setContentsMargins(0, 0, 0, 0)
    row.addWidget(label, 1)
    row.addWidget(button, 0, Qt.AlignmentFlag.AlignTop)
    return row


def _slug(text: str) -> str:
    return "-".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split()) or "export"


def export_button(parent: QWidget, plots: dict[str, Callable[[], Any]] | None = None,
                  tables: dict[str, Callable[[], Table]] | None = None) -> QToolButton:
    """A small "Export" button whose menu saves each named plot (PNG/SVG) and table (CSV).

    The same actions are the parent's right-click menu. A failed write is told through
    `parent.ctx.show_error` when the parent has a context, else raised.
    """
    button = QToolButton(parent)
    button.setText("Export")
    button.setObjectName("export_button")
    button.setToolTip("save a plot as PNG or SVG, or a table as CSV")
    button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
    menu = QMenu(button)

    def ask_and_save(title: str, suffix: str, write: Callable[[Path], Any]) -> None:
        path, _ = QFileDialog.getSaveFileName(parent, f"Export {title}", f"{_slug(title)}.{suffix}",
                                              f"{suffix.upper()} files (*.{suffix})")
        if not path:
            return
        if not path.lower().endswith(f".{suffix}"):
            path += f".{suffix}"
        try:
            write(Path(path))
        except (OSError, ValueError) as exc:
            ctx = getattr(parent, "ctx", None)
            if ctx is None:
                raise
            ctx.show_error(f"{Path(path).name} could not be saved: {exc}")

    for title, get in (plots or {}).items():
        for suffix in PLOT_FORMATS:
            act = menu.addAction(f"{title} as {suffix.upper()}…")
            act.triggered.connect(lambda _=False, t=title, s=suffix, g=get:
                                  ask_and_save(t, s, lambda p: export_plot(g(), p)))
    for title, get in (tables or {}).items():
        act = menu.addAction(f"{title} as CSV…")
        act.triggered.connect(lambda _=False, t=title, g=get: ask_and_save(t, "csv", lambda p: export_table(g(), p)))
    button.setMenu(menu)
    parent.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
    parent.addActions(menu.actions())
    return button
