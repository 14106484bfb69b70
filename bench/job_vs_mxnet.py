"""A whole training job, geomx's real runtime against MXNet 1.9.1 ``dist_sync``.

The same job both ways: an MLP 64-64-10 on scikit-learn's 8x8 digits, batch 32, Adam
(lr 0.005) on one parameter server, two workers, each key pushed then pulled every
iteration, 300 iterations, loopback, no WAN shaping and no compute padding. MXNet runs
as GeoMX's base does (a scheduler, a server and two workers with the DMLC_* variables,
ps-lite over ZeroMQ) in the Python given by ``--mxnet-python`` (a venv with
``numpy<1.24 mxnet==1.9.1``); geomx runs ``geomx run --runtime real`` on a flat PS.

Printed per system: wall seconds for the whole job (process start to the last exit),
seconds per iteration in the steady state (median gap between a worker's iterations
after the first 10%), and the final test accuracy; then geomx's ratios to MXNet. geomx
runs twice per round: with its nodes forked from the launcher (the default,
geomx/runtime/forked.py) and exec'd as fresh interpreters (``GEOMX_NODE_START=exec``).
Rounds rotate the order of the three.

Both run from byte-compiled modules, as installed packages do (pip compiles them at
install; MXNet's venv has them): geomx's are compiled first into its ``__pycache__``,
which a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` never gets, and then each of the
job's six processes would compile ~120 modules again (~0.2 s of CPU each).
``--source-only`` leaves geomx as it is, to measure such a checkout (one without
``__pycache__`` folders).

    python bench/job_vs_mxnet.py --mxnet-python /work/venv-mxnet/bin/python [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ITERS = 300

MXNET_WORKER = r"""
import json, sys, time
import numpy as np
import mxnet as mx
d = np.load(sys.argv[1]); iters = int(sys.argv[2])
kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(kv.rank + 1)
init = np.random.default_rng(0)
shapes = [(64, 64), (64,), (64, 10), (10,)]
params = [mx.nd.array(init.normal(0, 0.1, s).astype(np.float32)) for s in shapes]
kv.set_optimizer(mx.optimizer.Adam(learning_rate=0.005, rescale_grad=1.0 / kv.num_workers))
for i, p in enumerate(params):
    kv.init(i, p)
for i, p in enumerate(params):
    kv.pull(i, out=p)
mx.nd.waitall()
for p in params:
    p.attach_grad()
xtr, ytr = d["x_train"], d["y_train"]
stamps = []
for it in range(iters):
    idx = rng.integers(0, len(xtr), 32)
    x, y = mx.nd.array(xtr[idx]), mx.nd.array(ytr[idx])
    with mx.autograd.record():
        h = mx.nd.relu(mx.nd.dot(x, params[0]) + params[1])
        out = mx.nd.dot(h, params[2]) + params[3]
        loss = mx.nd.softmax_cross_entropy(out, y) / 32
    loss.backward()
    for i, p in enumerate(params):
        kv.push(i, p.grad, priority=-i)
        kv.pull(i, out=p, priority=-i)
    mx.nd.waitall()
    stamps.append(time.perf_counter())
h = np.maximum(d["x_test"] @ params[0].asnumpy() + params[1].asnumpy(), 0)
acc = float(((h @ params[2].asnumpy() + params[3].asnumpy()).argmax(1) == d["y_test"]).mean())
print("RESULT " + json.dumps({"rank": kv.rank, "stamps": stamps, "accuracy": acc}), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steady(stamps: list[float]) -> float:
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return statistics.median(gaps[len(gaps) // 10:])


def run_mxnet(python: str, data: Path, work: Path) -> dict:
    base = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(_free_port()),
                DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="2", PS_VERBOSE="0",
                OMP_NUM_THREADS="1", MXNET_ENGINE_TYPE="ThreadedEnginePerDevice")
    script = work / "mx_worker.py"
    script.write_text(MXNET_WORKER)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([python, "-c", "import mxnet"], env=dict(base, DMLC_ROLE=r),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for r in ("scheduler", "server")]
    workers = [subprocess.Popen([python, str(script), str(data), str(ITERS)],
                                env=dict(base, DMLC_ROLE="worker"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [w.communicate(timeout=600) for w in workers]
    for p in procs:
        p.wait(60)
    wall = time.perf_counter() - t0
    results = []
    for out, err in outs:
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if not line:
            raise RuntimeError(f"MXNet worker failed: {err[-2000:]}")
        results.append(json.loads(line[0][7:]))
    return {"wall_s": wall, "s_per_iter": statistics.mean(_steady(r["stamps"]) for r in results),
            "accuracy": results[0]["accuracy"]}


def run_geomx(work: Path, start: str = "fork") -> dict:
    """The job through ``geomx run --runtime real``, nodes forked from the launcher (the
    default) or exec'd as fresh interpreters (``GEOMX_NODE_START=exec``)."""
    sys.path.insert(0, str(ROOT))
    from geomx.fidelity import iteration_times

    out = work / "geomx_runs"
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "geomx", "run", str(ROOT / "scenarios/vanilla_ps.toml"),
         "--runtime", "real", "--quiet", "--out", str(out),
         "--set", "dc.party-a.workers=1", "--set", "dc.party-b.workers=1",
         "--set", "dc.party-a.compute_per_iter=0s", "--set", "dc.party-b.compute_per_iter=0s",
         "--set", "real.shape=false", "--set", "run.target_accuracy=0",
         "--set", f"run.iterations={ITERS}", "--set", f"run.eval_every={ITERS // 2}",
         "--set", "training.hidden=[64]", "--set", "metrics.plot=false",
         "--set", "metrics.trace=false"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "GEOMX_NODE_START": start})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"geomx failed: {r.stderr[-2000:]}")
    run_dir = Path(r.stdout.split("run folder: ")[1].split()[0])
    if not run_dir.is_absolute():
        run_dir = ROOT / run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    evaluator = "w:party-a:0"
    return {"wall_s": wall, "s_per_iter": iteration_times(run_dir, evaluator).median_s_per_iter,
            "accuracy": summary["final_accuracy"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mxnet-python", default=os.environ.get("GEOMX_MXNET_PYTHON", ""))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--source-only", action="store_true",
                   help="do not byte-compile geomx first (see the module docstring)")
    args = p.parse_args(argv)
    from sklearn.datasets import load_digits
    import numpy as np

    if not args.mxnet_python:
        print("no --mxnet-python given: MXNet 1.9.1 lives in a venv of its own "
              "(pip install 'numpy<1.24' mxnet==1.9.1); nothing to compare against")
        return 0
    if not args.source_only:
        import compileall

        compileall.compile_dir(str(ROOT / "geomx"), quiet=1)
    print(f"geomx {'as it is' if args.source_only else 'byte-compiled'}", flush=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    cut = int(0.8 * len(y))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "digits.npz"
        np.savez(data, x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:])
        systems = ("mxnet", "geomx", "geomx exec")
        rows: dict[str, list[dict]] = {s: [] for s in systems}
        for rnd in range(args.rounds):
            order_ = systems[rnd % 3:] + systems[:rnd % 3]  # rotate who goes first
            for system in order_:
                res = (run_mxnet(args.mxnet_python, data, work) if system == "mxnet"
                       else run_geomx(work, "exec" if system == "geomx exec" else "fork"))
                rows[system].append(res)
                print(f"round {rnd + 1} {system:10s} wall {res['wall_s']:6.2f} s  "
                      f"{res['s_per_iter'] * 1e3:7.2f} ms/iter  accuracy {res['accuracy']:.4f}",
                      flush=True)
    load = os.getloadavg()[0]
    med = {s: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "s_per_iter", "accuracy")}
           for s, rs in rows.items()}
    print(f"\nmedians over {args.rounds} rounds (load average {load:.1f} on {os.cpu_count()} CPUs):")
    for s in systems:
        m = med[s]
        print(f"  {s:10s} whole job {m['wall_s']:6.2f} s, {m['s_per_iter'] * 1e3:6.2f} ms per "
              f"iteration, accuracy {m['accuracy']:.4f}")
    m = med["mxnet"]
    for s in systems[1:]:
        g = med[s]
        print(f"  {s} / MXNet: whole job {g['wall_s'] / m['wall_s']:.2f}x the time, per "
              f"iteration {g['s_per_iter'] / m['s_per_iter']:.2f}x the time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
