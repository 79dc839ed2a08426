"""Engine > Pool size...: the blocks and block size of the model's pool, and of trace replays.

A number copied from a vLLM server's log (`num_gpu_blocks`) includes vLLM's null block; the
checkbox takes it as such (N - 1 usable blocks), so the pool evicts when the server does.
The dialog only asks; `MainWindow.set_pool_size` rebuilds the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtWidgets import (QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QSpinBox, QVBoxLayout,
                               QWidget)

from engine.core.blocks import usable_blocks_of_vllm


@dataclass(slots=True, frozen=True)
class PoolSize:
    """Usable blocks and tokens per block; `for_traces` also sizes replays of opened traces."""

    num_blocks: int
    block_size: int
    for_traces: bool = False


class PoolSizeDialog(QDialog):
    """Asks for a `PoolSize`; `pool_size()` is the answer after `accept`."""

    def __init__(self, initial: PoolSize, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Pool size")
        self.setObjectName("pool_size_dialog")
        self.blocks = QSpinBox()
        self.blocks.setRange(1, 2**31 - 1)  # a QSpinBox holds an int32; the engine checks memory
        self.blocks.setValue(initial.num_blocks)
        self.blocks.setGroupSeparatorShown(True)
        self.as_vllm = QCheckBox("This is a vLLM server's num_gpu_blocks (its null block included)")
        self.as_vllm.setToolTip("vLLM reserves block 0 as a null block: a server with num_gpu_blocks = N caches "
                                "in N - 1 blocks")
        self.block_size = QSpinBox()
        self.block_size.setRange(1, 4096)
        self.block_size.setValue(initial.block_size)
        self.for_traces = QCheckBox("Replay opened traces in a pool of this size too (instead of a size fitted to each)")
        self.for_traces.setChecked(initial.for_traces)
        self.usable = QLabel()
        self.error = QLabel()
        self.error.setObjectName("error")
        self.error.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Blocks", self.blocks)
        form.addRow("", self.as_vllm)
        form.addRow("Tokens per block", self.block_size)
        form.addRow("", self.for_traces)
        form.addRow("", self.usable)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.blocks.valueChanged.connect(self._explain)
        self.as_vllm.toggled.connect(self._explain)
        self.block_size.valueChanged.connect(self._explain)
        self._explain()

    def pool_size(self) -> PoolSize:
        """The usable pool the fields describe; ValueError (one sentence) if there is none."""
        n = self.blocks.value()
        usable = usable_blocks_of_vllm(n) if self.as_vllm.isChecked() else n
        return PoolSize(usable, self.block_size.value(), self.for_traces.isChecked())

    def _explain(self) -> None:
        try:
            size = self.pool_size()
        except ValueError as exc:
            self.usable.setText("")
            self.error.setText(_sentence(exc))
            return
        self.error.setText("")
        self.usable.setText(f"{size.num_blocks:,} usable blocks × {size.block_size} tokens = "
                            f"{size.num_blocks * size.block_size:,} tokens")

    def accept(self) -> None:
        try:
            self.pool_size()
        except ValueError as exc:
            self.error.setText(_sentence(exc))
            return
        super().accept()


def _sentence(exc: Exception) -> str:
    text = str(exc).strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
