"""Adam as MXNet 1.x runs it on GeoMX's global server (docs/geomx-behaviour.md §2.2).

    g   = clip(rescale_grad * grad + wd * w)
    m  <- beta1 * m + (1 - beta1) * g
    v  <- beta2 * v + (1 - beta2) * g^2
    lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
    w  <- w - lr_t * m / (sqrt(v) + epsilon)

``t`` counts the updates *of this key* (MXNet's per-index update count), starting at 1.
The bias correction is folded into the learning rate and ``epsilon`` sits outside the
square root, so results differ slightly from Kingma & Ba's ``m_hat / (sqrt(v_hat) + eps)``.
MXNet's adam operator clips after adding weight decay; we follow it.

State: ``{"mean": m, "var": v, "t": t}`` (float32 arrays, int count). Kernel:
``kernels.adam``, one pass.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, check_option, flat, kernels

__all__ = ["Adam", "AdamState", "moments_state"]

#: ``{"mean": ndarray, "var": ndarray, "t": int}``
AdamState = dict[str, Any]


def moments_state(weight: np.ndarray, first: str = "mean", second: str = "var") -> dict[str, Any]:
    """Two zeroed float32 moment arrays of the weight's shape and an update count 0."""
    return {first: np.zeros(weight.shape, np.float32), second: np.zeros(weight.shape, np.float32), "t": 0}


class Adam(OptimizerBase):
    """MXNet 1.x Adam (defaults lr=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8)."""

    name = "adam"
    has_kernel = True

    def __init__(
        self,
        lr: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        **kwargs: Any,
    ) -> None:
        super().__init__(lr=lr, **kwargs)
        self.beta1 = check_option("beta1", beta1, minimum=0.0, below=1.0)
        self.beta2 = check_option("beta2", beta2, minimum=0.0, below=1.0)
        self.epsilon = check_option("epsilon", epsilon, minimum=0.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}

    def create_state(self, key: Hashable, weight: np.ndarray) -> AdamState:
        return moments_state(weight)

    def _lr_t(self, state: AdamState) -> float:
        state["t"] += 1
        t = state["t"]
        return self.lr * math.sqrt(1.0 - self.beta2**t) / (1.0 - self.beta1**t)

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: AdamState) -> None:
        lr_t = self._lr_t(state)
        g = self._clipped_decayed_grad(w, grad)
        mean, var = state["mean"], state["var"]
        mean *= np.float32(self.beta1)
        mean += np.float32(1.0 - self.beta1) * g
        g *= g
        var *= np.float32(self.beta2)
        var += np.float32(1.0 - self.beta2) * g
        denom = np.sqrt(var)
        denom += np.float32(self.epsilon)
        w -= np.float32(lr_t) * mean / denom

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: AdamState) -> None:
        f = np.float32
        lr_t = self._lr_t(state)
        kernels().run(
            kernels().adam, (w, g, flat(state["mean"]), flat(state["var"])),
            f(lr_t), f(self.beta1), f(1.0 - self.beta1), f(self.beta2), f(1.0 - self.beta2),
            f(self.epsilon), f(self.rescale_grad), f(self.wd), self._clip_bound,
        )
