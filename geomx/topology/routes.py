"""WAN routes between DCs and what a route loses: the one rule both runtimes follow.

The emulator (:mod:`geomx.sim.topology`) sends a message over the DC route this module
picks, and the real runtime shapes each peer by the same route
(:mod:`geomx.runtime.wan_shapes`, the userspace shaper and the kernel's namespaces
alike). Emulated and real runs are only comparable while the two agree, so the rule
lives here once (docs/architecture.md, "Emulator details": fewest hops, ties broken by
lower delay):

* **route** -- the fewest WAN hops; among those, the lowest summed delay. Each directed
  link weighs :func:`route_weight` ``= 1 + delay_s * 1e-6``, so a hop always outweighs
  any realistic delay difference (delays are far below 1e6 s) and Dijkstra finds the
  fewest-hop, lowest-delay path. Equal weights are broken by networkx's visiting order:
  the order DCs and links were added, which both runtimes take from the scenario;
* **failed links** -- a route avoids the links routing has converged around
  (:func:`geomx.topology.link_faults.link_timeline`) when the rest still connects the
  two DCs, and crosses them otherwise (the traffic stalls until they return);
* **path loss** -- a message survives a route when it survives every link, so the
  route's loss probability is ``1 - prod(1 - loss_link)`` (:func:`path_loss`).

networkx (~0.15 s to import) loads when a route is first asked for, so a real node that
never routes does not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["WanGraph", "path_loss", "route_weight"]

#: Undirected WAN links (``frozenset({dc_a, dc_b})``) that routes leave out.
Avoid = frozenset[frozenset[str]]


def route_weight(delay_s: float) -> float:
    """The weight of one directed WAN link: one per hop, plus its delay in megaseconds."""
    return 1.0 + float(delay_s) * 1e-6


def path_loss(losses: Iterable[float]) -> float:
    """Loss probability of a route whose links drop with probabilities ``losses``
    (independent links, multiplied in route order)."""
    keep = 1.0
    for loss in losses:
        keep *= 1.0 - loss
    return 1.0 - keep


class WanGraph:
    """The DCs and their directed WAN links, and the routes between them.

    Add the DCs first and then the links, both in scenario order: that order breaks
    ties between routes of equal weight, so two graphs built from one scenario route
    alike. Routes are cached per failed-link set; adding a DC or link clears the cache.
    """

    def __init__(self) -> None:
        self._dcs: list[str] = []
        self._links: list[tuple[str, str, float]] = []
        self._graph: nx.DiGraph | None = None
        self._cache: dict[tuple[str, str, Avoid], list[str] | None] = {}

    def add_dc(self, dc: str) -> None:
        self._dcs.append(dc)
        self._graph = None
        self._cache.clear()

    def add_link(self, a: str, b: str, delay_s: float) -> None:
        """The directed WAN link ``a -> b`` with one-way delay ``delay_s``."""
        self._links.append((a, b, route_weight(delay_s)))
        self._graph = None
        self._cache.clear()

    def __contains__(self, dc: object) -> bool:
        return dc in self._dcs

    def _built(self) -> nx.DiGraph:
        if self._graph is None:
            import networkx as nx

            g = nx.DiGraph()
            g.add_nodes_from(self._dcs)
            for a, b, weight in self._links:
                g.add_edge(a, b, weight=weight)
            self._graph = g
        return self._graph

    def route(self, a: str, b: str, avoid: Avoid = frozenset()) -> list[str] | None:
        """The DCs from ``a`` to ``b`` (both included) along the route, around the
        ``avoid`` links when the rest still connects them, else over them; None when
        no route joins them (or a DC is unknown). The same list object is returned for
        repeated questions: do not change it."""
        key = (a, b, avoid)
        try:
            return self._cache[key]
        except KeyError:
            pass
        route = self._search(a, b, avoid)
        self._cache[key] = route
        return route

    def _search(self, a: str, b: str, avoid: Avoid) -> list[str] | None:
        if a not in self._dcs or b not in self._dcs:
            return None
        import networkx as nx

        g = self._built()
        if avoid:
            live = nx.subgraph_view(g, filter_edge=lambda u, v: frozenset((u, v)) not in avoid)
            try:
                return nx.shortest_path(live, a, b, weight="weight")
            except nx.NetworkXNoPath:
                pass
        try:
            return nx.shortest_path(g, a, b, weight="weight")
        except nx.NetworkXNoPath:
            return None
