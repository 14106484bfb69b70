"""SGD, heavy-ball momentum and Nesterov momentum, as MXNet 1.x computes them.

* ``sgd``: ``w <- w - lr * (g + wd * w)``.
* ``momentum`` (MXNet ``SGD(momentum=mu)``, Polyak's heavy ball):
  ``m <- mu * m - lr * (g + wd * w); w <- w + m``.
* ``nesterov`` (MXNet ``NAG``): ``g' = g + wd * w; m <- mu * m + g';
  w <- w - lr * (g' + mu * m)`` (Sutskever et al. 2013, in the form MXNet uses).

``g`` is always ``clip(rescale_grad * grad)``. Each has a one-pass Numba kernel
(``kernels.sgd`` / ``momentum`` / ``nesterov``); the numpy code below is the reference.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, check_option, flat, kernels

__all__ = ["SGD", "Momentum", "Nesterov"]


class SGD(OptimizerBase):
    """Plain stochastic gradient descent; no state."""

    name = "sgd"
    has_kernel = True

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: Any) -> None:
        step = self._decayed_grad(w, grad)
        step *= np.float32(self.lr)
        w -= step

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: Any) -> None:
        f = np.float32
        kernels().run(kernels().sgd, (w, g), f(self.lr), f(self.rescale_grad), f(self.wd), self._clip_bound)


class Momentum(OptimizerBase):
    """Heavy-ball momentum; the state is the velocity ``m`` (float32, starts at 0)."""

    name = "momentum"
    has_kernel = True

    def __init__(self, lr: float = 0.01, momentum: float = 0.9, **kwargs: Any) -> None:
        super().__init__(lr=lr, **kwargs)
        self.momentum = check_option("momentum", momentum, minimum=0.0, below=1.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"momentum": self.momentum}

    def create_state(self, key: Hashable, weight: np.ndarray) -> np.ndarray:
        return np.zeros(weight.shape, dtype=np.float32)

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: np.ndarray) -> None:
        g = self._decayed_grad(w, grad)
        state *= np.float32(self.momentum)
        g *= np.float32(self.lr)
        state -= g
        w += state

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: np.ndarray) -> None:
        self._run_kernel(kernels().momentum, w, g, state)

    def _run_kernel(self, kernel: Any, w: np.ndarray, g: np.ndarray, state: np.ndarray) -> None:
        f = np.float32
        kernels().run(kernel, (w, g, flat(state)), f(self.lr), f(self.momentum), f(self.rescale_grad),
                      f(self.wd), self._clip_bound)


class Nesterov(Momentum):
    """Nesterov accelerated gradient (MXNet ``NAG``); state is the momentum buffer."""

    name = "nesterov"

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: np.ndarray) -> None:
        g = self._decayed_grad(w, grad)
        state *= np.float32(self.momentum)
        state += g
        g += np.float32(self.momentum) * state
        g *= np.float32(self.lr)
        w -= g

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: np.ndarray) -> None:
        self._run_kernel(kernels().nesterov, w, g, state)
