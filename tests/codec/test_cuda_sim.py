"""Runs the CUDA kernel tests in numba's CUDA simulator, in a subprocess.

CI runs plain ``pytest`` once, without a GPU and without ``NUMBA_ENABLE_CUDASIM``; the
simulator must be switched on before ``numba.cuda`` is first imported, hence the
subprocess. This makes sure the CUDA kernels are exercised on every CI run.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

CUDA_TESTS = Path(__file__).resolve().parent / "test_cuda.py"
MIN_TESTS = 6


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"),
                    reason="already running inside the simulator")
def test_cuda_kernels_pass_in_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(CUDA_TESTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= MIN_TESTS, out[-2000:]
    assert not re.search(r"\d+ skipped", out), out[-2000:]


def test_a_cuda_target_that_cannot_load_is_named_with_its_fix():
    """numba-cuda under numpy 2.5 fails every kernel's first launch deep inside numba
    (``module 'numpy' has no attribute 'row_stack'``, seen on an H200): the kernels'
    module says so in one line, with what to install, when it is imported (on a real
    GPU; the simulator has no such target to check)."""
    import numpy as np

    from geomx.codec import cudasim

    def broken(name):
        raise AttributeError("module 'numpy' has no attribute 'row_stack'")

    def absent(name):
        raise ImportError(f"No module named {name!r}")

    with pytest.raises(ImportError) as info:
        cudasim.check_target_loads(broken)
    assert str(info.value).startswith(f"Numba's CUDA target does not load under numpy "
                                      f"{np.__version__} (module 'numpy' has no attribute "
                                      "'row_stack')")
    assert "numpy<2.5" in str(info.value)
    cudasim.check_target_loads(absent)  # nothing to check: no error
