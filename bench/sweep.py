"""`geomx sweep` in parallel processes vs one process: wall time for the same grid.

The sweep: the quickstart over 3 WAN bandwidths (both links) x 3 codecs (none,
fp16, Bi-Sparse with the bound scaled to the small model) x 2 seeds = 18 emulator runs,
each with its full run folder (events, trace, plots). It is run with `--jobs 1` (in this
process) and with `--jobs N` (spawned processes, each with its share of the Numba kernel
threads), in fresh folders, alternately `repeats` times; the figures are wall seconds
and the ratio jobs-1 / jobs-N. The results of both must be identical (emulated time is
deterministic): the bench checks it. The machine's load average is printed with the
figures, since other processes share the cores.

    python bench/sweep.py [--jobs N] [--repeats R]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from geomx.sweep import GridAxis, run_sweep

ROOT = Path(__file__).resolve().parent.parent
AXES = [GridAxis("wan.0.bandwidth+wan.1.bandwidth", ("10Mbps", "100Mbps", "1Gbps")),
        GridAxis("codec.type", ("none", "fp16", "bsc"))]
BASE = ["codec.size_lower_bound=1000"]


def timed(jobs: int, out: Path):
    t0 = time.perf_counter()
    result = run_sweep(ROOT / "scenarios" / "quickstart.toml", AXES, seeds=2, jobs=jobs, out=out,
                       base_overrides=BASE, progress=False)
    return time.perf_counter() - t0, result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    walls: dict[int, list[float]] = {1: [], args.jobs: []}
    tables = {}
    with tempfile.TemporaryDirectory(prefix="geomx-bench-sweep-") as tmp:
        for r in range(args.repeats):
            order = (1, args.jobs) if r % 2 == 0 else (args.jobs, 1)
            for jobs in order:
                load = os.getloadavg()[0]
                wall, result = timed(jobs, Path(tmp) / f"r{r}-j{jobs}")
                assert result.failed == 0 and result.ran == 18, (result.ran, result.failed)
                walls[jobs].append(wall)
                tables[jobs] = result.table
                print(f"repeat {r}: --jobs {jobs}: {wall:6.2f} s wall for 18 runs "
                      f"(load average before: {load:.2f})")
    for col in ("emulated_seconds", "bytes_wan", "final_accuracy"):
        if list(tables[1][col]) != list(tables[args.jobs][col]):
            print(f"MISMATCH in {col} between --jobs 1 and --jobs {args.jobs}")
            return 1
    best1, bestn = min(walls[1]), min(walls[args.jobs])
    print(f"\nbest of {args.repeats}: --jobs 1 {best1:.2f} s, --jobs {args.jobs} {bestn:.2f} s; "
          f"speed-up {best1 / bestn:.2f}x on {os.cpu_count()} cores; results identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
