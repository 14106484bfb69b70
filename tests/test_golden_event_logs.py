"""Every emulated scenario still writes the events.jsonl it wrote when its golden hash was
recorded: a refactor that changes one byte of an event log fails here.

The hashes, the commit they were recorded at and the overrides that keep each run short
are in tests/golden/event_logs.json, written by ``python tools/golden_logs.py record``;
docs/golden-logs.md says when to re-record. The scenarios run in one child process
(``tools/golden_logs.py hashes``) through the public run API (``load_scenario`` +
``run_scenario``), as a user's script would, with the tool's reference CPU environment:
float kernels pick instructions by the CPU they find, and the logs must not depend on it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers.paths import ROOT


def _golden_tool() -> ModuleType:
    """tools/golden_logs.py, a script outside the package, imported by path: the test and
    the tool share its list of scenario files, its hashing and its failure report."""
    name = "golden_logs_tool"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "golden_logs.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
    return sys.modules[name]


TOOL = _golden_tool()
GOLDEN = TOOL.load_golden()
RECORDED = GOLDEN["scenarios"]


@pytest.fixture(scope="module")
def current_hashes(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Every recorded scenario run once, in one child process with the reference CPU."""
    out = tmp_path_factory.mktemp("golden-runs")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "golden_logs.py"), "hashes",
                           "--out", str(out)], cwd=ROOT, env=TOOL.env_for(ROOT),
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"golden_logs.py hashes failed:\n{proc.stderr[-3000:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["path"]: r for r in rows}


# None of them is marked slow: the longest, netstorm_9dc_dynamic, takes about 8 s of CPU.
# The first one's setup runs them all (about 80 s of CPU; several times that on a machine
# shared with other work, or beside a second pytest worker), hence its own time limit.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("entry", [pytest.param(e, id=e["path"]) for e in RECORDED])
def test_event_log_is_byte_identical_to_the_recorded_one(entry, current_hashes):
    row = current_hashes.get(entry["path"])
    assert row is not None, f"{entry['path']} was not run; {TOOL.rerecord_advice(GOLDEN)}"
    assert row["sha256"] is not None, (
        f"{entry['path']} with {entry['overrides']} wrote no events.jsonl "
        f"({row.get('error', 'no error')}); {TOOL.rerecord_advice(GOLDEN)}")
    if row["sha256"] != entry["sha256"]:
        pytest.fail(TOOL.difference_report(entry["path"], entry["sha256"], row["sha256"],
                                           Path(row["log"]), GOLDEN), pytrace=False)


def test_golden_file_accounts_for_every_scenario_file():
    """A scenario file without a golden hash (or a hash for a file that is gone) fails, so
    the harness cannot silently miss one; only the files the golden file lists under
    ``not_run``, each with its reason, are left out."""
    files = set(TOOL.scenario_files(ROOT))
    recorded = {e["path"] for e in RECORDED}
    not_run = {e["path"] for e in GOLDEN["not_run"]}
    problems = []
    if missing := sorted(files - recorded - not_run):
        problems.append(f"no golden log for {', '.join(missing)}: once the test passes for the "
                        f"others, add them with: python {TOOL.THIS_SCRIPT} record (a file that "
                        f"cannot run under the test extra goes in NOT_RUNNABLE in "
                        f"{TOOL.THIS_SCRIPT}, with the reason)")
    if gone := sorted((recorded | not_run) - files):
        problems.append(f"golden entries for files that no longer exist: {', '.join(gone)}; "
                        f"re-record: python {TOOL.THIS_SCRIPT} record")
    if both := sorted(recorded & not_run):
        problems.append(f"both recorded and not run: {', '.join(both)}")
    assert not problems, "\n".join(problems)


def test_golden_runs_use_the_overrides_the_tool_would_apply_now():
    """The tool's shrinking overrides (and a scenario file's own settings that call for
    one, such as events turned off) are what the golden file recorded."""
    planned, skipped = TOOL.plan(ROOT)
    now = {e["path"]: e["overrides"] for e in planned}
    stale = [f"{e['path']}: recorded with {e['overrides']}, the tool now applies "
             f"{now[e['path']]}" for e in RECORDED if e["path"] in now
             and now[e["path"]] != e["overrides"]]
    assert not stale, ("\n".join(stale) + f"\nre-record at the recorded commit: python "
                       f"{TOOL.THIS_SCRIPT} record --at {GOLDEN['commit']['sha']}")
    assert {e["path"] for e in skipped} == {e["path"] for e in GOLDEN["not_run"]}


#: The numpy release the cross-version check runs (the test extra installs the newest):
#: an older minor with another bundled OpenBLAS. Emulated event logs are the same bytes
#: under numpy 2.2, 2.3 and 2.4; numpy 1.26 rounds differently in the scenarios that
#: sum, sort or sparsify large arrays (8 of 38: docs/golden-logs.md).
OTHER_NUMPY = "numpy==2.2.6"
#: Scenarios whose logs numpy 1.26 changes: the ones a numpy difference shows up in first.
NUMPY_SENSITIVE = ("scenarios/quickstart_bsc.toml", "scenarios/dgt.toml",
                   "examples/cnn_hfa.toml")


@pytest.mark.slow
def test_event_logs_do_not_depend_on_the_numpy_release(tmp_path):
    """The same code under another numpy (and its OpenBLAS) writes the same event logs:
    a venv that sees this environment's packages, with only numpy replaced."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    python = venv / "bin" / "python"
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", OTHER_NUMPY],
                         capture_output=True, text=True)
    assert pip.returncode == 0, f"could not install {OTHER_NUMPY}: {pip.stderr[-2000:]}"
    env = {**TOOL.env_for(ROOT), "PYTHONPATH": str(ROOT)}
    probe = subprocess.run([str(python), "-c", "import numpy; print(numpy.__version__)"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == OTHER_NUMPY.split("==")[1]
    proc = subprocess.run([str(python), str(ROOT / "tools" / "golden_logs.py"), "hashes",
                           "--out", str(tmp_path / "runs"), "--only", *NUMPY_SENSITIVE],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {r["path"]: r["sha256"] for r in
           (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    want = {e["path"]: e["sha256"] for e in RECORDED if e["path"] in NUMPY_SENSITIVE}
    assert len(want) == len(NUMPY_SENSITIVE) and got == want


def test_the_files_a_recording_names_as_uncommitted_keep_their_whole_path(tmp_path):
    """``git status --porcelain`` starts a modified file's line with a blank status column;
    the recorded list names ``geomx/...``, whichever line the file is on."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "geomx").mkdir()
    for name in ("a.py", "b.py"):
        (tmp_path / "geomx" / name).write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "start")
    (tmp_path / "geomx" / "a.py").write_text("x = 2\n")
    (tmp_path / "geomx" / "b.py").write_text("x = 2\n")
    assert TOOL.uncommitted(tmp_path) == ["geomx/a.py", "geomx/b.py"]
