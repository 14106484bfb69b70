"""Expectations a CI job gates on: ``geomx run --expect``, the ``[expect]`` table and
``geomx compare --baseline`` (docs/ci.md), through the command line as a user runs it."""

import json
import shutil
import tomllib

import pytest

from geomx.cli import main
from geomx.expect import (EXIT_EXPECTATION, ExpectationError, check_expectations,
                          format_outcome, parse_expectation, parse_tolerance, regressions)
from geomx.scenario import ScenarioError, load_scenario, parse_scenario, scenario_to_toml

#: A job of a few tenths of a second of CPU: 2 x 2 workers, digits, 20 iterations.
TINY = """\
[run]
name = "tiny"
iterations = 20
eval_every = 5
target_accuracy = 0.5
progress = false

[training]
model = "mlp"
hidden = [16]
dataset = "digits"
batch_size = 32
optimizer = "adam"
lr = 0.01

[metrics]
plot = false
trace = false
"""


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def _run(tiny, tmp_path, *args):
    return main(["run", str(tiny), "--quiet", "--out", str(tmp_path / "runs"), *args])


def _run_dirs(tmp_path):
    return sorted((tmp_path / "runs").glob("tiny-*")) if (tmp_path / "runs").exists() else []


# ------------------------------------------------------------------ reading expectations

@pytest.mark.parametrize("text, figure, op, bound", [
    ("final_accuracy >= 0.93", "final_accuracy", ">=", 0.93),
    ("final_accuracy>=93%", "final_accuracy", ">=", 0.93),
    ("time_to_target_s <= 6", "time_to_target_s", "<=", 6.0),
    ("time_to_target_s < 500ms", "time_to_target_s", "<", 0.5),
    ("bytes_wan <= 2MB", "bytes_wan", "<=", 2e6),
    ("bytes_wan <= 1.5MiB", "bytes_wan", "<=", 1.5 * 2**20),
    ("iterations == 1.2k", "iterations", "==", 1200),
    ("final_loss > 0.25", "final_loss", ">", 0.25),
    ("bytes_per_dc_pair.party-a->central <= 1MB", "bytes_per_dc_pair.party-a->central", "<=", 1e6),
    ("extra.final_eval.loss < 0.6", "extra.final_eval.loss", "<", 0.6),
])
def test_an_expectation_reads_its_bound_in_the_figures_unit(text, figure, op, bound):
    e = parse_expectation(text)
    assert (e.figure, e.op) == (figure, op) and e.bound == pytest.approx(bound)


@pytest.mark.parametrize("text, words", [
    ("final_acuracy >= 0.9", ["unknown figure 'final_acuracy'", "did you mean 'final_accuracy'",
                              "figures: final_accuracy", "time_to_target_s", "extra.<key>"]),
    ("bytes_wan <= 2Mb", ["bytes_wan", "'2Mb'", "sizes are in bytes"]),
    ("final_accuracy >= 1.5", ["final_accuracy", "between 0 and 1"]),
    ("final_accuracy => 0.9", ["unknown operator", ">= <= == > <"]),
    ("final_accuracy 0.9", ["expected FIGURE OP VALUE"]),
    ("bytes_per_link <= 1MB", ["table of figures", "bytes_per_link.<link>"]),
    ("bytes_wan <=", ["no value"]),
])
def test_a_bad_expectation_is_one_line_naming_what_is_allowed(text, words):
    with pytest.raises(ExpectationError) as info:
        parse_expectation(text)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_outcomes_show_the_measured_value_and_null_is_not_reached():
    summary = {"final_accuracy": 0.94, "bytes_wan": 3289968, "time_to_target_s": None,
               "emulated_seconds": None, "runtime": "real",
               "bytes_per_dc_pair": {"party-a->central": 812904}, "extra": {"final_eval": {}}}
    texts = ["final_accuracy >= 0.93", "bytes_wan <= 2MB", "time_to_target_s <= 6s",
             "emulated_seconds <= 10s", "bytes_per_dc_pair.party-b->central <= 1MB",
             "extra.final_eval.loss < 0.6"]
    lines = [format_outcome(o) for o in check_expectations(map(parse_expectation, texts), summary)]
    assert lines[0] == "ok   final_accuracy >= 0.93: measured 0.94"
    assert lines[1] == "FAIL bytes_wan <= 2MB: measured 3.29 MB (3289968 B)"
    assert lines[2] == "FAIL time_to_target_s <= 6s: not reached (null in summary.json)"
    assert lines[3].startswith("FAIL emulated_seconds <= 10s: not reached: the real runtime")
    assert "no such figure" in lines[4] and "party-a->central" in lines[4]
    assert lines[5].startswith("FAIL extra.final_eval.loss < 0.6: no such figure")


def test_regressions_go_each_figures_good_way_within_the_tolerance():
    base = {"final_accuracy": 0.90, "time_to_target_s": 10.0, "bytes_wan": 1_000_000,
            "emulated_seconds": None}
    now = {"final_accuracy": 0.86, "time_to_target_s": 10.4, "bytes_wan": 1_060_000,
           "emulated_seconds": 3.0}
    held = {r.figure: r.held for r in regressions(base, now, 0.05)}
    # accuracy may drop to 0.855, time grow to 10.5 s, bytes to 1.05 MB; no baseline time
    assert held == {"final_accuracy": True, "time_to_target_s": True, "bytes_wan": False}
    better = {"final_accuracy": 0.99, "time_to_target_s": 1.0, "bytes_wan": 10}
    assert all(r.held for r in regressions(base, better, 0.0))
    lost = regressions(base, {**now, "time_to_target_s": None}, 0.05)
    assert [r.reason for r in lost if r.figure == "time_to_target_s"] == ["not reached (null now)"]
    assert parse_tolerance("5%") == 0.05 and parse_tolerance("150%") == 1.5
    assert parse_tolerance("0.05") == 0.05
    with pytest.raises(ExpectationError, match="non-negative percentage"):
        parse_tolerance("-5%")


# ------------------------------------------------------------------ the [expect] table

def test_expect_table_parses_checks_and_round_trips(tiny):
    s = load_scenario(tiny, ["expect.bytes_wan=<= 2MB",
                             'expect.also=["extra.final_eval.loss < 0.6"]'])
    assert [e.text for e in s.expect.expectations()] == ["bytes_wan <= 2MB",
                                                          "extra.final_eval.loss < 0.6"]
    text = scenario_to_toml(s)
    assert tomllib.loads(text)["expect"] == {"bytes_wan": "<= 2MB",
                                             "also": ["extra.final_eval.loss < 0.6"]}
    assert parse_scenario(tomllib.loads(text)) == s
    assert "[expect]" not in scenario_to_toml(load_scenario(tiny))  # nothing set: left out


@pytest.mark.parametrize("override, words", [
    ("expect.final_acuracy=>= 0.9", ["final_acuracy", "did you mean 'final_accuracy'",
                                     "allowed keys in [expect]"]),
    ("expect.bytes_wan=<= 2Mb", ["expect.bytes_wan", "sizes are in bytes"]),
    ("expect.final_accuracy=0.9", ["expect.final_accuracy", "OP VALUE"]),
    ('expect.also=["foo < 3"]', ["expect.also[0]", "unknown figure 'foo'"]),
])
def test_a_bad_expect_table_names_the_key_and_what_is_allowed(tiny, override, words):
    with pytest.raises(ScenarioError) as info:
        load_scenario(tiny, [override])
    for word in words:
        assert word in str(info.value)


# ------------------------------------------------------------------ geomx run --expect

def test_run_exits_0_when_every_expectation_holds_and_3_with_a_line_per_failure(
        tiny, tmp_path, capsys):
    assert _run(tiny, tmp_path, "--expect", "final_accuracy >= 0.5",
                "--expect", "time_to_target_s <= 6s") == 0
    out = capsys.readouterr().out
    assert "expect: ok   final_accuracy >= 0.5: measured" in out
    summary = json.loads((_run_dirs(tmp_path)[0] / "summary.json").read_text())
    assert _run(tiny, tmp_path, "--expect", "final_accuracy >= 0.5",
                "--expect", "bytes_wan <= 100kB", "--expect", "iterations > 1k") == EXIT_EXPECTATION
    err = capsys.readouterr().err.splitlines()
    wan = summary["bytes_wan"]
    assert f"expect: FAIL bytes_wan <= 100kB: measured {wan / 1e6:.3g} MB ({wan} B)" in err
    assert f"expect: FAIL iterations > 1k: measured {summary['iterations']}" in err
    assert "geomx: 2 of 3 expectation(s) failed" in err


def test_a_target_never_reached_fails_as_not_reached(tiny, tmp_path, capsys):
    assert _run(tiny, tmp_path, "--set", "run.target_accuracy=0.999",
                "--expect", "time_to_target_s <= 6s") == EXIT_EXPECTATION
    assert ("expect: FAIL time_to_target_s <= 6s: not reached (null in summary.json)"
            in capsys.readouterr().err)


def test_an_unknown_figure_is_refused_before_anything_runs(tiny, tmp_path, capsys):
    assert _run(tiny, tmp_path, "--expect", "final_acuracy >= 0.9") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("geomx run: --expect 'final_acuracy >= 0.9': unknown figure")
    assert "did you mean 'final_accuracy'" in err and "bytes_wan" in err
    assert _run_dirs(tmp_path) == []


def test_the_scenarios_expect_table_gates_the_run_and_expect_adds_to_it(tiny, tmp_path, capsys):
    tiny.write_text(TINY + '\n[expect]\nfinal_accuracy = ">= 0.99"\n')
    assert _run(tiny, tmp_path) == EXIT_EXPECTATION
    assert "expect: FAIL final_accuracy >= 0.99: measured" in capsys.readouterr().err
    assert _run(tiny, tmp_path, "--set", "expect.final_accuracy=>= 0.5",
                "--expect", "bytes_wan <= 10MB") == 0
    out = capsys.readouterr().out
    assert "ok   final_accuracy >= 0.5" in out and "ok   bytes_wan <= 10MB" in out


# ------------------------------------------------------------------ geomx compare --baseline

def _two_runs(tiny, tmp_path):
    assert _run(tiny, tmp_path) == 0
    assert _run(tiny, tmp_path, "--set", "wan.0.latency=200ms",
                "--set", "wan.1.latency=200ms") == 0
    dirs = sorted((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    return dirs[0], dirs[1]


def test_compare_gates_a_run_against_a_stored_baseline(tiny, tmp_path, capsys):
    fast, slow = _two_runs(tiny, tmp_path)
    capsys.readouterr()
    # an emulated run reproduces exactly: itself passes at the default 0%
    assert main(["compare", str(fast), "--baseline", str(fast), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "regression: ok   final_accuracy" in out and "regression: ok   bytes_wan" in out
    # the same job on 200 ms links: same accuracy and bytes, later in emulated time
    assert main(["compare", str(slow), "--baseline", str(fast), "--max-regression", "5%",
                 "--no-plots"]) == EXIT_EXPECTATION
    err = capsys.readouterr().err
    assert "regression: FAIL emulated_seconds: measured" in err
    assert "regression: FAIL time_to_target_s" in err and "lower is better" in err
    assert "bytes_wan" not in err and "final_accuracy" not in err
    # the other way round is an improvement
    assert main(["compare", str(fast), "--baseline", str(slow), "--no-plots"]) == 0


def test_compare_needs_its_own_tolerance_for_a_real_runtime_run(tiny, tmp_path, capsys):
    fast, slow = _two_runs(tiny, tmp_path)
    # stand-ins for two stored real-runtime runs (the real runtime writes the same summary)
    real = []
    for src in (fast, slow):
        dst = tmp_path / f"real-{src.name}"
        shutil.copytree(src, dst)
        data = json.loads((dst / "summary.json").read_text())
        (dst / "summary.json").write_text(json.dumps({**data, "runtime": "real",
                                                      "emulated_seconds": None}))
        real.append(dst)
    capsys.readouterr()
    assert main(["compare", str(real[1]), "--baseline", str(real[0]), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "real-runtime run" in err and "--real-tolerance" in err
    assert main(["compare", str(real[1]), "--baseline", str(real[0]), "--no-plots",
                 "--real-tolerance", "1000%"]) == 0
    assert main(["compare", str(real[1]), "--baseline", str(fast), "--no-plots",
                 "--real-tolerance", "10%"]) == 2
    assert "baseline of its own runtime" in capsys.readouterr().err


def test_compare_options_of_the_gate_need_a_baseline(tiny, tmp_path, capsys):
    assert _run(tiny, tmp_path) == 0
    run = str(_run_dirs(tmp_path)[0])
    capsys.readouterr()
    assert main(["compare", run, "--max-regression", "5%", "--no-plots"]) == 2
    assert "--max-regression needs --baseline" in capsys.readouterr().err
    assert main(["compare", run, "--baseline", run, "--figure", "iterations", "--no-plots"]) == 2
    assert "no better direction" in capsys.readouterr().err
    assert main(["compare", run, "--baseline", run, "--max-regression", "five", "--no-plots"]) == 2
    assert main(["compare", run, run, "--no-plots"]) == 0  # without a gate: as before


@pytest.mark.slow
def test_run_expect_works_on_the_real_runtime(tiny, tmp_path, capsys):
    """Over real sockets the summary has the same figures; emulated time is null there."""
    assert _run(tiny, tmp_path, "--runtime", "real", "--expect", "final_accuracy >= 0.5",
                "--expect", "bytes_wan <= 10MB", "--expect", "emulated_seconds <= 1h") == 3
    captured = capsys.readouterr()
    assert "ok   bytes_wan <= 10MB" in captured.out
    assert "FAIL emulated_seconds <= 1h: not reached: the real runtime" in captured.err
    run = _run_dirs(tmp_path)[0]
    assert json.loads((run / "summary.json").read_text())["runtime"] == "real"

