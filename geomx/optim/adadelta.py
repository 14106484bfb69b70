"""AdaDelta as MXNet 1.x's ``mx.optimizer.AdaDelta`` (Zeiler, arXiv:1212.5701).

    g          = clip(rescale_grad * grad)
    acc_g     <- rho * acc_g + (1 - rho) * g^2
    delta      = sqrt(acc_delta + epsilon) / sqrt(acc_g + epsilon) * g
    acc_delta <- rho * acc_delta + (1 - rho) * delta^2
    w         <- w - (delta + wd * w)

There is no learning rate: MXNet 1.x's AdaDelta ignores ``learning_rate`` (the unit
correction ``sqrt(acc_delta)/sqrt(acc_g)`` is the step size), and so does this one --
``lr`` is accepted and kept in the config for uniformity but does not enter the update.
Weight decay is subtracted unscaled, as MXNet does. Defaults: rho=0.9, epsilon=1e-5.
State: ``(acc_g, acc_delta)``. Kernel: ``kernels.adadelta``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, check_option, flat, kernels

__all__ = ["AdaDelta"]


class AdaDelta(OptimizerBase):
    """Step sizes from running averages of squared gradients and squared steps."""

    name = "adadelta"
    has_kernel = True

    def __init__(self, lr: float = 1.0, rho: float = 0.9, epsilon: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(lr=lr, **kwargs)
        self.rho = check_option("rho", rho, minimum=0.0, below=1.0)
        self.epsilon = check_option("epsilon", epsilon, above=0.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"rho": self.rho, "epsilon": self.epsilon}

    def create_state(self, key: Hashable, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(weight.shape, np.float32), np.zeros(weight.shape, np.float32)

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray,
                      state: tuple[np.ndarray, np.ndarray]) -> None:
        f = np.float32
        acc_g, acc_delta = state
        g = self._prepared_grad(grad)
        acc_g *= f(self.rho)
        acc_g += f(1.0 - self.rho) * g * g
        delta = np.sqrt(acc_delta + f(self.epsilon)) / np.sqrt(acc_g + f(self.epsilon)) * g
        acc_delta *= f(self.rho)
        acc_delta += f(1.0 - self.rho) * delta * delta
        if self.wd:
            delta += f(self.wd) * w
        w -= delta

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray,
                       state: tuple[np.ndarray, np.ndarray]) -> None:
        f = np.float32
        kernels().run(kernels().adadelta, (w, g, flat(state[0]), flat(state[1])), f(self.rho), f(1.0 - self.rho),
                      f(self.epsilon), f(self.rescale_grad), f(self.wd), self._clip_bound)
