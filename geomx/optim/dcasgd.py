"""DC-ASGD: asynchronous SGD with delay compensation (Zheng et al., ICML 2017).

A sender computed its gradient ``g`` at the model ``w_bak`` it last pulled, but the
server's model has moved on to ``w``. DC-ASGD corrects ``g`` with a first-order Taylor
term whose Hessian is approximated by ``lambda * g * g`` (element-wise):

    delta = -lr * (g + wd * w + lambda * g * g * (w - w_bak))
    w    <- w + delta                  (with momentum mu: m <- mu * m + delta; w <- w + m)

Two rules for ``w_bak`` (docs/geomx-behaviour.md §2.2, §3.3; docs/papers.md §6.3):

* ``dcasgd`` (``per_sender=True``, the paper's rule): ``w_bak`` is the model *that
  sender* last pulled, recorded by ``note_pull(key, sender, weight)``. A sender that has
  not pulled yet is assumed to hold the model the state was created from (the initial
  weights every sender starts with).
* ``dcasgd_shared`` (``per_sender=False``, MXNet's ``mx.optimizer.DCASGD`` that GeoMX
  ships): one backup per key, ``w_prev``, set to the weight *before* every update,
  whichever sender caused it; it starts as the initial weight, so the first update has
  no correction.

``adaptive=True`` gives the paper's DC-ASGD-a: ``lambda_t = lambda / sqrt(ms_t)`` with
``ms_t = ms_decay * ms_{t-1} + (1 - ms_decay) * g * g`` per element.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, as_float32, check_option, check_shapes, write_back

__all__ = ["DCASGD", "DCASGDState", "adaptive_lambda"]

# Keeps lambda / sqrt(ms) finite where a coordinate has never had a gradient.
_ADAPTIVE_EPS = 1e-7


def adaptive_lambda(lamda: float, mean_square: np.ndarray) -> np.ndarray:
    """DC-ASGD-a's per-element lambda, ``lamda / sqrt(mean_square)`` (finite where the
    mean square is still 0)."""
    return np.float32(lamda) / (np.sqrt(mean_square) + np.float32(_ADAPTIVE_EPS))


#: Per-key state, a dict (the state contract in base.py): ``"backup"``: for the shared
#: rule, the weight before the previous update; for the per-sender rule, the initial
#: weight (the fallback ``w_bak`` for senders that never pulled). ``"momentum"`` only
#: when momentum > 0; ``"mean_square"`` only when adaptive. The per-sender backups live
#: on the optimizer (``pulled_weight``), not in the state. No kernel: DC-ASGD's update is
#: not the hot path of any scenario, and its per-sender lookups are Python anyway.
DCASGDState = dict[str, np.ndarray]


class DCASGD(OptimizerBase):
    """Delay-compensated SGD; ``per_sender`` picks the paper's rule (default) or MXNet's."""

    name = "dcasgd"

    def __init__(
        self,
        lr: float = 0.01,
        lamda: float = 0.04,
        momentum: float = 0.0,
        per_sender: bool = True,
        adaptive: bool = False,
        ms_decay: float = 0.95,
        **kwargs: Any,
    ) -> None:
        super().__init__(lr=lr, **kwargs)
        # "lamda" is MXNet's spelling of the option; keep it so configs carry over.
        self.lamda = check_option("lamda", lamda, minimum=0.0)
        self.momentum = check_option("momentum", momentum, minimum=0.0, below=1.0)
        self.ms_decay = check_option("ms_decay", ms_decay, minimum=0.0, below=1.0)
        for flag, value in (("per_sender", per_sender), ("adaptive", adaptive)):
            if not isinstance(value, bool):
                raise ValueError(f"optimizer option {flag} must be true or false, got {value!r}")
        self.per_sender = per_sender
        self.adaptive = adaptive
        self.needs_pull_notes = per_sender
        # key -> sender -> the weights that sender last pulled (per-sender rule only).
        self._pulled: dict[Hashable, dict[str, np.ndarray]] = {}

    def config_name(self) -> str:
        return "dcasgd" if self.per_sender else "dcasgd_shared"

    def extra_config(self) -> dict[str, JSONScalar]:
        config: dict[str, JSONScalar] = {"lamda": self.lamda, "momentum": self.momentum}
        if self.adaptive:
            config.update(adaptive=True, ms_decay=self.ms_decay)
        return config

    def create_state(self, key: Hashable, weight: np.ndarray) -> DCASGDState:
        state: DCASGDState = {"backup": np.array(weight, dtype=np.float32, copy=True)}
        if self.momentum:
            state["momentum"] = np.zeros(weight.shape, np.float32)
        if self.adaptive:
            state["mean_square"] = np.zeros(weight.shape, np.float32)
        return state

    def note_pull(self, key: Hashable, sender: str, weight: np.ndarray) -> None:
        """Record that ``sender`` now holds ``weight`` for ``key`` (its next ``w_bak``)."""
        if not self.per_sender:
            return
        by_sender = self._pulled.setdefault(key, {})
        kept = by_sender.get(sender)
        if kept is None or kept.shape != weight.shape:
            by_sender[sender] = np.array(weight, dtype=np.float32, copy=True)
        else:
            np.copyto(kept, weight, casting="same_kind")

    def pulled_weight(self, key: Hashable, sender: str) -> np.ndarray | None:
        """The backup kept for ``sender`` (None if it never pulled); for inspection."""
        return self._pulled.get(key, {}).get(sender)

    def forget_sender(self, sender: str) -> None:
        """Drop a departed sender's backups (they cost one model copy per sender)."""
        for by_sender in self._pulled.values():
            by_sender.pop(sender, None)

    def update(
        self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: DCASGDState, *, sender: str | None = None
    ) -> None:
        check_shapes(weight, grad)
        if self.per_sender:
            if sender is None:
                raise ValueError(
                    "dcasgd keeps a backup per sender and needs update(..., sender=name); "
                    "use 'dcasgd_shared' for MXNet's single-backup rule"
                )
            w_bak = self._pulled.get(key, {}).get(sender, state["backup"])
        else:
            w_bak = state["backup"]
        w = as_float32(weight)
        g = self._prepared_grad(grad)
        lam: np.floating | np.ndarray = np.float32(self.lamda)
        mean_square = state.get("mean_square")
        if mean_square is not None:
            mean_square *= np.float32(self.ms_decay)
            mean_square += np.float32(1.0 - self.ms_decay) * g * g
            lam = adaptive_lambda(self.lamda, mean_square)
        # delta = -lr * (g + wd*w + lam*g*g*(w - w_bak))
        delta = g * g
        delta *= lam
        delta *= w - w_bak
        delta += g
        if self.wd:
            delta += np.float32(self.wd) * w
        delta *= np.float32(-self.lr)
        if not self.per_sender:
            np.copyto(state["backup"], w)  # w_prev <- the weight before this update
        velocity = state.get("momentum")
        if velocity is not None:
            velocity *= np.float32(self.momentum)
            velocity += delta
            delta = velocity
        w += delta
        write_back(weight, w)
