"""Synchronisation algorithms side by side: emulated time-to-accuracy and WAN bytes.

Runs one scenario (default ``scenarios/heterogeneous.toml``: party-a's workers 4x slower,
one party-b worker 10x slower) once per algorithm in the emulator and prints a table:

* FSA (fully synchronous, Adam at the global server: the scenario as written);
* MixedSync (async across DCs, same optimizer);
* MixedSync + DC-ASGD (per-DC backups), MXNet's single-backup variant, and, for
  reference, MixedSync + plain SGD at the same learning rate (DC-ASGD is SGD plus the
  delay compensation);
* HFA (K1, K2 from the scenario; local Adam steps, global sync every K1*K2 steps);
* ESync (state-server-sized local steps, synchronous delta averaging).

Emulated times are deterministic, so the table is the same on every machine.

    python bench/sync_compare.py [--scenario FILE] [--set PATH=VALUE ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from geomx.experiment import run_scenario
from geomx.metrics.progress import read_progress
from geomx.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent

#: (label, overrides). DC-ASGD is SGD underneath: it gets an SGD learning rate.
ALGORITHMS: list[tuple[str, tuple[str, ...]]] = [
    ("FSA", ("sync.algorithm=fsa",)),
    ("MixedSync", ("sync.algorithm=mixed",)),
    ("MixedSync+DC-ASGD", ("sync.algorithm=mixed", "training.optimizer=dcasgd",
                           "training.lr=0.5")),
    ("MixedSync+DC-ASGD shared (MXNet)", ("sync.algorithm=mixed",
                                          "training.optimizer=dcasgd_shared", "training.lr=0.5")),
    ("MixedSync+SGD (ref.)", ("sync.algorithm=mixed", "training.optimizer=sgd",
                              "training.lr=0.5")),
    ("HFA", ("sync.algorithm=hfa",)),
    ("ESync", ("sync.algorithm=esync",)),
]


@dataclass
class Row:
    label: str
    time_to_target_s: float | None
    wan_bytes_to_target: int | None
    iteration_at_target: int | None
    emulated_s: float
    wan_bytes: int
    iterations: int
    final_accuracy: float | None
    wall_s: float


def run_one(scenario: Path, label: str, overrides: tuple[str, ...], out_dir: Path) -> Row:
    s = load_scenario(scenario, [*overrides, f"run.out_dir={out_dir}", "run.progress=false",
                                 "metrics.plot=false", "metrics.trace=false"])
    t0 = time.perf_counter()
    r = run_scenario(s)
    wall = time.perf_counter() - t0
    sm = r.summary
    hit = None
    if s.run.target_accuracy > 0:
        hit = next((row for row in read_progress(r.run_dir / "progress.csv")
                    if row.accuracy is not None and row.accuracy >= s.run.target_accuracy), None)
    return Row(label=label, time_to_target_s=sm.time_to_target_s,
               wan_bytes_to_target=hit.bytes_wan if hit else None,
               iteration_at_target=hit.iteration if hit else None,
               emulated_s=sm.emulated_seconds or 0.0, wan_bytes=sm.bytes_wan,
               iterations=sm.iterations, final_accuracy=sm.final_accuracy, wall_s=wall)


def _fmt(x: float | int | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[Row], target: float, baseline: str = "FSA") -> str:
    base = next((r for r in rows if r.label == baseline), None)
    lines = [f"| algorithm | time to {target:.0%} (emulated s) | speed-up vs {baseline} "
             f"| WAN MB to target | evaluator iteration at target | total emulated s "
             f"| total WAN MB | final accuracy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        speedup = (base.time_to_target_s / r.time_to_target_s
                   if base and base.time_to_target_s and r.time_to_target_s else None)
        lines.append(
            f"| {r.label} | {_fmt(r.time_to_target_s, '.2f')} | "
            f"{_fmt(speedup, '.2f')}{'x' if speedup else ''} | "
            f"{_fmt(r.wan_bytes_to_target and r.wan_bytes_to_target / 1e6, '.2f')} | "
            f"{_fmt(r.iteration_at_target, 'd')} | {r.emulated_s:.2f} | "
            f"{r.wan_bytes / 1e6:.2f} | {_fmt(r.final_accuracy, '.4f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "heterogeneous.toml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="PATH=VALUE", help="extra override applied to every run")
    ap.add_argument("--out", default=None, help="keep the run folders here (default: temp)")
    ap.add_argument("--only", action="append", default=[], metavar="LABEL",
                    help="run only these algorithms (labels as in the table)")
    args = ap.parse_args(argv)
    scenario = Path(args.scenario)
    target = load_scenario(scenario, args.overrides).run.target_accuracy
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        rows = []
        for label, overrides in ALGORITHMS:
            if args.only and label not in args.only:
                continue
            rows.append(run_one(scenario, label, (*overrides, *args.overrides), out))
            print(f"  {label}: {rows[-1].wall_s:.1f} s wall", file=sys.stderr)
    print(f"scenario: {scenario.name}  (target accuracy {target:.0%})")
    print(table(rows, target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
