"""A compiled replay's result rows as columns: `ServedColumns`, the Python engine's
`ServedRequest` rows kept as per-request arrays (`engine.core.served.RowColumns`), so a
replay that prints totals, or its JSON rows, never makes 12K row objects it does not need.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from engine.core.served import ReplayTotals, ServedRequest

# The keys of a JSON row that every row has, in `ServedRequest.to_dict` order.
_ROW_KEYS = ("index", "id", "tenant", "prompt_tokens", "cached_tokens", "computed_tokens", "output_tokens",
             "miss_reason", "first_miss_block", "divergence_token")


class ServedColumns:
    """A run's rows as per-request arrays, in input order (what the compiled kernel returns):
    `ServedRequest` rows are made once, on the first `rows()`; `to_dicts()` and `totals()`
    read the arrays and never make them. Every value equals the row the Python engine gives.

    Per request r: its input position `index[r]`, id `names[uid[r]]`, tenant
    `tenants[salt[r]]` (-1: None), prompt, cached, computed and output tokens, the miss
    reason `reason_names[reason[r]]` (-1: None), the first missing block, the divergence
    token (-1: None) and whether it was refused."""

    __slots__ = ("index", "uid", "names", "salt", "tenants", "prompt", "cached", "computed", "output", "reason",
                 "reason_names", "first_miss", "divergence", "refused", "_rows")

    def __init__(self, index: np.ndarray, uid: np.ndarray, names: Sequence[str], salt: np.ndarray,
                 tenants: Sequence[str | None], prompt: np.ndarray, cached: np.ndarray, computed: np.ndarray,
                 output: np.ndarray, reason: np.ndarray, reason_names: Sequence[str], first_miss: np.ndarray,
                 divergence: np.ndarray, refused: np.ndarray) -> None:
        self.index, self.uid, self.names, self.salt, self.tenants = index, uid, names, salt, tenants
        self.prompt, self.cached, self.computed, self.output = prompt, cached, computed, output
        self.reason, self.reason_names, self.first_miss = reason, reason_names, first_miss
        self.divergence, self.refused = divergence, refused
        self._rows: list[ServedRequest] | None = None

    def __len__(self) -> int:
        return len(self.index)

    def _columns(self) -> list[list]:
        """The row fields as Python lists, in `_ROW_KEYS` order, then `refused` as bools:
        one C-level pass per column (`tolist`, `map` over a list's `__getitem__`)."""
        names = list(self.names)
        tenants = [*self.tenants, None]  # salt -1 is the last: None
        reasons = [*self.reason_names, None]
        div = self.divergence.tolist()
        return [self.index.tolist(), list(map(names.__getitem__, self.uid.tolist())),
                list(map(tenants.__getitem__, self.salt.tolist())), self.prompt.tolist(), self.cached.tolist(),
                self.computed.tolist(), self.output.tolist(), list(map(reasons.__getitem__, self.reason.tolist())),
                self.first_miss.tolist(), [None if d < 0 else d for d in div] if min(div, default=0) < 0 else div,
                list(map(bool, self.refused.tolist()))]

    def rows(self) -> list[ServedRequest]:
        """The `ServedRequest` rows, made on the first call and kept."""
        if self._rows is None:
            self._rows = list(map(ServedRequest, *self._columns()))
        return self._rows

    def to_dicts(self) -> list[dict[str, Any]]:
        """`[row.to_dict() for row in self.rows()]`, from the arrays (no row objects)."""
        if self._rows is not None:
            return [r.to_dict() for r in self._rows]
        *fields, refused = self._columns()
        out = list(map(dict, map(zip, [_ROW_KEYS] * len(refused), zip(*fields))))
        for i in [i for i, x in enumerate(refused) if x] if any(refused) else ():
            out[i]["refused"] = True
        return out

    def totals(self, counters: Any) -> ReplayTotals:
        """`ReplayTotals.of(self.rows(), counters)`, from the arrays."""
        served = self.refused == 0
        prompt = int(self.prompt[served].sum())
        cached = int(self.cached[served].sum())
        n = len(self.index)
        n_served = int(served.sum())
        return ReplayTotals(n, prompt, cached, prompt - cached, round(cached / prompt, 6) if prompt else 0.0,
                            counters.num_stored_blocks, counters.num_evicted_blocks, n - n_served)
