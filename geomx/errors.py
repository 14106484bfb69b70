"""Errors a runtime raises that the layers above it catch.

``JobFailed`` is raised by both the emulator path (:mod:`geomx.experiment`) and the real
runtime's launcher (:mod:`geomx.runtime.launcher`); it lives below both so the launcher
need not import the experiment module that starts it. Users import it from
:mod:`geomx.experiment`, which re-exports it.
"""

from __future__ import annotations

__all__ = ["JobFailed"]


class JobFailed(RuntimeError):
    """A node of the job failed; the message names it."""
