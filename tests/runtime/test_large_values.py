"""One key larger than any frame, pushed and pulled end to end by a training program, in
the emulator and over real sockets (where it travels as a stream of bounded frames,
geomx/runtime/framing.py "Large messages"): the value arrives exact, and the job's memory
stays within a few copies of it.

The 1 GiB case (268M float32) is the slow one; the same program with a 40 MB key runs in
the fast tier. Each prints its wall time and the peak memory of the job's processes
(proportional set size, summed, so that pages forked processes share count once).
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from pathlib import Path

import pytest

from geomx.experiment import run_scenario
from geomx.metrics.recorder import iter_events
from geomx.scenario import load_scenario

from tests.helpers.procs import descendants

GIB = 1 << 30

SCENARIO = """
[run]
name = "large_value"
seed = 1
iterations = 1

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
latency = "1ms"

[topology]
kind = "flat"

[real]
shape = false

# a node that copies or first touches a 1 GiB array holds its event loop for seconds on
# a loaded machine (2 cores shared here); heartbeats must not call that a death
[membership]
heartbeat_timeout = "60s"

[training]
program = "{program}"
"""

#: The worker declares the key, pushes a pattern no arithmetic on the server could keep
#: (the bits of every element differ), pulls the server's value back into the same
#: array, and checks it piece by piece against the pattern it pushed.
PROGRAM = """
import numpy as np


def pattern(lo, hi):
    return (np.arange(lo, hi, dtype=np.uint32) * np.uint32(2654435761)).view(np.float32)


async def main(kv, ctx):
    if kv.is_master_worker:
        return
    n = int(ctx.args[0])
    x = np.zeros(n, np.float32)
    kv.init(0, x)
    await kv.waitall()
    for lo in range(0, n, 1 << 24):
        x[lo:lo + (1 << 24)] = pattern(lo, min(n, lo + (1 << 24)))
    kv.push(0, x)
    await kv.waitall()
    x[:] = 0
    kv.pull(0, out=x)
    await kv.waitall()
    bad = 0
    for lo in range(0, n, 1 << 24):
        hi = min(n, lo + (1 << 24))
        bad += int(np.count_nonzero(x[lo:hi].view(np.uint32) != pattern(lo, hi).view(np.uint32)))
    ctx.report(1, accuracy=1.0 if bad == 0 else 0.0, mismatches=bad)
"""


def _pss_bytes(pid: int) -> int:
    """A process's proportional set size (its resident set when smaps_rollup is missing)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakMemory:
    """The peak, over the block, of the memory of this process and its descendants, less
    what this process held when the block began (the test session's own imports: torch,
    when its tests ran first, is a few hundred MB that no job holds)."""

    def __init__(self, every_s: float = 0.05):
        self.every_s = every_s
        self.peak_bytes = 0
        self.base_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            total = sum(_pss_bytes(p) for p in [me, *descendants(me)])
            self.peak_bytes = max(self.peak_bytes, total - self.base_bytes)
            self._stop.wait(self.every_s)

    def __enter__(self) -> "PeakMemory":
        self.base_bytes = _pss_bytes(os.getpid())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_large_key(tmp_path: Path, runtime: str, n: int) -> tuple[dict, float, int]:
    program = tmp_path / "large_key.py"
    program.write_text(textwrap.dedent(PROGRAM))
    toml = tmp_path / "large_value.toml"
    toml.write_text(SCENARIO.format(program=program))
    s = load_scenario(toml, [f"run.out_dir={tmp_path / runtime}", "run.progress=false",
                             f'training.program_args=["{n}"]'])
    t0 = time.perf_counter()
    with PeakMemory() as mem:
        r = run_scenario(s, runtime=runtime)
    took_s = time.perf_counter() - t0
    reports = [e for e in iter_events(r.run_dir / "events.jsonl") if e["ev"] == "eval"]
    return reports[-1] if reports else {}, took_s, mem.peak_bytes


#: what the job's processes hold with no value at all (their numpy, numba, uvloop)
PROCESSES_BYTES = GIB


def _check(tmp_path: Path, runtime: str, n: int) -> None:
    report, took_s, peak = run_large_key(tmp_path, runtime, n)
    print(f"\n{runtime}: a {4 * n / GIB:.3f} GiB key pushed and pulled in {took_s:.1f} s, "
          f"peak memory of the job {peak / GIB:.2f} GiB")
    assert report.get("mismatches") == 0 and report.get("accuracy") == 1.0, report
    # a few copies of the value (the worker's array, the push in flight, the server's
    # value and the push it received) and the job's processes themselves
    assert peak < 6 * 4 * n + PROCESSES_BYTES, peak


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_key_larger_than_a_frame_travels_exact(tmp_path, runtime):
    _check(tmp_path, runtime, 10_000_000)  # 40 MB: ten pieces of a stream


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_one_gib_key_is_pushed_and_pulled_exact(tmp_path, runtime):
    _check(tmp_path, runtime, GIB // 4)
