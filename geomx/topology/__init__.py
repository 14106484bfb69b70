"""Topology planning: which nodes a job has, where they run and whom they register with.

``[topology] kind`` picks a planner from :data:`PLANNERS`; each is a module here that
implements :class:`~geomx.policy.layout.TopologyPlanner` (``hips``: GeoMX's two tiers;
``flat``: the vanilla parameter server; ``netstorm``, ``mlnet``, ``mxnet``: one server per
DC over a mesh, :mod:`geomx.topology.mesh`, planned by :mod:`geomx.topology.netstorm_plan`).
Two modules here serve both runtimes rather than a planner: :mod:`geomx.topology.routes`
(the WAN routing rule and path loss) and :mod:`geomx.topology.link_faults` (link failures
as a timeline of routing states).
This is a policy package: it takes plain values and imports nothing
from the scenario, the cluster, the nodes or the runtimes.
"""

from __future__ import annotations

from collections.abc import Sequence

from geomx.topology import flat, hips, mesh
from geomx.policy.layout import (GLOBAL_SCHEDULER, MASTER_WORKER, STATE_SERVER, DCShape,
                                 NodeLayout, TopologyPlanner)

__all__ = [
    "GLOBAL_SCHEDULER", "MASTER_WORKER", "STATE_SERVER", "DCShape", "NodeLayout",
    "TopologyPlanner", "PLANNERS", "KINDS", "MESH_KINDS", "plan_nodes",
]

#: ``[topology] kind`` -> planner.
PLANNERS: dict[str, TopologyPlanner] = {"hips": hips.plan, "flat": flat.plan,
                                        "netstorm": mesh.plan_tree, "mlnet": mesh.plan_tree,
                                        "mxnet": mesh.plan_mxnet}
#: Kinds over a mesh of DCs, without a central DC (docs/papers.md §1).
MESH_KINDS: tuple[str, ...] = mesh.MESH_KINDS
KINDS: tuple[str, ...] = tuple(PLANNERS)


def plan_nodes(kind: str, central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
               state_server: bool) -> NodeLayout:
    """The nodes of a job laid out by the planner of ``kind`` (one of :data:`KINDS`)."""
    try:
        planner = PLANNERS[kind]
    except KeyError:
        raise ValueError(f"unknown topology kind {kind!r}; allowed: "
                         f"{', '.join(repr(k) for k in KINDS)}") from None
    return planner(central_dc, parties, global_servers=global_servers, state_server=state_server)
