"""Is numba's CUDA simulator on? (``NUMBA_ENABLE_CUDASIM=1``, what CI runs the CUDA kernels
under.) A leaf module so that both the device dispatcher (``device.py``) and the kernels
(``cuda_kernels.py``, which ``device`` imports lazily) can ask without importing each other.
"""

from __future__ import annotations

import os


def simulator_enabled() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
