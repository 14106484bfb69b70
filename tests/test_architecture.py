"""The layers of geomx hold: import-linter's contract (pyproject.toml) is kept, every
package of geomx is placed in it, no module imports itself back through a cycle, and
the contract catches an upward import (so a kept contract means something).

docs/architecture.md, "Layers", draws the same picture for a person.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import networkx as nx
import pytest

from tests.helpers.paths import ROOT

LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def _contracts() -> list[dict]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LINT, "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_import_contracts_are_kept():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_every_geomx_package_is_in_a_layer():
    layers = next(c for c in _contracts() if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.replace(":", "|").split("|")}
    tops = {f"geomx.{p.stem}" for p in (ROOT / "geomx").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__")
            or (p.is_dir() and (p / "__init__.py").exists())}
    assert tops - named == set(), "add these to the layers contract in pyproject.toml"
    assert named - tops == set(), "the contract names packages that do not exist"


def test_no_import_cycles():
    g = grimp.build_graph("geomx", cache_dir=None)
    graph = nx.DiGraph()
    for m in g.modules:
        graph.add_node(m)
        for imported in g.find_modules_directly_imported_by(m):
            graph.add_edge(m, imported)
    cycles = list(nx.simple_cycles(graph))
    assert cycles == [], cycles


def test_an_upward_import_breaks_the_contract(tmp_path):
    """A node module that imports the emulator is reported, by import-linter, by name."""
    shutil.copytree(ROOT / "geomx", tmp_path / "geomx",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    spec = tmp_path / "geomx" / "node" / "spec.py"
    spec.write_text(spec.read_text() + "\nimport geomx.sim.loop  # an upward import\n")
    r = _lint(tmp_path)
    assert r.returncode != 0
    assert "BROKEN" in r.stdout and "geomx.node.spec -> geomx.sim.loop" in r.stdout, r.stdout


def test_a_node_role_importing_a_policy_module_breaks_the_contract(tmp_path):
    """A node role that reaches for a concrete policy (here P3) instead of the policy API
    is reported by name: the roles hold no policy."""
    shutil.copytree(ROOT / "geomx", tmp_path / "geomx",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    role = tmp_path / "geomx" / "node" / "local_server.py"
    role.write_text(role.read_text() + "\nimport geomx.sched.p3  # a policy in a role\n")
    r = _lint(tmp_path)
    assert r.returncode != 0
    assert "node roles hold no policy" in r.stdout and "BROKEN" in r.stdout, r.stdout
    assert "geomx.node.local_server -> geomx.sched.p3" in r.stdout, r.stdout
