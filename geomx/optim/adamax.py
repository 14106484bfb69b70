"""Adamax as MXNet 1.x's ``mx.optimizer.Adamax`` (Kingma & Ba, arXiv:1412.6980 §7).

    g    = clip(rescale_grad * grad + wd * w)
    m   <- beta1 * m + (1 - beta1) * g
    u   <- max(beta2 * u, |g|)
    w   <- w - lr / (1 - beta1^t) * m / u

``t`` counts this key's updates. One deliberate difference: where ``u == 0`` (a
coordinate that has only ever had zero gradients -- e.g. the weights of an always-black
pixel) MXNet computes ``0 / 0`` and writes NaN into the weight; we leave that coordinate
unchanged, which is the limit of the update as the gradient goes to zero.
Defaults: lr=0.002, beta1=0.9, beta2=0.999. State: ``{"mean", "u", "t"}``.
Kernel: ``kernels.adamax``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.adam import moments_state
from geomx.optim.base import JSONScalar, OptimizerBase, check_option, flat, kernels

__all__ = ["Adamax"]


class Adamax(OptimizerBase):
    """Adam with the infinity norm in place of the second moment."""

    name = "adamax"
    has_kernel = True

    def __init__(self, lr: float = 0.002, beta1: float = 0.9, beta2: float = 0.999, **kwargs: Any) -> None:
        super().__init__(lr=lr, **kwargs)
        self.beta1 = check_option("beta1", beta1, minimum=0.0, below=1.0)
        self.beta2 = check_option("beta2", beta2, minimum=0.0, below=1.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"beta1": self.beta1, "beta2": self.beta2}

    def create_state(self, key: Hashable, weight: np.ndarray) -> dict[str, Any]:
        return moments_state(weight, "mean", "u")

    def _lr_t(self, state: dict[str, Any]) -> float:
        state["t"] += 1
        return self.lr / (1.0 - self.beta1 ** state["t"])

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: dict[str, Any]) -> None:
        f = np.float32
        lr_t = self._lr_t(state)
        g = self._clipped_decayed_grad(w, grad)
        mean, u = state["mean"], state["u"]
        mean *= f(self.beta1)
        mean += f(1.0 - self.beta1) * g
        np.maximum(f(self.beta2) * u, np.abs(g), out=u)
        seen = u > 0
        w[seen] -= f(lr_t) * mean[seen] / u[seen]

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: dict[str, Any]) -> None:
        f = np.float32
        lr_t = self._lr_t(state)
        kernels().run(kernels().adamax, (w, g, flat(state["mean"]), flat(state["u"])), f(lr_t), f(self.beta1),
                      f(1.0 - self.beta1), f(self.beta2), f(self.rescale_grad), f(self.wd), self._clip_bound)
