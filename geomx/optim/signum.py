"""Signum and signSGD as MXNet 1.x's ``mx.optimizer.Signum`` (Bernstein et al., ICML 2018).

With ``momentum > 0`` (Signum, MXNet's ``signum_update``):

    m <- momentum * m - (1 - momentum) * wd * w - (1 - momentum) * clip(rescale_grad * grad)
    w <- (1 - lr * wd_lh) * w + lr * sign(m)

With ``momentum = 0`` (signSGD, MXNet's ``signsgd_update``, which ignores rescale_grad
and clip_gradient -- they cannot change a sign -- and uses ``wd`` as decoupled decay):

    w <- (1 - lr * wd) * w - lr * sign(grad)

``wd_lh`` is the decoupled weight decay of Loshchilov & Hutter. Note the state holds the
*negative* momentum, as MXNet's does. Defaults: lr=0.01, momentum=0.9, wd_lh=0.
Only the sign of each coordinate moves the weight, which is why signSGD pairs with 1-bit
gradient compression. State: the momentum array, or None for signSGD.
Kernels: ``kernels.signum`` and ``kernels.signsgd``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, check_option, flat, kernels

__all__ = ["Signum"]


class Signum(OptimizerBase):
    """Sign of the momentum (Signum) or of the gradient (signSGD, momentum=0)."""

    name = "signum"
    has_kernel = True

    def __init__(self, lr: float = 0.01, momentum: float = 0.9, wd_lh: float = 0.0, **kwargs: Any) -> None:
        super().__init__(lr=lr, **kwargs)
        self.momentum = check_option("momentum", momentum, minimum=0.0, below=1.0)
        self.wd_lh = check_option("wd_lh", wd_lh, minimum=0.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"momentum": self.momentum, "wd_lh": self.wd_lh}

    def create_state(self, key: Hashable, weight: np.ndarray) -> np.ndarray | None:
        return np.zeros(weight.shape, np.float32) if self.momentum else None

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: np.ndarray | None) -> None:
        f = np.float32
        if state is None:
            step = f(self.lr) * np.sign(np.asarray(grad, dtype=np.float32))
            w *= f(1.0) - f(self.lr) * f(self.wd)
            w -= step
            return
        c = f(1.0 - self.momentum)
        g = self._prepared_grad(grad)
        state *= f(self.momentum)
        state -= c * f(self.wd) * w
        state -= c * g
        w *= f(1.0) - f(self.lr) * f(self.wd_lh)
        w += f(self.lr) * np.sign(state)

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: np.ndarray | None) -> None:
        f = np.float32
        k = kernels()
        if state is None:
            k.run(k.signsgd, (w, g), f(self.lr), f(self.wd))
        else:
            k.run(k.signum, (w, g, flat(state)), f(self.lr), f(self.momentum), f(1.0 - self.momentum),
                  f(self.rescale_grad), f(self.wd), f(self.wd_lh), self._clip_bound)
