"""File > Attach to vLLM...: one server, a fleet of servers, or a bound address for llm-d's
centralized mode; their ranks, hash scheme and tokenizer.

The fields mirror vLLM's and SGLang's `--kv-events-config` (endpoint, replay_endpoint,
topic) and `--data-parallel-size`. A fleet is a list (or a servers file) of one
`name endpoint [replay]` per line; in centralized mode every pod's PUB socket connects to
the address bound here and its topic `kv@<pod>@<model>` names it. The last settings used
are remembered in QSettings. A bad field is one sentence under the form and the dialog
stays open; `engine.remote.AttachOptions` and `engine.remote.fleet_view.parse_servers`
check the endpoints, `app.runtime.remote` does the work.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from pathlib import Path

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QLabel, QLineEdit, QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from app.runtime.remote import MAX_BLOCK_SIZE, AttachSettings
from engine.core.errors import InputError
from engine.core.hashing import SERVER_HASHES
from engine.remote.attachment import MAX_DATA_PARALLEL, AttachOptions
from engine.remote.fleet_view import ServerEntry, format_servers, parse_servers

ONE, FLEET, CENTRAL = "One server", "A fleet of servers", "Centralized (llm-d: pods connect here)"
MODES = (ONE, FLEET, CENTRAL)
MAX_SERVERS_FILE = 1 << 20

SERVER_HINT = ("Start vLLM with <code>--kv-events-config '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
               "\"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", \"topic\": \"kv-events\"}'</code>"
               " (SGLang takes the same flag) and attach to its host here; a fleet is one server a line.")


class AttachDialog(QDialog):
    """Asks for `AttachSettings`; `options()` holds the validated result after `accept`."""

    def __init__(self, initial: AttachSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Attach to a server or a fleet")
        self.setObjectName("attach_dialog")
        self._result: AttachSettings | None = None
        self._initial = s = initial or AttachSettings()
        o = s.options

        self.mode = QComboBox()
        self.mode.setObjectName("attach_mode")
        self.mode.addItems(list(MODES))
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
        self.servers = QPlainTextEdit()
        self.servers.setObjectName("attach_servers")
        self.servers.setPlaceholderText("one server a line: name endpoint [replay]\n"
                                        "pod-a tcp://10.0.0.11:5557 tcp://10.0.0.11:5558\n"
                                        "pod-b tcp://10.0.0.12:5557 tcp://10.0.0.12:5558")
        self.servers.setFixedHeight(96)
        servers_file = QPushButton("Open servers file…")
        servers_file.clicked.connect(self._open_servers_file)
        self.servers_box = QWidget()
        servers_box = QVBoxLayout(self.servers_box)
        servers_box.setContentsMargins(0, 0, 0, 0)
        servers_box.addWidget(self.servers)
        servers_box.addWidget(servers_file, 0, Qt.AlignmentFlag.AlignRight)
        self.bind_address = QLineEdit(o.endpoints[0] if o.bind else "tcp://*:5557")
        self.bind_address.setObjectName("attach_bind_address")
        self.bind_address.setPlaceholderText("tcp://*:5557")
        self.bind_address.setToolTip("bound here; every pod's PUB socket connects to it with the topic "
                                     "kv@<pod>@<model>, which names the server")
        if len(o.endpoints) > 1:
            self.servers.setPlainText(format_servers(
                ServerEntry(o.servers[i] if i < len(o.servers) and o.servers[i] != e else "", e,
                            (o.replay_endpoints[i] if i < len(o.replay_endpoints) else None) or None)
                for i, e in enumerate(o.endpoints)))
        self.hash_scheme = QComboBox()
        self.hash_scheme.addItems(list(SERVER_HASHES))
        self.hash_scheme.setCurrentText(s.hash_scheme)
        self.hash_scheme.setToolTip("vLLM's --prefix-caching-hash-algo, or SGLang's page hash: "
                                    "the probes hash prompts the same way")
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

        self.record = QCheckBox("Record the frames into the session database, to open again later")
        self.record.setObjectName("attach_record")
        self.record.setChecked(s.record)
        self.record.setToolTip("what the servers send, kept as a session of the open database until you "
                               "detach (as cachescope attach --record keeps it); File > Open that database "
                               "to see the attach again, offline")

        form = QFormLayout()
        form.addRow("Attach to", self.mode)
        form.addRow("Endpoint", self.endpoint)
        form.addRow("Replay endpoint", self.replay)
        form.addRow("Servers", self.servers_box)
        form.addRow("Bind address", self.bind_address)
        form.addRow("Topic", self.topic)
        form.addRow("Data-parallel ranks", self.ranks)
        form.addRow("", self.bind)
        self.form = form
        form.addRow("Hash scheme", self.hash_scheme)
        form.addRow("Block size", self.block_size)
        form.addRow("Tokenizer", tok_row)
        form.addRow("", self.record)

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
        self.mode.currentTextChanged.connect(self._show_mode)
        self.mode.setCurrentText(CENTRAL if o.bind and len(o.endpoints) == 1 and "*" in o.endpoints[0]
                                 else FLEET if len(o.endpoints) > 1 else ONE)
        self._show_mode(self.mode.currentText())
        self.resize(600, self.sizeHint().height())

    def _show_mode(self, mode: str) -> None:
        """Only the fields of the chosen way of attaching."""
        for widget, modes in ((self.endpoint, (ONE,)), (self.replay, (ONE,)), (self.servers_box, (FLEET,)),
                              (self.bind_address, (CENTRAL,)), (self.bind, (ONE,))):
            self.form.setRowVisible(widget, mode in modes)
        self.adjustSize()

    def _open_servers_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "A servers file (name endpoint [replay] per line)",
                                              str(Path.home()), "Servers (*.txt *.list *.conf);;All files (*)")
        if path:
            self.load_servers_file(path)

    def load_servers_file(self, path: str | Path) -> bool:
        """Put a servers file's lines in the list (checked on Attach); False, with the
        reason under the form, when it cannot be read."""
        path = Path(path)
        try:
            if path.stat().st_size > MAX_SERVERS_FILE:
                raise InputError(f"{path.name} is over {MAX_SERVERS_FILE >> 20} MiB: not a servers file")
            text = path.read_text(encoding="utf-8")
            parse_servers(text, path.name)
        except UnicodeDecodeError:
            self.show_error(f"{path.name} is not UTF-8 text")
            return False
        except OSError as exc:
            self.show_error(f"{path.name} cannot be read ({exc.strerror or exc})")
            return False
        except InputError as exc:
            self.show_error(str(exc))
            return False
        self.mode.setCurrentText(FLEET)
        self.servers.setPlainText(text)
        self.show_error("")
        return True

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A Hugging Face model or tokenizer folder", self.tokenizer.text())
        if folder:
            self.tokenizer.setText(folder)

    def entered(self) -> AttachSettings:
        """The settings as typed (stripped); ValueError with one sentence when they cannot work.
        What the form does not show (the refill timeout) stays as it was."""
        mode = self.mode.currentText()
        timeout = self._initial.options.refill_timeout
        topic = self.topic.text().strip()
        if mode == FLEET:
            entries = parse_servers(self.servers.toPlainText())
            if not entries:
                raise InputError("list at least one server: name endpoint [replay], one a line")
            replays = [e.replay_endpoint or "" for e in entries]  # "": this server has no replay socket
            while replays and not replays[-1]:
                replays.pop()
            options = AttachOptions(tuple(e.endpoint for e in entries), tuple(replays), topic, self.ranks.value(),
                                    False, timeout, servers=tuple(e.name or e.endpoint for e in entries))
        elif mode == CENTRAL:
            options = AttachOptions((self.bind_address.text().strip(),), (), topic, self.ranks.value(), True, timeout)
        else:
            replay = self.replay.text().strip()
            options = AttachOptions((self.endpoint.text().strip(),), (replay,) if replay else (), topic,
                                    self.ranks.value(), self.bind.isChecked(), timeout)
        return AttachSettings(options, self.hash_scheme.currentText(), self.tokenizer.text().strip(),
                              self.block_size.value(), self.record.isChecked())

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
