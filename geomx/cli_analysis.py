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
  geomx compare runs/quickstart-new --baseline runs/quickstart-stored --max-regression 5%

With --baseline, each RUN_DIR is gated against the baseline run, figure by figure in its
good direction (accuracy may not drop, time to target, WAN bytes and emulated time may not
grow) by more than --max-regression; the exit status is 3 when one regressed (docs/ci.md).
Emulated runs are deterministic, so the default tolerance is 0%. Real-runtime figures vary
from run to run and need their own tolerance: --real-tolerance.
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
    cmp.add_argument("--baseline", default=None, metavar="RUN",
                     help="a stored run folder to gate the RUN_DIRs against (exit 3 when a "
                          "figure regressed)")
    cmp.add_argument("--max-regression", default=None, metavar="PCT",
                     help="with --baseline: how much worse an emulated run's figure may be, "
                          "e.g. 5%% (default 0%%: emulated runs are deterministic)")
    cmp.add_argument("--real-tolerance", default=None, metavar="PCT",
                     help="with --baseline: how much worse a real-runtime run's figure may "
                          "be (required when either run is one), e.g. 25%%")
    cmp.add_argument("--figure", dest="figures", action="append", default=None,
                     metavar="NAME", help="with --baseline: a figure to gate (repeatable; "
                     "default: final_accuracy, time_to_target_s, bytes_wan, emulated_seconds)")
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
        gate = _baseline_gate(args)
    except ValueError as e:
        print(f"geomx compare: {e}", file=sys.stderr)
        return 2
    sources = [args.baseline, *args.runs] if gate is not None else args.runs
    try:
        table = compare_table(sources, target_accuracy=args.target_accuracy)
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
        for name in plot_comparison(sources, out):
            print(f"plot: {out / name}")
    return 0 if gate is None else gate()


def _baseline_gate(args: argparse.Namespace):
    """With ``--baseline``: a function that prints each RUN_DIR's figures against the
    baseline's and returns the exit status (3 when one regressed); everything it needs is
    read and checked here, before the table is printed. Without: None."""
    from geomx.expect import (EXIT_EXPECTATION, FIGURES, REGRESSION_FIGURES, figure_of,
                              parse_tolerance, regressions)
    from geomx.metrics.summary import SUMMARY_FILE, read_summary

    if args.baseline is None:
        given = [o for o, v in (("--max-regression", args.max_regression),
                                ("--real-tolerance", args.real_tolerance),
                                ("--figure", args.figures)) if v is not None]
        if given:
            raise ValueError(f"{given[0]} needs --baseline RUN (the stored run to gate against)")
        return None
    tolerance = parse_tolerance(args.max_regression or "0%", "--max-regression")
    real_tolerance = (None if args.real_tolerance is None
                      else parse_tolerance(args.real_tolerance, "--real-tolerance"))
    figures = tuple(args.figures or REGRESSION_FIGURES)
    for name in figures:
        if not figure_of(name).better:
            directed = [n for n, f in FIGURES.items() if f.better]
            raise ValueError(f"--figure {name}: it has no better direction to gate on; "
                             f"figures with one: {', '.join(directed)}, "
                             "bytes_per_link.<link>, bytes_per_dc_pair.<pair>")

    def summary_of(run: str):
        path = Path(run) / SUMMARY_FILE
        if not path.exists():
            raise ValueError(f"{run}: not a run folder (no {SUMMARY_FILE})")
        return read_summary(path)

    baseline = summary_of(args.baseline)
    pairs = []
    for run in args.runs:
        current = summary_of(run)
        runtimes = {baseline.runtime, current.runtime}
        if len(runtimes) > 1:
            raise ValueError(f"{run} ran on the {current.runtime} runtime and the baseline on "
                             f"the {baseline.runtime} runtime: gate a run against a baseline "
                             "of its own runtime")
        if "real" in runtimes and real_tolerance is None:
            raise ValueError(f"{run} is a real-runtime run: its figures vary from run to run, "
                             "so give it a tolerance of its own with --real-tolerance PCT "
                             "(e.g. 25%)")
        pairs.append((run, current, real_tolerance if "real" in runtimes else tolerance))

    def gate() -> int:
        failed = 0
        for run, current, tol in pairs:
            print(f"against baseline {args.baseline}: {run}")
            for r in regressions(baseline.to_dict(), current.to_dict(), tol, figures):
                failed += not r.held
                sys.stdout.flush()  # keep the order in a log that merges both streams
                print(f"regression: {r.line(tol)}", file=sys.stdout if r.held else sys.stderr)
        if failed:
            print(f"geomx compare: {failed} figure(s) regressed beyond the tolerance",
                  file=sys.stderr)
            return EXIT_EXPECTATION
        return 0

    return gate
