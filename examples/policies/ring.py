"""A ring topology over a mesh of DCs, written only against the public API (geomx.policy).

Every DC roots an equal share of the model (like a ring all-reduce). The DCs are put on
a ring, and root r's tree runs along both arcs of the ring towards r: the DC k steps
clockwise from r sends to the one k - 1 steps clockwise, the DC k steps counter-clockwise
to the one k - 1 steps counter-clockwise, so no tree is deeper than half the ring and each
ring edge carries one partial sum per root. Ring neighbours that share no link talk over
the lowest-delay route between them.

The ring order is ``order`` from ``[topology.options]`` when given, else a greedy
nearest-neighbour tour by route delay starting at the first DC (ties broken by the
scenario's DC order). The topology does not measure links; when a link dies the
controller asks again and the ring is laid over the live links.

Use it in a scenario (options optional):

    [topology]
    kind = "ring.py:Ring"          # relative to the scenario file

    [topology.options]
    order = ["a", "b", "c", "d"]
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from geomx.policy import Link, MeshPlan, MeshTopology, MeshView, PolicyOptions, route_key


@dataclass(frozen=True)
class RingOptions(PolicyOptions):
    #: the ring's DC order (empty: a greedy nearest-neighbour tour by delay)
    order: tuple[str, ...] = ()
    #: aggregate along both arcs towards each root (False: clockwise only, a chain)
    both_ways: bool = True


def _routes_from(src: str, dcs: list[str], links: tuple[Link, ...]) -> dict[str, list[str]]:
    """The lowest-delay route (fewest hops on ties) from ``src`` to every DC it reaches."""
    adjacent: dict[str, list[tuple[str, float]]] = {d: [] for d in dcs}
    for ln in links:
        adjacent[ln.a].append((ln.b, ln.delay_s))
        adjacent[ln.b].append((ln.a, ln.delay_s))
    rank = {d: i for i, d in enumerate(dcs)}
    best: dict[str, tuple[float, int]] = {src: (0.0, 0)}
    route: dict[str, list[str]] = {src: [src]}
    heap = [(0.0, 0, rank[src], src)]
    while heap:
        delay, hops, _, u = heapq.heappop(heap)
        if (delay, hops) > best[u]:
            continue
        for v, d in adjacent[u]:
            cand = (delay + d, hops + 1)
            if v not in best or cand < best[v]:
                best[v] = cand
                route[v] = route[u] + [v]
                heapq.heappush(heap, (cand[0], cand[1], rank[v], v))
    return route


class Ring(MeshTopology):
    """Equal shares, one two-armed chain per root along a ring of DCs."""

    name = "ring"
    Options = RingOptions
    options: RingOptions

    def _ring(self, dcs: list[str], routes: dict[str, dict[str, list[str]]],
              view: MeshView) -> list[str]:
        if self.options.order:
            if sorted(self.options.order) != sorted(dcs):
                raise ValueError(f"ring order {list(self.options.order)} must list every DC "
                                 f"of the mesh once: {dcs}")
            return list(self.options.order)
        ring = [dcs[0]]
        while len(ring) < len(dcs):
            here = ring[-1]
            left = [d for d in dcs if d not in ring and d in routes[here]]
            if not left:
                raise ValueError(f"the live links do not connect {here} to the other DCs")
            ring.append(min(left, key=lambda d: (sum(view.delay_s(a, b) for a, b in
                                                     zip(routes[here][d], routes[here][d][1:])),
                                                 dcs.index(d))))
        return ring

    def plan_trees(self, view: MeshView) -> MeshPlan:
        dcs = list(view.dcs)
        live = view.live_links()
        routes = {d: _routes_from(d, dcs, live) for d in dcs}
        ring = self._ring(dcs, routes, view)
        n = len(ring)
        parent: dict[str, dict[str, str]] = {}
        plan_routes: dict[str, list[list[str]]] = {}
        for i, root in enumerate(ring):
            tree: dict[str, str] = {}
            for k in range(1, n):
                if self.options.both_ways and k > n // 2:
                    child, par = ring[(i + k) % n], ring[(i + k + 1) % n]  # counter-clockwise arc
                else:
                    child, par = ring[(i + k) % n], ring[(i + k - 1) % n]
                tree[child] = par
                for u, v in ((child, par), (par, child)):
                    if v not in routes[u]:
                        raise ValueError(f"the live links do not connect {u} to {v}")
                    plan_routes[route_key(u, v)] = [routes[u][v]]
            parent[root] = tree
        return MeshPlan(plan_id=view.plan_id, dcs=dcs, perf={d: 1.0 for d in dcs},
                        parent=parent, routes=plan_routes, kind="ring")
