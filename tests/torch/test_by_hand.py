"""A ``geomx.torch`` synchronous program in a job started by hand: one ``geomx node``
process per node, each told only the scenario, its name, the run folder and the job's
start (docs/real-runtime.md, "Nodes and rendezvous"; docs/torch.md, "Running the example
three ways"). Each DC has an address of its own (``dc.host``: 127.0.0.1, .2 and .3), as
on three hosts, so every node finds the others through the schedulers' addresses alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.paths import QUICKSTART
from tests.helpers.ports import free_port_block
from tests.torch.helpers import PROGRAM

#: one worker per party DC, HiPS: the tiers a user spreads over hosts
NODES = ("gh", "gs:0", "mw", "lh:party-a", "ls:party-a", "w:party-a:0",
         "lh:party-b", "ls:party-b", "w:party-b:0")
HOSTS = {"central": "127.0.0.1", "party-a": "127.0.0.2", "party-b": "127.0.0.3"}
ITERATIONS = 8


def _scenario(tmp_path: Path, port_base: int) -> Path:
    text = Path(QUICKSTART).read_text()
    for dc, host in HOSTS.items():
        text = text.replace(f'name = "{dc}"\n', f'name = "{dc}"\nhost = "{host}"\n', 1)
    path = tmp_path / "job.toml"
    path.write_text(text + f"\n[real]\nport_base = {port_base}\n")
    return path


def _log(tmp_path: Path, name: str) -> Path:
    return tmp_path / f"{name.replace(':', '_')}.log"


@pytest.mark.slow
def test_a_sync_torch_program_in_a_job_started_node_by_node(tmp_path):
    scenario = _scenario(tmp_path, free_port_block(4))
    run_dir = tmp_path / "run"
    sets = [f"run.iterations={ITERATIONS}", "run.eval_every=4", "run.target_accuracy=0",
            "metrics.plot=false", "metrics.trace=false", "dc.1.workers=1", "dc.2.workers=1",
            f"training.program={PROGRAM}:sync_main", 'training.program_args=["--sgd"]',
            "membership.heartbeat_timeout=60s"]
    start = repr(time.time())
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NUMBA_NUM_THREADS": "1"}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name in NODES:  # one by one, as a user starts them on their hosts
            cmd = [sys.executable, "-m", "geomx", "node", str(scenario), "--name", name,
                   "--run-dir", str(run_dir), "--start-epoch", start]
            for s in sets:
                cmd += ["--set", s]
            with open(_log(tmp_path, name), "w") as log:
                procs[name] = subprocess.Popen(cmd, env=env, stdout=log,
                                               stderr=subprocess.STDOUT,
                                               start_new_session=True)
        deadline = time.time() + 180
        while time.time() < deadline and any(p.poll() is None for p in procs.values()):
            failed = {n: p.returncode for n, p in procs.items() if p.returncode not in (None, 0)}
            assert not failed, (failed, {n: _log(tmp_path, n).read_text()[-2000:]
                                         for n in failed})
            time.sleep(0.2)
        running = [n for n, p in procs.items() if p.poll() is None]
        assert not running, ("still running after 180 s",
                             {n: _log(tmp_path, n).read_text()[-2000:] for n in running})
        codes = {n: p.returncode for n, p in procs.items()}
        assert set(codes.values()) == {0}, (codes, {n: _log(tmp_path, n).read_text()[-2000:]
                                                   for n, c in codes.items() if c})
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    results = {f.name: json.loads(f.read_text())
               for f in (run_dir / "nodes").glob("*.result.json")}
    assert len(results) == len(NODES)
    workers = [results[f"w_{dc}_0.result.json"] for dc in ("party-a", "party-b")]
    assert [w["iterations"] for w in workers] == [ITERATIONS, ITERATIONS]
    # the program trained: the evaluating worker's accuracy on the digits (10 classes)
    evaluated = [w["result"]["accuracy"] for w in workers if "accuracy" in w.get("result", {})]
    assert evaluated and evaluated[0] > 0.25  # chance: 0.1
    # every node started from the master worker's broadcast model
    events = [json.loads(line) for f in (run_dir / "nodes").glob("*.events.jsonl")
              for line in f.read_text().splitlines()]
    digests = {e["node"]: e["start_digest"] for e in events if "start_digest" in e}
    assert set(digests) == {"mw", "w:party-a:0", "w:party-b:0"}
    assert len(set(digests.values())) == 1
