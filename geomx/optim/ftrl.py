"""FTRL-proximal as MXNet 1.x's ``mx.optimizer.Ftrl`` (McMahan et al., "Ad Click
Prediction: a View from the Trenches", KDD 2013).

    g  = clip(rescale_grad * grad)
    z <- z + g - (sqrt(n + g^2) - sqrt(n)) * w / lr
    n <- n + g^2
    w  = (sign(z) * lamda1 - z) / ((beta + sqrt(n)) / lr + wd)   if |z| > lamda1, else 0

The weight is recomputed from ``z`` and ``n`` each step (not decremented), which is what
gives FTRL its exact zeros under the L1 term ``lamda1``. Options and defaults are MXNet's:
lr=0.1 (must be > 0: it divides), lamda1=0.01, beta=1. State: ``(z, n)``.
Kernel: ``kernels.ftrl``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, check_option, flat, kernels

__all__ = ["Ftrl"]


class Ftrl(OptimizerBase):
    """Follow-the-regularized-leader with per-coordinate rates and an L1 term."""

    name = "ftrl"
    has_kernel = True

    def __init__(self, lr: float = 0.1, lamda1: float = 0.01, beta: float = 1.0, **kwargs: Any) -> None:
        super().__init__(lr=lr, **kwargs)
        check_option("lr", lr, above=0.0)
        # "lamda1" is MXNet's spelling; keep it so configs carry over.
        self.lamda1 = check_option("lamda1", lamda1, minimum=0.0)
        self.beta = check_option("beta", beta, minimum=0.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"lamda1": self.lamda1, "beta": self.beta}

    def create_state(self, key: Hashable, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(weight.shape, np.float32), np.zeros(weight.shape, np.float32)

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray,
                      state: tuple[np.ndarray, np.ndarray]) -> None:
        f = np.float32
        z, n = state
        g = self._prepared_grad(grad)
        g2 = g * g
        z += g - (np.sqrt(n + g2) - np.sqrt(n)) * w / f(self.lr)
        n += g2
        active = np.abs(z) > f(self.lamda1)
        new = (np.sign(z) * f(self.lamda1) - z) / ((f(self.beta) + np.sqrt(n)) / f(self.lr) + f(self.wd))
        w[...] = np.where(active, new, f(0.0))

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray,
                       state: tuple[np.ndarray, np.ndarray]) -> None:
        f = np.float32
        kernels().run(kernels().ftrl, (w, g, flat(state[0]), flat(state[1])), f(self.lr), f(self.lamda1),
                      f(self.beta), f(self.rescale_grad), f(self.wd), self._clip_bound)
