"""``examples/resnet_torch.py`` runs unchanged in the emulator, and a ``geomx.torch``
program runs over real sockets (one process per node)."""

from __future__ import annotations

import json

import pytest

from geomx.experiment import run_scenario
from geomx.scenario import load_scenario

from tests.helpers.events import run_events
from tests.helpers.paths import EXAMPLES
from tests.torch.helpers import run

TINY = ["--width", "4", "--blocks", "1", "--samples", "400", "--batch-size", "16"]


def _example(tmp_path, sets, runtime="emu"):
    s = load_scenario(EXAMPLES / "resnet_torch.toml",
                      [f"run.out_dir={tmp_path}", "run.iterations=4", "run.eval_every=2",
                       "run.progress=false", "metrics.plot=false", "metrics.trace=false",
                       "training.program_args=" + json.dumps(TINY), *sets])
    return run_scenario(s, runtime=runtime, progress=False)


def test_the_resnet_example_runs_in_the_emulator(tmp_path):
    r = _example(tmp_path, [])
    evals = [e for e in run_events(r.run_dir, "eval") if e.get("accuracy") is not None]
    assert [e["iteration"] for e in evals] == [2, 4]
    assert r.summary.emulated_seconds > 4 * 0.06  # four steps of compute_per_iter 60 ms


@pytest.mark.slow
def test_the_resnet_example_runs_over_real_sockets(tmp_path):
    r = _example(tmp_path, [], runtime="real")
    assert [e["iterations"] for e in run_events(r.run_dir, "worker_done")] == [4] * 4


@pytest.mark.slow
def test_a_program_trains_over_real_sockets(tmp_path):
    r = run(tmp_path, ["membership.heartbeat_timeout=60s"], iterations=12, runtime="real")
    assert r.summary.final_accuracy > 0.3
