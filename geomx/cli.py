"""The ``geomx`` command line: run, validate, sweep, compare, and the real-runtime entry
points.

``geomx run SCENARIO`` is the main job: it trains on the scenario's topology in the
virtual-time WAN emulator (``--runtime emu``, default) or as one process per node over
real sockets on this host (``--runtime real``), and leaves a run folder. ``geomx sweep``
and ``geomx compare`` (geomx/cli_analysis.py) run grids of scenarios and compare runs.

Real runtime entry points (docs/real-runtime.md): ``geomx launch SCENARIO`` starts every
node here (or, with ``--hostfile``, each DC's nodes on its hosts over ssh);
``geomx node`` starts one node on this host from flags, environment (``GEOMX_*`` and
GeoMX's ``DMLC_*``) and the scenario -- what Slurm, Kubernetes or a shell script runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from geomx.expect import EXIT_EXPECTATION
from geomx.runtime.node_args import LOG_FORMAT, add_node_arguments, run_node_command

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
  geomx run scenarios/quickstart.toml --expect 'final_accuracy >= 0.93' --expect 'bytes_wan <= 4MB'
  geomx sweep scenarios/quickstart.toml --grid codec.type=none,fp16 --seeds 2
  geomx compare runs/quickstart-20261125-101010 runs/vanilla_ps-20261125-101515
  geomx compare runs/new-run --baseline runs/stored-run --max-regression 5%
  geomx validate scenarios/vanilla_ps.toml
  geomx launch scenarios/quickstart.toml --hostfile hosts.txt
  geomx node scenarios/quickstart.toml --name w:party-a:0 --global-scheduler 10.0.0.1:9092
"""

NODE_EPILOG = """\
precedence: command-line flag > environment (GEOMX_*, then GeoMX's DMLC_*) > scenario
file ([real], [security], [[dc]]) > default. See docs/real-runtime.md for every variable.

examples:
  geomx node scenarios/quickstart.toml --name gh
  geomx node scenarios/quickstart.toml --role worker --dc party-a --rank 1 \\
      --scheduler lh:party-a=10.0.1.7:9094 --host 10.0.1.8
  GEOMX_SCENARIO=job.toml GEOMX_NODE=ls:party-b GEOMX_SCHEDULER_gh=10.0.0.1:9092 geomx node
  DMLC_ROLE=worker DMLC_PS_ROOT_URI=10.0.1.7 DMLC_PS_ROOT_PORT=9094 GEOMX_RANK=0 geomx node job.toml
  geomx node job.toml --name w:party-a:0 --print-config     # show what was resolved, and from where
"""


def _add_scenario_args(p: argparse.ArgumentParser, *, resumable: bool = False) -> None:
    if resumable:
        p.add_argument("scenario", nargs="?", default=None,
                       help="scenario file (TOML); not with --resume")
        p.add_argument("--resume", default=None, metavar="RUN_DIR",
                       help="continue the job of run folder RUN_DIR from its latest complete "
                            "checkpoint ([checkpoint] every), with its scenario.toml (and "
                            "--set), into a new run folder beside it")
    else:
        p.add_argument("scenario", help="scenario file (TOML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. training.lr=0.05, dc.1.workers=4, "
                        "wan.0.bandwidth=20Mbps (repeatable)")


def _add_expect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expect", action="append", default=[], metavar="'FIGURE OP VALUE'",
                   help="a condition on a summary.json figure checked when the job ends, "
                        "e.g. 'final_accuracy >= 0.93', 'time_to_target_s <= 6s', "
                        "'bytes_wan <= 2MB' (repeatable; adds to the scenario's [expect]); "
                        f"exit {EXIT_EXPECTATION} when one fails (docs/ci.md)")


def _add_program_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--program", default=None, metavar="PROGRAM",
                   help="your training program (train.py, train.py:fn or module:fn) with "
                        "`async def main(kv, ctx)`, instead of [training] program; arguments "
                        "after `--` become ctx.args")


def _with_program(scenario, program: str | None, args: list[str] | None):
    """``--program`` / ``-- args``: the scenario's [training] program and program_args,
    set as ``--set`` would set them, so every check a file's program gets applies."""
    import json
    import os

    from geomx.scenario import override_scenario

    sets = []
    if program:
        where, sep, fn = program.rpartition(":")
        if not sep or not fn.isidentifier():
            where, sep, fn = program, "", ""
        if where.endswith(".py"):
            where = os.path.abspath(where)  # a command-line path is relative to here
        sets.append(f"training.program={json.dumps(where + (sep + fn if sep else ''))}")
    if args is not None:
        sets.append(f"training.program_args={json.dumps(list(args))}")
    return override_scenario(scenario, sets)


def version_line() -> str:
    """``geomx --version``: the release (CHANGELOG.md), the scenario schema it writes and
    reads, and the Python that runs it."""
    import platform

    from geomx import __version__
    from geomx.scenario.schema import SCHEMA_VERSION

    return (f"geomx {__version__} (scenario schema {SCHEMA_VERSION}; "
            f"Python {platform.python_version()})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geomx", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug)")
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print geomx's version and the scenario schema it writes, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run a scenario and write a run folder",
                         description="Run a scenario on the emulator or real sockets; writes "
                                     "runs/<name>-<time>/ with scenario.toml, events.jsonl, "
                                     "progress.csv, summary.json, trace.json and plots.")
    _add_scenario_args(run, resumable=True)
    run.add_argument("--runtime", choices=("emu", "real"), default=None,
                     help="emu: virtual-time WAN emulator (default from the scenario); "
                          "real: one process per node on 127.0.0.1")
    run.add_argument("--out", default=None, help="parent folder of the run folder "
                                                 "(default: the scenario's run.out_dir)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--host", default=None, metavar="PROFILE",
                     help="host profile from `geomx calibrate`: the emulator charges this "
                          "host's CPU costs (the same as --set host.profile=PROFILE; "
                          "docs/calibration.md)")
    _add_expect_args(run)
    _add_program_args(run)
    run.set_defaults(handler=_cmd_run)

    val = sub.add_parser("validate", help="check a scenario and print it fully resolved")
    _add_scenario_args(val)
    val.set_defaults(handler=_cmd_validate)

    launch = sub.add_parser("launch", help="start a scenario's nodes as real processes "
                                           "(here, or on the hosts of a hostfile over ssh)",
                            description="Start every node of the scenario as its own process "
                                        "over real sockets and supervise them: on this host, "
                                        "or with --hostfile on each DC's hosts over ssh. "
                                        "Writes a run folder like `geomx run`.")
    _add_scenario_args(launch, resumable=True)
    launch.add_argument("--hostfile", default=None,
                        help="lines 'DC HOST [address=IP] [bind=IP] [python=PATH] [cwd=DIR]': "
                             "start each DC's nodes on its host(s) with ssh")
    launch.add_argument("--ssh", default="ssh",
                        help="ssh command for --hostfile (default: ssh), e.g. 'ssh -p 2222'")
    launch.add_argument("--out", default=None, help="parent folder of the run folder")
    launch.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_expect_args(launch)
    _add_program_args(launch)
    launch.set_defaults(handler=_cmd_run)

    col = sub.add_parser("collect", help="merge the node files of a by-hand launch into a run "
                                         "folder (summary.json, progress.csv, plots)",
                         description="After nodes started one by one with `geomx node --run-dir "
                                     "RUN_DIR` have finished: merge RUN_DIR/nodes/* into the same "
                                     "run folder `geomx launch` leaves.")
    col.add_argument("run_dir", metavar="RUN_DIR")
    col.add_argument("--scenario", default=None,
                     help="the job's scenario (default: RUN_DIR/scenario.toml, which the "
                          "nodes leave there)")
    col.set_defaults(handler=_cmd_collect)

    node = sub.add_parser("node", help="run one node of a scenario on this host (per-host entry "
                                       "point for ssh, Slurm, Kubernetes)",
                          description="Run one node of a scenario in this process over real "
                                      "sockets.",
                          epilog=NODE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_node_arguments(node)
    node.set_defaults(handler=_cmd_node)
    from geomx.cli_analysis import add_parsers

    add_parsers(sub, _add_scenario_args)
    from geomx.fidelity import add_parser as add_fidelity_parser

    add_fidelity_parser(sub)
    from geomx.calibrate import add_parser as add_calibrate_parser

    add_calibrate_parser(sub)
    return parser


#: Exit status after Ctrl-C, as a shell reports a process stopped by SIGINT (128 + 2).
EXIT_INTERRUPTED = 130

#: Exit status of a command given something it cannot use (a bad scenario, a missing file).
EXIT_USAGE = 2


class UsageError(Exception):
    """Input a command cannot use; ``main`` prints ``geomx[ COMMAND]: <message>`` and
    exits 2."""

    def __init__(self, message: str, command: str | None = None):
        super().__init__(message)
        self.command = command


def main(argv: Sequence[str] | None = None) -> int:
    """``geomx ...``; Ctrl-C prints one line and exits 130 (the launcher has already
    stopped every node it started: no orphans, no traceback)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("\ngeomx: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None = None) -> int:
    """Parse, set up logging and call the chosen command's handler (``set_defaults``).

    Arguments after ``--`` belong to a training program (``ctx.args``) for the commands
    that run one, so they are cut off before argparse sees them."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    program_args: list[str] | None = None
    command = next((a for a in argv if not a.startswith("-")), None)
    if "--" in argv and command in ("run", "launch"):
        cut = argv.index("--")
        argv, program_args = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv, argparse.Namespace(program_args=program_args))
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format=LOG_FORMAT)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except UsageError as e:
        print(f"geomx{' ' + e.command if e.command else ''}: {e}", file=sys.stderr)
        return EXIT_USAGE


def _cmd_collect(args: argparse.Namespace) -> int:
    """``geomx collect RUN_DIR``: merge a by-hand launch's node files into a run folder."""
    from geomx.collect import CollectError, collect_run
    from geomx.scenario import ScenarioError

    try:
        summary = collect_run(args.run_dir, args.scenario)
    except (CollectError, ScenarioError, FileNotFoundError) as e:
        print(f"geomx collect: {e}", file=sys.stderr)
        return EXIT_USAGE
    acc = "n/a" if summary.final_accuracy is None else f"{summary.final_accuracy:.4f}"
    print(f"run folder: {args.run_dir}")
    print(f"final accuracy {acc} after {summary.iterations} iterations, "
          f"WAN {summary.bytes_wan / 1e6:.2f} MB, LAN {summary.bytes_lan / 1e6:.2f} MB")
    missing = (summary.extra or {}).get("missing_nodes")
    if missing:
        print(f"warning: no result from {', '.join(missing)}", file=sys.stderr)
    return 0


def _cmd_node(args: argparse.Namespace) -> int:
    """``geomx node``: one node of a scenario in this process."""
    return run_node_command(args)


def _scenario_of(args: argparse.Namespace):
    """The scenario a run, launch or validate names: its file (or ``--resume RUN_DIR``'s
    saved one), under GeoMX's switches from the environment, then ``--set``, then
    ``--program`` and the program's arguments."""
    import os

    from geomx.runtime.geomx_switches import SwitchError, switch_overrides
    from geomx.scenario import ScenarioError, load_scenario

    try:
        # GeoMX's switches in the environment, as `geomx node` reads them, below --set
        env_sets = [o for o, _ in switch_overrides(os.environ)]
        host = getattr(args, "host", None)
        if host:  # a command-line path is relative to here
            env_sets.append(f"host.profile={os.path.abspath(host)}")
        resume = getattr(args, "resume", None)
        if resume is not None:
            if args.scenario is not None:
                raise UsageError("give a scenario or --resume RUN_DIR, not both", args.command)
            from pathlib import Path

            from geomx.experiment import resume_scenario

            scenario = resume_scenario(resume, [*env_sets, *args.overrides])
            if args.out is None:
                args.out = str(Path(resume).resolve().parent)
        elif args.scenario is None:
            raise UsageError("a scenario file (or --resume RUN_DIR) is required", args.command)
        else:
            scenario = load_scenario(args.scenario, [*env_sets, *args.overrides])
    except (SwitchError, ValueError) as e:  # a ScenarioError, or --resume without a checkpoint
        raise UsageError(str(e)) from None
    except FileNotFoundError as e:
        raise UsageError(f"scenario file not found: {e.filename or args.scenario}") from None
    program = getattr(args, "program", None)
    if program or args.program_args is not None:
        try:
            scenario = _with_program(scenario, program, args.program_args)
        except ScenarioError as e:
            raise UsageError(str(e)) from None
    return scenario


def _cmd_validate(args: argparse.Namespace) -> int:
    """``geomx validate``: the scenario fully resolved on stdout."""
    from geomx.scenario import scenario_to_toml

    scenario = _scenario_of(args)
    sys.stdout.write(scenario_to_toml(scenario))
    print(f"# OK: {args.scenario} is valid", file=sys.stderr)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    """``geomx run`` and ``geomx launch``: run the job, then print where its run folder is
    and its headline figures, and check the expectations (``[expect]`` and ``--expect``,
    read before the job starts so a misspelt figure costs no run)."""
    scenario = _scenario_of(args)
    expectations = _expectations_of(scenario, args)
    from geomx.experiment import JobFailed, run_scenario
    from geomx.runtime.netns import NetnsUnavailable

    try:
        if args.command == "launch":
            result = _launch(scenario, args)
        else:
            result = run_scenario(scenario, runtime=args.runtime, out_dir=args.out,
                                  progress=not args.quiet)
    except JobFailed as e:
        print(f"geomx: job failed: {e}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, NetnsUnavailable) as e:  # ConfigError: a ValueError
        raise UsageError(str(e)) from None
    _print_result(scenario, result)
    return _check_expectations(expectations, result.summary)


def _expectations_of(scenario, args: argparse.Namespace) -> list:
    """The scenario's ``[expect]`` conditions, then ``--expect``'s (one line naming the
    figure and the allowed ones for a bad one)."""
    from geomx.expect import ExpectationError, parse_expectation

    out = scenario.expect.expectations()
    for text in args.expect:
        try:
            out.append(parse_expectation(text))
        except ExpectationError as e:
            raise UsageError(f"--expect {text!r}: {e}", args.command) from None
    return out


def _check_expectations(expectations: list, summary) -> int:
    """One line per expectation (failures on stderr, with the measured value); 0 when
    all hold, :data:`EXIT_EXPECTATION` when one does not."""
    from geomx.expect import check_expectations, format_outcome

    outcomes = check_expectations(expectations, summary.to_dict())
    for o in outcomes:
        sys.stdout.flush()  # the lines keep their order in a CI log that merges both streams
        print(f"expect: {format_outcome(o)}", file=sys.stdout if o.held else sys.stderr)
    failed = sum(not o.held for o in outcomes)
    if failed:
        print(f"geomx: {failed} of {len(outcomes)} expectation(s) failed", file=sys.stderr)
        return EXIT_EXPECTATION
    return 0


def _print_result(scenario, result) -> None:
    s = result.summary
    acc = "n/a" if s.final_accuracy is None else f"{s.final_accuracy:.4f}"
    emu = "" if s.emulated_seconds is None else f", emulated {s.emulated_seconds:.2f} s"
    final = (s.extra or {}).get("final_eval", {})
    metric = "accuracy"
    if s.final_accuracy is None and isinstance(final.get("score"), (int, float)):
        metric, acc = str(final.get("metric", "score")), f"{final['score']:.4f}"  # algorithms
    print(f"run folder: {result.run_dir}")
    if scenario.checkpoint.resume_from:
        print(f"resumed from checkpoint {scenario.checkpoint.resume_from}")
    print(f"final {metric} {acc} after {s.iterations} iterations{emu}, wall "
          f"{s.wall_seconds:.2f} s, WAN {s.bytes_wan / 1e6:.2f} MB, LAN {s.bytes_lan / 1e6:.2f} MB")
    reason = final.get("stop_reason")
    if reason:
        ttt = "" if s.time_to_target_s is None else f"; target reached at t = {s.time_to_target_s:.2f} s"
        print(f"stopped by: {reason}{ttt}")


def _launch(scenario, args):
    """``geomx launch``: the real runtime here, or over ssh on the hosts of a hostfile."""
    import shlex

    from geomx.experiment import RunResult, finish_run_dir, make_run_dir, run_scenario
    from geomx.scenario import scenario_to_toml

    if args.hostfile is None:
        return run_scenario(scenario, runtime="real", out_dir=args.out, progress=not args.quiet)
    from geomx.cluster import plan_job
    from geomx.runtime.hostfile import assign_hosts, load_hostfile
    from geomx.runtime.launcher import RemoteOptions, run_real

    plan = plan_job(scenario, "real")  # check the hostfile before a run folder exists
    assign_hosts(scenario, load_hostfile(args.hostfile), plan.nodes, plan.job.dc_of)
    run_dir = make_run_dir(args.out or scenario.run.out_dir, scenario.run.name).resolve()
    (run_dir / "scenario.toml").write_text(scenario_to_toml(scenario))
    show = scenario.run.progress and not args.quiet
    summary = run_real(scenario, run_dir, progress=show,
                       remote=RemoteOptions(hostfile=args.hostfile, ssh=shlex.split(args.ssh)))
    finish_run_dir(scenario, run_dir, summary)
    return RunResult(run_dir, summary)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
