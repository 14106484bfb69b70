"""Nadam as MXNet 1.x's ``mx.optimizer.Nadam`` (Dozat, "Incorporating Nesterov Momentum
into Adam", 2016): Adam with a warming momentum schedule and a Nesterov look-ahead.

    g       = clip(rescale_grad * grad + wd * w)
    mu_t    = beta1 * (1 - 0.5 * 0.96^(t * schedule_decay))
    mu_t1   = beta1 * (1 - 0.5 * 0.96^((t + 1) * schedule_decay))
    S      <- S * mu_t                    (the momentum schedule, starts at 1)
    m      <- beta1 * m + (1 - beta1) * g
    v      <- beta2 * v + (1 - beta2) * g^2
    m_bar   = (1 - mu_t) * g / (1 - S) + mu_t1 * m / (1 - S * mu_t1)
    w      <- w - lr * m_bar / (sqrt(v / (1 - beta2^t)) + epsilon)

``t`` counts this key's updates. One deliberate difference: MXNet 1.x keeps a single
``m_schedule`` on the optimizer and multiplies it on every update of *any* key, so a
key's schedule depends on how many other keys the model has; we keep ``S`` per key (in
the state), which equals MXNet's for a one-key model and is what the paper means.
Defaults: lr=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, schedule_decay=0.004.
State: ``{"mean", "var", "t", "m_schedule"}``. Kernel: ``kernels.nadam``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from geomx.optim.adam import moments_state
from geomx.optim.base import JSONScalar, OptimizerBase, check_option, flat, kernels

__all__ = ["Nadam"]


class Nadam(OptimizerBase):
    """Nesterov-accelerated Adam with MXNet's momentum schedule."""

    name = "nadam"
    has_kernel = True

    def __init__(
        self,
        lr: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        schedule_decay: float = 0.004,
        **kwargs: Any,
    ) -> None:
        super().__init__(lr=lr, **kwargs)
        self.beta1 = check_option("beta1", beta1, minimum=0.0, below=1.0)
        self.beta2 = check_option("beta2", beta2, minimum=0.0, below=1.0)
        self.epsilon = check_option("epsilon", epsilon, minimum=0.0)
        self.schedule_decay = check_option("schedule_decay", schedule_decay, minimum=0.0)

    def extra_config(self) -> dict[str, JSONScalar]:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                "schedule_decay": self.schedule_decay}

    def create_state(self, key: Hashable, weight: np.ndarray) -> dict[str, Any]:
        state = moments_state(weight)
        state["m_schedule"] = 1.0
        return state

    def _coefficients(self, state: dict[str, Any]) -> tuple[float, float, float]:
        """Advance the count and schedule; the factors of g, m and v in the update."""
        state["t"] += 1
        t = state["t"]
        mu_t = self.beta1 * (1.0 - 0.5 * 0.96 ** (t * self.schedule_decay))
        mu_next = self.beta1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * self.schedule_decay))
        state["m_schedule"] = schedule = state["m_schedule"] * mu_t
        return (1.0 - mu_t) / (1.0 - schedule), mu_next / (1.0 - schedule * mu_next), 1.0 / (1.0 - self.beta2**t)

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: dict[str, Any]) -> None:
        f = np.float32
        coef_g, coef_m, coef_v = self._coefficients(state)
        g = self._clipped_decayed_grad(w, grad)
        mean, var = state["mean"], state["var"]
        mean *= f(self.beta1)
        mean += f(1.0 - self.beta1) * g
        var *= f(self.beta2)
        var += f(1.0 - self.beta2) * g * g
        m_bar = f(coef_g) * g + f(coef_m) * mean
        w -= f(self.lr) * m_bar / (np.sqrt(var * f(coef_v)) + f(self.epsilon))

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: dict[str, Any]) -> None:
        f = np.float32
        coef_g, coef_m, coef_v = self._coefficients(state)
        kernels().run(kernels().nadam, (w, g, flat(state["mean"]), flat(state["var"])), f(self.lr), f(self.beta1),
                      f(1.0 - self.beta1), f(self.beta2), f(1.0 - self.beta2), f(coef_g), f(coef_m), f(coef_v),
                      f(self.epsilon), f(self.rescale_grad), f(self.wd), self._clip_bound)
