"""Every result says what produced it (geomx/provenance.py): the run folder's
summary.json and the fidelity report carry the code's commit and source digest, the
build, the library versions and the machine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from geomx import provenance as prov


def test_a_run_folder_records_what_produced_it(tmp_path):
    from geomx.experiment import run_scenario
    from geomx.scenario import load_scenario

    root = Path(__file__).resolve().parents[1]
    s = load_scenario(root / "scenarios" / "quickstart.toml",
                      ["run.iterations=4", "metrics.plot=false", f"run.out_dir={tmp_path}"])
    run_scenario(s)
    (summary,) = tmp_path.glob("*/summary.json")
    table = json.loads(summary.read_text())["provenance"]
    import numba
    import numpy as np

    import geomx
    assert table["geomx"]["version"] == geomx.__version__
    assert table["geomx"]["source_digest"] == prov.package_digest()
    assert table["build"] == prov.PURE_BUILD
    assert (table["numpy"], table["numba"]) == (np.__version__, numba.__version__)
    assert table["machine"]["cores"] >= 1 and table["machine"]["cpu"]
    assert table["host_profile"] is None
    # the same install gives the same table: it never disturbs a determinism check
    assert table == json.loads(json.dumps(prov.provenance()))


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True, env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                          "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                                          "PATH": "/usr/bin:/bin"}).stdout.strip()


@pytest.mark.parametrize("layout", ["loose", "packed", "worktree", "detached"])
def test_the_commit_is_read_without_git(tmp_path, layout):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "m.py").write_text("x = 1\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    head = _git(repo, "rev-parse", "HEAD")
    where = repo / "pkg"
    if layout == "packed":
        _git(repo, "pack-refs", "--all")
        assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    elif layout == "worktree":
        (repo / "pkg" / "m.py").write_text("x = 2\n")
        _git(repo, "commit", "-qam", "two")
        _git(repo, "worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"), head)
        where = tmp_path / "wt" / "pkg"
    elif layout == "detached":
        _git(repo, "checkout", "-q", "--detach")
    assert prov.git_commit(where) == head


def test_an_install_outside_a_checkout_has_no_commit(tmp_path):
    (tmp_path / "site-packages" / "geomx").mkdir(parents=True)
    assert prov.git_commit(tmp_path / "site-packages" / "geomx") is None


def test_the_fidelity_report_carries_provenance(tmp_path, monkeypatch):
    from geomx import fidelity

    def fake_compare(scenario, overrides, *, out_dir, shapers):
        return {"emu": {"window_s_per_iter": 0.1}, "real": {"window_s_per_iter": 0.11}}

    monkeypatch.setattr(fidelity, "compare", fake_compare)
    monkeypatch.setattr(fidelity, "plot_report", lambda rows, shapers, path: None)
    fidelity.run_report([fidelity.Case("q", "quickstart.toml", ())], out_dir=tmp_path,
                        progress=None)
    report = json.loads((tmp_path / "fidelity.json").read_text())
    assert report["provenance"]["geomx"]["source_digest"] == prov.package_digest()
    assert report["cases"][0]["case"] == "q"
    assert (tmp_path / "fidelity.md").read_text().rstrip().splitlines()[-1].startswith(
        "Produced by geomx ")
