"""OpenMP threads per node process in a local ``--runtime real`` job
(geomx/runtime/launcher.py, geomx/threads.py): each worker gets an equal share
of the host's cores unless the user set ``OMP_NUM_THREADS``, also when the launcher had
already loaded PyTorch before forking its nodes."""

import json
import os
import textwrap

import pytest

from geomx.experiment import run_scenario
from geomx.metrics.recorder import iter_events
from geomx.threads import THREADS_VAR, threads_per_worker
from geomx.scenario import load_scenario

from tests.helpers.paths import ROOT

PROGRAM = """
import os
import torch

def main(kv, ctx):
    if kv.is_master_worker:
        return
    ctx.report(1, accuracy=1.0, torch_threads=torch.get_num_threads(),
               omp=int(os.environ.get("OMP_NUM_THREADS", "0")))
"""


def test_each_worker_gets_an_equal_share_of_the_cores_and_at_least_one():
    assert threads_per_worker(4, 2) == 1
    assert threads_per_worker(2, 16) == 8
    assert threads_per_worker(3, 16) == 5
    assert threads_per_worker(0, 8) == 8
    assert threads_per_worker(1, None) == 1


def _run(tmp_path):
    prog = tmp_path / "threads.py"
    prog.write_text(textwrap.dedent(PROGRAM))
    s = load_scenario(ROOT / "examples" / "cnn.toml",
                      [f"run.out_dir={tmp_path / 'runs'}", "run.progress=false",
                       f"training.program={prog}", "run.iterations=2"])
    workers = sum(dc.workers for dc in s.dcs)
    r = run_scenario(s, runtime="real")
    rows = [e for e in iter_events(r.run_dir / "events.jsonl") if e.get("ev") == "eval"]
    launch = json.loads((r.run_dir / "launch.json").read_text())
    return workers, rows, launch


@pytest.mark.slow
def test_real_job_sizes_every_workers_thread_pool(tmp_path, monkeypatch):
    # torch loaded here first: nodes forked from this process inherit its thread pool
    import torch  # noqa: F401

    monkeypatch.delenv(THREADS_VAR, raising=False)
    workers, rows, launch = _run(tmp_path)
    want = threads_per_worker(workers, os.cpu_count())
    assert len(rows) == workers
    assert {(e["torch_threads"], e["omp"]) for e in rows} == {(want, want)}
    assert launch[THREADS_VAR] == str(want), launch["start"]


@pytest.mark.slow
def test_a_users_own_thread_count_is_kept(tmp_path, monkeypatch):
    # a value other than the launcher's own, within the cores (a fresh interpreter's
    # torch takes at most one thread per core from the variable)
    cores = os.cpu_count() or 1
    workers = 4  # examples/cnn.toml
    own = 1 if threads_per_worker(workers, cores) != 1 else min(2, cores)
    monkeypatch.setenv(THREADS_VAR, str(own))
    n, rows, launch = _run(tmp_path)
    assert n == workers
    assert rows and {(e["torch_threads"], e["omp"]) for e in rows} == {(own, own)}
    assert launch[THREADS_VAR] == str(own)
