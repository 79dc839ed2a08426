"""The vLLM probe: paste a prompt (or open a messages file) and watch how much of it the
attached server holds as its pool changes: cached tokens, the first missing block, why.

The prompt is tokenized with the attach's tokenizer and hashed with the server's scheme;
`engine.remote.probe` does the lookup in the live per-rank pools. Nothing here hashes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QProgressBar,
                               QPushButton, QVBoxLayout, QWidget)

from app.ui import theme
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext

CHECK_MS = 250  # at most this often while the pool changes
EDIT_MS = 300  # after the last keystroke the prompt is tokenized and hashed again


class ProbeView(PanelView):
    """Prompt in, answer out. `result` is the last `engine.remote.probe.ProbeResult` (or None)."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("probe_view")
        self.result: Any = None
        self.probe: Any = None  # engine.remote.probe.PromptProbe for the current prompt
        self.messages_file: Path | None = None
        self.error = ""

        self.prompt = QPlainTextEdit()
        self.prompt.setObjectName("probe_prompt")
        self.prompt.setPlaceholderText("Paste a prompt: it is checked against the attached server's pool")
        self.chat = QCheckBox("chat template")
        self.chat.setChecked(True)
        self.chat.setToolTip("render the text as one user message, as vLLM's chat endpoint does")
        self.salt = QLineEdit()
        self.salt.setPlaceholderText("cache_salt (none)")
        self.salt.setMaximumWidth(160)
        open_button = QPushButton("Open messages…")
        open_button.clicked.connect(self.open_dialog)
        bar = QHBoxLayout()
        bar.addWidget(self.chat)
        bar.addWidget(QLabel("salt"))
        bar.addWidget(self.salt)
        bar.addStretch(1)
        bar.addWidget(open_button)
        self.meter = QProgressBar()
        self.meter.setObjectName("probe_meter")
        self.meter.setTextVisible(True)
        self.meter.setRange(0, 1)
        self.meter.setValue(0)
        self.answer = QLabel()
        self.answer.setObjectName("probe_answer")
        self.answer.setWordWrap(True)
        self.answer.setTextFormat(Qt.TextFormat.RichText)
        self.answer.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.prompt, 1)
        layout.addLayout(bar)
        layout.addWidget(self.meter)
        layout.addWidget(self.answer)

        self._edit_timer = QTimer(self, singleShot=True, interval=EDIT_MS)
        self._edit_timer.timeout.connect(self.rebuild)
        self._check_timer = QTimer(self, singleShot=True, interval=CHECK_MS)
        self._check_timer.timeout.connect(self.check)
        self.prompt.textChanged.connect(self._on_edit)
        self.salt.textChanged.connect(lambda _t: self._edit_timer.start())
        self.chat.toggled.connect(lambda _on: self._edit_timer.start())
        self.state.sigChanged.connect(self._schedule)
        remote = ctx.remote
        if remote is not None:
            remote.sigTokenizer.connect(lambda _tok: self.rebuild())
            remote.sigAttached.connect(lambda _opts: self.rebuild())
        self._show()

    # ------------------------------------------------------------------ inputs
    def _on_edit(self) -> None:
        self.messages_file = None  # typed text replaces an opened file
        self._edit_timer.start()

    def set_prompt(self, text: str) -> None:
        """Model to view: the prompt as if typed; it is checked at once."""
        self.prompt.setPlainText(text)
        self._edit_timer.stop()
        self.rebuild()

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "A messages file (OpenAI, ShareGPT, Anthropic) or text",
                                              str(Path.home()), "Messages (*.json *.jsonl *.txt);;All files (*)")
        if path:
            self.open_file(path)

    def open_file(self, path: str | Path) -> None:
        """Probe the first conversation (or token row) of a file; its text shows in the box."""
        self.messages_file = Path(path)
        self.rebuild()
        remote = self.ctx.remote
        text = f"(from {self.messages_file.name})"
        if self.probe is not None and remote is not None and remote.tokenizer is not None:
            try:
                text = f"(from {self.messages_file.name})\n" + remote.tokenizer.decode(list(self.probe.token_ids))
            except Exception:  # noqa: BLE001 - ids of another model: the file name says enough
                pass
        self.prompt.blockSignals(True)  # shown, not typed: it must not replace the file
        self.prompt.setPlainText(text)
        self.prompt.blockSignals(False)

    # ------------------------------------------------------------------ work
    def _schedule(self) -> None:
        if self.probe is not None and not self._check_timer.isActive():
            self._check_timer.start()

    def rebuild(self) -> None:
        """Tokenize and hash the prompt again (text, salt, template or server changed)."""
        from engine.analysis.diff import load_request, request_from_text
        from engine.core.hashing import BlockHasher
        from engine.remote.probe import PromptProbe

        self.probe, self.result, self.error = None, None, ""
        remote = self.ctx.remote
        text = self.prompt.toPlainText()
        if remote is None or remote.settings is None:
            self.error = "Attach to a vLLM server first (File > Attach to vLLM…)."
        elif remote.tokenizer is None:
            self.error = "Loading the tokenizer…"
        elif not text.strip() and self.messages_file is None:
            self.error = "Paste a prompt or open a messages file."
        else:
            salt = self.salt.text().strip() or None
            try:
                if self.messages_file is not None:
                    req = load_request(str(self.messages_file), remote.tokenizer, salt)
                    ids, salt = req.token_ids, req.salt  # a token row may name its tenant
                elif self.chat.isChecked():
                    ids = request_from_text(remote.tokenizer, text, salt).token_ids
                else:
                    ids = remote.tokenizer.encode(text, add_special_tokens=False)
                self.probe = PromptProbe(tuple(int(t) for t in ids), BlockHasher(remote.settings.hash_scheme), salt,
                                         remote.settings.block_size)
            except ValueError as exc:  # InputError too: a bad file is one sentence
                self.error = str(exc)
        self.check()

    def check(self) -> None:
        """Ask the live pools again (under the attachment's lock: subscribers mutate them)."""
        remote = self.ctx.remote
        att = getattr(remote, "attachment", None)
        if self.probe is not None and att is not None:
            with att.lock:
                self.result = self.probe.check(att.pools)
        self._show()

    def _show(self) -> None:
        p = theme.palette()
        r = self.result
        if r is None:
            self.meter.setRange(0, 1)
            self.meter.setValue(0)
            self.meter.setFormat("")
            self.answer.setText(f"<span style='color:{p['text_dim']}'>{self.error}</span>")
            return
        self.meter.setRange(0, max(1, r.prompt_tokens))
        self.meter.setValue(r.cached_tokens)
        self.meter.setFormat(f"{r.cached_tokens:,} of {r.prompt_tokens:,} tokens cached")
        missing = "none: every full block is cached" if r.first_missing_block is None else f"block {r.first_missing_block}"
        where = f" · best rank: {r.source}" if r.source else ""
        self.answer.setText(f"cached <b>{r.cached_tokens:,}</b> of {r.prompt_tokens:,} prompt tokens · "
                            f"first missing: <b>{missing}</b>{where}<br>why: {r.reason}")
