"""The router's view: a probe prompt (typed, or a file) scored against every server the way a
KV-aware router scores it, live as the pools change.

Per server: the matched prefix blocks, cached tokens, llm-d's longest-prefix score (each
block weighted by the best tier holding it; weights configurable) and Dynamo's overlap
blocks, and the server the router picks; under it, where the prompt's blocks live. The
prompt is hashed with the servers' scheme (`engine.remote.probe.PromptProbe`); the
scoring is `engine.remote.fleet.Fleet.route`. Nothing here hashes or scores.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QFont
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QPlainTextEdit, QPushButton, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from app.runtime.remote import view_tokenizer
from app.ui import theme
from app.views.fleet.palette import server_color, server_tint
from app.views.fleet.tables import LocationGrid
from engine.remote.fleet import TierWeights
from engine.remote.fleet_view import FleetSnapshot, locate, route

if TYPE_CHECKING:
    from app.runtime.context import AppContext

EDIT_MS = 300  # after the last keystroke the prompt is tokenized and hashed again
ROUTER_COLUMNS = ("Server", "Matched blocks", "Cached tokens", "llm-d score", "Dynamo overlap", "Best tier per block")


class RouterPanel(QWidget):
    """Prompt in, per-server scores out. `view` is the last `engine.remote.fleet.RouterView`
    (None without a prompt or a fleet); `keys` the prompt's block hashes."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fleet_router")
        self.ctx = ctx
        self.view: Any = None
        self.keys: list[bytes] = []
        self.places: list[Any] = []
        self.token_ids: tuple[int, ...] | None = None  # set by a token file or `set_token_ids`
        self.prompt_file: Path | None = None
        self.error = ""
        self.weights = TierWeights()

        self.prompt = QPlainTextEdit()
        self.prompt.setObjectName("router_prompt")
        self.prompt.setPlaceholderText("A probe prompt: where would a KV-aware router send it?")
        self.prompt.setMaximumHeight(120)
        self.chat = QCheckBox("chat template")
        self.chat.setChecked(True)
        self.chat.setToolTip("render the text as one user message, as the servers' chat endpoints do")
        self.salt = QLineEdit()
        self.salt.setPlaceholderText("cache_salt (none)")
        self.salt.setMaximumWidth(150)
        self.weights_edit = QLineEdit(self._weights_text(self.weights))
        self.weights_edit.setObjectName("router_weights")
        self.weights_edit.setToolTip("llm-d's tier weights: TIER=WEIGHT, comma-separated; 'other' weighs any "
                                     "tier not listed (storage, a remote pool)")
        self.weights_edit.setMinimumWidth(220)
        self.weights_edit.setMaximumWidth(320)
        open_button = QPushButton("Open prompt…")
        open_button.setToolTip("a text or messages file, or a token trace (one JSON object with \"tokens\" a line)")
        open_button.clicked.connect(self.open_dialog)
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(self.chat)
        bar.addWidget(QLabel("salt"))
        bar.addWidget(self.salt)
        bar.addWidget(QLabel("tier weights"))
        bar.addWidget(self.weights_edit)
        bar.addStretch(1)
        bar.addWidget(open_button)

        self.best = QLabel()
        self.best.setObjectName("router_best")
        self.best.setTextFormat(Qt.TextFormat.RichText)
        self.best.setWordWrap(True)
        self.table = QTableWidget(0, len(ROUTER_COLUMNS))
        self.table.setObjectName("router_scores")
        self.table.setHorizontalHeaderLabels(list(ROUTER_COLUMNS))
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.location = LocationGrid()
        self.location.setObjectName("router_location")

        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(self.prompt)
        top_layout.addLayout(bar)
        top_layout.addWidget(self.best)
        top_layout.addWidget(self.table, 1)
        where = QWidget()
        where_layout = QVBoxLayout(where)
        where_layout.setContentsMargins(0, 0, 0, 0)
        self.where_label = QLabel("Where the prompt's blocks live")
        where_layout.addWidget(self.where_label)
        where_layout.addWidget(self.location, 1)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(top)
        split.addWidget(where)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        split.setSizes([1, 1])  # half each: the scores, then where the blocks live
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)

        self._edit_timer = QTimer(self, singleShot=True, interval=EDIT_MS)
        self._edit_timer.timeout.connect(self.rebuild)
        self.prompt.textChanged.connect(self._on_edit)
        self.salt.textChanged.connect(lambda _t: self._edit_timer.start())
        self.chat.toggled.connect(lambda _on: self._edit_timer.start())
        self.weights_edit.editingFinished.connect(self._on_weights)
        remote = ctx.remote
        remote.sigTokenizer.connect(self._on_tokenizer)
        self._show(FleetSnapshot())

    def _on_tokenizer(self, _tok: Any) -> None:
        self.rebuild()

    @staticmethod
    def _weights_text(w: TierWeights) -> str:
        return ",".join(f"{t}={v:g}" for t, v in w.to_dict().items())

    # ------------------------------------------------------------------ inputs
    def _on_edit(self) -> None:
        self.prompt_file, self.token_ids = None, None  # typed text replaces an opened file
        self._edit_timer.start()

    def set_prompt(self, text: str) -> None:
        """Model to view: the prompt as if typed; it is scored at once."""
        self.prompt.setPlainText(text)
        self._edit_timer.stop()
        self.rebuild()

    def set_token_ids(self, token_ids: Any, salt: str | None = None) -> None:
        """Model to view: probe these token ids (a prompt already tokenized)."""
        self.prompt.blockSignals(True)
        self.prompt.setPlainText(f"({len(token_ids):,} token ids)")
        self.prompt.blockSignals(False)
        self.salt.blockSignals(True)
        self.salt.setText(salt or "")
        self.salt.blockSignals(False)
        self.token_ids, self.prompt_file = tuple(int(t) for t in token_ids), None
        self.rebuild()

    def set_weights(self, text: str) -> bool:
        """Model to view: llm-d's tier weights as `GPU=1,CPU=0.8,other=0.5`; False (the
        reason shown) when they do not read."""
        self.weights_edit.setText(text)
        return self._on_weights()

    def _on_weights(self) -> bool:
        try:
            self.weights = TierWeights.parse(self.weights_edit.text())
        except ValueError as exc:
            self.error = str(exc)[0].upper() + str(exc)[1:] + "."
            self.view = None
            self._show(FleetSnapshot())
            return False
        self.error = ""
        self.weights_edit.setText(self._weights_text(self.weights))
        self.rebuild()
        return True

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "A prompt: text, messages (OpenAI, ShareGPT) or token trace",
                                              str(Path.home()), "Prompts (*.txt *.json *.jsonl);;All files (*)")
        if path:
            self.open_file(path)

    def open_file(self, path: str | Path) -> None:
        """Probe a file's first prompt: a token trace needs no tokenizer, text and messages
        files are tokenized with the servers' tokenizer."""
        from engine.core.sniff import is_request_trace

        path = Path(path)
        self.prompt_file, self.token_ids = path, None
        try:
            if path.is_file() and is_request_trace(path):
                from engine.core.trace import load_trace

                first = load_trace(path)[0]
                if first.tokens is None:
                    raise ValueError(f"{path.name} is a block-level trace: it has no token ids to hash")
                self.token_ids = first.tokens
                if first.tenant and not self.salt.text().strip():
                    self.salt.blockSignals(True)
                    self.salt.setText(first.tenant)
                    self.salt.blockSignals(False)
        except ValueError as exc:  # InputError and TraceError too: one sentence
            self.prompt_file, self.error = None, str(exc)
            self.view = None
            self._show(FleetSnapshot())
            return
        self.prompt.blockSignals(True)  # shown, not typed: it must not replace the file
        self.prompt.setPlainText(f"(from {path.name})")
        self.prompt.blockSignals(False)
        self.rebuild()

    # ------------------------------------------------------------------ work
    def rebuild(self) -> None:
        """Tokenize and hash the prompt again (text, salt, template, file or servers changed)."""
        from engine.analysis.diff import load_request, request_from_text
        from engine.core.hashing import BlockHasher
        from engine.remote.probe import PromptProbe

        self.keys, self.error = [], ""
        settings = self.ctx.remote.reading_settings
        text = self.prompt.toPlainText()
        salt = self.salt.text().strip() or None
        tok = view_tokenizer(self.ctx)
        ids: Any = self.token_ids
        if settings is None:
            self.error = "Attach to a fleet first (File > Attach to vLLM…), or open a recorded one."
        elif ids is None and not text.strip():
            self.error = "Type a probe prompt, or open a prompt file."
        elif ids is None and tok is None:
            self.error = "Loading the tokenizer…" if self.ctx.remote.settings is not None else \
                "No tokenizer is loaded: open a token trace (one JSON object with \"tokens\" a line) instead."
        else:
            try:
                if ids is None and self.prompt_file is not None:
                    req = load_request(str(self.prompt_file), tok, salt)
                    ids, salt = req.token_ids, req.salt
                elif ids is None:
                    ids = (request_from_text(tok, text, salt).token_ids if self.chat.isChecked()
                           else tok.encode(text, add_special_tokens=False))
                probe = PromptProbe(tuple(int(t) for t in ids), BlockHasher(settings.hash_scheme), salt,
                                    settings.block_size)
                self.keys = probe.keys(settings.block_size)
                if not self.keys:
                    self.error = (f"The prompt is {len(probe.token_ids):,} tokens: shorter than one block of "
                                  f"{settings.block_size}, so no server can hold any of it.")
            except ValueError as exc:
                self.error = str(exc)
        self.refresh()

    def refresh(self, snap: FleetSnapshot | None = None) -> None:
        """Score the prompt against the fleet as it is now (the pools under their lock)."""
        remote = self.ctx.remote
        settings = remote.reading_settings
        if snap is None:
            snap = remote.fleet_snapshot(max_rows=0)
        if self.keys and settings is not None:
            keys, weights, bs = list(self.keys), self.weights, settings.block_size
            self.view, self.places = remote.with_fleet(
                lambda fleet: (route(fleet, keys, bs, weights), locate(fleet, keys)), (None, []))
        else:
            self.view, self.places = None, []
        self._show(snap)

    def _show(self, snap: FleetSnapshot) -> None:
        p = theme.palette()
        v = self.view
        if v is None:
            self.table.setRowCount(0)
            self.location.show_places([], [])
            self.best.setText(f"<span style='color:{p['text_dim']}'>{html.escape(self.error)}</span>")
            return
        index = {s.server: s.index for s in snap.servers}
        if v.best_server is None:
            self.best.setText(f"No server holds block 0 of this prompt's {v.num_blocks} blocks: a KV-aware router "
                              "has no cache to route by and falls back to load.")
        else:
            best = v.score_of(v.best_server)
            color = server_color(index.get(v.best_server, 0)).name()
            self.best.setText(f"A KV-aware router sends this prompt ({v.num_blocks} blocks of {v.block_size}) to "
                              f"<b style='color:{color}'>{html.escape(v.best_server)}</b>: "
                              f"{best.matched_blocks} blocks cached ({best.cached_tokens:,} tokens), "
                              f"llm-d score {best.score:g}, Dynamo overlap {best.overlap_blocks}.")
        bold = QFont(self.table.font())
        bold.setBold(True)
        self.table.setRowCount(len(v.servers))
        for r, s in enumerate(v.servers):
            ranks = ", ".join(f"r{rank}: {n}" for rank, n in s.overlap_by_rank) if len(s.overlap_by_rank) > 1 else ""
            cells = (s.server, f"{s.matched_blocks} of {v.num_blocks}", f"{s.cached_tokens:,}", f"{s.score:g}",
                     f"{s.overlap_blocks}" + (f"  ({ranks})" if ranks else ""), " ".join(s.tiers) or "—")
            for c, text in enumerate(cells):
                it = QTableWidgetItem(text)
                it.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
                if c == 0:
                    it.setBackground(QBrush(server_tint(index.get(s.server, 0), 110)))
                if s.server == v.best_server:
                    it.setFont(bold)
                self.table.setItem(r, c, it)
        self.location.show_places(self.places, snap.servers)
        held = sum(1 for pl in self.places if pl.num_servers)
        self.where_label.setText(f"Where the prompt's {len(self.places)} blocks live: {held} held somewhere in the "
                                 "fleet (a router counts a server's blocks from block 0 up to the first it lacks)")

    def scores(self) -> dict[str, dict[str, Any]]:
        """Per server, what the table shows as numbers (what a test reads)."""
        return {} if self.view is None else {s.server: s.to_dict() for s in self.view.servers}
