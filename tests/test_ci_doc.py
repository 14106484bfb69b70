"""docs/ci.md stays true: its project files and its GitHub Actions workflow
(docs/ci/geomx-wan.yml) are built and run here as the workflow runs them on a runner.

The project is written from the doc's titled code blocks; geomx is installed into a fresh
virtual environment as a wheel built from a copy of this checkout (the doc's install
step, word for word: the copy sits where the workflow checks geomx out); then every
``run:`` step runs with bash -eo pipefail in the project folder, as Actions runs it. The
kernel-shaped step needs root, ``ip`` and ``tc``: it runs where they are (here, and on a
CI runner with sudo) and is skipped with the reason elsewhere. The virtual environment
sees this interpreter's packages (``--system-site-packages``), so installing geomx's
dependencies downloads nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

DOC = ROOT / "docs" / "ci.md"
WORKFLOW = ROOT / "docs" / "ci" / "geomx-wan.yml"


def titled_blocks(markdown: str) -> dict[str, str]:
    """The doc's code blocks whose info string has ``title=NAME``, by name."""
    return {m.group(1): m.group(2) for m in
            re.finditer(r"^```\w+ title=(\S+)\n(.*?)^```$", markdown, re.M | re.S)}


def workflow_steps(text: str) -> list[tuple[str, str]]:
    """(name, script) of each step of the workflow that has a ``run:``, in order."""
    steps: list[tuple[str, str]] = []
    lines = text.splitlines()
    name = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        found = re.match(r"^\s*-?\s*name:\s*(.*)$", line)
        if found and not line.strip().startswith("name: geomx"):
            name = found.group(1).strip()
        run = re.match(r"^(\s*)-?\s*run:\s*(.*)$", line)
        if run:
            indent, rest = len(run.group(1)), run.group(2).strip()
            if rest != "|":
                steps.append((name, rest))
            else:
                body = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip()) > indent):
                    body.append(lines[i])
                    i += 1
                width = min(len(b) - len(b.lstrip()) for b in body if b.strip())
                steps.append((name, "\n".join(b[width:] for b in body).strip() + "\n"))
                continue
        i += 1
    return steps


def _copy_checkout(dest: Path) -> None:
    """This checkout's files as ``actions/checkout`` would give them (tracked and new
    files, nothing git ignores: no build folders, run folders or caches)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:  # not a git checkout: the tree without its build outputs
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "*.egg-info", "__pycache__", "runs", ".venv"))
        return
    for rel in listed.stdout.decode().split("\0"):
        if rel and (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)


class Runner:
    """The project folder and the environment its steps run in."""

    def __init__(self, project: Path, venv: Path):
        self.project = project
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "PYTHONHOME")}
        self.env.update(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
                        VIRTUAL_ENV=str(venv), GITHUB_WORKSPACE=str(project))

    def step(self, script: str, timeout: int = 300) -> subprocess.CompletedProcess:
        if shutil.which("sudo") is None and os.geteuid() == 0:
            script = script.replace("sudo -E ", "")  # root already, and no sudo to call
        return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                              cwd=self.project, env=self.env, capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture(scope="module")
def doc_blocks() -> dict[str, str]:
    return titled_blocks(DOC.read_text())


@pytest.fixture(scope="module")
def steps() -> list[tuple[str, str]]:
    return workflow_steps(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def installed(tmp_path_factory, doc_blocks, steps) -> Runner:
    """The doc's project with geomx installed by the workflow's install step."""
    base = tmp_path_factory.mktemp("ci-doc")
    project = base / "project"
    for name, text in doc_blocks.items():
        if name.startswith("docs/") or name.endswith(".sh"):
            continue
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    _copy_checkout(project / "geomx-src")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    runner = Runner(project, venv)
    name, script = steps[0]
    assert "pip install" in script, f"the first run: step installs geomx, not {name!r}"
    proc = runner.step(script, timeout=600)
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return runner


def test_the_doc_quotes_the_workflow_file_as_it_is(doc_blocks):
    assert doc_blocks["docs/ci/geomx-wan.yml"] == WORKFLOW.read_text()


def test_the_doc_has_the_projects_files(doc_blocks):
    assert {"job.toml", "train.py", "tests/test_wan.py", "pytest.ini",
            "make-baseline.sh"} <= set(doc_blocks)


@pytest.mark.slow
def test_the_workflow_steps_run_as_written(installed, doc_blocks, steps):
    """Every step but the kernel-shaped one, with the geomx the install step installed."""
    where = installed.step("python -c 'import geomx; print(geomx.__file__)'")
    assert where.stdout.startswith(str(Path(installed.env["VIRTUAL_ENV"]))), where.stdout
    proc = installed.step(doc_blocks["make-baseline.sh"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (installed.project / "baseline" / "job" / "summary.json").is_file()
    ran = []
    for name, script in steps[1:]:
        if "shaper=kernel" in script:
            continue
        proc = installed.step(script)
        assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        ran.append((name, proc.stdout))
    out = "\n".join(o for _, o in ran)
    assert len(ran) == 3
    # the installed wheel registers the plugin by its entry point; -p no:geomx turns it off
    assert "--geomx-runtime" in installed.step("python -m pytest --help").stdout
    assert "--geomx-runtime" not in installed.step("python -m pytest -p no:geomx --help").stdout
    assert re.search(r"expect: ok   bytes_wan <= 2MB: measured", out)
    assert "regression: ok   final_accuracy" in out
    assert re.search(r"\b3 passed\b", out)


def _kernel_problem() -> str | None:
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        return "needs root (or sudo)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2's {tool}"
    return None


@pytest.mark.slow
def test_the_kernel_shaped_step_runs_where_there_is_root(installed, steps):
    problem = _kernel_problem()
    if problem:
        pytest.skip(f"the kernel-shaped step {problem}")
    [(name, script)] = [(n, s) for n, s in steps if "shaper=kernel" in s]
    proc = installed.step(script, timeout=300)
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "expect: ok   final_accuracy >= 0.9" in proc.stdout
    run = next((installed.project / "runs-kernel").glob("job-*"))
    assert (run / "kernel_wan.sh").is_file()  # the kernel built the WAN
