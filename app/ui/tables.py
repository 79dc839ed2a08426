"""Read-only data tables: the Compare window's and the Statistics pane's grids of numbers.

`data_table(columns)` makes one (rows selected whole, one at a time, not editable) and
`fill_table(table, rows, formats)` fills it in one pass: numbers right-aligned, each
column formatted by its code, the columns as wide as their contents and headers.
"""

from __future__ import annotations

from typing import Any, Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHeaderView, QTableWidget, QTableWidgetItem

# Format codes: "" plain (ints with thousands separators), "%" a fraction as a percentage,
# "%1" the same with one decimal, "+%" a difference of fractions, "+" a signed number,
# "text" as it is (line breaks shown as a return glyph), "usd" dollars with six decimals.
FORMATS = ("", "%", "%1", "+%", "+", "text", "usd", "+usd")
AUTO_FIT_ROWS = 2_000


def data_table(columns: Sequence[str]) -> QTableWidget:
    t = QTableWidget(0, len(columns))
    t.setHorizontalHeaderLabels(list(columns))
    t.verticalHeader().hide()
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    t.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
    t.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    t.horizontalHeader().setStretchLastSection(True)
    return t


def cell_text(value: Any, fmt: str = "") -> str:
    if value is None:
        return ""
    if fmt == "text" or isinstance(value, str):
        return str(value).replace("\n", "\u21b5")
    if isinstance(value, bool):
        return str(value)
    if fmt == "%":
        return f"{value:.2%}"
    if fmt == "%1":
        return f"{value:.1%}"
    if fmt == "+%":
        return f"{value:+.4%}"  # a difference is often small
    if fmt in ("usd", "+usd"):
        return f"{value:+.6f}" if fmt == "+usd" else f"{value:.6f}"
    if isinstance(value, (int, float)):
        sign = "+" if fmt == "+" else ""
        return f"{value:{sign},}" if isinstance(value, int) else f"{value:{sign},.2f}"
    return str(value)


def cell(value: Any, fmt: str = "") -> QTableWidgetItem:
    """One cell: `value` in format `fmt`, right-aligned when it is a number."""
    item = QTableWidgetItem(cell_text(value, fmt))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def fill_table(table: QTableWidget, rows: Sequence[Sequence[Any]], formats: Sequence[str] = ()) -> None:
    """Replace the table's rows; `formats[j]` formats column j ("" where not given). Signals
    are held during the fill. Up to AUTO_FIT_ROWS rows the columns fit their contents and
    headers by themselves (again after a theme change); a longer table is sized once after
    the fill: fitting per item, 12,000 rows cost minutes."""
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
    header.setStretchLastSection(True)
    table.setUpdatesEnabled(False)
    blocked = table.blockSignals(True)
    try:
        table.setRowCount(len(rows))
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                table.setItem(i, j, cell(value, formats[j] if j < len(formats) else ""))
    finally:
        table.blockSignals(blocked)
        if len(rows) <= AUTO_FIT_ROWS:
            header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        else:
            table.resizeColumnsToContents()  # the cells' widths; a header wider than them is kept whole
            for j in range(table.columnCount()):
                table.setColumnWidth(j, max(table.columnWidth(j), header.sectionSizeHint(j)))
        table.setUpdatesEnabled(True)
