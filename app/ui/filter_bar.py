"""A filter bar any view can put above its rows: the filter language of
`engine.analysis.filter_language`, checked as you type with a one-line error, a count of
matches, and saved filters (kept in the app's settings).

The bar only parses; the view applies `bar.filter` to its own rows and reports the count
back with `set_count`.
"""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QSettings, QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QMenu, QToolButton, QVBoxLayout, QWidget

from engine.analysis.filter_language import Filter, FilterError, parse

SAVED_KEY = "filters/saved"
MAX_SAVED = 50
EXAMPLE = "kind:evicted and tier:GPU and tenant:bob"


class FilterBar(QWidget):
    """`sigFilterChanged(Filter)` fires (debounced) when the text parses to a new filter; an
    invalid text keeps the last good filter and shows its error under the field."""

    sigFilterChanged = Signal(object)

    def __init__(self, settings: QSettings | None = None, parent: QWidget | None = None,
                 placeholder: str = EXAMPLE) -> None:
        super().__init__(parent)
        self.setObjectName("filter_bar")
        self.settings = settings
        self.filter: Filter = parse("")
        self.error: FilterError | None = None
        self.edit = QLineEdit()
        self.edit.setObjectName("filter_edit")
        self.edit.setPlaceholderText(f"filter, e.g. {placeholder}")
        self.edit.setClearButtonEnabled(True)
        self.edit.setToolTip("fields: kind tier server rank tenant model request session reason block hash; "
                             "operators : = != < <= > >=; and, or, not, ( )")
        self.count = QLabel("")
        self.count.setObjectName("filter_count")
        self.saved = QToolButton()
        self.saved.setText("Saved")
        self.saved.setToolTip("save this filter, or use a saved one")
        self.saved.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.saved.setMenu(QMenu(self.saved))
        self.saved.menu().aboutToShow.connect(self._fill_menu)
        self.message = QLabel("")
        self.message.setObjectName("filter_error")
        self.message.setWordWrap(False)
        self.message.hide()
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.edit, 1)
        row.addWidget(self.count)
        row.addWidget(self.saved)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(2)
        col.addLayout(row)
        col.addWidget(self.message)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(150)
        self._debounce.timeout.connect(self._emit)
        self.edit.textChanged.connect(self._check)

    # ---- text in, filter out
    @property
    def text(self) -> str:
        return self.edit.text()

    def set_text(self, text: str) -> None:
        self.edit.setText(text)
        self._check(text)
        self._emit()

    def _check(self, text: str) -> None:
        try:
            f = parse(text)
        except FilterError as exc:
            self.error = exc
            self.message.setText(str(exc))
            self.message.show()
            self.edit.setProperty("invalid", True)
        else:
            self.error = None
            self.message.hide()
            self.edit.setProperty("invalid", False)
            if f.text != self.filter.text:
                self.filter = f
                self._debounce.start()
        self.edit.style().unpolish(self.edit)
        self.edit.style().polish(self.edit)

    def _emit(self) -> None:
        if self.error is None:
            self.sigFilterChanged.emit(self.filter)

    def set_count(self, matched: int, total: int) -> None:
        """What the view found: 'N of M' beside the field (nothing while no filter is set)."""
        self.count.setText("" if self.filter.root is None else f"{matched:,} of {total:,}")

    # ---- saved filters
    def saved_filters(self) -> list[str]:
        if self.settings is None:
            return []
        raw = self.settings.value(SAVED_KEY, "[]")
        try:
            items = json.loads(raw) if isinstance(raw, str) else list(raw or [])
        except ValueError:
            return []
        return [t for t in items if isinstance(t, str)][:MAX_SAVED]

    def save_current(self) -> bool:
        """Keep the current text among the saved filters (if it parses and is new)."""
        text = self.text.strip()
        if self.settings is None or not text or self.error is not None:
            return False
        items = [t for t in self.saved_filters() if t != text]
        self.settings.setValue(SAVED_KEY, json.dumps([text, *items][:MAX_SAVED]))
        return True

    def forget(self, text: str) -> None:
        if self.settings is not None:
            self.settings.setValue(SAVED_KEY, json.dumps([t for t in self.saved_filters() if t != text]))

    def _fill_menu(self) -> None:
        menu = self.saved.menu()
        menu.clear()
        save = menu.addAction("Save this filter")
        save.setEnabled(bool(self.text.strip()) and self.error is None and self.settings is not None)
        save.triggered.connect(self.save_current)
        items = self.saved_filters()
        if items:
            menu.addSeparator()
        for text in items:
            menu.addAction(text).triggered.connect(lambda _=False, t=text: self.set_text(t))

    def select(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows the current filter keeps (and the count shown), for small views."""
        kept = self.filter.select(rows)
        self.set_count(len(kept), len(rows))
        return kept
