"""Recently opened files: kept in the settings, newest first, shown in File > Open recent."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMenu

MAX_RECENT = 8
SETTINGS_KEY = "recent/files"


class RecentFiles:
    """The list under `recent/files` in `settings`; at most `MAX_RECENT`, no duplicates."""

    def __init__(self, settings: QSettings) -> None:
        self.settings = settings

    def files(self) -> list[str]:
        value = self.settings.value(SETTINGS_KEY, [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def add(self, path: Path) -> None:
        text = str(path.resolve())
        files = [text] + [f for f in self.files() if f != text]
        self.settings.setValue(SETTINGS_KEY, files[:MAX_RECENT])

    def last_dir(self) -> str:
        """Where a file dialog starts: beside the newest file, else the home folder."""
        files = self.files()
        return str(Path(files[0]).parent) if files else str(Path.home())

    def fill_menu(self, menu: QMenu, open_file: Callable[[str], Any]) -> None:
        menu.clear()
        files = self.files()
        for f in files:
            act = menu.addAction(Path(f).name)
            act.setToolTip(f)
            act.triggered.connect(lambda _checked=False, f=f: open_file(f))
        if not files:
            menu.addAction("No recent files").setEnabled(False)
