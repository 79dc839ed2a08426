"""The Help > Keyboard shortcuts dialog: every action of a window that has a shortcut."""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDialog, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from app.ui.timeline_keys import TIMELINE_KEYS


def shortcut_rows(window: QWidget) -> list[tuple[str, str]]:
    """(action, keys) of every action under `window` with a shortcut, sorted, each once,
    then the keys every timeline takes when it has the focus (`TIMELINE_KEYS`)."""
    rows = []
    for act in window.findChildren(QAction):
        if not act.shortcut().isEmpty():
            rows.append((act.text().replace("&", ""), act.shortcut().toString(QKeySequence.SequenceFormat.NativeText)))
    return sorted(set(rows)) + list(TIMELINE_KEYS)


class ShortcutsDialog(QDialog):
    """A two-column table of `rows` (action, keys)."""

    def __init__(self, rows: list[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.table = QTableWidget(len(rows), 2, self)
        self.table.setHorizontalHeaderLabels(["Action", "Shortcut"])
        self.table.verticalHeader().hide()
        for i, (name, keys) in enumerate(rows):
            self.table.setItem(i, 0, QTableWidgetItem(name))
            self.table.setItem(i, 1, QTableWidgetItem(keys))
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        self.resize(420, 480)
