"""NETSTORM: multi-root, network-aware aggregation trees over a mesh of DCs.

docs/papers.md §1 (b): every DC hosts one server; the controller plans, from the
measured link rates, which DCs are roots, each root's share of the model and its tree
(Steps 1-2, :func:`geomx.topology.netstorm_plan.plan_netstorm`), and plans again when the
servers' passive measurements (Step 4) show the rates changed. This is the topology of
``[topology] kind = "netstorm"``; its options come from the scenario's ``[netstorm]``
table (:meth:`NetStorm.from_section`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from geomx.policy.mesh_plan import MeshPlan
from geomx.policy.options import PolicyOptions
from geomx.policy.topology import MeshTopology, MeshView, SendQueue
from geomx.topology.netstorm_multipath import AUX_RULES, Detours, pick_by_arrival
from geomx.topology.netstorm_plan import DEFAULT_MAX_AUX, plan_netstorm

__all__ = ["NetStorm", "NetStormOptions"]


@dataclass(frozen=True)
class NetStormOptions(PolicyOptions):
    """``[netstorm]``'s planning settings (docs/scenario.md, ``[netstorm]``); each field is
    a key of that section (``geomx.scenario.netstorm.SECTION_OPTION_KEYS``)."""

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
    #: how chunks take auxiliary routes (:mod:`geomx.topology.netstorm_multipath`):
    #: "arrival" (idle links, earliest expected arrival) or "queue" (the authors' rule)
    aux_rule: Literal["arrival", "queue"] = "arrival"
    #: probe a link direction no measurement covered for this long (0 = never): passive
    #: awareness alone never measures a link again once the plans stop using it
    probe_after_s: float = 10.0

    def __post_init__(self) -> None:
        if self.aux_rule not in AUX_RULES:
            raise ValueError(f"aux_rule = {self.aux_rule!r}; allowed: "
                             + ", ".join(repr(r) for r in AUX_RULES))
        if self.roots < 0:
            raise ValueError(f"roots = {self.roots}; allowed: an integer >= 0")
        if self.probe_after_s < 0:
            raise ValueError(f"probe_after_s = {self.probe_after_s}; allowed: >= 0 (0 = never)")
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
                                   awareness=bool(netstorm.awareness),
                                   max_aux=int(netstorm.max_aux),
                                   aux_rule=str(netstorm.aux_rule),
                                   probe_after_s=float(netstorm.probe_after_s)))

    def __init__(self, options: NetStormOptions | None = None) -> None:
        super().__init__(options)
        self._detours: Detours | None = None  # this server's chunks on auxiliary routes

    @property
    def measures_links(self) -> bool:
        return self.options.awareness

    @property
    def probe_after_s(self) -> float:
        return self.options.probe_after_s if self.options.awareness else 0.0

    def plan_trees(self, view: MeshView) -> MeshPlan:
        o = self.options
        return plan_netstorm(view.dcs, view.links, view.rates_bps, plan_id=view.plan_id,
                             roots=o.roots, dynamic_roots=o.dynamic_roots,
                             multipath=o.multipath, cost=o.cost, chunk_bytes=view.chunk_bytes,
                             max_aux=o.max_aux, aux_rule=o.aux_rule)

    def pick_route(self, plan: MeshPlan, routes: Sequence[Sequence[str]],
                   queue: Callable[[str], SendQueue], chunk_bytes: int,
                   now_s: float) -> int:
        """The route of earliest expected arrival (``aux_rule = "arrival"``), or the
        authors' queue rule (``"queue"``, the base class's)."""
        if self.options.aux_rule == "queue":
            return super().pick_route(plan, routes, queue, chunk_bytes, now_s)
        if self._detours is None or self._detours.plan_id != plan.plan_id:
            self._detours = Detours(plan.plan_id)
        return pick_by_arrival(plan, routes, queue, chunk_bytes, now_s, self._detours)
