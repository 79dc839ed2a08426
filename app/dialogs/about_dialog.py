"""Help > About: the version, the model, and where Cachescope keeps its files.

A user who wonders where 500 MB of disk went, or who wants a clean first start again,
finds the answer here: the data folder (session database), the settings file and the
cache folder (converted models), each with a button to open it in the file manager, and
the cache with a button to clear it. Clearing asks first and is refused while the model
worker is busy, since a conversion may be writing there.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QGridLayout, QHBoxLayout, QLabel, QMessageBox, QPushButton,
                               QVBoxLayout, QWidget)

if TYPE_CHECKING:
    from app.runtime.context import AppContext


def folder_size(path: Path) -> int:
    """Bytes in the files under `path` (0 if it does not exist); symlinks are not followed."""
    if not path.exists():
        return 0
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file() and not item.is_symlink():
                total += item.stat().st_size
        except OSError:
            continue  # a file removed while we count
    return total


def human_size(num_bytes: int) -> str:
    size = float(num_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def describe_install(ctx: AppContext) -> dict[str, Any]:
    """Facts the dialog shows, as plain values (also what the tests check)."""
    from engine.model.loader import DEFAULT_MODEL_NAME, cache_dir, resolve_model
    from engine.store.database import default_db_path

    from app import version

    loaded = getattr(ctx.runner, "loaded", None)
    try:
        model_file = resolve_model(ctx.model_name).location
    except Exception as exc:  # noqa: BLE001 - a missing model is shown, not raised, here
        model_file = f"not found ({exc})"
    store_path = getattr(ctx.store, "path", None)
    db_path = Path(store_path) if store_path else default_db_path()
    settings = ctx.settings.fileName()
    return {
        "version": version(),
        "frozen": bool(getattr(sys, "frozen", False)),
        "model": loaded.name if loaded is not None else (ctx.model_name or DEFAULT_MODEL_NAME),
        "model_loaded": loaded is not None,
        "model_file": model_file,
        "data_dir": db_path.parent,
        "database": db_path,
        "settings_file": settings,
        "cache_dir": cache_dir(),
    }


class AboutDialog(QDialog):
    """The About box: version, model, data/settings/cache locations with open and clear buttons."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.setObjectName("about_dialog")
        self.setWindowTitle("About Cachescope")
        self.info = describe_install(ctx)
        info = self.info
        layout = QVBoxLayout(self)
        title = QLabel(f"<h2>Cachescope {info['version']}</h2>"
                       "<p>A desktop inspector for the caches of LLM inference: the paged prefix cache, KV "
                       "memory, semantic caches and hosted prompt-caching bills, live from a real local model."
                       "</p><p>Apache-2.0</p>")
        title.setWordWrap(True)
        layout.addWidget(title)

        grid = QGridLayout()
        grid.setColumnStretch(1, 1)
        state = "loaded" if info["model_loaded"] else "not loaded yet"
        rows = [("Build", "desktop bundle" if info["frozen"] else "running from Python")]
        rows.append(("Model", f"{info['model']} ({state})"))
        rows.append(("Model file", str(info["model_file"])))
        for i, (name, value) in enumerate(rows):
            grid.addWidget(QLabel(f"<b>{name}</b>"), i, 0)
            grid.addWidget(self._path_label(value), i, 1, 1, 2)
        r = len(rows)
        self.data_label = self._path_label(f"{info['data_dir']}  (sessions: {info['database'].name})")
        self.cache_label = self._path_label("")
        grid.addWidget(QLabel("<b>Data</b>"), r, 0)
        grid.addWidget(self.data_label, r, 1)
        data_buttons = QHBoxLayout()
        data_buttons.addWidget(self._button("Open", "open_data", lambda: self.open_folder(info["data_dir"])))
        data_buttons.addStretch(1)
        grid.addLayout(data_buttons, r, 2)
        grid.addWidget(QLabel("<b>Settings</b>"), r + 1, 0)
        grid.addWidget(self._path_label(str(info["settings_file"])), r + 1, 1, 1, 2)
        grid.addWidget(QLabel("<b>Cache</b>"), r + 2, 0)
        grid.addWidget(self.cache_label, r + 2, 1)
        cache_buttons = QHBoxLayout()
        cache_buttons.addWidget(self._button("Open", "open_cache", lambda: self.open_folder(info["cache_dir"])))
        self.clear_button = self._button("Clear…", "clear_cache", self.clear_cache)
        cache_buttons.addWidget(self.clear_button)
        grid.addLayout(cache_buttons, r + 2, 2)
        layout.addLayout(grid)
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        layout.addWidget(self.status_label)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        close.rejected.connect(self.reject)
        layout.addWidget(close)
        self.refresh_cache_size()
        self.setMinimumWidth(620)

    def _path_label(self, text: str) -> QLabel:
        label = QLabel(text)
        label.setWordWrap(True)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        return label

    def _button(self, text: str, name: str, slot: Any) -> QPushButton:
        button = QPushButton(text, self)
        button.setObjectName(name)
        button.setAutoDefault(False)  # Enter closes the dialog; it never opens or clears a folder
        button.clicked.connect(lambda _checked=False: slot())
        return button

    def refresh_cache_size(self) -> None:
        cache = Path(self.info["cache_dir"])
        size = folder_size(cache)
        self.cache_label.setText(f"{cache}  ({human_size(size)} of converted models)" if size
                                 else f"{cache}  (empty)")
        self.clear_button.setEnabled(size > 0)

    def open_folder(self, path: Path) -> bool:
        """Show `path` in the file manager (creating it, so there is something to open)."""
        path = Path(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.status_label.setText(f"Cannot create {path}: {exc.strerror or exc}.")
            return False
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
            self.status_label.setText(f"No file manager could open {path}; the path can be copied from above.")
            return False
        return True

    def clear_cache(self, confirm: bool = True) -> bool:
        """Delete the converted models after asking; the next model load converts again."""
        cache = Path(self.info["cache_dir"])
        if self.ctx.worker.is_busy:
            self.status_label.setText("The model worker is busy (it may be converting into the cache); "
                                      "try again when it is idle.")
            return False
        size = folder_size(cache)
        if confirm:
            answer = QMessageBox.question(
                self, "Clear the cache",
                f"Delete the converted models in {cache} ({human_size(size)})?\n\nThe next start converts "
                "the bundled model again (about 20 s). Sessions and settings are not touched.",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel)
            if answer != QMessageBox.StandardButton.Yes:
                return False
        failed = []
        for child in list(cache.iterdir()) if cache.is_dir() else []:
            try:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            except OSError as exc:
                failed.append(f"{child.name} ({exc.strerror or exc})")
        self.refresh_cache_size()
        if failed:
            self.status_label.setText("Could not delete " + ", ".join(failed) + ".")
            return False
        self.status_label.setText(f"Cleared {human_size(size)} from the cache.")
        return True
