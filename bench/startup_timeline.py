"""Where a real job's start-up goes: per-process costs and the launch timeline.

Two parts, both on the whole-job bench's job (``bench/job_vs_mxnet.py``: the digits MLP
on a flat PS, two workers, Adam on the server, 300 iterations, no shaping):

* **per process**, each phase timed in a fresh interpreter of its own, one at a time (so
  the figures are a process's own cost, not its share of a loaded machine): the
  interpreter and geomx's imports (``geomx.runtime.node_main`` and the TCP transport, as
  ``geomx node`` loads them), the job plan (scenario to nodes; it reads the dataset, 27 ms
  for the digits), a worker's partition and model, and the server's first optimizer
  update (where a Numba kernel would load);
* **the launch timeline**, from the run's own files: ``geomx run`` starting to the
  launcher spawning the nodes (``launch.json``'s ``start_epoch``), each node's
  registration, the first iteration, the last and the job's end -- once with the nodes
  forked from the launcher (the default, geomx/runtime/forked.py) and once exec'd as
  fresh interpreters (``GEOMX_NODE_START=exec``, the baseline), alternating, in the
  same run. ``--nodes-per-dc N`` gives each of the two party DCs N workers (more
  processes: 5 + 2N with the flat PS's schedulers and server).

    python bench/startup_timeline.py [--rounds 3] [--nodes-per-dc 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ITERS = 300

#: The bench job's overrides of scenarios/vanilla_ps.toml (as bench/job_vs_mxnet.py).
SETS = ["dc.party-a.workers=1", "dc.party-b.workers=1", "dc.party-a.compute_per_iter=0s",
        "dc.party-b.compute_per_iter=0s", "real.shape=false", "run.target_accuracy=0",
        f"run.iterations={ITERS}", f"run.eval_every={ITERS // 2}", "training.hidden=[64]",
        "metrics.plot=false", "metrics.trace=false"]

#: Each phase a process goes through, timed in order in one fresh interpreter.
PHASES = r"""
import sys, time, json
t = [time.perf_counter()]
import geomx.runtime.node_main, geomx.runtime.tcp
t.append(time.perf_counter())
from geomx.cluster import plan_job
from geomx.scenario import load_scenario
s = load_scenario(sys.argv[1], overrides=sys.argv[2:])
plan = plan_job(s, "real")
t.append(time.perf_counter())
from geomx.node.trainer import build_model, initial_params, load_data, worker_indices
load_data(plan.train); worker_indices(plan.train, 0, 2); build_model(plan.train)
params = initial_params(plan.train)
t.append(time.perf_counter())
import numpy as np
from geomx.optim import optimizer_from_config
opt = optimizer_from_config(dict(plan.train.global_optimizer))
for k, p in enumerate(params):
    w = np.array(p, dtype=np.float32)
    opt.update(k, w, np.ones_like(w), opt.create_state(k, w))
t.append(time.perf_counter())
print(json.dumps([b - a for a, b in zip(t, t[1:])]))
"""


def phases(python: str) -> dict[str, float]:
    """Seconds of each start-up phase, and the interpreter's own start, in one process."""
    t0 = time.perf_counter()
    r = subprocess.run([python, "-c", PHASES, str(ROOT / "scenarios/vanilla_ps.toml"), *SETS],
                       capture_output=True, text=True, cwd=ROOT, check=True)
    total = time.perf_counter() - t0
    imp, plan, data, opt = json.loads(r.stdout.strip().splitlines()[-1])
    return {"interpreter": total - imp - plan - data - opt, "imports": imp, "plan+dataset": plan,
            "model": data, "first update": opt, "total": total}


def launch(out: Path, how: str = "fork", sets: list[str] = SETS) -> dict[str, float]:
    """Run the job once, its nodes started ``how`` (``fork`` or ``exec``); its timeline in
    seconds since ``geomx run`` started."""
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "geomx", "run",
                        str(ROOT / "scenarios/vanilla_ps.toml"), "--runtime", "real",
                        "--quiet", "--out", str(out), *[a for kv in sets for a in ("--set", kv)]],
                       capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "GEOMX_NODE_START": how})
    end = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"geomx failed: {r.stderr[-2000:]}")
    run_dir = Path(r.stdout.split("run folder: ")[1].split()[0])
    start = json.loads((run_dir / "launch.json").read_text())["start_epoch"] - t0
    registered, first, last, done = [], [], [], []
    for f in sorted((run_dir / "nodes").glob("*.events.jsonl")):
        events = [json.loads(line) for line in f.read_text().splitlines()]
        reg = [e["t"] for e in events if e.get("msg") == "REGISTER" or e["ev"] == "register"]
        if reg:
            registered.append(min(reg))
        computes = [e["t"] for e in events if e["ev"] == "compute"]
        if computes:
            first.append(computes[0])
            last.append(computes[-1])
        done.append(events[-1]["t"])
    return {"spawn": start, "all registered": start + max(registered),
            "first iteration": start + min(first), "last iteration": start + max(last),
            "nodes done": start + max(done), "launcher exit": end,
            "processes": len(done)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nodes-per-dc", type=int, default=1,
                   help="workers in each of the two party DCs (default 1)")
    args = p.parse_args(argv)
    n = args.nodes_per_dc
    sets = [f"dc.party-a.workers={n}", f"dc.party-b.workers={n}", *SETS[2:]]
    env_note = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    per: list[dict[str, float]] = []
    lines: dict[str, list[dict[str, float]]] = {"fork": [], "exec": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            per.append(phases(sys.executable))
            for how in (("fork", "exec") if i % 2 == 0 else ("exec", "fork")):
                lines[how].append(launch(Path(tmp), how, sets))
    print(f"per process, one at a time (medians of {args.rounds}; {env_note} at start):")
    for k in per[0]:
        print(f"  {k:16s} {statistics.median(r[k] for r in per) * 1e3:7.0f} ms")
    print(f"launch timeline, seconds since `geomx run` started (medians of {args.rounds}; "
          f"{lines['fork'][0]['processes']:.0f} processes), nodes forked from the launcher "
          f"vs exec'd (GEOMX_NODE_START=exec):")
    print(f"  {'':16s} {'fork':>6s} {'exec':>6s} {'fork/exec':>9s}")
    for k in lines["fork"][0]:
        if k != "processes":
            f = statistics.median(r[k] for r in lines["fork"])
            e = statistics.median(r[k] for r in lines["exec"])
            print(f"  {k:16s} {f:6.2f} {e:6.2f} {f / e:9.2f}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
