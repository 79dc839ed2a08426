"""Read-only data tables: the Compare window's and the Statistics pane's grids of numbers.

`data_table(columns)` makes one (rows selected whole, one at a time, not editable) and
`fill_table(table, rows, formats)` fills it in one pass: numbers right-aligned, each
column formatted by its code, the columns as wide as their contents and headers.

A table of thousands of rows (a bill of a whole trace) is a `RowsModel` in a `QTableView`
instead: it keeps the caller's rows as they are and makes a cell's text only when the view
draws it, so showing 12,000 rows costs what showing the visible few does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, QPersistentModelIndex, Qt
from PySide6.QtWidgets import QHeaderView, QTableView, QTableWidget, QTableWidgetItem

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


class RowsModel(QAbstractTableModel):
    """A read-only table model over a sequence of rows, in any shape (dicts, tuples, an
    array's records): `cells(row)` gives a row's values, one per column, when the view asks
    for them, and `tip(row, column)` a cell's tooltip (None: none). A value is shown as
    `str(value)` (None as empty), a number right-aligned. `set_rows` replaces everything in
    one reset: nothing is copied or formatted ahead of the paint."""

    def __init__(self, columns: Sequence[str] = (), parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._columns: tuple[str, ...] = tuple(columns)
        self._rows: Sequence[Any] = ()
        self._cells: Callable[[Any], Sequence[Any]] = tuple
        self._tip: Callable[[Any, int], str | None] | None = None
        self._memo: tuple[int, Sequence[Any]] = (-1, ())  # the last row's cells: a view asks one row many times

    def set_rows(self, rows: Sequence[Any], cells: Callable[[Any], Sequence[Any]] = tuple,
                 columns: Sequence[str] | None = None, tip: Callable[[Any, int], str | None] | None = None) -> None:
        """Show `rows` (kept, not copied), under `columns` when given."""
        self.beginResetModel()
        if columns is not None:
            self._columns = tuple(columns)
        self._rows, self._cells, self._tip = rows, cells, tip
        self._memo = (-1, ())
        self.endResetModel()

    def clear(self, columns: Sequence[str] | None = None) -> None:
        self.set_rows((), tuple, columns)

    @property
    def rows(self) -> Sequence[Any]:
        return self._rows

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802, B008
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802, B008
        return 0 if parent.isValid() else len(self._columns)

    def _row_cells(self, row: int) -> Sequence[Any]:
        if self._memo[0] != row:
            self._memo = (row, self._cells(self._rows[row]))
        return self._memo[1]

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            value = self._row_cells(index.row())[index.column()]
            return "" if value is None else str(value)
        if role == Qt.ItemDataRole.TextAlignmentRole:
            value = self._row_cells(index.row())[index.column()]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            return None
        if role == Qt.ItemDataRole.ToolTipRole and self._tip is not None:
            return self._tip(self._rows[index.row()], index.column())
        return None

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal \
                and 0 <= section < len(self._columns):
            return self._columns[section]
        return None


def rows_table(columns: Sequence[str] = (), sample_rows: int = 60) -> tuple[QTableView, RowsModel]:
    """A read-only `QTableView` over a new `RowsModel`: no row numbers, whole rows selected,
    the last column stretched, and columns fitted (`resizeColumnsToContents`) from at most
    `sample_rows` rows, so fitting a long table does not format every row."""
    model = RowsModel(columns)
    view = QTableView()
    view.setModel(model)
    model.setParent(view)
    view.verticalHeader().hide()
    view.setEditTriggers(QTableView.EditTrigger.NoEditTriggers)
    view.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
    view.setWordWrap(False)  # one line a row: a long note is cut at the column's edge, its tooltip whole
    view.horizontalHeader().setStretchLastSection(True)
    view.horizontalHeader().setResizeContentsPrecision(sample_rows)
    return view, model
