"""File > Attach to vLLM...: the endpoints, ranks, hash scheme and tokenizer of a server.

The fields mirror vLLM's `--kv-events-config` (endpoint, replay_endpoint, topic) and its
`--data-parallel-size`; the last options used are remembered in QSettings. A bad field
is one sentence under the form and the dialog stays open; `app.runtime.remote` does the work.
"""

from __future__ import annotations


from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from app.runtime.remote import HASH_SCHEMES, MAX_RANKS, AttachOptions

SERVER_HINT = ("Start vLLM with <code>--kv-events-config '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
               "\"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", \"topic\": \"kv-events\"}'</code>"
               " and attach to its host here.")


class AttachDialog(QDialog):
    """Asks for `AttachOptions`; `options()` holds the validated result after `accept`."""

    def __init__(self, initial: AttachOptions | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Attach to vLLM")
        self.setObjectName("attach_dialog")
        self._result: AttachOptions | None = None
        o = initial or AttachOptions()

        self.endpoint = QLineEdit(o.endpoint)
        self.endpoint.setPlaceholderText("tcp://HOST:5557")
        self.replay = QLineEdit(o.replay_endpoint)
        self.replay.setPlaceholderText("tcp://HOST:5558 (empty: no replay, late batches are missed)")
        self.topic = QLineEdit(o.topic)
        self.topic.setPlaceholderText("empty = every topic")
        self.ranks = QSpinBox()
        self.ranks.setRange(1, MAX_RANKS)
        self.ranks.setValue(o.data_parallel_size)
        self.ranks.setToolTip("vLLM's --data-parallel-size: rank r publishes on both ports plus r")
        self.bind = QCheckBox("Bind (the server was given a concrete host, so it connects to us)")
        self.bind.setChecked(o.bind)
        self.hash_scheme = QComboBox()
        self.hash_scheme.addItems(list(HASH_SCHEMES))
        self.hash_scheme.setCurrentText(o.hash_scheme)
        self.hash_scheme.setToolTip("vLLM's --prefix-caching-hash-algo: the probe hashes prompts the same way")
        self.block_size = QSpinBox()
        self.block_size.setRange(1, 4096)
        self.block_size.setValue(o.block_size)
        self.tokenizer = QLineEdit(o.tokenizer)
        self.tokenizer.setPlaceholderText("the default model (SmolLM2-135M)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        tok_row = QHBoxLayout()
        tok_row.setContentsMargins(0, 0, 0, 0)
        tok_row.addWidget(self.tokenizer, 1)
        tok_row.addWidget(browse)

        form = QFormLayout()
        form.addRow("Endpoint", self.endpoint)
        form.addRow("Replay endpoint", self.replay)
        form.addRow("Topic", self.topic)
        form.addRow("Data-parallel ranks", self.ranks)
        form.addRow("", self.bind)
        form.addRow("Hash scheme", self.hash_scheme)
        form.addRow("Block size", self.block_size)
        form.addRow("Tokenizer", tok_row)

        hint = QLabel(SERVER_HINT)
        hint.setWordWrap(True)
        hint.setTextFormat(Qt.TextFormat.RichText)
        hint.setObjectName("attach_hint")
        self.error = QLabel()
        self.error.setObjectName("attach_error")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #e05561;")
        self.error.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Attach")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.buttons = buttons

        layout = QVBoxLayout(self)
        layout.addWidget(hint)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.resize(560, self.sizeHint().height())

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A Hugging Face model or tokenizer folder", self.tokenizer.text())
        if folder:
            self.tokenizer.setText(folder)

    def entered(self) -> AttachOptions:
        """The options as typed, not yet validated."""
        return AttachOptions(endpoint=self.endpoint.text(), replay_endpoint=self.replay.text(),
                             topic=self.topic.text(), data_parallel_size=self.ranks.value(),
                             bind=self.bind.isChecked(), hash_scheme=self.hash_scheme.currentText(),
                             tokenizer=self.tokenizer.text(), block_size=self.block_size.value())

    def show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.setVisible(bool(text))

    def accept(self) -> None:  # noqa: D102 - Qt override: validate before closing
        try:
            self._result = self.entered().validated()
        except ValueError as exc:
            self.show_error(str(exc))
            return
        self.show_error("")
        super().accept()

    def options(self) -> AttachOptions | None:
        return self._result
