"""RMSProp, both of MXNet 1.x's variants (``mx.optimizer.RMSProp``).

``centered=False`` -- Tieleman & Hinton (2012), MXNet's ``rmsprop_update``:

    g  = clip(rescale_grad * grad + wd * w)
    n <- (1 - gamma1) * g^2 + gamma1 * n
    w <- w - lr * g / sqrt(n + epsilon)

``centered=True`` -- Graves (2013, eqs. 38-45), MXNet's ``rmspropalex_update``: also a
running mean of the gradient, subtracted to estimate its variance, and a momentum term:

    n     <- (1 - gamma1) * g^2 + gamma1 * n
    gbar  <- (1 - gamma1) * g + gamma1 * gbar
    delta <- gamma2 * delta - lr * g / sqrt(n - gbar^2 + epsilon)
    w     <- w + delta

Both then clip the weight to ``[-clip_weights, clip_weights]`` when ``clip_weights`` is
set. ``epsilon`` is inside the square root (unlike Adam's). Options and defaults are
MXNet's: lr=0.001, gamma1=0.9, gamma2=0.9 (centered only), epsilon=1e-8.
State: ``(n,)`` or ``(n, gbar, delta)``. Kernels: ``kernels.rmsprop`` and
``kernels.rmsprop_centered``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.base import JSONScalar, OptimizerBase, check_flag, check_option, check_optional, flat, kernels

__all__ = ["RMSProp"]


class RMSProp(OptimizerBase):
    """RMSProp; ``centered=True`` is Graves's variant (name ``rmsprop_centered`` too)."""

    name = "rmsprop"
    has_kernel = True

    def __init__(
        self,
        lr: float = 0.001,
        gamma1: float = 0.9,
        gamma2: float = 0.9,
        epsilon: float = 1e-8,
        centered: bool = False,
        clip_weights: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(lr=lr, **kwargs)
        self.gamma1 = check_option("gamma1", gamma1, minimum=0.0, below=1.0)
        self.gamma2 = check_option("gamma2", gamma2, minimum=0.0, below=1.0)
        self.epsilon = check_option("epsilon", epsilon, minimum=0.0)
        self.centered = check_flag("centered", centered)
        self.clip_weights = check_optional("clip_weights", clip_weights, minimum=0.0)

    def config_name(self) -> str:
        return "rmsprop_centered" if self.centered else "rmsprop"

    def extra_config(self) -> dict[str, JSONScalar]:
        config: dict[str, JSONScalar] = {"gamma1": self.gamma1, "epsilon": self.epsilon,
                                         "clip_weights": self.clip_weights}
        if self.centered:
            config["gamma2"] = self.gamma2
        return config

    def create_state(self, key: Hashable, weight: np.ndarray) -> tuple[np.ndarray, ...]:
        count = 3 if self.centered else 1
        return tuple(np.zeros(weight.shape, np.float32) for _ in range(count))

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: tuple[np.ndarray, ...]) -> None:
        f = np.float32
        g = self._clipped_decayed_grad(w, grad)
        n = state[0]
        n *= f(self.gamma1)
        n += f(1.0 - self.gamma1) * (g * g)
        if not self.centered:
            w -= f(self.lr) * (g / np.sqrt(n + f(self.epsilon)))
        else:
            gbar, delta = state[1], state[2]
            gbar *= f(self.gamma1)
            gbar += f(1.0 - self.gamma1) * g
            delta *= f(self.gamma2)
            delta -= f(self.lr) * g / np.sqrt(n - gbar * gbar + f(self.epsilon))
            w += delta
        if self.clip_weights is not None:
            np.clip(w, -self.clip_weights, self.clip_weights, out=w)

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: tuple[np.ndarray, ...]) -> None:
        f = np.float32
        k = kernels()
        clip_w = f(-1.0 if self.clip_weights is None else self.clip_weights)
        if not self.centered:
            k.run(k.rmsprop, (w, g, flat(state[0])), f(self.lr), f(self.gamma1), f(1.0 - self.gamma1),
                  f(self.epsilon), f(self.rescale_grad), f(self.wd), self._clip_bound, clip_w)
        else:
            k.run(k.rmsprop_centered, (w, g, *(flat(s) for s in state)), f(self.lr), f(self.gamma1),
                  f(1.0 - self.gamma1), f(self.gamma2), f(self.epsilon), f(self.rescale_grad), f(self.wd),
                  self._clip_bound, clip_w)
