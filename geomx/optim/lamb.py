"""LAMB as MXNet 1.x's ``mx.optimizer.LAMB`` (You et al., "Large Batch Optimization for
Deep Learning: Training BERT in 76 minutes", ICLR 2020), MXNet's two-phase operators
``lamb_update_phase1`` / ``lamb_update_phase2``:

    g    = clip(rescale_grad * grad)
    m   <- beta1 * m + (1 - beta1) * g
    v   <- beta2 * v + (1 - beta2) * g^2
    upd  = m_hat / (sqrt(v_hat) + epsilon) + wd * w
           (m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t) if bias_correction,
            else m and v)
    r1   = ||w||, clipped to [lower_bound, upper_bound] where those are set
    r2   = ||upd||
    w   <- w - lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1) * upd

The trust ratio ``r1 / r2`` is per key (MXNet's per parameter array): a layer-wise
learning rate. The norms are summed in float64 over fixed chunks (the same for any thread
count; MXNet sums in float32). Defaults: lr=0.001, beta1=0.9, beta2=0.999,
epsilon=1e-6, no bounds, bias_correction=true. State: ``{"mean", "var", "t"}``.
Kernels: ``kernels.lamb_phase1`` / ``lamb_phase2``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.adam import moments_state
from geomx.optim.base import JSONScalar, OptimizerBase, check_flag, check_option, check_optional, flat, kernels

__all__ = ["LAMB"]


class LAMB(OptimizerBase):
    """Adam direction scaled per layer by ||w|| / ||direction||."""

    name = "lamb"
    has_kernel = True

    def __init__(
        self,
        lr: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-6,
        lower_bound: float | None = None,
        upper_bound: float | None = None,
        bias_correction: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(lr=lr, **kwargs)
        self.beta1 = check_option("beta1", beta1, minimum=0.0, below=1.0)
        self.beta2 = check_option("beta2", beta2, minimum=0.0, below=1.0)
        self.epsilon = check_option("epsilon", epsilon, minimum=0.0)
        self.lower_bound = check_optional("lower_bound", lower_bound, minimum=0.0)
        self.upper_bound = check_optional("upper_bound", upper_bound, minimum=0.0)
        if self.lower_bound is not None and self.upper_bound is not None and self.lower_bound > self.upper_bound:
            raise ValueError(f"optimizer option lower_bound must be <= upper_bound ({self.upper_bound}), "
                             f"got {self.lower_bound}")
        self.bias_correction = check_flag("bias_correction", bias_correction)
        # The kernel path's buffer for the direction, reused across updates (a fresh
        # 100 MB array per update of a 25M-parameter key costs its page faults each time).
        self._scratch = np.empty(0, np.float32)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon, "lower_bound": self.lower_bound,
                "upper_bound": self.upper_bound, "bias_correction": self.bias_correction}

    def create_state(self, key: Hashable, weight: np.ndarray) -> dict[str, Any]:
        return moments_state(weight)

    def _corrections(self, state: dict[str, Any]) -> tuple[float, float]:
        state["t"] += 1
        if not self.bias_correction:
            return 1.0, 1.0
        t = state["t"]
        return 1.0 / (1.0 - self.beta1**t), 1.0 / (1.0 - self.beta2**t)

    def _trust_lr(self, w_norm: float, upd_norm: float) -> float:
        r1 = w_norm
        if self.lower_bound is not None:
            r1 = max(r1, self.lower_bound)
        if self.upper_bound is not None:
            r1 = min(r1, self.upper_bound)
        return self.lr * (r1 / upd_norm if r1 > 0.0 and upd_norm > 0.0 else 1.0)

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: dict[str, Any]) -> None:
        f = np.float32
        coef1, coef2 = self._corrections(state)
        g = self._prepared_grad(grad)
        mean, var = state["mean"], state["var"]
        mean *= f(self.beta1)
        mean += f(1.0 - self.beta1) * g
        var *= f(self.beta2)
        var += f(1.0 - self.beta2) * g * g
        upd = (mean * f(coef1)) / (np.sqrt(var * f(coef2)) + f(self.epsilon))
        if self.wd:
            upd += f(self.wd) * w
        w_norm = math.sqrt(float(np.dot(w.ravel().astype(np.float64), w.ravel().astype(np.float64))))
        upd_norm = math.sqrt(float(np.dot(upd.ravel().astype(np.float64), upd.ravel().astype(np.float64))))
        w -= f(self._trust_lr(w_norm, upd_norm)) * upd

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: dict[str, Any]) -> None:
        f = np.float32
        k = kernels()
        coef1, coef2 = self._corrections(state)
        if self._scratch.size < w.size:
            self._scratch = np.empty(w.size, np.float32)
        upd = self._scratch[: w.size]
        k.run(k.lamb_phase1, (w, g, flat(state["mean"]), flat(state["var"]), upd), f(self.beta1),
              f(1.0 - self.beta1), f(self.beta2), f(1.0 - self.beta2), f(coef1), f(coef2), f(self.epsilon),
              f(self.rescale_grad), f(self.wd), self._clip_bound)
        w_sq = math.fsum(k.run(k.sum_squares, (w,)))
        upd_sq = math.fsum(k.run(k.sum_squares, (upd,)))
        k.run(k.lamb_phase2, (w, upd), f(self._trust_lr(math.sqrt(w_sq), math.sqrt(upd_sq))))
