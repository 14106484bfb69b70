"""What produced a result: the code, its build, the libraries and the machine.

A figure copied from a run folder into a paper must lead back to the run that made it,
so every ``summary.json`` (and every report built from runs: fidelity, claims) carries a
``provenance`` table:

* ``geomx``: the release (``__version__``, which only moves at releases), the git commit
  of the checkout it runs from when there is one, and ``source_digest``, a hash of the
  source files actually imported (two installs with the same digest run the same code,
  whatever their version string or commit says; uncommitted edits change it);
* ``build``: ``"pure"`` (the Python modules) or the compiled build's name;
* ``host_profile``: the calibration profile the emulator charged, if any;
* ``python``, ``numpy`` (and its BLAS), ``numba``: the versions that decide floating-point
  results (docs/golden-logs.md says which of them emulated figures depend on);
* ``machine``: the CPU model, the cores this process may use and the platform.

Nothing here is timed or random: the same install on the same machine gives the same
table, so it never disturbs a determinism check.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from pathlib import Path
from typing import Any

#: The build a process runs: the pure-Python modules (the reference implementation).
PURE_BUILD = "pure"


@functools.cache
def package_digest() -> str:
    """A hash of the source files of the geomx this process imports (paths and bytes)."""
    import geomx

    root = Path(geomx.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_commit(start: Path | None = None) -> str | None:
    """The commit checked out where geomx's source lives (read from ``.git`` without
    running git), or None for an install that is not a git checkout."""
    import geomx

    here = (start or Path(geomx.__file__).parent).resolve()
    for folder in (here, *here.parents):
        git = folder / ".git"
        if git.is_file():  # a worktree: "gitdir: PATH"
            text = git.read_text(errors="replace").strip()
            if not text.startswith("gitdir:"):
                return None
            git = (folder / text.split(":", 1)[1].strip()).resolve()
        if git.is_dir():
            return _resolve_head(git)
    return None


def _resolve_head(git: Path) -> str | None:
    try:
        head = (git / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head or None
    ref = head.split(":", 1)[1].strip()
    common = git
    commondir = git / "commondir"
    if commondir.is_file():  # a linked worktree keeps its refs in the main repository
        common = (git / commondir.read_text().strip()).resolve()
    for base in (git, common):
        try:
            return (base / ref).read_text().strip()
        except OSError:
            pass
    try:
        for line in (common / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name.strip() == ref:
                return sha
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _blas() -> str | None:
    import numpy as np

    try:
        config = np.show_config(mode="dicts")
    except TypeError:  # numpy < 1.25 prints only
        return None
    blas = (config or {}).get("Build Dependencies", {}).get("blas", {})
    name, version = blas.get("name"), blas.get("version")
    return f"{name} {version}" if name else None


@functools.cache
def _static() -> dict[str, Any]:
    import numba
    import numpy as np

    from geomx import __version__

    return {
        "geomx": {"version": __version__, "commit": git_commit(),
                  "source_digest": package_digest()},
        "build": PURE_BUILD,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": _blas(),
        "numba": numba.__version__,
        "machine": {"cpu": _cpu_model(), "cores": _usable_cores(),
                    "platform": f"{sys.platform}-{platform.machine()}"},
    }


def provenance(*, host_profile: str | None = None) -> dict[str, Any]:
    """The provenance table of a result produced by this process (see the module's
    docstring); ``host_profile``: the calibration profile the emulator charged."""
    table = dict(_static())
    table["host_profile"] = host_profile
    return table


def provenance_line(table: dict[str, Any]) -> str:
    """One line for the foot of a Markdown report: what produced it."""
    g = table.get("geomx", {})
    commit = (g.get("commit") or "no git checkout")[:12]
    m = table.get("machine", {})
    profile = table.get("host_profile") or "none"
    return (f"Produced by geomx {g.get('version')} ({table.get('build')} build, commit {commit}, "
            f"source {g.get('source_digest')}), Python {table.get('python')}, numpy "
            f"{table.get('numpy')} ({table.get('blas') or 'BLAS unknown'}), numba "
            f"{table.get('numba')}, host profile {profile}, on {m.get('cpu')} "
            f"({m.get('cores')} cores, {m.get('platform')}).")
