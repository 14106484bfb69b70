"""Tests that need the launcher to fork its nodes, from a process that may no longer
be able to (geomx/runtime/forked.py, ``fork_usable``)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from tests.helpers.paths import ROOT
from tests.helpers.procs import sigint_as_from_a_terminal


def delegate_unless_fork_usable(request: Any) -> bool:
    """False when this process may fork nodes: the test goes on here. Otherwise the
    test runs again in a new interpreter, where nothing ran before it, must pass there,
    and this returns True (the caller returns at once).

    Why: earlier tests in the same pytest worker may have left a Numba parallel pool or
    a thread running, and the launcher does not fork from such a process (it starts
    nodes by exec instead); which files a worker ran first varies from run to run."""
    from geomx.runtime.forked import fork_usable

    if fork_usable():
        return False
    assert os.environ.get("GEOMX_TEST_DELEGATED") != "1", "cannot fork even in a new process"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{request.path}::{request.node.name}"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "GEOMX_TEST_DELEGATED": "1"},
                       preexec_fn=sigint_as_from_a_terminal)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    return True
