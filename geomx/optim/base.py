"""The optimizer protocol: how a server turns a received gradient into new weights.

GeoMX installs the optimizer on the global servers (``kv.set_optimizer``) and runs
``updater(key, received, stored)`` once per key and round (geomx-behaviour.md §2.1,
§3.2). We keep MXNet 1.x's shape of the contract:

* ``create_state(key, weight)`` makes the per-key state (momentum buffers, ...);
* ``update(key, weight, grad, state)`` changes ``weight`` *in place*;
* ``rescale_grad`` multiplies the gradient first, then ``clip_gradient`` clips it,
  then weight decay ``wd`` is added, as MXNet's update operators do.

Two additions for the per-sender DC-ASGD rule: ``update`` takes ``sender=`` (the node
that pushed), and ``note_pull(key, sender, weight)`` tells the optimizer what model a
sender just pulled. Optimizers that do not care ignore both, so a server can always
pass them; ``needs_pull_notes`` lets it skip the call.

The arithmetic runs in float32 whatever the stored dtype (a float16 key is updated in
float32 and rounded back), and optimizers are shipped to servers as JSON
(``to_config()``), never pickled as GeoMX does.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

__all__ = ["Optimizer", "OptimizerBase", "JSONScalar"]

JSONScalar = None | bool | int | float | str


@runtime_checkable
class Optimizer(Protocol):
    """What a server needs from an optimizer."""

    name: str
    lr: float
    wd: float
    rescale_grad: float
    needs_pull_notes: bool

    def create_state(self, key: Hashable, weight: np.ndarray) -> Any: ...

    def update(
        self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: Any, *, sender: str | None = None
    ) -> None: ...

    def note_pull(self, key: Hashable, sender: str, weight: np.ndarray) -> None: ...

    def to_config(self) -> dict[str, JSONScalar]: ...


def check_option(name: str, value: float, *, minimum: float | None = None, below: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"optimizer option {name} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"optimizer option {name} must be >= {minimum}, got {value!r}")
    if below is not None and value >= below:
        raise ValueError(f"optimizer option {name} must be < {below}, got {value!r}")
    return float(value)


class OptimizerBase:
    """Shared hyper-parameters and gradient preparation (MXNet 1.x ``Optimizer``)."""

    name: ClassVar[str] = ""
    needs_pull_notes: bool = False

    def __init__(
        self,
        lr: float = 0.01,
        wd: float = 0.0,
        rescale_grad: float = 1.0,
        clip_gradient: float | None = None,
    ) -> None:
        self.lr = check_option("lr", lr, minimum=0.0)
        self.wd = check_option("wd", wd, minimum=0.0)
        self.rescale_grad = check_option("rescale_grad", rescale_grad)
        self.clip_gradient = None if clip_gradient is None else check_option("clip_gradient", clip_gradient, minimum=0.0)

    # -- protocol -----------------------------------------------------------------------
    def create_state(self, key: Hashable, weight: np.ndarray) -> Any:
        return None

    def update(
        self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: Any, *, sender: str | None = None
    ) -> None:
        raise NotImplementedError

    def note_pull(self, key: Hashable, sender: str, weight: np.ndarray) -> None:
        """Only the per-sender DC-ASGD rule keeps track of pulls."""

    def to_config(self) -> dict[str, JSONScalar]:
        """JSON-able description; ``optimizer_from_config`` rebuilds an equal optimizer."""
        config: dict[str, JSONScalar] = {
            "name": self.config_name(),
            "lr": self.lr,
            "wd": self.wd,
            "rescale_grad": self.rescale_grad,
            "clip_gradient": self.clip_gradient,
        }
        config.update(self.extra_config())
        return config

    def config_name(self) -> str:
        return self.name

    def extra_config(self) -> dict[str, JSONScalar]:
        """Options beyond the shared four; subclasses extend."""
        return {}

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.to_config().items() if k != "name")
        return f"{type(self).__name__}({options})"

    # -- helpers ------------------------------------------------------------------------
    def _work_and_grad(self, weight: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The float32 working weight and ``clip(rescale_grad * grad) + wd * w``: the common
        start of the SGD family's updates (Adam orders weight decay and clipping its own way)."""
        check_shapes(weight, grad)
        w = as_float32(weight)
        g = self._prepared_grad(grad)
        if self.wd:
            g += np.float32(self.wd) * w
        return w, g

    def _prepared_grad(self, grad: np.ndarray) -> np.ndarray:
        """A fresh float32 ``clip(rescale_grad * grad)``: never aliases the caller's array."""
        g = np.array(grad, dtype=np.float32, copy=True)
        if self.rescale_grad != 1.0:
            g *= np.float32(self.rescale_grad)
        if self.clip_gradient is not None:
            np.clip(g, -self.clip_gradient, self.clip_gradient, out=g)
        return g


def check_shapes(weight: np.ndarray, grad: np.ndarray) -> None:
    if weight.shape != np.shape(grad):
        raise ValueError(f"gradient shape {np.shape(grad)} does not match weight shape {weight.shape}")


def as_float32(weight: np.ndarray) -> np.ndarray:
    """The weight itself if float32, else a float32 working copy (write back after)."""
    return weight if weight.dtype == np.float32 else weight.astype(np.float32)


def write_back(weight: np.ndarray, work: np.ndarray) -> None:
    if work is not weight:
        weight[...] = work
