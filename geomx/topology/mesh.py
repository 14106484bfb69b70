"""Layouts over a mesh of DCs with no central tier: NETSTORM, MLNET and the MXNET baseline.

docs/papers.md §1 (b) "Entities": every DC hosts one parameter server and its workers; a
controller (a scheduler that also plans) and the master worker sit in the first DC (the
repo puts them on extra hosts h10/h11; here they share DC 1, and only small control
messages and the initial model leave it). A worker talks only to its own DC's server
(``ns:{dc}``); servers relay and aggregate for each other along the controller's trees.

``mxnet`` is the stock parameter server of the paper's baseline: one global server per DC
(``gs:{i}`` in the i-th DC), parameters sharded evenly over them, every worker pushing to
every server across the mesh (the flat-PS node code, ``mode = "flat_ps"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from geomx.policy.layout import (MASTER_WORKER, DCShape, NodeLayout, assemble_layout,
                                 global_server_name)

#: JobSpec mode of NETSTORM and MLNET jobs (one tree-aggregating server per DC).
MODE = "netstorm"
#: The kinds laid out over a mesh without a central DC.
MESH_KINDS = ("netstorm", "mlnet", "mxnet")


def mesh_server_name(dc: str) -> str:
    return f"ns:{dc}"


def _check(parties: Sequence[DCShape]) -> None:
    if not parties:
        raise ValueError("a mesh topology needs at least one DC with workers")


def plan_tree(central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
              state_server: bool) -> NodeLayout:
    """``netstorm`` / ``mlnet``: a server per DC (its ``local_server_of`` entry, which the
    DC's workers push to), listed as the job's servers so the master's commands and the
    workers' SHUTDOWN reach every one; ``central_dc`` hosts the controller ``gh``."""
    _check(parties)
    if state_server:
        raise ValueError("a mesh topology has no state server (ESync); allowed: sync = fsa")
    lay = assemble_layout(MODE, central_dc, parties, global_servers=0, state_server=False,
                          local_tier={})
    servers = [mesh_server_name(d.name) for d in parties]
    lay.global_servers = servers
    lay.local_server_of = {d.name: mesh_server_name(d.name) for d in parties}
    for d in parties:
        lay.dc_of[mesh_server_name(d.name)] = d.name
        lay.roles[mesh_server_name(d.name)] = "mesh_server"
    # the controller keeps the global scheduler's role (every runtime starts, books and
    # addresses it as one); cluster.make_node builds the planning scheduler for this mode
    lay.dc_of[MASTER_WORKER] = central_dc
    return lay


def plan_mxnet(central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
               state_server: bool) -> NodeLayout:
    """``mxnet``: flat PS with global server i in the i-th DC (``global_servers`` is
    ignored: one per DC, as the stock MXNet deployment of the paper)."""
    _check(parties)
    lay = assemble_layout("flat_ps", central_dc, parties, global_servers=len(parties),
                          state_server=state_server, local_tier={})
    for i, d in enumerate(parties):
        lay.dc_of[global_server_name(i)] = d.name
    return lay
