"""geomx.torch against what a PyTorch user would pick instead: DistributedDataParallel.

A communication-heavy model (an MLP of ``--params`` parameters, 25M by default) trains on
2 workers, once with ``torch.nn.parallel.DistributedDataParallel`` over gloo and once with
``geomx.torch.DistributedOptimizer`` (``--runtime real``: one process per node, real
sockets) in each configuration of :data:`LOOPBACK` and :data:`SHAPED` (a flat parameter
server with one or two global servers, P3's slicing, HiPS with a local server per DC).
Both run on this host's loopback, unshaped (geomx's nodes pass large values through
shared-memory rings there, ``[real] shm``, docs/real-runtime.md "Same-host transfers";
``--rings-off-too`` adds each configuration with every byte through loopback TCP);
then, with ``--shaped-mbit`` (100 by default) and root, both again across a
``tc tbf``-shaped veth link -- DDP's two ranks in two network namespaces
(geomx/runtime/netns.py), geomx's workers in their DCs' namespaces (``[real] shaper =
"kernel"``, geomx/runtime/kernel_wan.py; no rings between namespaces) -- DDP with its
``fp16_compress_hook``, geomx with ``Compression.fp16``. geomx runs in two geometries
(:data:`SITES`): on DDP's own network, one shaped link between the two workers' sites
with the server at worker a's site (joined to it by a 10 Gbit/s link, a campus network);
and with the server in a third DC that each worker reaches over a shaped link of its own.

**What is measured, in the same run:** the communication time an iteration *exposes*,
what a training iteration takes beyond the same iteration without communication:

* DDP: (forward + backward with its allreduce) minus (forward + backward under
  ``no_sync()``), alternating the two every iteration on the same model;
* geomx: (forward + backward + ``opt.step()``: push, servers' sum, pull, local step)
  minus (forward + backward + the torch optimizer's step on an identical model that
  trains alone), alternating the two every iteration in the same process.

Both overlap communication with the backward pass (DDP by its buckets, geomx.torch by
sending each gradient from its hook), so the ratio compares what each leaves exposed;
a value on a loaded machine is noisy, which is why each figure is the median, over
``--iterations`` iterations after ``--warmup``, of the difference within an iteration
(:func:`exposed_ms`).

Each part prints every configuration against DDP, then the best geomx one with its
ratio and the issue's target, and what the wire or the loopback costs by itself.

Run: ``python bench/torch_vs_ddp.py --repeat 2`` (``--quick`` for a 2M-parameter smoke
run; ``--shaped-only`` for the shaped part alone).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]


def mlp(params: float, inputs: int = 1024, classes: int = 10) -> nn.Module:
    """Four linear layers with about ``params`` parameters (the hidden width solves
    2h^2 + (inputs + classes) h = params)."""
    b = inputs + classes + 3
    h = int((-b + math.sqrt(b * b + 8 * params)) / 4)
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inputs, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                         nn.Linear(h, h), nn.ReLU(), nn.Linear(h, classes))


def batch(size: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(size, 1024, generator=g), torch.randint(0, 10, (size,), generator=g)


def median_ms(xs: list[float]) -> float:
    return 1000.0 * statistics.median(xs)


def exposed_ms(synced: list[float], local: list[float]) -> float:
    """The median over iterations of (the iteration with communication - the same
    iteration without it, timed right after): each pair sees about the same load, so a
    change of the machine's load between iterations cancels out, which a difference of
    two medians of ~1 s figures on a shared machine does not."""
    return median_ms([s - c for s, c in zip(synced, local)])


# ---------------------------------------------------------------------------- DDP
def ddp_rank(rank: int, addr: str, port: int, params: float, iters: int, warmup: int,
             bs: int, fp16: bool) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=2, timeout=__import__("datetime").timedelta(seconds=600))
    model = DDP(mlp(params))
    if fp16:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
        model.register_comm_hook(None, fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batch(bs, rank)
    synced, local = [], []
    for it in range(warmup + iters):
        for sync in (True, False):
            opt.zero_grad()
            t0 = time.perf_counter()
            if sync:
                nn.functional.cross_entropy(model(x), y).backward()
            else:
                with model.no_sync():
                    nn.functional.cross_entropy(model(x), y).backward()
            dt = time.perf_counter() - t0
            if it >= warmup:
                (synced if sync else local).append(dt)
            if sync:
                opt.step()
    dist.destroy_process_group()
    return {"comm_ms": exposed_ms(synced, local), "iter_ms": median_ms(synced),
            "compute_ms": median_ms(local)}


def receive_all(conn: socket.socket, nbytes: int, buf: memoryview) -> None:
    """Read ``nbytes`` from ``conn``, ``len(buf)`` at most at a time, into ``buf``."""
    got = 0
    while got < nbytes:
        k = conn.recv_into(buf, min(len(buf), nbytes - got))
        if not k:
            raise ConnectionError(f"peer closed after {got} of {nbytes} bytes")
        got += k


def raw_side(side: str, addr: str, port: int, nbytes: int, rounds: int) -> list[float]:
    """One end of :func:`raw_both_ways_ms`: ``a`` listens, ``b`` connects; every round both
    send ``nbytes`` on one TCP connection while receiving as much."""
    import threading

    if side == "a":
        with socket.socket() as ls:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((addr, port))
            ls.listen(1)
            conn = ls.accept()[0]
    else:
        for _ in range(200):
            try:
                conn = socket.create_connection((addr, port))
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"could not reach {addr}:{port}")

    buf = memoryview(bytearray(1 << 20))

    def receive(done: list[float]) -> None:
        receive_all(conn, nbytes, buf)
        done.append(time.perf_counter())

    data, times = memoryview(bytearray(nbytes)), []
    with conn:
        for _ in range(rounds):
            conn.sendall(b"x")  # both ends start the round together
            if conn.recv(1) != b"x":
                raise ConnectionError("out of step")
            t0, done = time.perf_counter(), []
            th = threading.Thread(target=receive, args=(done,))
            th.start()
            conn.sendall(data)
            th.join()
            times.append(done[0] - t0)
    return times


def raw_both_ways_ms(pair: Any, nbytes: int, rounds: int = 5) -> float:
    """``nbytes`` each way at once between the two namespaces of ``pair`` over one plain
    TCP connection, the slower end's median over ``rounds``: the floor that a ring
    allreduce and a sliced parameter server both stand on."""
    port = free_port()
    procs = [subprocess.Popen(pair.exec_argv(side, [
        sys.executable, str(HERE), "--raw-side", side, "--addr", pair.addr_a, "--port",
        str(port), "--raw-bytes", str(nbytes), "--iterations", str(rounds)]),
        stdout=subprocess.PIPE, text=True) for side in "ab"]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a raw transfer end failed: {outs}")
    a, b = (json.loads(o.strip().splitlines()[-1]) for o in outs)
    return 1000 * statistics.median(max(x, y) for x, y in zip(a, b))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(args, *, fp16: bool, netns=None) -> dict:
    """DDP's two ranks as two processes (inside two namespaces when ``netns``)."""
    addr = netns.addr_a if netns else "127.0.0.1"
    port = free_port()
    procs = []
    for rank in (0, 1):
        argv = [sys.executable, str(HERE), "--ddp-rank", str(rank), "--addr", addr,
                "--port", str(port), "--params", str(args.params), "--iterations",
                str(args.iterations), "--warmup", str(args.warmup), "--batch", str(args.batch)]
        if fp16:
            argv.append("--fp16")
        if netns:
            argv = netns.exec_argv("ab"[rank], argv)
        device = (netns.if_a, netns.if_b)[rank] if netns else "lo"
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                                      env={**os.environ, "GLOO_SOCKET_IFNAME": device}))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a DDP rank failed: {outs}")
    rows = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return {k: statistics.mean(r[k] for r in rows) for k in rows[0]}


# ---------------------------------------------------------------------------- geomx
def geomx_main(kv, ctx):
    """The training program each geomx node runs (``training.program``): a synchronous
    ``def main``, as a Horovod user writes one, so the node's event loop sends the
    gradients the backward pass hands it while the pass goes on (docs/torch.md)."""
    import geomx.torch as hvd

    p = argparse.ArgumentParser()
    p.add_argument("--params", type=float)
    p.add_argument("--batch", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--fp16", action="store_true")
    a = p.parse_args(ctx.args)
    hvd.init(kv, ctx)
    torch.set_num_threads(1)
    model, twin = mlp(a.params), mlp(a.params)  # the twin trains alone, for the compute
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    alone = torch.optim.SGD(twin.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16 if a.fp16 else "none")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if hvd.is_master():
        return
    x, y = batch(a.batch, hvd.rank())
    synced, local = [], []
    for it in ctx.iterations():
        opt.zero_grad()
        t0 = time.perf_counter()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        t1 = time.perf_counter()
        alone.zero_grad()
        nn.functional.cross_entropy(twin(x), y).backward()
        alone.step()
        t2 = time.perf_counter()
        if it > a.warmup:
            synced.append(t1 - t0)
            local.append(t2 - t1)
    ctx.report(ctx.max_iterations, comm_ms=exposed_ms(synced, local),
               iter_ms=median_ms(synced), compute_ms=median_ms(local))


SCENARIO = """
[run]
name = "torch_vs_ddp"
iterations = {iterations}
eval_every = 1000000
progress = false
[metrics]
plot = false
trace = false
[[dc]]
name = "central"
central = true
global_servers = 1
workers = 0
[[dc]]
name = "a"
workers = 1
compute_per_iter = "0ms"
[[dc]]
name = "b"
workers = 1
compute_per_iter = "0ms"
[[wan]]
a = "a"
b = "central"
bandwidth = "{mbit_a}Mbps"
latency = "0ms"
[[wan]]
a = "b"
b = "central"
bandwidth = "{mbit}Mbps"
latency = "0ms"
[topology]
kind = "{topology}"
[membership]
heartbeat_timeout = "60s"
[training]
program = "{program}"
dataset = "synthetic"
[real]
shape = {shape}
shaper = "{shaper}"
"""


#: where the global server sits on the shaped links: the bandwidth of worker a's link to
#: it, as a multiple of the shaped rate (worker b's link always has the shaped rate).
#: "one link": at worker a's site, one shaped link between the two sites as DDP has;
#: "third DC": each worker reaches it over a shaped link of its own.
SITES = {"one link": 100.0, "third DC": 1.0}


def run_geomx(args, *, topology: str, fp16: bool, mbit: float | None,
              sets: tuple[str, ...] = (), sites: str = "third DC") -> dict:
    """One geomx.torch job over real sockets (``sets``: scenario overrides; ``sites``: a
    key of :data:`SITES`, for the shaped links)."""
    from geomx.experiment import run_scenario
    from geomx.metrics import load_run
    from geomx.scenario import load_scenario

    with tempfile.TemporaryDirectory() as tmp:
        text = SCENARIO.format(iterations=args.warmup + args.iterations, topology=topology,
                               program=f"{HERE}:geomx_main", mbit=mbit or 100000,
                               mbit_a=mbit * SITES[sites] if mbit else 100000,
                               shape="true" if mbit else "false",
                               shaper="kernel" if mbit else "userspace")
        prog_args = ["--params", str(args.params), "--batch", str(args.batch),
                     "--warmup", str(args.warmup)] + (["--fp16"] if fp16 else [])
        path = Path(tmp) / "torch_vs_ddp.toml"
        path.write_text(text)
        s = load_scenario(path, [f"run.out_dir={tmp}",
                                 "training.program_args=" + json.dumps(prog_args), *sets])
        r = run_scenario(s, runtime="real", progress=False)
        rows = [e for e in load_run(r.run_dir).events()
                if e.get("ev") == "eval" and "comm_ms" in e]
    return {k: statistics.mean(e[k] for e in rows) for k in ("comm_ms", "iter_ms", "compute_ms")}


# ---------------------------------------------------------------------------- main
def p3(slice_elements: int) -> tuple[str, ...]:
    return ("sched.p3=true", f"sched.p3_slice_elements={slice_elements}")


#: the geomx.torch configurations each part measures: (label, topology, overrides[, a key
#: of :data:`SITES`])
LOOPBACK = [("geomx.torch flat PS", "flat", ()),
            ("geomx.torch flat PS, 2 servers", "flat", ("dc.0.global_servers=2",)),
            ("geomx.torch flat PS + P3 1M", "flat", p3(1_000_000)),
            ("geomx.torch HiPS", "hips", ())]
SHAPED = [("geomx.torch flat PS + P3 50k, one link", "flat", p3(50_000), "one link"),
          ("geomx.torch flat PS + P3 100k, third DC", "flat", p3(100_000), "third DC"),
          ("geomx.torch HiPS + P3 250k, third DC", "hips", p3(250_000), "third DC"),
          ("geomx.torch HiPS, third DC", "hips", (), "third DC")]


def loopback_transfer_ms(nbytes: int, repeat: int = 5) -> float:
    """One TCP transfer of ``nbytes`` over this host's loopback (a sending thread, a
    receiving one): the unit both DDP's and geomx's loopback traffic is made of."""
    import threading

    data = memoryview(bytearray(nbytes))
    sink = memoryview(bytearray(4 << 20))
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname()) as out, srv.accept()[0] as inp:
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                sender = threading.Thread(target=out.sendall, args=(data,))
                sender.start()
                receive_all(inp, nbytes, sink)
                sender.join()
                times.append(time.perf_counter() - t0)
    return median_ms(times)


def measure(args, repeat: int, ddp_run, configs, *, fp16: bool, mbit: float | None
            ) -> list[tuple[str, dict]]:
    """DDP and every geomx configuration, ``repeat`` times in turn (so that a change of
    the machine's load hits all of them); each figure the median over the repeats."""
    runs: dict[str, list[dict]] = {}
    for _ in range(repeat):
        runs.setdefault("DDP", []).append(ddp_run())
        for label, topology, sets, *sites in configs:
            runs.setdefault(label, []).append(run_geomx(args, topology=topology, fp16=fp16,
                                                        mbit=mbit, sets=sets, sites=sites[0]
                                                        if sites else "third DC"))
    return [(label, {k: statistics.median(r[k] for r in rs) for k in rs[0]})
            for label, rs in runs.items()]


def table(title: str, rows: list[tuple[str, dict]], ddp_label: str, target: str,
          met: Any) -> tuple[str, dict]:
    base = rows[0][1]
    print(f"\n{title}")
    print(f"  {'':42s} {'comm ms/it':>11s} {'vs DDP':>7s} {'compute ms':>11s} {'iter ms':>9s}")
    for name, r in rows:
        label = ddp_label if name == "DDP" else name
        print(f"  {label:42s} {r['comm_ms']:11.1f} {r['comm_ms'] / base['comm_ms']:6.2f}x "
              f"{r['compute_ms']:11.1f} {r['iter_ms']:9.1f}")
    # the best of the default configurations (not those with the rings turned off)
    best = min((nr for nr in rows[1:] if not nr[0].endswith(", no shm")),
               key=lambda nr: nr[1]["comm_ms"])
    ratio = best[1]["comm_ms"] / base["comm_ms"]
    print(f"  best geomx: {best[0]}: {best[1]['comm_ms']:.1f} ms against DDP's "
          f"{base['comm_ms']:.1f} ms = {ratio:.2f}x (target: {target}): "
          f"{'met' if met(ratio) else 'MISSED'}")
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=25e6)
    p.add_argument("--shaped-params", type=float, default=5e6,
                   help="model size on the shaped link (25M at 100 Mbit/s is 8 s per step)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of every configuration, in turn; figures are their medians")
    p.add_argument("--shaped-mbit", type=float, default=100.0, help="0: skip the shaped part")
    p.add_argument("--shaped-only", action="store_true", help="skip the loopback part")
    p.add_argument("--rings-off-too", action="store_true",
                   help="also run each loopback configuration with `[real] shm = false` "
                        "(every byte through loopback TCP), in the same turns")
    p.add_argument("--quick", action="store_true", help="2M parameters, 4 iterations")
    p.add_argument("--ddp-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--addr", default="127.0.0.1", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--fp16", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--raw-side", choices=("a", "b"), help=argparse.SUPPRESS)
    p.add_argument("--raw-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.raw_side:
        print(json.dumps(raw_side(args.raw_side, args.addr, args.port, args.raw_bytes,
                                  args.iterations)))
        return
    if args.ddp_rank >= 0:
        print(json.dumps(ddp_rank(args.ddp_rank, args.addr, args.port, args.params,
                                  args.iterations, args.warmup, args.batch, args.fp16)))
        return
    if args.quick:
        args.params, args.shaped_params, args.iterations, args.warmup = 2e6, 1e6, 4, 2
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    params = args.shaped_params if args.shaped_only else args.params
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {load:.1f}; 2 workers, "
          f"MLP of {params / 1e6:.1f}M parameters, batch {args.batch}, median of "
          f"{args.iterations} iterations after {args.warmup}, {args.repeat} run(s) each")
    if not args.shaped_only:
        loopback_part(args)
    if args.shaped_mbit <= 0:
        print("\nshaped link: skipped (--shaped-mbit 0)")
        return
    shaped_part(args)


def loopback_part(args: argparse.Namespace) -> None:
    """Every configuration of :data:`LOOPBACK` against DDP on this host's loopback."""
    loopback = LOOPBACK
    if args.rings_off_too:
        loopback = [c for label, topology, sets in LOOPBACK
                    for c in ((label, topology, sets),
                              (label + ", no shm", topology, (*sets, "real.shm=false")))]
    rows = measure(args, args.repeat, lambda: run_ddp(args, fp16=False), loopback,
                   fp16=False, mbit=None)
    table("loopback, unshaped, no codec", rows, "DDP (gloo)", "within 1.25x",
          lambda r: r <= 1.25)
    nbytes = 4 * sum(q.numel() for q in mlp(args.params).parameters())
    unit = loopback_transfer_ms(nbytes)
    print(f"  one loopback TCP transfer of the {nbytes / 1e6:.0f} MB gradient: {unit:.1f} ms. "
          "Per iteration each DDP rank sends and receives it once, at the same time; a PS "
          "server receives it from both workers and sends it to both (4 transfers through "
          "one process), the workers' halves of the same transfers meanwhile")


def shaped_part(args: argparse.Namespace) -> None:
    """DDP and every configuration of :data:`SHAPED` across tbf-shaped links, FP16."""
    from geomx.runtime.kernel_wan import QUEUE_LATENCY_MS, tbf_rate_and_burst
    from geomx.runtime.netns import NetnsPair, unavailable_reason

    why = unavailable_reason()
    if why is not None:
        print(f"\nshaped link: skipped: {why}")
        return
    shaped = argparse.Namespace(**{**vars(args), "params": args.shaped_params})

    # DDP's link is shaped as geomx's kernel WAN shapes each of its links (rate, bucket,
    # queue, no slow start after idle: geomx/runtime/kernel_wan.py)
    rate_bps, burst_bytes = tbf_rate_and_burst(args.shaped_mbit * 1e6)

    def ddp16() -> dict:
        with NetnsPair(rate_mbit=rate_bps / 1e6, burst_bytes=burst_bytes,
                       latency_ms=QUEUE_LATENCY_MS) as pair:
            return run_ddp(shaped, fp16=True, netns=pair)

    rows = measure(shaped, args.repeat, ddp16, SHAPED, fp16=True, mbit=args.shaped_mbit)
    best = table(f"{args.shaped_mbit:g} Mbit/s tbf-shaped links (netns), "
                 f"{args.shaped_params / 1e6:.1f}M parameters, FP16", rows,
                 "DDP (gloo) + fp16_compress_hook", "ahead of DDP", lambda r: r < 1.0)
    half = 2 * sum(q.numel() for q in mlp(args.shaped_params).parameters())
    wire = 1000 * half * 8 / (args.shaped_mbit * 1e6)
    with NetnsPair(rate_mbit=rate_bps / 1e6, burst_bytes=burst_bytes,
                   latency_ms=QUEUE_LATENCY_MS) as pair:
        raw = raw_both_ways_ms(pair, half)
    ddp_ms = rows[0][1]["comm_ms"]
    print(f"  wire: each worker sends its {half / 1e6:.1f} MB FP16 gradient and receives as "
          f"much, {wire:.0f} ms each way at {args.shaped_mbit:g} Mbit/s, both ways at once "
          f"(a ring allreduce and a sliced PS alike); one plain TCP connection moving as much "
          f"both ways over the same link took {raw:.0f} ms (headers, acknowledgements). "
          f"Above that floor: DDP {ddp_ms - raw:+.0f} ms, geomx {best[1]['comm_ms'] - raw:+.0f} ms")


if __name__ == "__main__":
    main()
