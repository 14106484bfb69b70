"""NETSTORM's and MLNET's planners: routes, per-root aggregation trees, root shares.

Follows docs/papers.md §1 (b), Steps 1-2 (fengwenjiao/netstorm ``van.cc``'s route
enumeration and perf metric, ``kvstore_dist.h``'s task division), and §6.6 for the MLNET
baseline's static tree. Everything here takes plain values (DC names, directed link rates
in bit/s, delays in seconds) and returns a :class:`~geomx.policy.mesh_plan.MeshPlan` (the
plan's data types, the seeded initial rate matrix and the task division live there, in the
public API), which the topology classes :class:`geomx.topology.netstorm.NetStorm` and
:class:`geomx.topology.mlnet.MLNet` hand to the job's controller.

* **Routes** (Step 1). Edge cost is the store-and-forward time per unit of data,
  ``1 / bw`` (``cost = "bandwidth"``), or the time of one chunk, ``delay + bytes * 8 / bw``
  (``cost = "latency"``, the paper's "deeper inquiry"). The main route of (s, d) is the
  cheapest path (Dijkstra, the first path of networkx's ``shortest_simple_paths``);
  auxiliary routes are accepted greedily in cost order when no interior node is an
  interior node of an accepted path, which is the same as taking, one Dijkstra each, the
  cheapest path that hides the interiors accepted so far (no path enumeration at all:
  neither the repo's exhaustive DFS nor Yen's ``shortest_simple_paths``, whose candidate
  lists would mostly be rejected). Auxiliary routes are only computed for the pairs a plan
  uses (tree edges), so 200 DCs plan in about a second.
* **FAPT** (Step 2). For root r, node j's parent is the next hop of j's main route to r.
  Its metric is the aggregate-forward time ``T_r = sum over depth l of max 1/bw(e)`` over
  the distinct edges at depth l of the root->node main routes; ``perf_r = 1 / T_r``; the
  R best roots keep their perf, the others get 0.
* **Dynamic roots** (beyond the paper): R is chosen to minimise the busiest link's load
  ``max_e sum_r share_r [e in tree r] / bw(e)`` (each tree moves its share up and down
  every edge once).
* **Task division** (:func:`geomx.policy.mesh_plan.chunk_table`): the flattened model is
  cut into chunks of at most ``chunk_elements``; root r's quota is
  ``ceil(perf_r / sum perf * total)`` elements and chunks go round-robin over the roots,
  skipping full ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from geomx.policy.mesh_plan import (AUX_QUEUE_LIMIT, Chunk, Link, MeshPlan, chunk_table,
                                   initial_rates, route_key)
from geomx.topology.netstorm_multipath import AUX_RULES, busy_links, idle_aux_routes

if TYPE_CHECKING:  # networkx (~0.15 s to import) loads only when a mesh is planned
    import networkx as nx

__all__ = ["Link", "MeshPlan", "Chunk", "initial_rates", "plan_netstorm", "plan_mlnet",
           "chunk_table", "route_key", "DEFAULT_MAX_AUX", "AUX_QUEUE_LIMIT"]

#: Auxiliary routes kept per pair (beyond the main route).
DEFAULT_MAX_AUX = 3


def _graph(dcs: Sequence[str], links: Iterable[Link], rates_bps: Mapping[tuple[str, str], float],
           cost: str, chunk_bytes: float) -> nx.DiGraph:
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(dcs)
    for ln in links:
        for u, v in ((ln.a, ln.b), (ln.b, ln.a)):
            bw = rates_bps.get((u, v), 0.0)
            if bw <= 0:
                continue  # a dead (or unknown) direction carries nothing
            w = 1.0 / bw if cost == "bandwidth" else ln.delay_s + chunk_bytes * 8.0 / bw
            g.add_edge(u, v, weight=w, inv_bw=1.0 / bw)
    return g


def _path_cost(g: nx.DiGraph, path: Sequence[str]) -> float:
    return sum(g[u][v]["weight"] for u, v in zip(path, path[1:]))


def _fapt(root: str, dcs: Sequence[str], paths: Mapping[str, Mapping[str, list[str]]],
          g: nx.DiGraph) -> tuple[dict[str, str], float] | None:
    """Root ``root``'s tree (parent of every other DC) and its aggregate-forward time T_r,
    or None when some DC cannot reach the root."""
    parent: dict[str, str] = {}
    for j in dcs:
        if j == root:
            continue
        p = paths.get(j, {}).get(root)
        if p is None or root not in paths or j not in paths[root]:
            return None
        parent[j] = p[1]
    depth_max: dict[int, float] = {}
    seen: set[tuple[str, str]] = set()
    for j in dcs:
        if j == root:
            continue
        down = paths[root][j]
        for depth, (u, v) in enumerate(zip(down, down[1:])):
            if (u, v) in seen:
                continue
            seen.add((u, v))
            depth_max[depth] = max(depth_max.get(depth, 0.0), g[u][v]["inv_bw"])
    t_r = sum(depth_max.values())
    return parent, t_r


def _best_root_count(ranked: Sequence[str], trees: Mapping[str, tuple[dict[str, str], float]],
                     g: nx.DiGraph) -> int:
    """The R whose perf-proportional shares give the lowest busiest-link load
    ``max_e sum_r share_r [e in tree r] / bw(e)`` (each tree edge carries its share up and
    down once), adding roots best first; O(N (N + E))."""
    acc: dict[tuple[str, str], float] = {}
    psum = 0.0
    best_n, best = 1, math.inf
    for n, r in enumerate(ranked, start=1):
        perf = 1.0 / trees[r][1] if trees[r][1] > 0 else 1.0
        psum += perf
        for j, p in trees[r][0].items():
            for u, v in ((j, p), (p, j)):
                acc[(u, v)] = acc.get((u, v), 0.0) + perf * g[u][v]["inv_bw"]
        load = max(acc.values(), default=0.0) / psum
        if load < best * (1 - 1e-9):
            best_n, best = n, load
    return best_n


def plan_netstorm(dcs: Sequence[str], links: Sequence[Link],
                  rates_bps: Mapping[tuple[str, str], float], *, plan_id: int = 0,
                  roots: int = 0, dynamic_roots: bool = False, multipath: bool = True,
                  cost: str = "bandwidth", chunk_bytes: float = 4e6,
                  max_aux: int = DEFAULT_MAX_AUX, aux_rule: str = "arrival") -> MeshPlan:
    """NETSTORM's plan for the current rate matrix (directed, bit/s; missing or 0 = down).

    ``roots``: how many of the best roots keep a share (0 = all, the demo's R = N);
    ``dynamic_roots`` picks R by the link-load estimate instead. With ``multipath``, every
    tree edge gets auxiliary routes: over idle links, and the plan carries the rates and
    delays the servers weigh them by (``aux_rule = "arrival"``,
    :mod:`geomx.topology.netstorm_multipath`), or any interior-disjoint ones (``"queue"``,
    the authors' rule). Raises ``ValueError`` when the live links do not connect the DCs.
    """
    if cost not in ("bandwidth", "latency"):
        raise ValueError(f"cost = {cost!r}; allowed: 'bandwidth', 'latency'")
    if aux_rule not in AUX_RULES:
        raise ValueError(f"aux_rule = {aux_rule!r}; allowed: "
                         + ", ".join(repr(r) for r in AUX_RULES))
    dcs = list(dcs)
    g = _graph(dcs, links, rates_bps, cost, chunk_bytes)
    import networkx as nx

    paths = dict(nx.all_pairs_dijkstra_path(g, weight="weight"))
    trees: dict[str, tuple[dict[str, str], float]] = {}
    for r in dcs:
        t = _fapt(r, dcs, paths, g)
        if t is not None:
            trees[r] = t
    if not trees:
        raise ValueError("the live links do not connect the DCs: no root reaches every DC")
    ranked = sorted(trees, key=lambda r: (trees[r][1], dcs.index(r)))
    if dynamic_roots:
        chosen = ranked[:_best_root_count(ranked, trees, g)]
    else:
        chosen = ranked[:roots] if roots > 0 else ranked
    keep = set(chosen)
    perf = {d: (1.0 / trees[d][1] if d in keep and trees[d][1] > 0 else
                (1.0 if d in keep else 0.0)) for d in dcs}
    parent = {r: trees[r][0] for r in dcs if r in keep}
    routes: dict[str, list[list[str]]] = {}
    idle = multipath and aux_rule == "arrival"
    for r in parent:
        for j, p in parent[r].items():
            for u, v in ((j, p), (p, j)):
                k = route_key(u, v)
                if k in routes:
                    continue
                main = paths[u][v]
                routes[k] = (idle_aux_routes(g, u, v, main, max_aux, set())
                             if multipath and not idle else [main])
    if idle:
        # slowest main routes first: they get the idle links before faster ones do
        busy = busy_links(parent, perf, rates_bps)
        for k in sorted(routes, key=lambda k: (-_path_cost(g, routes[k][0]), k)):
            main = routes[k][0]
            routes[k] = idle_aux_routes(g, main[0], main[-1], main, max_aux, busy)
            for aux in routes[k][1:]:
                busy.update(zip(aux[1:], aux[2:]))  # an idle link serves one pair only
    rates: dict[str, float] = {}
    delays: dict[str, float] = {}
    if idle:  # what the servers weigh the routes by
        delay = {}
        for ln in links:
            delay[(ln.a, ln.b)] = delay[(ln.b, ln.a)] = ln.delay_s
        live = [(u, v, bw) for (u, v), bw in rates_bps.items() if bw > 0]
        rates = {route_key(u, v): bw for u, v, bw in live}
        delays = {route_key(u, v): delay.get((u, v), 0.0) for u, v, _ in live}
    return MeshPlan(plan_id=plan_id, dcs=dcs, perf=perf, parent=parent, routes=routes,
                    kind="netstorm", rates_bps=rates, delays_s=delays)


def plan_mlnet(dcs: Sequence[str], links: Sequence[Link], *, fan_in: int = 5,
               plan_id: int = 0) -> MeshPlan:
    """MLNET's static overlay (docs/papers.md §6.6) on the stock PS's sharding: every DC's
    server owns an equal share of the parameters (as MXNET shards them) and aggregates it
    over its own balanced ``fan_in``-ary tree, laid over the DCs in breadth-first order of
    the mesh from that root (hop counts only: not network-aware); each overlay edge is
    routed over a fewest-hop path and relayed hop by hop."""
    if fan_in < 1:
        raise ValueError(f"fan_in = {fan_in}; allowed: an integer >= 1")
    dcs = list(dcs)
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(dcs)
    g.add_edges_from((ln.a, ln.b) for ln in links)
    parents: dict[str, dict[str, str]] = {}
    routes: dict[str, list[list[str]]] = {}
    for root in dcs:
        order = [root] + [v for _, v in nx.bfs_edges(g, root)]
        if len(order) != len(dcs):
            raise ValueError("the links do not connect the DCs")
        parent = {order[i]: order[(i - 1) // fan_in] for i in range(1, len(order))}
        parents[root] = parent
        for j, p in parent.items():
            for u, v in ((j, p), (p, j)):
                if route_key(u, v) not in routes:
                    routes[route_key(u, v)] = [list(nx.shortest_path(g, u, v))]
    return MeshPlan(plan_id=plan_id, dcs=dcs, perf={d: 1.0 for d in dcs}, parent=parents,
                    routes=routes, kind="mlnet")
