"""Adam as MXNet 1.x runs it on GeoMX's global server (geomx-behaviour.md §2.2).

    g   = clip(rescale_grad * grad + wd * w)
    m  <- beta1 * m + (1 - beta1) * g
    v  <- beta2 * v + (1 - beta2) * g^2
    lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
    w  <- w - lr_t * m / (sqrt(v) + epsilon)

``t`` counts the updates *of this key* (MXNet's per-index update count), starting at 1.
The bias correction is folded into the learning rate and ``epsilon`` sits outside the
square root, so results differ slightly from Kingma & Ba's ``m_hat / (sqrt(v_hat) + eps)``.
MXNet's adam operator clips after adding weight decay; we follow it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, as_float32, check_option, check_shapes, write_back

__all__ = ["Adam", "AdamState"]


@dataclass
class AdamState:
    """First and second moment estimates (float32) and this key's update count."""

    mean: np.ndarray
    var: np.ndarray
    t: int = 0


class Adam(OptimizerBase):
    """MXNet 1.x Adam (defaults lr=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8)."""

    name = "adam"

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
        return AdamState(np.zeros(weight.shape, np.float32), np.zeros(weight.shape, np.float32))

    def update(
        self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: AdamState, *, sender: str | None = None
    ) -> None:
        check_shapes(weight, grad)
        state.t += 1
        t = state.t
        lr_t = self.lr * math.sqrt(1.0 - self.beta2**t) / (1.0 - self.beta1**t)
        w = as_float32(weight)
        g = np.array(grad, dtype=np.float32, copy=True)
        if self.rescale_grad != 1.0:
            g *= np.float32(self.rescale_grad)
        if self.wd:
            g += np.float32(self.wd) * w
        if self.clip_gradient is not None:
            np.clip(g, -self.clip_gradient, self.clip_gradient, out=g)
        state.mean *= np.float32(self.beta1)
        state.mean += np.float32(1.0 - self.beta1) * g
        g *= g
        state.var *= np.float32(self.beta2)
        state.var += np.float32(1.0 - self.beta2) * g
        denom = np.sqrt(state.var)
        denom += np.float32(self.epsilon)
        w -= np.float32(lr_t) * state.mean / denom
        write_back(weight, w)
