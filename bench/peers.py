"""Benchmark: geomx's real runtime against the systems it replaces, on loopback.

    python bench/peers.py [--rounds 3] [--mb 100] [--keys 1000] [--key-kb 4] [--pings 300]
        [--mxnet-python /work/venv-mxnet/bin/python] [--torch-python PATH] [--only geomx,zmq]
        [--json out.json]

The same three operations, one worker and one server on this host, no shaping:

* **100 MB push + pull** of one float32 key (GB/s counting both directions);
* **1,000 keys x 4 KB push + pull** (every key pushed, then every key pulled; ms), and
  where the system has one, the same as one list call (``kv.push(keys)``/``kv.pull(keys)``);
* **64-byte push + pull round trip** (p50 over ``--pings``, µs).

Contenders (``bench/peers_side.py`` says exactly what each does):

* **geomx**: ``geomx.kv`` through ``geomx run --runtime real`` (TcpTransport, flat PS, one
  global server, ``[real] shape = false``, optimizer ``none`` so the server stores what it
  is pushed, ``[metrics] events = false`` unless ``--events``), program
  ``bench/peers_geomx.py``;
* **mxnet**: MXNet 1.9.1 ``dist_sync`` kvstore (ps-lite over ZeroMQ, GeoMX's own base) in
  the Python given by ``--mxnet-python`` (a separate venv:
  ``pip install 'numpy<1.24' mxnet==1.9.1``), scheduler, server and worker processes with
  the DMLC_* launcher variables;
* **gloo-p2p** / **gloo-allreduce**: torch.distributed's gloo backend, send/recv and
  all_reduce between two ranks (``pip install '.[peers]'`` or ``--torch-python``);
* **zmq**: raw pyzmq DEALER/ROUTER, ps-lite's push/ack + pull/reply exchange.

A contender that is not installed is skipped, and the bench says so. Every contender's
processes are started afresh in each round (start-up is not timed: each side warms up
once and times after); the order of contenders rotates from round to round, and each
figure is the median over rounds. Ratios are speed ratios: baseline time / this time,
so > 1 means faster than the baseline (MXNet, and gloo send/recv).
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
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDE = HERE / "peers_side.py"
OPS = ("big", "small", "small_list", "rtt")
PEERS = ("geomx", "mxnet", "gloo-p2p", "gloo-allreduce", "zmq")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has(python: str, module: str) -> bool:
    r = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    return r.returncode == 0


def _sizes(args: argparse.Namespace) -> list[str]:
    return ["--mb", str(args.mb), "--keys", str(args.keys), "--key-kb", str(args.key_kb),
            "--pings", str(args.pings), "--reps", str(args.reps)]


def _wait(procs: list[subprocess.Popen], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            if rc != 0:
                err = p.stderr.read() if p.stderr else ""
                raise RuntimeError(f"{what}: a process exited with {rc}: {err.strip()[-800:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_geomx(args: argparse.Namespace, work: Path) -> dict[str, float]:
    out = work / "geomx.json"
    prog_args = ["--out", str(out), *_sizes(args)]
    scenario = work / "peers.toml"
    scenario.write_text(f"""# bench/peers.py: one worker, one global server, loopback, no shaping
[run]
name = "peers"
seed = 1
iterations = 1
runtime = "real"

[[dc]]
name = "central"
central = true
global_servers = 1
workers = 0

[[dc]]
name = "party"
workers = 1

[[wan]]
a = "party"
b = "central"
bandwidth = "100Gbps"
latency = "0ms"

[topology]
kind = "flat"

[training]
program = {json.dumps(str(HERE / "peers_geomx.py"))}
program_args = {json.dumps(prog_args)}
optimizer = "none"
model = "mlp"
dataset = "digits"

[real]
shape = false

[metrics]
events = {"true" if args.events else "false"}
trace = false
plot = false
""")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "geomx", "run", str(scenario), "--out",
                          str(work / "run"), "--quiet"], env=env, cwd=work,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait([p], args.timeout_s, "geomx")
    return json.loads(out.read_text())


def run_side(peer: str, python: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    out = work / f"{peer}.json"
    port = _free_port()
    common = [python, str(SIDE), "--peer", peer, "--port", str(port), *_sizes(args)]
    procs = []
    if peer == "mxnet":
        base = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
                    DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="1", PS_VERBOSE="0")
        base.pop("PYTHONPATH", None)
        for role in ("scheduler", "server"):
            procs.append(subprocess.Popen([python, "-c", "import mxnet"], cwd=work,
                                          env=dict(base, DMLC_ROLE=role),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True))
        worker_env = dict(base, DMLC_ROLE="worker")
    else:
        procs.append(subprocess.Popen(common + ["--role", "server"], cwd=work,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
        worker_env = dict(os.environ)
    worker = subprocess.Popen(common + ["--role", "worker", "--out", str(out)], cwd=work,
                              env=worker_env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    _wait([worker, *procs], args.timeout_s, peer)
    return json.loads(out.read_text())


def available(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """Contender name -> how to run it; and the skipped ones with the reason."""
    runs: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    want = set(args.only.split(",")) if args.only else set(PEERS)
    if "geomx" in want:
        runs["geomx"] = run_geomx
    torch_py = args.torch_python or sys.executable
    for peer in ("gloo-p2p", "gloo-allreduce"):
        if peer in want:
            if _has(torch_py, "torch"):
                runs[peer] = lambda a, w, p=peer: run_side(p, torch_py, a, w)
            else:
                skipped[peer] = (f"torch is not installed for {torch_py} "
                                 "(pip install '.[peers]' or --torch-python PATH)")
    if "zmq" in want:
        if _has(sys.executable, "zmq"):
            runs["zmq"] = lambda a, w: run_side("zmq", sys.executable, a, w)
        else:
            skipped["zmq"] = "pyzmq is not installed (pip install '.[peers]')"
    if "mxnet" in want:
        mx_py = args.mxnet_python or sys.executable
        if _has(mx_py, "mxnet"):
            runs["mxnet"] = lambda a, w: run_side("mxnet", mx_py, a, w)
        else:
            skipped["mxnet"] = (f"mxnet is not installed for {mx_py} (a separate venv: pip "
                                "install 'numpy<1.24' mxnet==1.9.1, then --mxnet-python PATH)")
    return runs, skipped


def _fmt(op: str, seconds: float, args: argparse.Namespace) -> str:
    if op == "big":
        return f"{2 * args.mb / 1e3 / seconds:7.2f} GB/s"
    if op == "rtt":
        return f"{seconds * 1e6:7.0f} us  "
    return f"{seconds * 1e3:7.1f} ms  "


def report(results: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> dict[str, Any]:
    med = {peer: {op: statistics.median(v) for op, v in ops.items()}
           for peer, ops in results.items()}
    titles = {"big": f"{args.mb:g} MB push+pull",
              "small": f"{args.keys} keys x {args.key_kb:g} KB push+pull, one call per key",
              "small_list": f"{args.keys} keys x {args.key_kb:g} KB push+pull, one list call",
              "rtt": "64 B push+pull round trip, p50"}
    print(f"\nmedians of {args.rounds} rounds; x = speed ratio (baseline time / this time)")
    for op in OPS:
        rows = [(peer, m[op]) for peer, m in med.items() if op in m]
        if not rows:
            continue
        print(f"\n{titles[op]}")
        for peer, t in rows:
            cols = []
            for base in ("mxnet", "gloo-p2p"):
                b = med.get(base, {}).get(op if op != "small_list" or base == "mxnet"
                                          else "small")
                cols.append(f"{b / t:5.2f}x {base}" if b else f"   --  {base}")
            print(f"  {peer:15s} {_fmt(op, t, args)}   {'   '.join(cols)}")
    if "geomx" in med and "small_list" in med["geomx"]:
        g = med["geomx"]
        print(f"\ngeomx list call vs one call per key: {g['small'] / g['small_list']:.2f}x")
    return {"medians_s": med, "rounds": {p: r for p, r in results.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--key-kb", type=float, default=4.0)
    p.add_argument("--pings", type=int, default=300)
    p.add_argument("--reps", type=int, default=1, help="timed repetitions per process")
    p.add_argument("--mxnet-python", default=os.environ.get("GEOMX_MXNET_PYTHON", ""))
    p.add_argument("--torch-python", default="")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(PEERS)}")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--events", action="store_true",
                   help="geomx writes events.jsonl (a line per message; off by default, as "
                        "a production job would run)")
    p.add_argument("--json", default="")
    args = p.parse_args()
    runs, skipped = available(args)
    for peer, why in skipped.items():
        print(f"skipped {peer}: {why}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"contenders: {', '.join(runs)}; {os.cpu_count()} CPUs, load average {load:.1f}")
    results: dict[str, dict[str, list[float]]] = {peer: {} for peer in runs}
    names = list(runs)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for peer in order:
            with tempfile.TemporaryDirectory(prefix=f"peers-{peer}-") as tmp:
                t0 = time.perf_counter()
                try:
                    res = runs[peer](args, Path(tmp))
                except Exception as e:  # noqa: BLE001 -- a failing contender is reported, not fatal
                    print(f"round {r + 1}: {peer} failed: {e}")
                    continue
                for op, v in res.items():
                    results[peer].setdefault(op, []).append(v)
                print(f"round {r + 1}: {peer:15s} " + "  ".join(
                    f"{op} {_fmt(op, v, args).strip()}" for op, v in res.items())
                    + f"  ({time.perf_counter() - t0:.1f} s with start-up)", flush=True)
    results = {p: r for p, r in results.items() if r}
    out = report(results, args)
    out["load_average"] = load
    out["skipped"] = skipped
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
