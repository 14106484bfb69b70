"""The arguments of ``geomx node`` and what runs them, shared by the CLI and by the local
launcher's forked nodes (geomx/runtime/forked.py), which run exactly what
``python -m geomx node ARGS`` runs without a fresh interpreter."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

#: How every geomx process formats its log lines.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_node_arguments(node: argparse.ArgumentParser) -> None:
    """The options of ``geomx node`` (scenario, which node, rendezvous, address, job,
    security, shaping, and the launcher's own flags)."""
    node.add_argument("scenario_pos", nargs="?", metavar="SCENARIO",
                      help="scenario file (or --scenario / GEOMX_SCENARIO; default: built-in)")
    node.add_argument("--scenario", default=None, help=argparse.SUPPRESS)
    node.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE", help="override a scenario field (repeatable)")
    who = node.add_argument_group("which node (or GEOMX_NODE / GEOMX_ROLE, GEOMX_DC, "
                                  "GEOMX_RANK / DMLC_ROLE...)")
    who.add_argument("--name", help="node name: gh, gs:0, mw, lh:DC, ls:DC, w:DC:RANK")
    who.add_argument("--role", help="global_scheduler, global_server, master_worker, "
                                    "local_scheduler, local_server, worker (or gh, gs, mw, lh, "
                                    "ls, w)")
    who.add_argument("--dc", help="DC of a local scheduler/server/worker")
    who.add_argument("--rank", type=int, help="rank of a worker in its DC, or of a global server")
    rdv = node.add_argument_group("rendezvous (or GEOMX_SCHEDULER_<name>, DMLC_PS_*ROOT_*, "
                                  "[real])")
    rdv.add_argument("--global-scheduler", metavar="HOST:PORT",
                     help="address of the global scheduler gh")
    rdv.add_argument("--scheduler", dest="schedulers", action="append", default=[],
                     metavar="NAME=HOST:PORT", help="address of a scheduler, e.g. "
                                                    "lh:party-a=10.0.1.7:9094 (repeatable)")
    rdv.add_argument("--book", default=None, help=argparse.SUPPRESS)  # launcher: JSON of all
    net = node.add_argument_group("this node's address (or GEOMX_HOST / DMLC_NODE_HOST / "
                                  "DMLC_INTERFACE, GEOMX_BIND_HOST, GEOMX_PORT / PORT)")
    net.add_argument("--host", help="address peers dial to reach this node")
    net.add_argument("--bind", help="address to listen on (default: --host; 0.0.0.0 = all)")
    net.add_argument("--port", type=int, help="port to listen on (default: any free port; "
                                              "schedulers use their rendezvous port)")
    job = node.add_argument_group("job (or GEOMX_RUN_DIR, GEOMX_START_EPOCH)")
    job.add_argument("--run-dir", help="folder for nodes/<name>.events.jsonl and result "
                                       "(default: <run.out_dir>/<run.name>)")
    job.add_argument("--start-epoch", type=float,
                     help="job start as Unix seconds, the same on every node (default: now)")
    sec = node.add_argument_group("security (or [security], GEOMX_SECRET, GEOMX_TLS*)")
    sec.add_argument("--secret-env", metavar="VAR",
                     help="environment variable holding the shared secret (default GEOMX_SECRET)")
    sec.add_argument("--secret-file", metavar="PATH", help="file holding the shared secret")
    sec.add_argument("--tls", action=argparse.BooleanOptionalAction, default=None,
                     help="TLS on every connection")
    sec.add_argument("--tls-cert", help="PEM certificate this node presents")
    sec.add_argument("--tls-key", help="PEM private key of --tls-cert")
    sec.add_argument("--tls-ca", help="PEM CA bundle that peers' certificates must chain to")
    node.add_argument("--shape", action=argparse.BooleanOptionalAction, default=None,
                      help="shape WAN traffic like the scenario's links (default: [real].shape)")
    node.add_argument("--link-budget", metavar="PATH",
                      help="the job's shared link budget file on this host (launchers create "
                           "it; or GEOMX_LINK_BUDGET; default: the node keeps its own)")
    node.add_argument("--kernel-shapes", choices=("rate", "all"), default=None,
                      help="the kernel already shapes the WAN's bandwidth (rate) or everything "
                           "(all: netem too); launchers with [real] shaper = \"kernel\" set it")
    node.add_argument("--rejoin", action="store_true",
                      help="restart a worker the job lost ([membership] on_worker_loss = "
                           "'continue'): it registers again, pulls the current model at the "
                           "next round boundary and trains from there); or take over a "
                           "local server's name ([membership] on_server_loss = 'wait')")
    node.add_argument("--print-config", action="store_true",
                      help="print the resolved settings and where each came from, then exit")
    node.add_argument("--watch-stdin", dest="parent_watch", action="store_true", default=None,
                      help="exit when stdin closes (launchers pass a pipe)")
    node.add_argument("--stdin-config", action="store_true",
                      help="read {'scenario': TOML, 'env': {...}} as the first line of stdin, "
                           "then watch stdin (remote launchers)")


def run_node_command(args: argparse.Namespace) -> int:
    """``geomx node`` with its parsed arguments: the node's exit status."""
    from geomx.runtime.node_main import node_main

    if args.scenario_pos is not None:
        if args.scenario is not None and args.scenario != args.scenario_pos:
            print("geomx node: give the scenario once (positional or --scenario)",
                  file=sys.stderr)
            return 2
        args.scenario = args.scenario_pos
    return node_main(args)


def node_command_main(argv: Sequence[str]) -> int:
    """``geomx node ARGV`` in this process, as a fresh ``python -m geomx node ARGV`` would
    run it (logging set up the same way)."""
    parser = argparse.ArgumentParser(prog="geomx node")
    add_node_arguments(parser)
    args = parser.parse_args(list(argv))
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    return run_node_command(args)
