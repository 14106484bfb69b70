"""The optimizer protocol: how a server turns a received gradient into new weights.

GeoMX installs the optimizer on the global servers (``kv.set_optimizer``) and runs
``updater(key, received, stored)`` once per key and round (docs/geomx-behaviour.md §2.1,
§3.2). We keep MXNet 1.x's shape of the contract:

* ``create_state(key, weight)`` makes the per-key state (momentum buffers, ...);
* ``update(key, weight, grad, state)`` changes ``weight`` *in place*;
* ``rescale_grad`` multiplies the gradient first; then, as MXNet's operators do, the SGD
  family (sgd, momentum, NAG, AdaGrad, AdaDelta, FTRL, Signum, LAMB, DC-ASGD) clips with
  ``clip_gradient`` before weight decay ``wd`` enters, and the Adam family (Adam,
  RMSProp, Adamax, Nadam) adds ``wd * w`` before clipping. Each module states its rule.

Two additions for the per-sender DC-ASGD rule: ``update`` takes ``sender=`` (the node
that pushed), and ``note_pull(key, sender, weight)`` tells the optimizer what model a
sender just pulled. Optimizers that do not care ignore both, so a server can always
pass them; ``needs_pull_notes`` lets it skip the call.

The arithmetic runs in float32 whatever the stored dtype (a float16 key is updated in
float32 and rounded back), and optimizers are shipped to servers as JSON
(``to_config()``), never pickled as GeoMX does.

**State contract.** What ``create_state`` returns, and ``update`` mutates in place, is
one of: ``None``; a float32 ``np.ndarray``; a tuple of them; or a ``dict`` from ``str``
to a float32 ndarray, a float or an int (e.g. Adam's ``{"mean", "var", "t"}``). Nothing
else -- no dataclasses, no None inside containers -- so a checkpoint can save and restore
any optimizer's states generically, without pickle. Arrays have the weight's shape and are
C-contiguous (the kernels update them through flat views).

**Two implementations of every elementwise update.** ``_kernel_update`` runs a Numba
kernel (``geomx/optim/kernels.py``: one pass over memory, chunks on a thread pool) and
``_numpy_update`` the same formula as whole-array numpy operations. The kernel is used
when the state holds only contiguous float32 arrays and ``use_kernels`` says so: ``None``
(default) for arrays of at least :data:`KERNEL_MIN_ELEMENTS` elements, ``True`` always,
``False`` never (``GEOMX_OPTIM_KERNELS`` sets the process's default: ``0`` never, ``1``
always). The numpy path is the readable reference the tests hold the kernels to.

Why small arrays skip the kernel by default: the first kernel call of a process costs
about a second of CPU (importing Numba, then loading its CPU target, which imports SciPy
for BLAS), and each server of a real job is a process of its own. On a small array the
kernel saves a few microseconds per update, so a small model (the digits MLP: 4,810
parameters) would need hundreds of thousands of updates to win that second back.
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

__all__ = ["Optimizer", "OptimizerBase", "JSONScalar", "KERNEL_MIN_ELEMENTS",
           "kernels_enabled_by_default"]

JSONScalar = None | bool | int | float | str


#: Smallest array (elements) the kernels update when ``use_kernels`` is None (the default):
#: 256 KiB of float32, where a kernel's single pass starts to save tens of microseconds
#: per update over numpy's dozen.
KERNEL_MIN_ELEMENTS = 1 << 16


def kernels_enabled_by_default() -> bool | None:
    """New optimizers' ``use_kernels``: None (kernels for arrays of at least
    :data:`KERNEL_MIN_ELEMENTS`), or ``GEOMX_OPTIM_KERNELS``: ``0`` False, ``1`` True."""
    value = os.environ.get("GEOMX_OPTIM_KERNELS", "").strip().lower()
    if not value:
        return None
    return value not in ("0", "false", "no", "off")


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


def check_option(
    name: str,
    value: float,
    *,
    minimum: float | None = None,
    below: float | None = None,
    above: float | None = None,
) -> float:
    """``value`` as a float, or a ValueError naming the option and its allowed range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"optimizer option {name} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"optimizer option {name} must be >= {minimum}, got {value!r}")
    if below is not None and value >= below:
        raise ValueError(f"optimizer option {name} must be < {below}, got {value!r}")
    if above is not None and value <= above:
        raise ValueError(f"optimizer option {name} must be > {above}, got {value!r}")
    return float(value)


def check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"optimizer option {name} must be true or false, got {value!r}")
    return value


def check_optional(name: str, value: float | None, *, minimum: float | None = None) -> float | None:
    """An option that may be None (off), else a finite number >= ``minimum``."""
    return None if value is None else check_option(name, value, minimum=minimum)


class OptimizerBase:
    """Shared hyper-parameters and gradient preparation (MXNet 1.x ``Optimizer``)."""

    name: ClassVar[str] = ""
    needs_pull_notes: bool = False
    #: Has a Numba kernel (``_kernel_update``); otherwise only ``_numpy_update`` runs.
    has_kernel: ClassVar[bool] = False

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
        #: Run the Numba kernel when one exists: None for arrays of at least
        #: :data:`KERNEL_MIN_ELEMENTS`, True always, False never (not part of the config: a
        #: property of the process, not of the optimizer; the result is the same to
        #: float32 rounding).
        self.use_kernels: bool | None = kernels_enabled_by_default()

    # -- protocol -----------------------------------------------------------------------
    def create_state(self, key: Hashable, weight: np.ndarray) -> Any:
        return None

    def update(
        self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: Any, *, sender: str | None = None
    ) -> None:
        """Update ``weight`` in place: through the kernel when possible, else numpy."""
        check_shapes(weight, grad)
        use = self.use_kernels
        if (self.has_kernel and (use or (use is None and weight.size >= KERNEL_MIN_ELEMENTS))
                and kernel_ready(state)):
            work = np.ascontiguousarray(weight, dtype=np.float32)
            g = np.ascontiguousarray(grad, dtype=np.float32).reshape(-1)
            self._kernel_update(key, work.reshape(-1), g, state)
        else:
            work = as_float32(weight)
            self._numpy_update(key, work, grad, state)
        write_back(weight, work)

    def _numpy_update(self, key: Hashable, w: np.ndarray, grad: np.ndarray, state: Any) -> None:
        """The update as numpy operations on the float32 working weight ``w`` (in place)."""
        raise NotImplementedError

    def _kernel_update(self, key: Hashable, w: np.ndarray, g: np.ndarray, state: Any) -> None:
        """The update through a Numba kernel; ``w`` and ``g`` are flat float32 views."""
        raise NotImplementedError

    @property
    def _clip_bound(self) -> np.float32:
        """The clip bound as the kernels take it (negative: off, MXNet's -1)."""
        return np.float32(-1.0 if self.clip_gradient is None else self.clip_gradient)

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
    def _decayed_grad(self, w: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """``clip(rescale_grad * grad) + wd * w``: the SGD family's gradient (MXNet's
        sgd_update order: clip, then weight decay)."""
        g = self._prepared_grad(grad)
        if self.wd:
            g += np.float32(self.wd) * w
        return g

    def _clipped_decayed_grad(self, w: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """``clip(rescale_grad * grad + wd * w)``: the Adam family's gradient (MXNet's
        adam/rmsprop/adamax/nadam order: weight decay, then clip)."""
        g = np.array(grad, dtype=np.float32, copy=True)
        if self.rescale_grad != 1.0:
            g *= np.float32(self.rescale_grad)
        if self.wd:
            g += np.float32(self.wd) * w
        if self.clip_gradient is not None:
            np.clip(g, -self.clip_gradient, self.clip_gradient, out=g)
        return g

    def _prepared_grad(self, grad: np.ndarray) -> np.ndarray:
        """A fresh float32 ``clip(rescale_grad * grad)``: never aliases the caller's array."""
        g = np.array(grad, dtype=np.float32, copy=True)
        if self.rescale_grad != 1.0:
            g *= np.float32(self.rescale_grad)
        if self.clip_gradient is not None:
            np.clip(g, -self.clip_gradient, self.clip_gradient, out=g)
        return g


def kernel_ready(state: Any) -> bool:
    """Whether every array in ``state`` (see the state contract) is a contiguous float32
    array, so the kernels can update it through a flat view."""
    if state is None:
        return True
    if isinstance(state, np.ndarray):
        return state.dtype == np.float32 and state.flags.c_contiguous
    values = state.values() if isinstance(state, dict) else state if isinstance(state, tuple) else None
    if values is None:
        return False
    return all(
        (v.dtype == np.float32 and v.flags.c_contiguous) if isinstance(v, np.ndarray) else isinstance(v, (int, float))
        for v in values
    )


def flat(array: np.ndarray) -> np.ndarray:
    """A 1-D view of a contiguous state array (never a copy)."""
    view = array.reshape(-1)
    assert np.may_share_memory(view, array) or array.size == 0
    return view


def kernels():  # type: ignore[no-untyped-def]
    """The kernel module, imported on first use (it imports numba)."""
    from geomx.optim import kernels as module

    return module


def check_shapes(weight: np.ndarray, grad: np.ndarray) -> None:
    if weight.shape != np.shape(grad):
        raise ValueError(f"gradient shape {np.shape(grad)} does not match weight shape {weight.shape}")


def as_float32(weight: np.ndarray) -> np.ndarray:
    """The weight itself if float32, else a float32 working copy (write back after)."""
    return weight if weight.dtype == np.float32 else weight.astype(np.float32)


def write_back(weight: np.ndarray, work: np.ndarray) -> None:
    if work is not weight:
        weight[...] = work
