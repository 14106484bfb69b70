"""``geomx fidelity``: cases from scenario files and suites, the report's table and plot.

(The runs themselves are what tests/runtime/test_fidelity.py times; here the parts that
turn figures into a report, with made-up figures, and the refusals.)
"""

from __future__ import annotations


import pytest

from geomx.cli import main
from geomx.fidelity import Case, load_cases, plot_report, report_table

from tests.helpers.paths import ROOT


def test_the_suite_lists_every_shape_of_issue_13_and_each_case_loads():
    from geomx.scenario import load_scenario

    cases = load_cases([str(ROOT / "scenarios/fidelity/suite.toml")], ["run.seed=1"])
    names = " ".join(c.name for c in cases)
    for shape in ("quickstart", "asymmetric", "lossy", "chain", "flat PS", "2 global servers",
                  "triangle", "trace", "lan_bandwidth", "jitter"):
        assert shape in names
    for c in cases:
        assert c.overrides[-1] == "run.seed=1"  # the command line's overrides come last
        load_scenario(c.scenario, list(c.overrides))
    assert load_cases([str(ROOT / "scenarios/quickstart.toml")]) == [
        Case("quickstart", str(ROOT / "scenarios/quickstart.toml"), ())]


def test_the_table_and_plot_say_what_was_measured_and_what_could_not_be(tmp_path):
    rows = [{"case": "a: one", "emu_s_per_iter": 2.0, "userspace_s_per_iter": 2.1,
             "userspace_error": 0.05, "kernel_s_per_iter": None, "kernel_error": None,
             "kernel_skipped": "traces: userspace only", "load_average": 1.5},
            {"case": "b", "emu_s_per_iter": 1.0, "userspace_s_per_iter": 0.9,
             "userspace_error": -0.1, "kernel_s_per_iter": 1.05, "kernel_error": 0.05,
             "load_average": 2.5}]
    table = report_table(rows, ["userspace", "kernel"])
    assert "| a: one | 2.000 | 2.100 | +5.0% | n/a | traces: userspace only |" in table
    assert "| b | 1.000 | 0.900 | -10.0% | 1.050 | +5.0% |" in table
    assert "1.50-2.50" in table
    plot_report(rows, ["userspace", "kernel"], tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_bad_cases_and_shapers_are_refused_before_anything_runs(tmp_path, capsys):
    suite = tmp_path / "suite.toml"
    suite.write_text('[[case]]\nname = "x"\nscenario = "nowhere.toml"\n')
    assert main(["fidelity", str(suite), "--out", str(tmp_path / "o")]) == 2
    assert "nowhere.toml" in capsys.readouterr().err
    suite.write_text('[[case]]\nscenario = 3\n')
    assert main(["fidelity", str(suite)]) == 2
    assert "case[0]" in capsys.readouterr().err
    assert main(["fidelity", str(ROOT / "scenarios/quickstart.toml"), "--shaper", "tc"]) == 2
    assert "allowed: userspace, kernel" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
