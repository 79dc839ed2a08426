"""The Diff panel: two requests side by side as token strips, the divergence marked, the cause named.

Tokenising runs on the context's worker; the comparison itself is `engine.analysis.diff`.
A demo can fill both sides (`show_messages`); that content belongs to the demo and goes
when another subject opens, while requests the user typed stay.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QFormLayout, QGridLayout, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QSpinBox, QVBoxLayout, QWidget,
)

from app.ui.token_strip import StripData, TokenStrip
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

INTRO = "Type two requests to compare their token ids."


def parse_side(text: str) -> list[dict[str, str]]:
    """A box holds raw text (one user message) or an OpenAI-style JSON message list."""
    stripped = text.strip()
    if stripped[:1] in "[{":
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            data = data.get("messages")
        if isinstance(data, list) and data and all(isinstance(m, dict) and "role" in m for m in data):
            return [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in data]
    return [{"role": "user", "content": text}]


def compute_diff(tokenizer: Any, text_a: str, text_b: str, salt_a: str | None, salt_b: str | None,
                 block_size: int) -> Any:
    from engine.analysis.diff import diff_requests, request_from_messages

    a = request_from_messages(tokenizer, parse_side(text_a), salt_a or None, "A")
    b = request_from_messages(tokenizer, parse_side(text_b), salt_b or None, "B")
    return a, b, diff_requests(tokenizer, a, b, block_size)


class DiffView(PanelView):
    """Edit A and B (or call `set_texts`); `sigDiffDone(TokenDiff)` fires after each comparison."""

    sigDiffDone = Signal(object)

    def __init__(self, ctx: AppContext, tokenizer: Any = None, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.tokenizer = tokenizer
        self.source: str | None = None  # the demo that filled A and B, None for the user's own
        self.result: Any = None
        self._pending = False
        self._busy = False

        self.edit_a, self.edit_b = QPlainTextEdit(), QPlainTextEdit()
        for edit, name in ((self.edit_a, "A"), (self.edit_b, "B")):
            edit.setPlaceholderText(f"Request {name}: raw text (one user message) or a JSON message list")
            edit.setMaximumHeight(110)
            edit.textChanged.connect(self.schedule)
        self.salt_a, self.salt_b = QLineEdit(), QLineEdit()
        for w in (self.salt_a, self.salt_b):
            w.setPlaceholderText("tenant (salt)")
            w.textChanged.connect(self.schedule)
        self.block_size = QSpinBox()
        self.block_size.setRange(1, 4096)
        self.block_size.setValue(16)
        self.block_size.valueChanged.connect(self.schedule)

        self.source_label = QLabel("")
        self.source_label.setObjectName("muted")
        self.source_label.setWordWrap(True)
        self.source_label.hide()
        self.cause_label = QLabel(INTRO)
        self.cause_label.setObjectName("diffCause")
        self.cause_label.setWordWrap(True)
        self.summary_label = QLabel("")
        self.summary_label.setWordWrap(True)
        self.strip_a, self.strip_b = TokenStrip(), TokenStrip()
        self.window_a, self.window_b = QLabel(""), QLabel("")
        for w in (self.window_a, self.window_b):
            w.setWordWrap(True)
            w.setStyleSheet("font-family: monospace;")

        grid = QGridLayout()
        grid.addWidget(QLabel("A"), 0, 0)
        grid.addWidget(self.edit_a, 0, 1)
        grid.addWidget(self.salt_a, 0, 2)
        grid.addWidget(QLabel("B"), 1, 0)
        grid.addWidget(self.edit_b, 1, 1)
        grid.addWidget(self.salt_b, 1, 2)
        grid.setColumnStretch(1, 1)
        options = QFormLayout()
        options.addRow("block size", self.block_size)
        top = QHBoxLayout()
        top.addLayout(grid, 1)
        top.addLayout(options)

        layout = QVBoxLayout(self)
        layout.addWidget(self.source_label)
        layout.addLayout(top)
        layout.addWidget(self.cause_label)
        layout.addWidget(self.summary_label)
        layout.addWidget(QLabel("A tokens (green: shared prefix; orange: from the divergence on)"))
        layout.addWidget(self.strip_a)
        layout.addWidget(self.window_a)
        layout.addWidget(QLabel("B tokens"))
        layout.addWidget(self.strip_b)
        layout.addWidget(self.window_b)
        layout.addStretch(1)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(250)  # one comparison per burst of typing
        self._timer.timeout.connect(self.compare)

    # ---------------------------------------------------------------- model -> view
    def show_messages(self, a: list[dict[str, str]], b: list[dict[str, str]], source: str) -> None:
        """Compare two message lists a demo (`source`, its title) is about."""
        self.set_texts(json.dumps(a, ensure_ascii=False), json.dumps(b, ensure_ascii=False))
        self.source = source
        self.source_label.setText(f"From the demo \u201c{source}\u201d; edit either side to compare your own.")
        self.source_label.show()

    def show_subject(self, subject: Subject) -> None:
        if self.source is not None and not (subject.kind == "demo" and subject.title == self.source):
            self.clear()

    def clear(self) -> None:
        """Empty both sides and the result."""
        self.source = None
        self.source_label.hide()
        self.set_texts("", "")
        self.result = None
        self.cause_label.setText(INTRO)
        self.summary_label.setText("")
        for strip in (self.strip_a, self.strip_b):
            strip.clear()
        for w in (self.window_a, self.window_b):
            w.setText("")

    def set_texts(self, a: str, b: str, salt_a: str = "", salt_b: str = "") -> None:
        self.source = None
        self.source_label.hide()
        for w, v in ((self.edit_a, a), (self.edit_b, b), (self.salt_a, salt_a), (self.salt_b, salt_b)):
            w.blockSignals(True)
            (w.setPlainText if isinstance(w, QPlainTextEdit) else w.setText)(v)
            w.blockSignals(False)
        self.compare()

    # ---------------------------------------------------------------- view -> model
    def schedule(self, *_: Any) -> None:
        self._timer.start()

    def compare(self) -> None:
        self._timer.stop()
        if not self.edit_a.toPlainText() or not self.edit_b.toPlainText():
            return
        if self._busy:
            self._pending = True  # coalesce: compare again once the running job is back
            return
        self._busy = True
        args = (self.edit_a.toPlainText(), self.edit_b.toPlainText(), self.salt_a.text().strip(),
                self.salt_b.text().strip(), self.block_size.value())
        self.ctx.worker.submit(self._job, *args, on_done=self._done, on_error=self._failed)

    def _job(self, *args: Any) -> Any:  # runs on the worker thread
        if self.tokenizer is None:
            from engine.model.loader import load_tokenizer

            self.tokenizer = load_tokenizer(self.ctx.model_name)
        return compute_diff(self.tokenizer, *args)

    def _failed(self, exc: BaseException) -> None:
        self._busy = False
        self.ctx.show_error(str(exc))
        if self._pending:
            self._pending = False
            self.compare()

    def _done(self, out: Any) -> None:
        self._busy = False
        if self._pending:
            self._pending = False
            self.compare()
            return
        a, b, result = out
        self.result = result
        self._show(a, b, result)
        self.sigDiffDone.emit(result)

    def _show(self, a: Any, b: Any, r: Any) -> None:
        d = r.first_divergent_token
        self.cause_label.setText(f"<b>cause: {r.cause.replace('_', ' ')}</b> — {r.explanation}")
        if d is None:
            self.summary_label.setText(f"no divergence in the token ids; {r.matching_blocks} whole blocks of "
                                       f"{r.block_size} match")
        else:
            self.summary_label.setText(
                f"first divergent token: <b>{d}</b> of {len(a.token_ids)} (A) / {len(b.token_ids)} (B); "
                f"<b>{r.matching_blocks}</b> whole blocks of {r.block_size} match, {r.reusable_blocks} reusable by B")
        for strip, side, req in ((self.strip_a, r.a, a), (self.strip_b, r.b, b)):
            strip.set_data(self._strip(req.token_ids, side, r))
        for label, side in ((self.window_a, r.a), (self.window_b, r.b)):
            div = side["divergent"]
            at = f"token {div['id']} {div['text']!r}" if div else "end of request"
            label.setText(f"at {d if d is not None else '-'}: {at} · …{side['text']!r}…")

    def _strip(self, ids: tuple[int, ...], side: dict[str, Any], r: Any) -> StripData:
        shared = r.matching_tokens if r.cause != "tenant_salt" else 0
        states = ["cached" if i < shared else "computed" for i in range(len(ids))]
        start = side["window_start"]
        texts = [""] * len(ids)
        for i, t in enumerate(side["token_texts"]):
            texts[start + i] = t
        return StripData(list(ids), texts, states, 0, r.block_size,
                         miss_position=r.matching_blocks * r.block_size if r.first_divergent_token is not None else None,
                         divergence_position=r.first_divergent_token, miss_text=r.cause)
