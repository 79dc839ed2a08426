"""Help > Glossary: the words the views use, each in one or two plain sentences.

`GLOSSARY` is the text (term, definition), kept in the order a reader meets the ideas;
`GlossaryDialog` shows it with a filter box. Nothing else lives here.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QLineEdit, QScrollArea, QVBoxLayout, QWidget

GLOSSARY: tuple[tuple[str, str], ...] = (
    ("token", "The unit a model reads and writes: a word piece with a number (its token id)."),
    ("KV cache", "The keys and values each attention layer computed for every token of a request. "
                 "Keeping them means a token is computed once, not again at every generated step."),
    ("block", "A fixed number of tokens (the block size, 16 by default; 512 in Mooncake traces) whose KV "
              "is stored together. Only full blocks are cached."),
    ("partial block", "The tail of a prompt shorter than a block. It is never cached, so it is computed every time."),
    ("block hash", "A digest of a block's tokens and of its parent's hash (SHA-256 by default). Equal hashes "
                   "mean an equal prefix, so the block can be reused."),
    ("parent hash", "The hash of the block before this one in the same prompt; the first block's parent is a root value."),
    ("hash chain", "The hashes of a prompt's blocks, each built on the previous one. Two prompts share the "
                   "chain up to the first block where they differ, and nothing after it."),
    ("radix tree", "All cached hash chains drawn as one tree: shared prefixes are one trunk, and a branch "
                   "starts where prompts diverge. A run is a stretch with no branch, drawn as one line."),
    ("prefix cache", "The store of finished requests' KV blocks, looked up by hash chain, so a later request "
                     "that starts the same way skips computing that part."),
    ("prefix hit", "The leading blocks of a request found in the prefix cache. The lookup stops at the first "
                   "miss and never resumes after it."),
    ("hit rate", "Cached prompt tokens over all prompt tokens. In sweeps a refused request counts as missed."),
    ("miss reason", "Why the first missing block missed: new content, evicted, another salt, a partial block, "
                    "or only the last token left (it is always recomputed)."),
    ("ref count", "How many running requests hold a block. A block with ref count above zero is never evicted."),
    ("free queue", "Blocks no request holds, in least-recently-used order. A free block keeps its hash and can "
                   "still be hit until it is taken for new data."),
    ("LRU", "Least recently used: the free block used longest ago is evicted first. LRU position 0 is next."),
    ("eviction", "Taking a free block for new data, which forgets its old hash: later requests miss there."),
    ("refused request", "A request that needs more blocks than the pool can give at once; it changes nothing."),
    ("capacity", "How many blocks the pool holds, set directly or from a memory budget."),
    ("salt / tenant", "An extra key mixed into a prompt's first block hash, so identical text from different "
                      "tenants never shares blocks (and cannot reveal what another tenant sent)."),
    ("event seq", "The number of an engine event (stored, evicted, ref count changed, ...); every view and the "
                  "time bar count events the same way. Scrubbing shows the pool right after event N."),
    ("TTFT", "Time to first token: from sending a request to its first generated token. Reuse shortens it."),
    ("prompt caching (billing)", "A hosted API's prefix cache, billed: writes cost more than plain input, "
                                 "reads much less, and short prefixes are silently not cached."),
    ("breakpoint", "Where a hosted API is told to cache the prompt up to (Anthropic's cache_control)."),
    ("TTL", "Time to live: how long a hosted cache entry lasts without a hit."),
    ("semantic cache", "A cache of finished answers looked up by meaning (embedding similarity). Unlike the "
                       "prefix cache it can be wrong: a near neighbour may need a different answer."),
    ("sweep", "The same trace replayed with several block sizes or pool capacities, to see what each would hit."),
)


def glossary_html(filter_text: str = "") -> str:
    """The glossary as rich text, only the entries whose term or text holds `filter_text`."""
    key = filter_text.strip().lower()
    rows = [(t, d) for t, d in GLOSSARY if not key or key in t.lower() or key in d.lower()]
    if not rows:
        return f"No entry mentions “{html.escape(filter_text.strip())}”."
    return "".join(f"<p><b>{html.escape(t)}</b><br>{html.escape(d)}</p>" for t, d in rows)


class GlossaryDialog(QDialog):
    """The glossary with a filter box; not modal, so it can stay open beside the views."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("glossary_dialog")
        self.setWindowTitle("Glossary")
        self.resize(520, 600)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("filter: e.g. evict, hash, TTFT")
        self.filter.setClearButtonEnabled(True)
        self.text = QLabel(glossary_html())
        self.text.setObjectName("glossary_text")
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setWordWrap(True)
        self.text.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.filter)
        layout.addWidget(scroll, 1)
        layout.addWidget(buttons)
        self.filter.textChanged.connect(lambda text: self.text.setText(glossary_html(text)))
