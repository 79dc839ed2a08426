"""File > Attach to vLLM...: the endpoints, ranks, hash scheme and tokenizer of a server.

The fields mirror vLLM's `--kv-events-config` (endpoint, replay_endpoint, topic) and its
`--data-parallel-size`: one endpoint, and its ranks. The last settings used are remembered
in QSettings. A bad field is one sentence under the form and the dialog stays open;
`engine.remote.AttachOptions` checks the endpoints, `app.runtime.remote` does the work.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from app.runtime.remote import MAX_BLOCK_SIZE, AttachSettings
from engine.core.hashing import VLLM_HASHES
from engine.remote.attachment import MAX_DATA_PARALLEL, AttachOptions

SERVER_HINT = ("Start vLLM with <code>--kv-events-config '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
               "\"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", \"topic\": \"kv-events\"}'</code>"
               " and attach to its host here.")


class AttachDialog(QDialog):
    """Asks for `AttachSettings`; `options()` holds the validated result after `accept`."""

    def __init__(self, initial: AttachSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Attach to vLLM")
        self.setObjectName("attach_dialog")
        self._result: AttachSettings | None = None
        self._initial = s = initial or AttachSettings()
        o = s.options

        self.endpoint = QLineEdit(o.endpoints[0])
        self.endpoint.setPlaceholderText("tcp://HOST:5557")
        self.replay = QLineEdit(o.replay_endpoints[0] if o.replay_endpoints else "")
        self.replay.setPlaceholderText("tcp://HOST:5558 (empty: no replay, late batches are missed)")
        self.topic = QLineEdit(o.topic)
        self.topic.setPlaceholderText("empty = every topic")
        self.ranks = QSpinBox()
        self.ranks.setRange(1, MAX_DATA_PARALLEL)
        self.ranks.setValue(o.data_parallel_size)
        self.ranks.setToolTip("vLLM's --data-parallel-size: rank r publishes on both ports plus r "
                              "(an ipc:// path gets _dp<r>)")
        self.bind = QCheckBox("Bind (the server was given a concrete host, so it connects to us)")
        self.bind.setChecked(o.bind)
        self.hash_scheme = QComboBox()
        self.hash_scheme.addItems(list(VLLM_HASHES))
        self.hash_scheme.setCurrentText(s.hash_scheme)
        self.hash_scheme.setToolTip("vLLM's --prefix-caching-hash-algo: the probe hashes prompts the same way")
        self.block_size = QSpinBox()
        self.block_size.setRange(1, MAX_BLOCK_SIZE)
        self.block_size.setValue(s.block_size)
        self.tokenizer = QLineEdit(s.tokenizer)
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

    def entered(self) -> AttachSettings:
        """The settings as typed (stripped); ValueError with one sentence when they cannot work.
        What the form does not show (the refill timeout) stays as it was."""
        replay = self.replay.text().strip()
        options = AttachOptions((self.endpoint.text().strip(),), (replay,) if replay else (), self.topic.text().strip(),
                                self.ranks.value(), self.bind.isChecked(), self._initial.options.refill_timeout)
        return AttachSettings(options, self.hash_scheme.currentText(), self.tokenizer.text().strip(),
                              self.block_size.value())

    def show_error(self, text: str) -> None:
        """`text` under the form as a sentence (the engine's messages start in lower case)."""
        text = text.strip()
        if text:
            text = text[0].upper() + text[1:]
            text += "" if text.endswith((".", "?", "!")) else "."
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

    def options(self) -> AttachSettings | None:
        return self._result
