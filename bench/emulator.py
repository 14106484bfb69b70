"""Emulator speed: a phantom ResNet-50 with FSA on the WAN of scenarios/resnet50_phantom.toml.

Default: 4 DCs x 8 workers, 20 iterations, HiPS and the flat-PS variant (the baseline in
the same run, which sends far more bytes across the WAN with the same number of flows).
Prints messages delivered per second of wall time (and per CPU second: on a shared
machine the wall figure includes time other processes took) and emulated time / wall
time (> 1 means the emulator runs faster than the system it emulates).

``--profile`` adds a cProfile of the HiPS run, top 30 functions by own time.

``--scale`` prints the scaling table instead: the same job on 2x4, 4x8, 8x16, 16x32 and
16x64 (DCs x workers per DC; each DC has its own 1 Gbps WAN link to the central DC, with
30/40/50/60 ms latencies repeating), each row in a fresh subprocess so its peak RSS is its
own. Next to it, measured in the same run on geomx's VirtualTimeLoop, the ceiling any
Python emulator on this loop can reach: a bare ``call_soon`` chain (one callback per
message), an ``asyncio.Queue`` put/get pair, and a Queue hand-off to a task waiting for
it (what a node's receive loop costs at least), and the least a request and its reply
cost with the node code's primitives alone (a Message, a reply future and its callback,
two call_soon hand-offs: no network model, kvstore or server logic), all per wall second;
the last columns are the emulator's msg/s as a fraction of the first two and of that
floor.

    python bench/emulator.py [--iterations 20] [--profile]
    python bench/emulator.py --scale [--sizes 2x4,4x8,8x16,16x32,16x64] [--tensors 161]
    python bench/emulator.py --scale --sizes scenarios/scale_1024.toml   # 1,024 workers, 10 iterations

A ``--sizes`` entry may also be a scenario file, run as it is (with events, traces and
plots off).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import resource
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from geomx.experiment import run_emulated  # noqa: E402
from geomx.scenario import load_scenario, parse_scenario  # noqa: E402
from geomx.sim.loop import run_virtual  # noqa: E402

BASE = ROOT / "scenarios" / "resnet50_phantom.toml"
QUIET = ["metrics.events=false", "metrics.trace=false", "metrics.plot=false", "run.progress=false"]
RESNET50_PARAMS = 25_557_032
#: iterations per row of --scale: enough for a few seconds of wall time per row
SCALE_ITERATIONS = {2: 20, 4: 10, 8: 4, 16: 2}


def scaled_scenario(n_dcs: int, workers_per_dc: int, iterations: int, tensors: int = 161,
                    kind: str = "hips") -> Any:
    """resnet50_phantom.toml with ``n_dcs`` worker DCs of ``workers_per_dc`` workers each."""
    raw = tomllib.loads(BASE.read_text())
    central = dict(raw["dc"][0])
    template = dict(raw["dc"][1])
    raw["dc"] = [central] + [dict(template, name=f"dc{i + 1}", workers=workers_per_dc)
                             for i in range(n_dcs)]
    wan = raw["wan"][0]
    raw["wan"] = [dict(wan, a=f"dc{i + 1}", b=central["name"], latency=f"{30 + 10 * (i % 4)}ms")
                  for i in range(n_dcs)]
    raw["run"] = dict(raw["run"], iterations=iterations, progress=False)
    raw["topology"] = {"kind": kind}
    raw["metrics"] = {"events": False, "trace": False, "plot": False}
    if tensors != 161:
        raw["training"] = {k: v for k, v in raw["training"].items() if k != "phantom_preset"}
        size = RESNET50_PARAMS // tensors
        raw["training"]["phantom_layers"] = [size] * tensors
    return parse_scenario(raw, f"{BASE.name} scaled to {n_dcs}x{workers_per_dc}")


def measure(s: Any, profile: bool = False) -> dict[str, Any]:
    """Run scenario ``s`` in the emulator and time it (wall time includes setting up)."""
    with tempfile.TemporaryDirectory() as d:
        prof = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        c0 = time.process_time()
        if prof:
            prof.enable()
        summary = run_emulated(s, Path(d), progress=False)
        if prof:
            prof.disable()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
    msgs = summary.extra["messages_delivered"]
    return {"wall_s": wall, "cpu_s": cpu, "emulated_s": summary.emulated_seconds, "messages": msgs,
            "msgs_per_wall_s": msgs / wall, "msgs_per_cpu_s": msgs / cpu,
            "us_per_msg": wall / msgs * 1e6,
            "emu_over_wall": summary.emulated_seconds / wall,
            "wan_gb": summary.bytes_wan / 1e9, "lan_gb": summary.bytes_lan / 1e9,
            "recomputations": summary.extra["rate_recomputations"],
            "callbacks_per_msg": summary.extra.get("loop_callbacks", 0) / msgs,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "profile": prof}


def run(kind: str, iterations: int, profile: bool = False) -> dict[str, Any]:
    s = load_scenario(BASE, [f"run.iterations={iterations}", f"topology.kind={kind}", *QUIET])
    return {"mode": kind, **measure(s, profile)}


# -- the ceiling: what the bare loop carries ------------------------------------------------

def call_soon_chain_per_s(n: int = 300_000) -> float:
    """Callbacks per wall second when each one schedules the next (one callback a message)."""
    async def main() -> float:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        left = [n]

        def step() -> None:
            left[0] -= 1
            if left[0]:
                loop.call_soon(step)
            else:
                done.set_result(None)

        t0 = time.perf_counter()
        loop.call_soon(step)
        await done
        return n / (time.perf_counter() - t0)

    return run_virtual(main())


def queue_put_get_per_s(n: int = 300_000) -> float:
    """``asyncio.Queue`` put/get pairs per wall second (one task: no switch)."""
    async def main() -> float:
        q: asyncio.Queue[int] = asyncio.Queue()
        t0 = time.perf_counter()
        for i in range(n):
            q.put_nowait(i)
            await q.get()
        return n / (time.perf_counter() - t0)

    return run_virtual(main())


def queue_handoff_per_s(n: int = 200_000) -> float:
    """Messages per wall second through an ``asyncio.Queue`` from one task to another
    that waits for each (two task switches a message, as a node's receive loop)."""
    async def main() -> float:
        q: asyncio.Queue[int] = asyncio.Queue()

        async def consumer() -> None:
            for _ in range(n):
                await q.get()

        async def producer() -> None:
            for i in range(n):
                q.put_nowait(i)
                await asyncio.sleep(0)

        t0 = time.perf_counter()
        await asyncio.gather(consumer(), producer())
        return n / (time.perf_counter() - t0)

    return run_virtual(main())


def request_reply_floor_per_s(n: int = 100_000) -> float:
    """Messages per wall second of the least a request and its reply can cost with the
    node code's primitives and nothing else: build a ``Message``, register a reply
    future, hand the request over with ``call_soon``, answer it with
    :meth:`Message.answer`, resolve the future, run its done callback (no network model,
    no kvstore, no server logic). Two messages per exchange; the floor under any design
    that keeps a future per request in shared asyncio node code."""
    from geomx.wire import Kind, Message

    async def main() -> float:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        pending: dict[int, asyncio.Future[Message]] = {}
        left = [n]

        def serve(msg: Message) -> None:  # the server: answer at once
            loop.call_soon(receive, msg.answer(Kind.PUSH_ACK, 0, {}))

        def receive(reply: Message) -> None:  # the client's receive path
            pending.pop(reply.request_id).set_result(reply)

        def replied(fut: asyncio.Future[Message]) -> None:
            left[0] -= 1
            if left[0]:
                send()
            else:
                done.set_result(None)

        def send() -> None:
            msg = Message(Kind.PUSH, "w:dc1:0", "ls:dc1", key=left[0] % 161,
                          request_id=left[0])
            fut = loop.create_future()
            pending[msg.request_id] = fut
            fut.add_done_callback(replied)
            loop.call_soon(serve, msg)

        t0 = time.perf_counter()
        send()
        await done
        return 2 * n / (time.perf_counter() - t0)

    return run_virtual(main())


def _best(fn: Any, repeat: int = 3) -> float:
    return max(fn() for _ in range(repeat))


# -- output -------------------------------------------------------------------------------

def print_profile(prof: cProfile.Profile, top: int = 30) -> None:
    print(f"\nprofile of the HiPS run, top {top} by own time:")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def main_default(args: argparse.Namespace) -> int:
    rows = [run("hips", args.iterations, args.profile)]
    if not args.skip_baseline:
        rows.append(run("flat", args.iterations))
    print(f"phantom ResNet-50 (25.6M params, 161 tensors), 4 DCs x 8 workers, FSA, "
          f"{args.iterations} iterations")
    print(f"{'mode':8} {'wall s':>8} {'emulated s':>11} {'messages':>9} {'msg/wall s':>11} "
          f"{'msg/CPU s':>10} {'us/msg':>7} {'emu/wall':>9} {'WAN GB':>8} {'LAN GB':>8} "
          f"{'recomputes':>10} {'cb/msg':>6}")
    for r in rows:
        print(f"{r['mode']:8} {r['wall_s']:8.2f} {r['emulated_s']:11.2f} {r['messages']:9d} "
              f"{r['msgs_per_wall_s']:11.0f} {r['msgs_per_cpu_s']:10.0f} {r['us_per_msg']:7.2f} "
              f"{r['emu_over_wall']:9.2f} "
              f"{r['wan_gb']:8.2f} {r['lan_gb']:8.2f} {r['recomputations']:10d} "
              f"{r['callbacks_per_msg']:6.2f}")
    if len(rows) == 2:
        print(f"HiPS vs flat PS: emulated time x{rows[1]['emulated_s'] / rows[0]['emulated_s']:.2f} "
              f"faster, WAN bytes x{rows[1]['wan_gb'] / rows[0]['wan_gb']:.2f} fewer")
    if args.profile:
        print_profile(rows[0]["profile"])
    return 0


def main_row(args: argparse.Namespace) -> int:
    """One row of --scale, in its own process: prints a JSON object."""
    if args.row.endswith(".toml"):
        s = load_scenario(args.row, QUIET)
        worker_dcs = [dc for dc in s.dcs if dc.workers]
        n_dcs, wpd = len(worker_dcs), max(dc.workers for dc in worker_dcs)
        iters = s.run.iterations
    else:
        n_dcs, wpd = (int(x) for x in args.row.split("x"))
        iters = args.iterations if args.iterations_given else SCALE_ITERATIONS.get(n_dcs, 2)
        s = scaled_scenario(n_dcs, wpd, iters, args.tensors)
    r = measure(s)
    r.pop("profile")
    print(json.dumps({"dcs": n_dcs, "workers_per_dc": wpd, "iterations": iters, **r}))
    return 0


def main_scale(args: argparse.Namespace) -> int:
    soon = _best(call_soon_chain_per_s)
    queue = _best(queue_put_get_per_s)
    handoff = _best(queue_handoff_per_s)
    floor = _best(request_reply_floor_per_s)
    rows = []
    for size in args.sizes.split(","):
        cmd = [sys.executable, __file__, "--row", size, "--tensors", str(args.tensors)]
        if args.iterations_given:
            cmd += ["--iterations", str(args.iterations)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"phantom ResNet-50 ({args.tensors} tensors, 25.6M params), FSA, HiPS; "
          f"ceiling on VirtualTimeLoop: call_soon chain {soon / 1e3:.0f}k/s, "
          f"asyncio.Queue put/get {queue / 1e3:.0f}k/s, Queue hand-off to a waiting task "
          f"{handoff / 1e3:.0f}k/s, request/reply with a future and nothing else "
          f"{floor / 1e3:.0f}k msg/s (wall, best of 3; /floor: the emulator's msg/s as a "
          "fraction of the last)")
    print(f"{'DCs x w':>8} {'workers':>7} {'iters':>5} {'tensors':>7} {'messages':>9} {'wall s':>7} "
          f"{'msg/s':>8} {'msg/CPUs':>8} {'us/msg':>7} {'emu/wall':>8} {'wall s/it':>9} "
          f"{'RSS MiB':>8} {'cb/msg':>6} {'/soon':>6} {'/queue':>6} {'/floor':>6}")
    for r in rows:
        print(f"{r['dcs']:>3} x {r['workers_per_dc']:<3} {r['dcs'] * r['workers_per_dc']:7d} "
              f"{r['iterations']:5d} {args.tensors:7d} {r['messages']:9d} {r['wall_s']:7.2f} "
              f"{r['msgs_per_wall_s']:8.0f} {r['msgs_per_cpu_s']:8.0f} {r['us_per_msg']:7.2f} "
              f"{r['emu_over_wall']:8.2f} "
              f"{r['wall_s'] / r['iterations']:9.3f} {r['rss_mib']:8.0f} "
              f"{r['callbacks_per_msg']:6.2f} "
              f"{r['msgs_per_wall_s'] / soon:6.3f} {r['msgs_per_wall_s'] / queue:6.3f} "
              f"{r['msgs_per_wall_s'] / floor:6.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=None,
                    help="FSA iterations (default 20; per-size defaults with --scale)")
    ap.add_argument("--profile", action="store_true", help="cProfile the HiPS run (top 30 by own time)")
    ap.add_argument("--skip-baseline", action="store_true", help="no flat-PS run")
    ap.add_argument("--scale", action="store_true", help="print the scaling table")
    ap.add_argument("--sizes", default="2x4,4x8,8x16,16x32,16x64",
                    help="--scale: comma-separated DCs x workers per DC")
    ap.add_argument("--tensors", type=int, default=161,
                    help="--scale: 161 (the real ResNet-50 layers) or N equal tensors")
    ap.add_argument("--row", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.iterations_given = args.iterations is not None
    if args.iterations is None:
        args.iterations = 20
    if args.row:
        return main_row(args)
    if args.scale:
        return main_scale(args)
    return main_default(args)


if __name__ == "__main__":
    sys.exit(main())
