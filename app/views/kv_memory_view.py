"""Per-layer KV memory: measured bytes per layer as bars, totals, the formula with the
numbers filled in, and what-ifs for another dtype or model preset.

Measured sizes come from `sigEngineChanged`'s `per_layer_bytes` (or the runner's pool);
presets and reports from `engine.kv_memory` when it is available.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from app import theme

BYTES_PER_VALUE = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def formula_bytes(layers: int, kv_heads: int, head_dim: int, bytes_per_value: int, tokens: int) -> int:
    """DESIGN 4.5: 2 (K and V) * layers * kv_heads * head_dim * bytes_per_value * tokens."""
    return 2 * layers * kv_heads * head_dim * bytes_per_value * tokens


def _presets() -> dict[str, Any]:
    try:
        from engine.kv_memory import PRESETS
    except ImportError:  # engineer A's module; the what-if falls back to the current shape
        return {}
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


class KvMemoryView(QWidget):
    """Bars of measured bytes per layer and the formula check, plus a what-if calculator."""

    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.state = ctx.state
        self.setObjectName("kv_memory_view")
        self.per_layer: list[int] = []
        self.presets = _presets()

        self.totals = QLabel()
        self.totals.setObjectName("kv_totals")
        self.totals.setTextFormat(Qt.TextFormat.RichText)
        self.totals.setWordWrap(True)
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.setLabel("bottom", "layer")
        self.plot.setLabel("left", "MiB (K + V)")
        self.plot.getAxis("left").setWidth(64)
        self.plot.showGrid(x=False, y=True, alpha=0.15)
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

        bar = QHBoxLayout()
        bar.addWidget(QLabel("What if:"))
        bar.addWidget(self.preset_box)
        bar.addWidget(self.dtype_box)
        bar.addWidget(self.tokens_box)
        bar.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.totals)
        layout.addWidget(self.plot, 1)
        layout.addLayout(bar)
        layout.addWidget(self.what_if)

        for box in (self.dtype_box, self.preset_box):
            box.currentIndexChanged.connect(self.update_what_if)
        self.tokens_box.valueChanged.connect(self.update_what_if)
        self.state.sigReset.connect(self.refresh)
        self.state.sigChanged.connect(self._on_changed)
        if hasattr(ctx, "sigThemeChanged"):
            ctx.sigThemeChanged.connect(self.apply_theme)
        self._in_use_shown = -1
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.plot.setBackground(p["panel"])
        self.bars.setOpts(brush=pg.mkBrush(p["accent"]), pen=pg.mkPen(None))
        self.refresh()

    # ------------------------------------------------------------------ model
    def _info(self) -> dict[str, Any]:
        info = dict(self.state.engine_info)
        if not info.get("per_layer_bytes"):
            runner = getattr(self.ctx, "runner", None)
            pool = getattr(runner, "kv_pool", None)
            if pool is not None:
                info["per_layer_bytes"] = list(pool.per_layer_bytes())
        return info

    def _on_changed(self) -> None:
        # only the "in use now" line depends on events; redo it when the count moves
        if self.state.projection.num_in_use != self._in_use_shown:
            self._update_totals()

    def refresh(self) -> None:
        info = self._info()
        self.per_layer = [int(b) for b in info.get("per_layer_bytes") or []]
        x = np.arange(len(self.per_layer), dtype=float)
        self.bars.setOpts(x=x, height=np.array(self.per_layer, dtype=float) / 2**20, width=0.75)
        capacity = int(info.get("num_blocks") or 0) * int(info.get("block_size") or 0)
        if capacity and self.tokens_box.value() == 1:
            self.tokens_box.setValue(min(capacity, self.tokens_box.maximum()))
        dtype = info.get("dtype")
        if dtype in BYTES_PER_VALUE:
            self.dtype_box.setCurrentText(dtype)
        self._update_totals()
        self.update_what_if()

    def _update_totals(self) -> None:
        info = self._info()
        p = self.state.projection
        self._in_use_shown = p.num_in_use
        layers, heads, dim = (int(info.get(k) or 0) for k in ("num_layers", "num_kv_heads", "head_dim"))
        dtype = info.get("dtype") or "float32"
        bpv = BYTES_PER_VALUE.get(str(dtype), 4)
        tokens = int(info.get("num_blocks") or 0) * int(info.get("block_size") or 0)
        if not self.per_layer or not layers:
            self.totals.setText("No model pool yet: per-layer KV memory is measured from the model runner's "
                                "tensors once a model is loaded. The what-if below works without one.")
            return
        measured = sum(self.per_layer)
        expected = formula_bytes(layers, heads, dim, bpv, tokens)
        check = "✓ equals" if measured == expected else "✗ differs from"
        in_use = p.num_in_use * p.block_size * (measured // tokens if tokens else 0)
        self.totals.setText(
            f"<b>{info.get('model') or 'model'}</b> · {layers} layers · {heads} KV heads · head dim {dim} · "
            f"{dtype}<br>measured <b>{human_bytes(measured)}</b> ({measured:,} bytes) for {tokens:,} tokens "
            f"({human_bytes(measured / tokens if tokens else 0)} per token) · in use now {human_bytes(in_use)}"
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
        total = formula_bytes(layers, heads, dim, BYTES_PER_VALUE[dtype], tokens)
        self.what_if_bytes = total
        self.what_if.setText(
            f"{name} in {dtype}: 2 × {layers} × {heads} × {dim} × {BYTES_PER_VALUE[dtype]} × {tokens:,} = "
            f"<b>{human_bytes(total)}</b> ({human_bytes(total / tokens)} per token)")
