"""`geomx sweep`: grids checked like --set, runs tabulated, resumable, parallel = serial."""

import json
import os
import sys
import shutil

import pytest

from geomx.cli import main
from geomx.metrics.sweep_results import read_sweep, sweep_keys
from geomx.scenario import ScenarioError
import io

from geomx.sweep import (
    GridAxis,
    RunsBar,
    SweepError,
    _run_point,
    parse_grid,
    parse_grids,
    plan_sweep,
    run_sweep,
    split_values,
)

from tests.helpers.paths import ROOT

QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
#: a short, cheap quickstart: 12 iterations, no trace or plots per run
BASE = ["run.iterations=12", "run.target_accuracy=0", "run.eval_every=4", "metrics.trace=false",
        "metrics.plot=false"]


def test_grid_values_split_outside_brackets_and_quotes():
    assert split_values("20Mbps, 100Mbps") == ["20Mbps", "100Mbps"]
    assert split_values("[64],[64, 32]") == ["[64]", "[64, 32]"]
    assert split_values('"a,b",c') == ['"a,b"', "c"]
    axis = parse_grid("training.hidden=[32],[64,32]")
    assert axis == GridAxis("training.hidden", ("[32]", "[64,32]"))
    assert parse_grid("wan.0.bandwidth+wan.1.bandwidth=1Gbps").assignments("1Gbps") == [
        "wan.0.bandwidth=1Gbps", "wan.1.bandwidth=1Gbps"]


@pytest.mark.parametrize("spec, words", [
    ("codec.type", ["expected KEY=V1,V2"]),
    ("codec.type=none,,fp16", ["empty value"]),
    ("codec.type=fp16,fp16", ["appears twice"]),
    ("wan.0.bandwidth+=1Gbps", ["empty path"]),
])
def test_bad_grid_syntax_says_what_to_write(spec, words):
    with pytest.raises(SweepError) as e:
        parse_grid(spec)
    for w in words:
        assert w in str(e.value)


def test_a_key_given_twice_is_refused():
    with pytest.raises(SweepError, match="given twice"):
        parse_grids(["codec.type=none", "codec.type=fp16"])


def test_bad_grid_values_get_the_errors_of_set_naming_the_grid_entry():
    with pytest.raises(ScenarioError) as e:
        plan_sweep(QUICKSTART, [GridAxis("wan.0.bandwidth", ("20Mbps", "fast"))])
    msg = str(e.value)
    assert "--grid wan.0.bandwidth=fast" in msg and "wan[0].bandwidth" in msg and "100Mbps" in msg
    with pytest.raises(ScenarioError) as e:
        plan_sweep(QUICKSTART, [GridAxis("codec.typ", ("none",))])
    assert "unknown key 'typ'" in str(e.value) and "did you mean" in str(e.value)
    with pytest.raises(SweepError, match="--seeds 0"):
        plan_sweep(QUICKSTART, [], seeds=0)


def test_plan_is_the_product_of_grid_and_seeds_with_stable_folders():
    axes = [GridAxis("codec.type", ("none", "fp16")), GridAxis("training.lr", ("0.01", "0.005"))]
    points = plan_sweep(QUICKSTART, axes, seeds=2, base_overrides=BASE)
    assert len(points) == 8
    assert [p.seed for p in points[:2]] == [42, 43]  # run.seed, run.seed + 1
    assert points[0].overrides(BASE)[-3:] == ["codec.type=none", "training.lr=0.01", "run.seed=42"]
    assert len({p.folder for p in points}) == 8
    assert [p.folder for p in plan_sweep(QUICKSTART, axes, 2, BASE)] == [p.folder for p in points]
    # a different base scenario is a different run, even with the same grid values
    other = plan_sweep(QUICKSTART, axes, 2, [*BASE, "training.batch_size=16"])
    assert not {p.folder for p in other} & {p.folder for p in points}


@pytest.mark.slow
def test_sweep_writes_table_and_plots_and_resumes(tmp_path):
    axes = [GridAxis("codec.type", ("none", "fp16"))]
    out = tmp_path / "sweep"
    first = run_sweep(QUICKSTART, axes, seeds=2, jobs=1, out=out, base_overrides=BASE,
                      progress=False)
    assert (first.ran, first.resumed, first.failed) == (4, 0, 0)
    table = read_sweep(out)
    assert table.keys()[:6] == ["index", "run", "status", "codec.type", "seed", table.keys()[5]]
    assert sweep_keys(table) == ["codec.type"]
    assert list(table["codec.type"]) == ["none", "none", "fp16", "fp16"]
    assert list(table["seed"]) == [42, 43, 42, 43]
    assert set(table["status"]) == {"done"}
    for col in ("final_accuracy", "bytes_wan", "emulated_seconds", "iterations",
                "extra.emulated_over_wall"):
        assert col in table
    assert list(table["iterations"]) == [12] * 4
    # fp16 halves what crosses the WAN (plus headers)
    assert table["bytes_wan"][2] < 0.55 * table["bytes_wan"][0]
    assert [p.name for p in first.plots] == ["sweep_codec.type.png"]
    assert json.loads((out / "sweep.json").read_text())["grid"] == {"codec.type": ["none", "fp16"]}
    for run in table["run"]:
        assert (out / run / "summary.json").exists()
    assert not (out / ".tmp").exists()

    again = run_sweep(QUICKSTART, axes, seeds=2, jobs=1, out=out, base_overrides=BASE,
                      progress=False, plots=False)
    assert (again.ran, again.resumed) == (0, 4)
    assert list(again.table["bytes_wan"]) == list(table["bytes_wan"])
    shutil.rmtree(out / table["run"][1])  # an interrupted point is run again, alone
    (out / ".tmp" / "p1").mkdir(parents=True)  # and leftovers of the interruption go
    third = run_sweep(QUICKSTART, axes, seeds=2, jobs=1, out=out, base_overrides=BASE,
                      progress=False, plots=False)
    assert (third.ran, third.resumed) == (1, 3)
    assert list(third.table["bytes_wan"]) == list(table["bytes_wan"])


@pytest.mark.slow
def test_parallel_sweep_gives_the_serial_results(tmp_path):
    axes = [GridAxis("wan.0.bandwidth+wan.1.bandwidth", ("20Mbps", "1Gbps"))]
    serial = run_sweep(QUICKSTART, axes, jobs=1, out=tmp_path / "s", base_overrides=BASE,
                       progress=False, plots=False).table
    parallel = run_sweep(QUICKSTART, axes, jobs=2, out=tmp_path / "p", base_overrides=BASE,
                         progress=False, plots=False).table
    for col in ("emulated_seconds", "bytes_wan", "final_accuracy", "messages", "run"):
        assert list(serial[col]) == list(parallel[col]), col
    # the slower WAN takes longer in emulated time
    assert serial["emulated_seconds"][0] > serial["emulated_seconds"][1]


def test_a_point_that_fails_is_reported_not_fatal(tmp_path):
    outcome = _run_point(str(tmp_path / "missing.toml"), [], str(tmp_path / "t"),
                         str(tmp_path / "r"))
    assert outcome["status"] == "failed" and "missing.toml" in outcome["error"]


@pytest.mark.slow
def test_cli_sweep_and_compare(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", str(QUICKSTART), "--grid", "codec.type=none,bf16", "--jobs", "1",
            "--out", str(out), "--quiet", *[a for s in BASE for a in ("--set", s)]]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "2 runs: 2 ran, 0 resumed, 0 failed" in text and "sweep_codec.type.png" in text
    assert main(["compare", str(out)]) == 0
    text = capsys.readouterr().out
    assert "type=none seed=42" in text and "WAN x1st" in text
    assert (out / "compare_accuracy_time.png").exists()


def test_cli_sweep_bad_grid_is_a_clear_error(capsys):
    assert main(["sweep", str(QUICKSTART), "--grid", "codec.type=none,zip"]) == 2
    err = capsys.readouterr().err
    assert "--grid codec.type=zip" in err and "'fp16'" in err
    assert main(["sweep", str(QUICKSTART)]) == 2
    assert "nothing to sweep" in capsys.readouterr().err


def test_progress_bar_counts_runs_and_sums_up_resumed_ones():
    out = io.StringIO()
    bar = RunsBar(4, stream=out)
    bar.advance("a", resumed=True)
    bar.advance("b", resumed=True)
    assert out.getvalue() == ""  # resumed points are not a line each
    bar.advance("c")
    bar.advance("d", failed=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "3/4 runs (2 resumed, 0 failed)" in lines[0] and lines[0].endswith("| c")
    assert "4/4 runs (2 resumed, 1 failed)" in lines[1] and lines[1].endswith("| FAILED d")


def test_progress_bar_shows_running_runs_when_told():
    out = io.StringIO()
    bar = RunsBar(3, stream=out)
    bar.running = 2
    bar.advance("a")
    bar.set_running(1)  # not a terminal: no line of its own
    bar.advance("b")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "1/3 runs (0 resumed, 0 failed, 2 running)" in lines[0]
    assert "2/3 runs (0 resumed, 0 failed, 1 running)" in lines[1]


def _threads_after_limit(code: str, env_threads: str | None) -> str:
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = env_threads
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout.split()


def test_a_sweep_process_gives_pytorch_its_share_of_the_cores():
    limit = "from geomx.sweep_cluster import limit_kernel_threads as f; f(1); "
    show = "import os, torch; print(os.environ['OMP_NUM_THREADS'], torch.get_num_threads())"
    # torch imported before the limit; imported after it, geomx.torch.init applies the
    # variable (Numba's pool leaves its own count in the OpenMP runtime)
    assert _threads_after_limit("import torch; " + limit + show, None) == ["1", "1"]
    assert _threads_after_limit(limit + show, None)[0] == "1"
    # the user's own setting wins
    assert _threads_after_limit(limit + "import os; print(os.environ['OMP_NUM_THREADS'])",
                                "2") == ["2"]
