"""SGD, heavy-ball momentum and Nesterov momentum, as MXNet 1.x computes them.

* ``sgd``: ``w <- w - lr * (g + wd * w)``.
* ``momentum`` (MXNet ``SGD(momentum=mu)``, Polyak's heavy ball):
  ``m <- mu * m - lr * (g + wd * w); w <- w + m``.
* ``nesterov`` (MXNet ``NAG``): ``g' = g + wd * w; m <- mu * m + g';
  w <- w - lr * (g' + mu * m)`` (Sutskever et al. 2013, in the form MXNet uses).

``g`` is always ``clip(rescale_grad * grad)``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, check_option, write_back

__all__ = ["SGD", "Momentum", "Nesterov"]


class SGD(OptimizerBase):
    """Plain stochastic gradient descent; no state."""

    name = "sgd"

    def update(
        self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: Any, *, sender: str | None = None
    ) -> None:
        w, step = self._work_and_grad(weight, grad)
        step *= np.float32(self.lr)
        w -= step
        write_back(weight, w)


class Momentum(OptimizerBase):
    """Heavy-ball momentum; the state is the velocity ``m`` (float32, starts at 0)."""

    name = "momentum"

    def __init__(self, lr: float = 0.01, momentum: float = 0.9, **kwargs: Any) -> None:
        super().__init__(lr=lr, **kwargs)
        self.momentum = check_option("momentum", momentum, minimum=0.0, below=1.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"momentum": self.momentum}

    def create_state(self, key: Hashable, weight: np.ndarray) -> np.ndarray:
        return np.zeros(weight.shape, dtype=np.float32)

    def update(
        self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: np.ndarray, *, sender: str | None = None
    ) -> None:
        w, g = self._work_and_grad(weight, grad)
        state *= np.float32(self.momentum)
        g *= np.float32(self.lr)
        state -= g
        w += state
        write_back(weight, w)


class Nesterov(Momentum):
    """Nesterov accelerated gradient (MXNet ``NAG``); state is the momentum buffer."""

    name = "nesterov"

    def update(
        self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: np.ndarray, *, sender: str | None = None
    ) -> None:
        w, g = self._work_and_grad(weight, grad)
        state *= np.float32(self.momentum)
        state += g
        g += np.float32(self.momentum) * state
        g *= np.float32(self.lr)
        w -= g
        write_back(weight, w)
