"""Is numba's CUDA simulator on? (``NUMBA_ENABLE_CUDASIM=1``, what CI runs the CUDA kernels
under.) Can Numba's CUDA target compile here? A leaf module so that both the device
dispatcher (``device.py``) and the kernels (``cuda_kernels.py``, which ``device`` imports
lazily) can ask without importing each other.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def simulator_enabled() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def check_target_loads(import_module: Any = None) -> None:
    """Raise one line with the fix where Numba's CUDA target cannot compile a kernel in
    this environment. numba-cuda's array support refers to numpy names that numpy 2.5
    removed (``np.row_stack``); there every kernel's first launch fails with an
    AttributeError from deep inside numba (seen on an H200 with numpy 2.5.2 and numba
    0.68). ``import_module`` is :func:`importlib.import_module`, replaceable by a test."""
    import importlib

    load = import_module or importlib.import_module
    try:
        load("numba.cuda.np.arrayobj")
    except ImportError:  # a numba without that module (the simulator, older numba)
        return
    except AttributeError as exc:
        raise ImportError(
            f"Numba's CUDA target does not load under numpy {np.__version__} ({exc}), so the "
            "CUDA codecs cannot compile; install a numpy this numba supports (numpy<2.5 "
            "worked with numba 0.68) or keep the tensors on the host") from None
