"""AdaGrad as MXNet 1.x's ``mx.optimizer.AdaGrad`` (Duchi, Hazan & Singer, JMLR 2011).

    g        = clip(rescale_grad * grad)
    history <- history + g^2
    w       <- w - lr * (g / sqrt(history + eps) + wd * w)

Weight decay is added *after* the adaptive scaling, not into ``g`` (MXNet's dense
path). The option is MXNet's ``eps`` (default 1e-7). State: the ``history`` array.
Kernel: ``kernels.adagrad``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, check_option, flat, kernels

__all__ = ["AdaGrad"]


class AdaGrad(OptimizerBase):
    """Per-coordinate learning rates from the sum of squared gradients (lr=0.01, eps=1e-7)."""

    name = "adagrad"
    has_kernel = True

    def __init__(self, lr: float = 0.01, eps: float = 1e-7, **kwargs: Any) -> None:
        super().__init__(lr=lr, **kwargs)
        self.eps = check_option("eps", eps, minimum=0.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"eps": self.eps}

    def create_state(self, key: Hashable, weight: np.ndarray) -> np.ndarray:
        return np.zeros(weight.shape, np.float32)

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: np.ndarray) -> None:
        g = self._prepared_grad(grad)
        state += g * g
        step = g / np.sqrt(state + np.float32(self.eps))
        if self.wd:
            step += np.float32(self.wd) * w
        w -= np.float32(self.lr) * step

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: np.ndarray) -> None:
        f = np.float32
        kernels().run(kernels().adagrad, (w, g, flat(state)), f(self.lr), f(self.eps), f(self.rescale_grad),
                      f(self.wd), self._clip_bound)
