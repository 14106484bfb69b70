"""Emulator speed: a phantom ResNet-50 on 4 DCs x 8 workers, FSA, 20 iterations.

Prints messages delivered per second of wall time and the emulated-time / wall-time
ratio (> 1 means the emulator runs faster than the system it emulates). The baseline in
the same run is the same job's flat-PS variant, which sends far more bytes across the
WAN with the same number of flows; ``--profile`` writes a cProfile of the HiPS run.

    python bench/emulator.py [--iterations 20] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

from geomx.experiment import run_emulated
from geomx.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def run(kind: str, iterations: int, profile: str | None = None) -> dict:
    s = load_scenario(ROOT / "scenarios" / "resnet50_phantom.toml",
                      [f"run.iterations={iterations}", f"topology.kind={kind}",
                       "metrics.events=false", "metrics.trace=false", "metrics.plot=false",
                       "run.progress=false"])
    with tempfile.TemporaryDirectory() as d:
        prof = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        summary = run_emulated(s, Path(d), progress=False)
        if prof:
            prof.disable()
            prof.dump_stats(profile)
        wall = time.perf_counter() - t0
    msgs = summary.extra["messages_delivered"]
    return {"mode": kind, "wall_s": wall, "emulated_s": summary.emulated_seconds,
            "messages": msgs, "msgs_per_wall_s": msgs / wall,
            "emu_over_wall": summary.emulated_seconds / wall,
            "wan_gb": summary.bytes_wan / 1e9, "lan_gb": summary.bytes_lan / 1e9,
            "recomputations": summary.extra["rate_recomputations"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--profile", default=None, help="write a cProfile of the HiPS run here")
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args(argv)
    rows = [run("hips", args.iterations, args.profile)]
    if not args.skip_baseline:
        rows.append(run("flat", args.iterations))
    print(f"phantom ResNet-50 (25.6M params, 161 tensors), 4 DCs x 8 workers, FSA, "
          f"{args.iterations} iterations")
    print(f"{'mode':8} {'wall s':>8} {'emulated s':>11} {'messages':>9} {'msg/wall s':>11} "
          f"{'emu/wall':>9} {'WAN GB':>8} {'LAN GB':>8} {'recomputes':>10}")
    for r in rows:
        print(f"{r['mode']:8} {r['wall_s']:8.2f} {r['emulated_s']:11.2f} {r['messages']:9d} "
              f"{r['msgs_per_wall_s']:11.0f} {r['emu_over_wall']:9.2f} {r['wan_gb']:8.2f} "
              f"{r['lan_gb']:8.2f} {r['recomputations']:10d}")
    if len(rows) == 2:
        print(f"HiPS vs flat PS: emulated time x{rows[1]['emulated_s'] / rows[0]['emulated_s']:.2f} "
              f"faster, WAN bytes x{rows[1]['wan_gb'] / rows[0]['wan_gb']:.2f} fewer")
    if args.profile:
        print(f"\nprofile of the HiPS run ({args.profile}), top 15 by own time:")
        pstats.Stats(args.profile, stream=sys.stdout).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
