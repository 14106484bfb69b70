"""Where an array lives, and the lazy door to the CUDA kernels.

Dispatch rule: numpy arrays (and anything ``np.asarray`` accepts) run the Numba CPU
kernels; anything exposing ``__cuda_array_interface__`` (numba device arrays, CuPy
arrays, PyTorch CUDA tensors) runs the ``numba.cuda`` kernels, zero-copy through
``numba.cuda.as_cuda_array``. Under ``NUMBA_ENABLE_CUDASIM=1`` numba's simulated device
arrays (which have no ``__cuda_array_interface__``) count as CUDA arrays too, so the
CUDA path is testable on a machine without a GPU.

``numba.cuda`` is imported only when a CUDA array is actually seen: a CPU-only run never
pays for it.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

_cuda_kernels: ModuleType | None = None


def _is_simulated_device_array(x: Any) -> bool:
    t = type(x)
    return t.__module__.startswith("numba.cuda.simulator") and hasattr(x, "copy_to_host")


def is_cuda_array(x: Any) -> bool:
    """True for arrays that live on a CUDA device (or the numba CUDA simulator)."""
    if isinstance(x, np.ndarray):
        return False
    if hasattr(x, "__cuda_array_interface__"):
        return True
    return _is_simulated_device_array(x)


def backend(x: Any) -> str:
    """"cuda" or "cpu"."""
    return "cuda" if is_cuda_array(x) else "cpu"


def cuda_kernels() -> ModuleType:
    """The CUDA kernel module, imported on first use."""
    global _cuda_kernels
    if _cuda_kernels is None:
        _cuda_kernels = importlib.import_module("geomx.codec.cuda_kernels")
    return _cuda_kernels


def as_device(x: Any) -> Any:
    """A numba device-array view of a CUDA array (zero-copy)."""
    if _is_simulated_device_array(x):
        return x
    from numba import cuda

    if cuda.is_cuda_array(x) and not hasattr(x, "copy_to_host"):
        return cuda.as_cuda_array(x)
    return x


def to_host(x: Any) -> np.ndarray:
    """A numpy copy of a CUDA array; numpy arrays are returned as they are."""
    if is_cuda_array(x):
        return as_device(x).copy_to_host()
    return np.asarray(x)
