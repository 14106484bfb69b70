"""The ``geomx`` command line: run, validate, and the real-runtime entry points.

``geomx run SCENARIO`` is the main job: it trains on the scenario's topology in the
virtual-time WAN emulator (``--runtime emu``, default) or as one process per node over
real sockets on this host (``--runtime real``), and leaves a run folder.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

DESCRIPTION = """\
geomx: geo-distributed training on a two-tier parameter server (HiPS).

Workers in each data center push to their local server; local servers aggregate and
talk to global server(s) in a central DC across the WAN. A scenario file (TOML)
describes the DCs, WAN links, model, data, sync algorithm and codecs. The same node
code runs in a virtual-time WAN emulator or over real sockets.

examples:
  geomx run scenarios/quickstart.toml
  geomx run scenarios/quickstart.toml --set training.lr=0.005 --set wan.0.bandwidth=20Mbps
  geomx run scenarios/quickstart.toml --runtime real
  geomx validate scenarios/vanilla_ps.toml
"""


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario file (TOML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. training.lr=0.05, dc.1.workers=4, "
                        "wan.0.bandwidth=20Mbps (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geomx", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run a scenario and write a run folder",
                         description="Run a scenario on the emulator or real sockets; writes "
                                     "runs/<name>-<time>/ with scenario.toml, events.jsonl, "
                                     "progress.csv, summary.json, trace.json and plots.")
    _add_scenario_args(run)
    run.add_argument("--runtime", choices=("emu", "real"), default=None,
                     help="emu: virtual-time WAN emulator (default from the scenario); "
                          "real: one process per node on 127.0.0.1")
    run.add_argument("--out", default=None, help="parent folder of the run folder "
                                                 "(default: the scenario's run.out_dir)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")

    val = sub.add_parser("validate", help="check a scenario and print it fully resolved")
    _add_scenario_args(val)

    node = sub.add_parser("node", help="(internal/real runtime) run one node of a scenario")
    node.add_argument("--scenario", required=True)
    node.add_argument("--name", required=True)
    node.add_argument("--run-dir", required=True)
    node.add_argument("--book", required=True, help="JSON: scheduler name -> host:port")
    node.add_argument("--start-epoch", type=float, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    from geomx.scenario import ScenarioError, load_scenario, scenario_to_toml

    if args.command == "node":
        from geomx.runtime.node_main import node_main

        return node_main(args)
    try:
        scenario = load_scenario(args.scenario, args.overrides)
    except ScenarioError as e:
        print(f"geomx: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"geomx: scenario file not found: {e.filename or args.scenario}", file=sys.stderr)
        return 2
    if args.command == "validate":
        sys.stdout.write(scenario_to_toml(scenario))
        print(f"# OK: {args.scenario} is valid", file=sys.stderr)
        return 0
    from geomx.experiment import JobFailed, run_scenario

    try:
        result = run_scenario(scenario, runtime=args.runtime, out_dir=args.out,
                              progress=not args.quiet)
    except JobFailed as e:
        print(f"geomx: job failed: {e}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as e:
        print(f"geomx: {e}", file=sys.stderr)
        return 2
    s = result.summary
    acc = "n/a" if s.final_accuracy is None else f"{s.final_accuracy:.4f}"
    emu = "" if s.emulated_seconds is None else f", emulated {s.emulated_seconds:.2f} s"
    print(f"run folder: {result.run_dir}")
    print(f"final accuracy {acc} after {s.iterations} iterations{emu}, wall "
          f"{s.wall_seconds:.2f} s, WAN {s.bytes_wan / 1e6:.2f} MB, LAN {s.bytes_lan / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
