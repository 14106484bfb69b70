"""What a synchronous program's blocking calls cost: wall time per kvstore call, sync vs async.

A synchronous program (``def main(kv, ctx)``, docs/guide.md "Synchronous programs") hands
every call to its node's loop and waits for the reply (geomx/node/program_thread.py):
two thread switches per call that an ``async def`` program does not pay. This runs the
same training loop written both ways, in the same bench run, in each runtime, and
prints the wall time per kvstore call of each and their ratio:

* one worker (and the master worker) against one global server, no compute, no WAN
  delay, small keys: the per-call cost is the whole cost;
* per iteration, ``push`` and ``pull(out=)`` of each of ``--keys`` keys and a
  ``waitall``: 2 x keys + 1 calls; the worker's program times its iterations after a
  warm-up (``time.perf_counter``, its own wall time, both runtimes);
* the emulator (one process, virtual time) and ``--runtime real`` (a process per node
  over loopback sockets, uvloop where installed).

It also times the handoff alone: a call that does nothing, made on a virtual-time loop
and on the real runtime's loop from a program thread.

    python bench/sync_program.py [--iterations 300] [--keys 8] [--repeat 3] [--no-real]

Wall times depend on the machine and its load (a handoff is two thread wake-ups, which
a busy machine delays most); compare the two columns of one run, not runs of two days.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from geomx.experiment import run_scenario  # noqa: E402
from geomx.node.program_thread import ProgramThread, run_on_loop  # noqa: E402
from geomx.runtime.eventloop import new_event_loop  # noqa: E402
from geomx.scenario import load_scenario  # noqa: E402
from geomx.sim.loop import new_virtual_loop  # noqa: E402

SCENARIO = """
[run]
name = "sync-program-bench"
seed = 1
target_accuracy = 0

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
bandwidth = "10Gbps"
latency = "0ms"

[training]
model = "mlp"
hidden = [16]
dataset = "digits"
optimizer = "sgd"
"""

LOOP = """
import time
import numpy as np

{kind}def main(kv, ctx):
    keys = list(range(ctx.args and int(ctx.args[0]) or 8))
    values = [np.zeros(16, np.float32) for _ in keys]
    kv.init(keys, values)
    if kv.is_master_worker:
        {await_}kv.waitall()
        return
    warmup = 20
    t0 = None
    for it in ctx.iterations():
        if it == warmup + 1:
            t0 = time.perf_counter()
        for k in keys:
            kv.push(k, values[k])
            kv.pull(k, out=values[k])
        {await_}kv.waitall()
    calls = (it - warmup) * (2 * len(keys) + 1)
    return {{"per_call_s": (time.perf_counter() - t0) / calls, "calls": calls}}
"""


def _per_call_s(folder: Path, kind: str, runtime: str, iterations: int, keys: int) -> float:
    program = folder / f"loop_{kind}.py"
    is_async = kind == "async"
    program.write_text(LOOP.format(kind="async " if is_async else "",
                                   await_="await " if is_async else ""))
    scenario = folder / "bench.toml"
    scenario.write_text(SCENARIO)
    s = load_scenario(scenario, [f"run.out_dir={folder / 'runs'}", "run.progress=false",
                                 f"run.iterations={iterations}", "metrics.plot=false",
                                 "metrics.trace=false", f"training.program={program}",
                                 f"training.program_args=[\"{keys}\"]"])
    r = run_scenario(s, runtime=runtime, progress=False)
    return float(r.summary.extra["final_eval"]["per_call_s"])


def _handoff_s(loop: asyncio.AbstractEventLoop, calls: int) -> float:
    """Wall time per no-op call from a program thread to ``loop`` and back."""
    def program() -> float:
        for _ in range(100):
            run_on_loop(_nothing)
        t0 = time.perf_counter()
        for _ in range(calls):
            run_on_loop(_nothing)
        return (time.perf_counter() - t0) / calls

    try:
        return loop.run_until_complete(ProgramThread(loop, "bench").run(program))
    finally:
        loop.close()


def _nothing() -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--keys", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3, help="runs of each; the median is shown")
    p.add_argument("--no-real", action="store_true", help="the emulator only")
    args = p.parse_args(argv)
    runtimes = ["emu"] if args.no_real else ["emu", "real"]
    print(f"{args.iterations} iterations x ({2 * args.keys} push/pull + 1 waitall) calls, "
          f"one worker, median of {args.repeat}")
    print(f"{'runtime':8s} {'async us/call':>14s} {'sync us/call':>13s} {'ratio':>6s} "
          f"{'overhead us/call':>17s}")
    with tempfile.TemporaryDirectory() as tmp:
        for runtime in runtimes:
            got: dict[str, list[float]] = {"async": [], "sync": []}
            for i in range(args.repeat):
                for kind in ("async", "sync"):  # interleaved: load changes hit both
                    folder = Path(tmp) / f"{runtime}-{kind}-{i}"
                    folder.mkdir()
                    got[kind].append(_per_call_s(folder, kind, runtime, args.iterations,
                                                 args.keys))
            a, s = statistics.median(got["async"]), statistics.median(got["sync"])
            print(f"{runtime:8s} {a * 1e6:14.1f} {s * 1e6:13.1f} {s / a:6.2f} "
                  f"{(s - a) * 1e6:17.1f}")
    calls = 20_000
    virtual = _handoff_s(new_virtual_loop(), calls)
    real = _handoff_s(new_event_loop(), calls)
    print(f"handoff alone (a no-op call from the program thread): virtual-time loop "
          f"{virtual * 1e6:.1f} us, real runtime loop {real * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
