"""The block details pane: everything known about one block, whichever view it was picked in.

`ctx.selection` is the one channel views use to say "the user picked block N" (a click in
the block table, a node of the hash chains); `BlockDetailsView` listens to it and reads the
pool state read-only. `describe_block` is the Qt-free summary the pane shows.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from app.ui import theme
from app.ui.widgets import PanelView
from engine.core.projection import PoolProjection

if TYPE_CHECKING:
    from app.runtime.context import AppContext

MAX_REQUESTS_LISTED = 12
MAX_TOKENS_SHOWN = 64


def _spaced(digest: str) -> str:
    # a 64-digit hash in groups of 16 wraps in a narrow pane instead of being cut
    return " ".join(digest[i:i + 16] for i in range(0, len(digest), 16))


@dataclass(slots=True, frozen=True)
class BlockDescription:
    """One block as the pane shows it; `requests` are the ids whose prompt used its hash."""

    block_id: int
    state: str
    block_hash: str | None
    parent_hash: str | None
    ref_count: int
    lru_position: int | None  # 0 = evicted next; None when in use or empty
    num_free: int
    token_ids: tuple[int, ...]
    tenant: str | None
    running: tuple[str, ...]
    requests: tuple[str, ...]
    num_requests: int
    last_use_seq: int | None
    evicted_seq: int | None


def requests_using(p: PoolProjection, block_hash: bytes, limit: int = MAX_REQUESTS_LISTED) -> tuple[tuple[str, ...], int]:
    """Up to `limit` request ids whose prompt hashed to `block_hash` (latest first), and how many."""
    columns = getattr(p, "requests_using", None)
    if columns is not None:  # a columnar state: one search of the requests' chain ids
        return columns(block_hash, limit)
    found: list[str] = []
    num = 0
    for rid in reversed(list(dict.fromkeys(p.order))):
        rec = p.requests.get(rid)
        if rec is not None and block_hash in rec.block_hashes:
            num += 1
            if len(found) < limit:
                found.append(rid)
    return tuple(found), num


def describe_block(p: PoolProjection, block_id: int) -> BlockDescription:
    """What the projection knows of `block_id`; raises ValueError for a block not in the pool."""
    info = p.block_info(block_id)
    if info.ref_count > 0:
        state = f"in use by {info.ref_count} request{'s' if info.ref_count != 1 else ''}"
    elif info.block_hash is not None:
        state = "cached, free (reusable until evicted)"
    else:
        state = "empty"
    requests, num = requests_using(p, info.block_hash) if info.block_hash is not None else ((), 0)
    return BlockDescription(
        block_id, state, info.block_hash.hex() if info.block_hash is not None else None,
        info.parent_hash.hex() if info.parent_hash is not None else None, info.ref_count,
        info.free_rank if info.block_hash is not None and info.ref_count == 0 else None, p.num_free_blocks,
        info.token_ids, info.tenant, info.owners, requests, num, info.last_use_seq, info.evicted_seq)


class BlockDetailsView(PanelView):
    """The pane: hash, parent, ref count, LRU position, token text and the requests that used it."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("block_details_view")
        self.block_id: int | None = None
        self.description: BlockDescription | None = None
        self.text = QLabel()
        self.text.setObjectName("block_details_text")
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setWordWrap(True)
        self.text.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(self.text)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(scroll)
        ctx.selection.sigBlockSelected.connect(self.show_block)
        self.state.sigChanged.connect(self._on_state_changed)
        self._refresh()

    def apply_theme(self, name: str | None = None) -> None:
        self._refresh()  # the text's colours come from the palette

    def _on_state_changed(self) -> None:
        # listing the requests that used a block scans every request: only when it is seen
        if self.isVisible():
            self._refresh()

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        self._refresh()
        super().showEvent(event)

    def show_block(self, block_id: int | None) -> None:
        self.block_id = block_id
        self._refresh()

    def _decode(self, token_ids: tuple[int, ...]) -> str | None:
        tokenizer = getattr(self.ctx.runner, "tokenizer", None)
        if tokenizer is None or not token_ids:
            return None
        try:
            return tokenizer.decode(list(token_ids[:MAX_TOKENS_SHOWN]))
        except Exception:  # noqa: BLE001 - ids from another model (a trace) show as ids only
            return None

    def _refresh(self) -> None:
        dim = theme.palette()["text_dim"]
        p = self.state.projection
        if self.block_id is None or not 0 <= self.block_id < p.num_blocks:
            self.description = None
            self.text.setText(f"<span style='color:{dim}'>Click a block in the block table or a node of the "
                              "hash chains to see its hash, parent, ref count, place in the eviction queue, "
                              "tokens and the requests that used it.</span>")
            return
        d = self.description = describe_block(p, self.block_id)
        rows = [("state", d.state), ("ref count", str(d.ref_count))]
        rows.append(("block hash", _spaced(d.block_hash) if d.block_hash else "none (holds no full block)"))
        if d.block_hash is not None:
            rows.append(("parent hash", _spaced(d.parent_hash) if d.parent_hash else "none: the first block of its prompt"))
            rows.append(("tenant (salt)", d.tenant or "none"))
        if d.lru_position is not None:
            rows.append(("LRU position", f"{d.lru_position:,} of {d.num_free:,} free blocks (0 is evicted next)"))
        elif d.ref_count > 0:
            rows.append(("LRU position", "not in the free queue while in use"))
        if d.token_ids:
            ids = ", ".join(map(str, d.token_ids[:MAX_TOKENS_SHOWN])) + (" …" if len(d.token_ids) > MAX_TOKENS_SHOWN else "")
            text = self._decode(d.token_ids)
            if text is not None:
                rows.append(("token text", "“" + text.replace("\n", "⏎") + "”"))
            rows.append((f"{len(d.token_ids)} token ids", ids))
        elif d.block_hash is not None:
            rows.append(("tokens", "not in the trace (block-level hash ids only)"))
        if d.running:
            rows.append(("held by", ", ".join(d.running)))
        if d.block_hash is not None:
            used = ", ".join(d.requests) + (f" and {d.num_requests - len(d.requests):,} more"
                                            if d.num_requests > len(d.requests) else "")
            rows.append((f"used by {d.num_requests:,} request{'s' if d.num_requests != 1 else ''}", used or "none shown"))
        if d.last_use_seq is not None:
            rows.append(("last use", f"event {d.last_use_seq:,}"))
        if d.evicted_seq is not None:
            rows.append(("last evicted", f"event {d.evicted_seq:,}"))
        body = "".join(f"<tr><td style='color:{dim}; padding-right:8px'>{html.escape(k)}</td>"
                       f"<td>{html.escape(v)}</td></tr>" for k, v in rows)
        self.text.setText(f"<b>Block {d.block_id:,}</b><table cellspacing='2'>{body}</table>")
