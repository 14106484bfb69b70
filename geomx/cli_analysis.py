"""`geomx sweep` and `geomx compare`: the analysis commands of the command line.

Kept out of geomx/cli.py (which only registers them) so that the run/launch/node entry
points stay small; the work is in geomx/sweep.py and geomx/metrics/compare.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SWEEP_EPILOG = """\
examples:
  geomx sweep scenarios/quickstart.toml --grid wan.0.bandwidth=20Mbps,100Mbps,1Gbps \\
      --grid codec.type=none,fp16,bsc --seeds 2 --jobs 2
  geomx sweep scenarios/quickstart.toml --grid training.hidden=[32],[64,32] --out runs/hidden

  geomx sweep scenarios/quickstart.toml --grid codec.type=none,fp16 --seeds 4 \\
      --cluster tcp://10.0.0.5:8786          # on a Dask cluster (docs/sweeps.md)

A rerun with the same --out (default <run.out_dir>/sweep-<run.name>) skips the points
that finished. Results: <out>/sweep.csv, <out>/sweep_<key>.png, <out>/runs/<point>/.
"""

COMPARE_EPILOG = """\
examples:
  geomx compare runs/quickstart-20261125-101010 runs/vanilla_ps-20261125-101515
  geomx compare runs/sweep-quickstart --target-accuracy 0.9
"""


def add_parsers(sub, add_scenario_args) -> None:
    """Register `sweep` and `compare` on the main parser's subparsers."""
    sweep = sub.add_parser(
        "sweep", help="run a scenario over a grid of overrides x seeds (parallel, resumable)",
        description="Run the cartesian product of --grid values x seeds in the emulator, in "
                    "parallel processes; write one folder with every run, sweep.csv and plots.",
        epilog=SWEEP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(sweep)
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="a field and its values, e.g. codec.type=none,fp16 (repeatable; "
                            "the same paths and values as --set)")
    sweep.add_argument("--seeds", type=int, default=1,
                       help="runs per grid point, seeds run.seed, run.seed+1, ... (default 1)")
    sweep.add_argument("--jobs", "-j", type=int, default=None,
                       help="parallel processes (default: the number of cores)")
    sweep.add_argument("--out", default=None,
                       help="sweep folder (default: <run.out_dir>/sweep-<run.name>)")
    sweep.add_argument("--cluster", default=None, metavar="tcp://HOST:PORT",
                       help="run the points on this Dask scheduler's workers instead of local "
                            "processes (default: $GEOMX_CLUSTER; needs pip install "
                            "'geomx[cluster]'; --jobs is then not used)")
    sweep.add_argument("--shared-fs", action=argparse.BooleanOptionalAction, default=None,
                       help="with --cluster: the workers see the sweep folder at the same path "
                            "and write runs in place (default: found out by a probe file); "
                            "--no-shared-fs sends files with the tasks and runs back as bytes")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.add_argument("--no-plots", dest="plots", action="store_false",
                       help="do not draw sweep_<key>.png")
    sweep.set_defaults(handler=sweep_main)

    cmp = sub.add_parser(
        "compare", help="compare run folders (or a sweep): table and overlaid plots",
        description="Print final accuracy, time to target, WAN bytes, emulated and wall time "
                    "with ratios to the first run; write overlaid plots next to the runs.",
        epilog=COMPARE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders, or one sweep folder")
    cmp.add_argument("--target-accuracy", type=float, default=None,
                     help="recompute time to target for this accuracy (default: each run's own)")
    cmp.add_argument("--out", default=None,
                     help="folder for the plots (default: the sweep folder, or the first "
                          "run's parent folder)")
    cmp.add_argument("--no-plots", dest="plots", action="store_false", help="only the table")
    cmp.add_argument("--csv", default=None, help="also write the table to this CSV file")
    cmp.set_defaults(handler=compare_main)


def sweep_main(args: argparse.Namespace) -> int:
    from geomx.scenario import ScenarioError
    from geomx.sweep import SweepError, parse_grids, run_sweep
    from geomx.sweep_cluster import ClusterError, cluster_address

    if not args.grid and args.seeds == 1:
        print("geomx sweep: nothing to sweep: give --grid KEY=V1,V2,... and/or --seeds N",
              file=sys.stderr)
        return 2
    try:
        axes = parse_grids(args.grid)
        result = run_sweep(args.scenario, axes, args.seeds, jobs=args.jobs, out=args.out,
                           base_overrides=args.overrides, progress=not args.quiet,
                           plots=args.plots, cluster=cluster_address(args.cluster),
                           shared_fs=args.shared_fs)
    except (ScenarioError, SweepError, ClusterError) as e:
        print(f"geomx: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"geomx: scenario file not found: {e.filename or args.scenario}", file=sys.stderr)
        return 2
    print(f"sweep folder: {result.path}")
    print(f"{len(result.table)} runs: {result.ran} ran, {result.resumed} resumed, "
          f"{result.failed} failed; table {result.path / 'sweep.csv'}")
    for p in result.plots:
        print(f"plot: {p}")
    if result.failed:
        for row in result.table.rows():
            if row["status"] != "done":
                print(f"failed: {row['run']}: {row.get('error')}", file=sys.stderr)
        return 1
    return 0


def compare_main(args: argparse.Namespace) -> int:
    from geomx.metrics.compare import compare_table, format_comparison, plot_comparison

    try:
        table = compare_table(args.runs, target_accuracy=args.target_accuracy)
    except ValueError as e:
        print(f"geomx: {e}", file=sys.stderr)
        return 2
    print(format_comparison(table))
    if args.csv:
        table.to_csv(args.csv)
        print(f"table: {args.csv}")
    if args.plots:
        first = Path(args.runs[0])
        out = Path(args.out) if args.out else (first if len(args.runs) == 1 else first.parent)
        for name in plot_comparison(args.runs, out):
            print(f"plot: {out / name}")
    return 0
