"""``geomx node``: run one node of a scenario in this process, over real sockets.

The launcher (``launcher.py``) starts one of these per node; people running on several
hosts start them by hand, with ssh, Slurm or Kubernetes. Each process writes, under the
run folder, ``nodes/<name>.events.jsonl`` (its own events, including every ``send``),
``nodes/<name>.result.json`` and ``logs/<name>.log``; the launcher merges them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from geomx.cluster import make_node, plan_job
from geomx.metrics.recorder import EventRecorder
from geomx.runtime.services import RealServices
from geomx.runtime.wan_shapes import dc_routes
from geomx.scenario import Scenario, load_scenario

log = logging.getLogger(__name__)


def safe_name(node: str) -> str:
    """File-name form of a node name (``w:party-a:0`` -> ``w_party-a_0``)."""
    return node.replace(":", "_").replace("/", "_")


def build_shaper(s: Scenario, plan: Any, name: str):
    """Per-peer shapes for ``name``'s traffic to nodes in other DCs (None: no WAN)."""
    from geomx.runtime.shaper import LinkShape, Shaper

    routes = dc_routes(s)
    my_dc = plan.job.dc_of[name]
    shapes = {}
    for peer in plan.nodes:
        peer_dc = plan.job.dc_of[peer]
        r = routes.get((my_dc, peer_dc))
        if peer_dc != my_dc and r is not None:
            shapes[peer] = LinkShape(bandwidth_bps=r["bandwidth_bps"], delay_s=r["delay_s"],
                                     jitter_s=r["jitter_s"], loss=r["loss"])
    if not shapes:
        return None
    return Shaper(shapes, seed=s.run.seed)


async def run_node(s: Scenario, name: str, run_dir: Path, book: dict[str, str],
                   start_epoch: float, *, shape: bool = True) -> dict[str, Any]:
    from geomx.runtime.tcp import TcpTransport

    plan = plan_job(s, "real")
    if name not in plan.roles:
        raise KeyError(f"no node named {name!r} in this scenario; nodes: {', '.join(plan.nodes)}")
    nodes_dir = run_dir / "nodes"
    nodes_dir.mkdir(parents=True, exist_ok=True)
    recorder = EventRecorder(nodes_dir / f"{safe_name(name)}.events.jsonl",
                             clock=lambda: time.time() - start_epoch, enabled=s.metrics.events,
                             dc_of=plan.job.dc_of.get, byte_kinds=("send",))
    services = RealServices(s.run.seed, recorder, plan.job.dc_of, start_epoch)
    host, _, port = book.get(name, "").rpartition(":")
    dc = next(d for d in s.dcs if d.name == plan.job.dc_of[name])
    transport = TcpTransport(name, host=host or dc.host, port=int(port) if port else 0,
                             secret=os.environ.get("GEOMX_SECRET") or None,
                             shaper=build_shaper(s, plan, name) if shape else None)
    await transport.start()
    transport.set_address_book(book)
    node = make_node(plan, name, transport, services)
    node.address_book.update(book)
    try:
        await node.run()
    finally:
        await transport.close(flush_timeout_s=2.0 if node.failure is not None else 10.0)
        recorder.close()
    result: dict[str, Any] = {"name": name, "role": plan.roles[name],
                              "counters": recorder.counters.to_dict()}
    if hasattr(node, "iteration"):
        result["iterations"] = node.iteration
    if isinstance(getattr(node, "result", None), dict):
        result["result"] = node.result
    (nodes_dir / f"{safe_name(name)}.result.json").write_text(json.dumps(result, sort_keys=True))
    return result


def node_main(args: Any) -> int:
    """Entry point of ``geomx node`` (argparse namespace from ``geomx.cli``)."""
    from geomx.runtime.eventloop import run

    s = load_scenario(args.scenario)
    try:
        run(run_node(s, args.name, Path(args.run_dir), json.loads(args.book), args.start_epoch))
    except Exception as e:  # the launcher reports the node by name
        log.exception("node %s failed", args.name)
        print(f"geomx node {args.name}: failed: {type(e).__name__}: {e}", flush=True)
        return 1
    return 0
