"""How large DC-ASGD's delay-compensation term is in a run, next to the gradient it corrects.

DC-ASGD (docs/papers.md §6.3; geomx/optim/dcasgd.py) adds ``lambda * g * g * (w - w_bak)``
to each pushed gradient ``g``. When a run of DC-ASGD trains exactly like plain asynchronous
SGD, that is either because the term is negligible (little staleness: ``w - w_bak`` is
small) or because the optimizer is not doing its job; equal times to accuracy cannot tell
the two apart. :class:`CompensationProbe` measures the term itself, in every update of the
emulated runs it wraps, so bench/claims.py's DC-ASGD row rests on the measured size of the
correction rather than on the equality of two runs.

The probe is instrumentation for this bench: while active it wraps ``DCASGD.update`` (the
emulator runs every global server in this process), computes the term from the same
inputs the update reads (``pulled_weight`` for the paper's per-sender rule, the state's
``backup`` otherwise) and hands the call on unchanged.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from geomx.optim.dcasgd import DCASGD, adaptive_lambda


@dataclass
class CompensationProbe:
    """Per update: ``||lambda g g (w - w_bak)|| / ||g||`` (``ratios``) and whether the
    sender's weights were stale at all (``w_bak != w``, ``stale``)."""

    ratios: list[float] = field(default_factory=list)
    stale: int = 0
    updates: int = 0

    def __enter__(self) -> "CompensationProbe":
        self._original = DCASGD.update
        probe, original = self, DCASGD.update

        def update(opt: DCASGD, key: Hashable, weight: np.ndarray, grad: np.ndarray,
                   state: Any, *, sender: str | None = None) -> None:
            probe.observe(opt, key, weight, grad, state, sender)
            original(opt, key, weight, grad, state, sender=sender)

        DCASGD.update = update  # type: ignore[method-assign]
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        DCASGD.update = self._original  # type: ignore[method-assign]

    def observe(self, opt: DCASGD, key: Hashable, weight: np.ndarray, grad: np.ndarray,
                state: Any, sender: str | None) -> None:
        w_bak = opt.pulled_weight(key, sender) if opt.per_sender and sender else None
        if w_bak is None:
            w_bak = state["backup"]
        w = np.asarray(weight, dtype=np.float32)
        g = np.asarray(grad, dtype=np.float32) * np.float32(opt.rescale_grad)
        drift = w - w_bak
        lam: Any = np.float32(opt.lamda)
        mean_square = state.get("mean_square") if isinstance(state, dict) else None
        if mean_square is not None:  # DC-ASGD-a: lambda / sqrt of the updated mean square
            ms = np.float32(opt.ms_decay) * mean_square + np.float32(1 - opt.ms_decay) * g * g
            lam = adaptive_lambda(opt.lamda, ms)
        term = lam * g * g * drift
        g_norm = float(np.linalg.norm(g))
        self.updates += 1
        self.stale += bool(np.any(drift))
        if g_norm > 0:
            self.ratios.append(float(np.linalg.norm(term)) / g_norm)

    def summary(self) -> dict[str, float]:
        """Median and largest ratio, and the share of updates with stale weights."""
        if not self.ratios:
            return {"updates": self.updates, "median": 0.0, "max": 0.0, "stale_share": 0.0}
        return {"updates": self.updates, "median": statistics.median(self.ratios),
                "max": max(self.ratios), "stale_share": self.stale / max(1, self.updates)}
