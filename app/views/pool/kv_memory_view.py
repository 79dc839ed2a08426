"""Per-layer KV memory: measured bytes per layer as bars, totals, the formula with the
numbers filled in, and what-ifs for another dtype or model preset.

Measured sizes come from `sigEngineChanged`'s `per_layer_bytes` (or the pool of the runner
whose events the views show); presets and reports from `engine.model.kv_memory`. The what-if
token count follows the engine: every new engine or adopted trace log (`PoolState.sigReset`)
sets it to that pool's capacity in tokens; the user's own count stands until the next one.
The text column scrolls by itself, so the bar plot always fits the dock it is in.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent, QShowEvent
from PySide6.QtWidgets import (QBoxLayout, QComboBox, QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QSpinBox,
                               QVBoxLayout, QWidget)

from app.ui import theme
from app.ui.export import export_button, header_row
from app.ui.plots import CountAxis
from engine.core.validation import human_bytes
from engine.model.kv_memory import PRESETS, kv_bytes
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

QWIDGETSIZE_MAX = 16777215
TEXT_MIN_PX = 60  # the text column is never shorter; it scrolls instead
TEXT_MAX_SHARE = 0.55  # stacked, the text takes at most this share of the height
BYTES_PER_VALUE = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1}


# Why a subject that is not a chat has no KV tensors to measure, by its kind.
NO_TENSORS = {
    "trace": "{s} is replayed without a model: its pool holds blocks, not KV tensors",
    "demo": "{s} runs without the model: its pool holds blocks, not KV tensors",
    "server": "{s} keeps its KV tensors on its own GPUs: only its block events reach this window",
    "usage": "{s} records an API's requests and cached tokens: it has no KV pool here",
}
WHAT_IF_NOTE = "The what-if below works without one."


def no_pool_text(ctx: AppContext) -> str:
    """What the panel says when it has no measured KV pool, and what the user can do: the
    subject has no tensors (a trace, a demo without the model, a server, a usage log), the
    model failed to load, no model is loaded, or the loaded model has not run here yet."""
    subject = ctx.subject
    if subject.kind in NO_TENSORS:
        what = NO_TENSORS[subject.kind].format(s=html.escape(subject.describe()))
        return (f"{what[0].upper()}{what[1:]}. Start a chat (File > New session) and send a message to see the "
                f"local model's per-layer KV memory. {WHAT_IF_NOTE}")
    if ctx.runner is None and ctx.model_error:
        return (f"No model, so no KV memory to measure: {html.escape(ctx.model_error.rstrip('.'))}. Load it again with "
                f"Engine > Load model (Ctrl+L). {WHAT_IF_NOTE}")
    if ctx.runner is None:
        return ("No model loaded yet: load one (Engine > Load model, Ctrl+L) and its KV pool's bytes per layer "
                f"appear here, measured from its tensors; send a message to fill the pool. {WHAT_IF_NOTE}")
    return (f"The model is loaded: send a message in this session to see its per-layer KV memory (the views show "
            f"its pool once it runs). {WHAT_IF_NOTE}")


def _presets() -> dict[str, Any]:
    return dict(PRESETS)


def _shape_numbers(shape: Any) -> tuple[int, int, int] | None:
    """(layers, kv_heads, head_dim) of a preset, whatever its container."""
    names = (("num_layers", "layers"), ("num_kv_heads", "kv_heads"), ("head_dim",))
    out = []
    for options in names:
        value = None
        for name in options:
            value = shape.get(name) if isinstance(shape, dict) else getattr(shape, name, None)
            if value is not None:
                break
        if value is None:
            return None
        out.append(int(value))
    return out[0], out[1], out[2]


class KvMemoryView(PanelView):
    """Bars of measured bytes per layer and the formula check, plus a what-if calculator."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("kv_memory_view")
        self.per_layer: list[int] = []
        self.presets = _presets()

        self.totals = QLabel()
        self.totals.setObjectName("kv_totals")
        self.totals.setTextFormat(Qt.TextFormat.RichText)
        self.totals.setWordWrap(True)
        self.plot = pg.PlotWidget(axisItems={"left": CountAxis("left", integer=False), "bottom": CountAxis("bottom")})
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.getAxis("left").setWidth(44)
        self.plot.showGrid(x=False, y=True, alpha=0.15)
        # the plot takes the room the text leaves and never asks for more (a preferred height
        # would make the dock's scroll area scroll)
        self.plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.plot.setMinimumSize(200, 110)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.75)
        self.plot.addItem(self.bars)

        self.dtype_box = QComboBox()
        self.dtype_box.setObjectName("kv_dtype")
        for name in BYTES_PER_VALUE:
            self.dtype_box.addItem(name)
        self.preset_box = QComboBox()
        self.preset_box.setObjectName("kv_preset")
        self.preset_box.addItem("this model", None)
        for name in self.presets:
            self.preset_box.addItem(name, name)
        self.tokens_box = QSpinBox()
        self.tokens_box.setObjectName("kv_tokens")
        self.tokens_box.setRange(1, 10_000_000)
        self.tokens_box.setSingleStep(1024)
        self.tokens_box.setSuffix(" tokens")
        self.what_if = QLabel()
        self.what_if.setObjectName("kv_what_if")
        self.what_if.setTextFormat(Qt.TextFormat.RichText)
        self.what_if.setWordWrap(True)

        for box in (self.preset_box, self.dtype_box):
            # long preset names must not widen the dock: the box shows as much as fits
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            box.setMinimumContentsLength(6)
        self.tokens_box.setMinimumWidth(112)
        self.preset_box.setToolTip("a model preset, or the model loaded now")
        self.dtype_box.setToolTip("the KV cache's data type")
        self.tokens_box.setToolTip("tokens held in the KV cache")
        self.what_if_caption = QLabel("What if — model, data type, tokens:")
        self.what_if_caption.setObjectName("kv_what_if_caption")
        bar = QHBoxLayout()
        bar.setSpacing(4)
        bar.addWidget(self.preset_box, 2)
        bar.addWidget(self.dtype_box, 1)
        bar.addWidget(self.tokens_box, 2)
        text = QVBoxLayout()
        text.setSpacing(6)
        self.export = export_button(self, plots={"KV bytes per layer": lambda: self.plot},
                                    tables={"KV bytes per layer": lambda: (["layer", "bytes"],
                                                                           list(enumerate(self.per_layer)))})
        text.addLayout(header_row(self.totals, self.export))
        text.addSpacing(2)
        text.addWidget(self.what_if_caption)
        text.addLayout(bar)
        text.addWidget(self.what_if)
        # A quantized cache measured by the quantized-kv-cache demo; hidden until one is shown.
        self.quantized = QLabel()
        self.quantized.setObjectName("kv_quantized")
        self.quantized.setTextFormat(Qt.TextFormat.RichText)
        self.quantized.setWordWrap(True)
        self.quantized.hide()
        self.quantized_findings: dict[str, Any] | None = None
        text.addWidget(self.quantized)
        text.addStretch(1)
        # The text scrolls in a column of its own: a long text (the quantized findings) must
        # not make the panel taller than its dock, or the dock's scroll area would scroll the
        # whole panel and cut the bar plot off at the bottom.
        self.text_body = QWidget()
        self.text_body.setObjectName("kv_text")
        self.text_body.setLayout(text)
        text.setContentsMargins(0, 0, 0, 0)
        self.text_area = QScrollArea()
        self.text_area.setObjectName("kv_text_area")
        self.text_area.setWidgetResizable(True)
        self.text_area.setFrameShape(QFrame.Shape.NoFrame)
        self.text_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.text_area.setWidget(self.text_body)
        self.text_area.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.text_area.setMinimumSize(200, TEXT_MIN_PX)
        # Side by side in a wide, short dock (the default); stacked when the dock is tall.
        self.box = QBoxLayout(QBoxLayout.Direction.LeftToRight, self)
        self.box.setContentsMargins(6, 6, 6, 6)
        self.box.setSpacing(10)
        self.box.addWidget(self.plot, 5)
        self.box.addWidget(self.text_area, 4)

        for box in (self.dtype_box, self.preset_box):
            box.currentIndexChanged.connect(self.update_what_if)
        self.tokens_box.valueChanged.connect(self.update_what_if)
        # The capacity (tokens) the what-if count was last set to from an engine; None: the
        # next engine's capacity sets it.
        self.followed_capacity: int | None = None
        self.state.sigReset.connect(self._on_reset)
        self.state.sigReset.connect(self.clear_quantized)
        self.state.sigChanged.connect(self._on_changed)
        ctx.sigRunnerChanged.connect(lambda _runner: self._retext())
        self._in_use_shown = -1
        self.apply_theme()

    def show_subject(self, subject: Subject) -> None:
        """The text says what the new subject has to measure (its engine, if any, resets the bars)."""
        self._retext()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self._retext()  # a model that failed to load meanwhile is said

    def _retext(self) -> None:
        self._update_totals()
        self._refit()

    def resizeEvent(self, event: QResizeEvent) -> None:
        wide = event.size().width() >= 1.6 * event.size().height()
        self.box.setDirection(QBoxLayout.Direction.LeftToRight if wide else QBoxLayout.Direction.TopToBottom)
        self._fit_text(event.size().width(), event.size().height(), wide)
        super().resizeEvent(event)

    def _fit_text(self, width: int, height: int, wide: bool) -> None:
        """Side by side the text column is as tall as the panel; stacked it takes the height
        its wrapped text needs, at most `TEXT_MAX_SHARE` of the panel, and the plot the rest."""
        area = self.text_area
        if wide or not self.plot.isVisibleTo(self):
            area.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
            area.setMinimumHeight(TEXT_MIN_PX)
            area.setMaximumHeight(QWIDGETSIZE_MAX)
            self.box.setStretchFactor(self.plot, 5)
            self.box.setStretchFactor(area, 4)
            return
        margins = self.box.contentsMargins()
        inner = max(1, width - margins.left() - margins.right())
        body = self.text_body.layout()
        need = body.totalHeightForWidth(inner) if body is not None and body.hasHeightForWidth() else \
            self.text_body.sizeHint().height()
        inside = height - margins.top() - margins.bottom() - self.box.spacing()
        # a long text scrolls rather than squeeze the plot to its minimum
        room = min(inside - self.plot.minimumHeight(), int(inside * TEXT_MAX_SHARE))
        # Fixed, not Ignored: an ignored height beside the plot's ignored one is laid out past the bottom
        area.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        area.setFixedHeight(max(TEXT_MIN_PX, min(need, room)))
        self.box.setStretchFactor(self.plot, 1)
        self.box.setStretchFactor(area, 0)

    def _on_reset(self) -> None:
        """A new engine or an adopted log: the what-if count follows its pool again."""
        self.followed_capacity = None
        self.refresh()

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.plot.setBackground(p["panel"])
        self.bars.setOpts(brush=pg.mkBrush(p["accent"]), pen=pg.mkPen(None))
        for side in ("left", "bottom"):
            self.plot.getAxis(side).setTextPen(p["text_dim"])
            self.plot.getAxis(side).setPen(p["text_dim"])
        self.plot.setTitle("KV bytes per layer, MiB (K + V)", color=p["text_dim"], size="9pt")
        self.what_if_caption.setStyleSheet(f"color: {p['text_dim']}")
        self.refresh()
        if self.quantized_findings is not None:
            self.show_quantized(self.quantized_findings)

    # ------------------------------------------------------------------ model
    def _info(self) -> dict[str, Any]:
        info = dict(self.state.engine_info)
        if not info.get("per_layer_bytes"):
            # The runner's pool only while its events are the ones shown: a trace opened
            # after a chat has no model pool, whatever runner stays loaded behind it.
            runner = self.ctx.runner
            pool = getattr(runner, "kv_pool", None)
            manager = getattr(runner, "manager", None)
            if pool is not None and (manager is None or self.ctx.bridge.bus is getattr(manager, "events", None)):
                info["per_layer_bytes"] = list(pool.per_layer_bytes())
        return info

    def capacity_tokens(self) -> int:
        """Tokens the shown pool holds: the engine's blocks × block size, or the adopted
        log's pool when the engine did not say (a trace cancelled before it was sized)."""
        info = self.state.engine_info
        blocks, size = int(info.get("num_blocks") or 0), int(info.get("block_size") or 0)
        if not blocks:
            p = self.state.projection
            blocks, size = int(getattr(p, "num_blocks", 0) or 0), int(getattr(p, "block_size", 0) or size)
        return blocks * size

    def _on_changed(self) -> None:
        # only the "in use now" line depends on events; redo it when the count moves
        if self.state.projection.num_in_use != self._in_use_shown:
            self._update_totals()

    def refresh(self) -> None:
        info = self._info()
        self.per_layer = [int(b) for b in info.get("per_layer_bytes") or []]
        x = np.arange(len(self.per_layer), dtype=float)
        heights = np.array(self.per_layer, dtype=float) / 2**20
        self.bars.setOpts(x=x, height=heights, width=0.75)
        self.plot.setYRange(0, max(float(heights.max()) if len(heights) else 0.0, 1e-3) * 1.08, padding=0)
        self.plot.setXRange(-0.6, max(len(heights), 1) - 0.4, padding=0)
        self.plot.setVisible(bool(self.per_layer))  # no model pool: empty axes would only waste room
        capacity = self.capacity_tokens()
        if capacity and capacity != self.followed_capacity:
            self.followed_capacity = capacity
            self.tokens_box.setValue(min(capacity, self.tokens_box.maximum()))
        dtype = info.get("dtype")
        if dtype in BYTES_PER_VALUE:
            self.dtype_box.setCurrentText(dtype)
        self._update_totals()
        self.update_what_if()
        self._refit()

    def _refit(self) -> None:
        """Lay the text out again for the current size (the plot shown or hidden, text changed)."""
        w, h = self.width(), self.height()
        self._fit_text(w, h, w >= 1.6 * h)

    def _update_totals(self) -> None:
        info = self._info()
        p = self.state.projection
        self._in_use_shown = p.num_in_use
        layers, heads, dim = (int(info.get(k) or 0) for k in ("num_layers", "num_kv_heads", "head_dim"))
        dtype = info.get("dtype") or "float32"
        bpv = BYTES_PER_VALUE.get(str(dtype), 4)
        tokens = int(info.get("num_blocks") or 0) * int(info.get("block_size") or 0)
        if not self.per_layer or not layers:
            self.totals.setText(no_pool_text(self.ctx))
            return
        measured = sum(self.per_layer)
        expected = kv_bytes(layers, heads, dim, bpv, tokens)
        check = "✓ equals" if measured == expected else "✗ differs from"
        in_use = p.num_in_use * p.block_size * (measured // tokens if tokens else 0)
        self.totals.setText(
            f"<b>{info.get('model') or 'model'}</b> · {layers} layers · {heads} KV heads · head dim {dim} · "
            f"{dtype}<br>measured <b>{human_bytes(measured, 2)}</b> ({measured:,} bytes) for {tokens:,} tokens "
            f"({human_bytes(measured / tokens if tokens else 0, 2)} per token) · in use now {human_bytes(in_use, 2)}"
            f"<br>formula 2 × {layers} layers × {heads} kv heads × {dim} head dim × {bpv} bytes × {tokens:,} tokens"
            f" = <b>{expected:,}</b> bytes, {check} the measured size")

    def update_what_if(self) -> None:
        """The formula for the chosen preset (or this model), dtype and token count."""
        info = self._info()
        preset = self.preset_box.currentData()
        numbers = None
        name = info.get("model") or "this model"
        if preset is not None:
            numbers = _shape_numbers(self.presets[preset])
            name = preset
        elif info.get("num_layers"):
            numbers = (int(info["num_layers"]), int(info["num_kv_heads"]), int(info["head_dim"]))
        dtype = self.dtype_box.currentText()
        tokens = self.tokens_box.value()
        if numbers is None:
            self.what_if.setText("Pick a model preset to see what its KV cache would need.")
            return
        layers, heads, dim = numbers
        # Latent attention (DeepSeek-V3) caches one compressed latent per token and layer,
        # not K and V per head: the preset's kv_factor says which (2 or 1).
        factor = int(getattr(self.presets[preset], "kv_factor", 2)) if preset is not None else 2
        total = kv_bytes(layers, heads, dim, BYTES_PER_VALUE[dtype], tokens, factor)
        self.what_if_bytes = total
        note = "" if factor == 2 else " (latent attention: one latent per token and layer, no separate K and V)"
        self.what_if.setText(
            f"{name} in {dtype}: {factor} × {layers} × {heads} × {dim} × {BYTES_PER_VALUE[dtype]} × {tokens:,} = "
            f"<b>{human_bytes(total, 2)}</b> ({human_bytes(total / tokens, 2)} per token){note}")

    def show_quantized(self, findings: dict[str, Any]) -> None:
        """A measured quantized KV cache (the quantized-kv-cache demo's findings) against the
        full-precision one: bytes, capacity, TTFT, decode time, logit cost and the refusal.
        The what-if shows this model in bfloat16 at the long context beside it."""
        self.quantized_findings = findings
        self.preset_box.setCurrentIndex(0)  # "this model"
        if self.dtype_box.findText("bfloat16") >= 0:
            self.dtype_box.setCurrentText("bfloat16")
        contexts = findings.get("contexts") or []
        if contexts:
            self.tokens_box.setValue(int(contexts[-1]["tokens_with_kv"]))
        p = theme.palette()
        rows = "".join(
            f"<br>{c['context']}, {c['tokens_with_kv']:,} tokens: float32 {human_bytes(c['fp32_bytes'], 2)} · "
            f"bf16 {human_bytes(c['bf16_bytes'], 2)} · {findings.get('nbits')}-bit "
            f"<b>{human_bytes(c['quantized_bytes'], 2)}</b> ({c['capacity_vs_bf16']:.2f}× less than bf16) · "
            f"TTFT {c['fp32_ttft_ms']:,.0f} → {c['quantized_ttft_ms']:,.0f} ms · decode "
            f"{c['fp32_decode_ms_per_token']:,.0f} → {c['quantized_decode_ms_per_token']:,.0f} ms per token · "
            f"largest logit change {c['decode_logit_max_abs_diff']:.2f}"
            for c in findings.get("contexts", ()))
        refusal = (findings.get("refusal") or {}).get("engine_refusal")
        refused = (f"<br><span style='color:{p['warn']}'>Group size {findings['refusal']['group_size']} refused: "
                   f"{refusal}.</span>" if refusal else "")
        self.quantized.setText(
            f"<b>Quantized KV cache, measured</b> · {findings.get('nbits')}-bit, groups of {findings.get('group_size')}, "
            f"{findings.get('backend')}, unpacking in {str(findings.get('unpack', 'torch')).split(' (')[0]}"
            f"{rows}{refused}")
        self.quantized.show()
        self._refit()

    def clear_quantized(self) -> None:
        """Forget the quantized cache shown: a new engine's pool is not what it measured."""
        self.quantized_findings = None
        self.quantized.hide()
        self._refit()
