"""NETSTORM: multi-root, network-aware aggregation trees over a mesh of DCs.

docs/papers.md §1 (b): every DC hosts one server; the controller plans, from the
measured link rates, which DCs are roots, each root's share of the model and its tree
(Steps 1-2, :func:`geomx.topology.netstorm_plan.plan_netstorm`), and plans again when the
servers' passive measurements (Step 4) show the rates changed. This is the topology of
``[topology] kind = "netstorm"``; its options come from the scenario's ``[netstorm]``
table (:meth:`NetStorm.from_section`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from geomx.policy.mesh_plan import MeshPlan
from geomx.policy.options import PolicyOptions
from geomx.policy.topology import MeshTopology, MeshView
from geomx.topology.netstorm_plan import DEFAULT_MAX_AUX, plan_netstorm

__all__ = ["NetStorm", "NetStormOptions"]


@dataclass(frozen=True)
class NetStormOptions(PolicyOptions):
    """``[netstorm]``'s planning settings (docs/scenario-reference.md, ``[netstorm]``)."""

    #: how many of the best roots keep a share (0 = every DC, the demo's R = N)
    roots: int = 0
    #: choose R by the busiest-link load estimate instead of ``roots``
    dynamic_roots: bool = False
    #: plan auxiliary routes the servers may switch to (Step 5)
    multipath: bool = True
    #: edge cost of the routes: store-and-forward time per unit of data, or of one chunk
    cost: Literal["bandwidth", "latency"] = "bandwidth"
    #: time the links (Step 4) and plan again when their rates change
    awareness: bool = True
    #: auxiliary routes kept per pair
    max_aux: int = DEFAULT_MAX_AUX

    def __post_init__(self) -> None:
        if self.roots < 0:
            raise ValueError(f"roots = {self.roots}; allowed: an integer >= 0")
        if self.max_aux < 0:
            raise ValueError(f"max_aux = {self.max_aux}; allowed: an integer >= 0")


class NetStorm(MeshTopology):
    """NETSTORM's planner behind the mesh topology API."""

    name = "netstorm"
    Options = NetStormOptions
    options: NetStormOptions
    #: the scenario section its options are read from (:meth:`from_section`)
    scenario_section: ClassVar[str] = "netstorm"

    @classmethod
    def from_section(cls, netstorm: Any) -> "NetStorm":
        """Built from the scenario's ``[netstorm]`` section (its parsed object)."""
        return cls(NetStormOptions(roots=int(netstorm.roots),
                                   dynamic_roots=bool(netstorm.dynamic_roots),
                                   multipath=bool(netstorm.multipath), cost=str(netstorm.cost),
                                   awareness=bool(netstorm.awareness)))

    @property
    def measures_links(self) -> bool:
        return self.options.awareness

    def plan_trees(self, view: MeshView) -> MeshPlan:
        o = self.options
        return plan_netstorm(view.dcs, view.links, view.rates_bps, plan_id=view.plan_id,
                             roots=o.roots, dynamic_roots=o.dynamic_roots,
                             multipath=o.multipath, cost=o.cost, chunk_bytes=view.chunk_bytes,
                             max_aux=o.max_aux)
