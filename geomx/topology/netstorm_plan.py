"""NETSTORM's controller policy: routes, per-root aggregation trees, root shares, chunks.

Follows docs/papers.md §1 (b), Steps 1-2 (fengwenjiao/netstorm ``van.cc``'s route
enumeration and perf metric, ``kvstore_dist.h``'s task division), and §6.6 for the MLNET
baseline's static tree. Everything here takes plain values (DC names, directed link rates
in bit/s, delays in seconds) and returns a :class:`MeshPlan` that travels as JSON, so the
controller node, the servers, the benchmarks and the tests all share one implementation.

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
* **Task division**: the flattened model is cut into chunks of at most
  ``chunk_elements``; root r's quota is ``ceil(perf_r / sum perf * total)`` elements and
  chunks go round-robin over the roots, skipping full ones.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # networkx (~0.15 s to import) loads only when a mesh is planned
    import networkx as nx

__all__ = ["Link", "MeshPlan", "Chunk", "initial_rates", "plan_netstorm", "plan_mlnet",
           "chunk_table", "route_key", "DEFAULT_MAX_AUX", "AUX_QUEUE_LIMIT"]

#: Auxiliary routes kept per pair (beyond the main route).
DEFAULT_MAX_AUX = 3
#: L of Step 5: a relayed chunk leaves the main route when its first-hop queue holds more
#: than 2*L messages and an auxiliary first-hop queue holds fewer than L (the demo's
#: AUXILIARY_QUEUE_LENGTH = 1).
AUX_QUEUE_LIMIT = 1


@dataclass(frozen=True)
class Link:
    """An undirected mesh link (a [[wan]]) with a one-way propagation delay."""

    a: str
    b: str
    delay_s: float = 0.0


def route_key(src: str, dst: str) -> str:
    return f"{src}>{dst}"


@dataclass
class MeshPlan:
    """One plan of the controller: who aggregates for whom, over which routes.

    ``perf`` has every DC (0 = not a root), in DC order; ``parent[root][dc]`` is ``dc``'s
    parent in root's tree (the root has none); ``routes["u>v"]`` is the main route then the
    auxiliary routes from u to v, each a list of DCs from u to v, for every tree edge in
    both directions. JSON-able: :meth:`to_json` / :meth:`from_json`.
    """

    plan_id: int
    dcs: list[str]
    perf: dict[str, float]
    parent: dict[str, dict[str, str]]
    routes: dict[str, list[list[str]]]
    kind: str = "netstorm"
    _children: dict[tuple[str, str], list[str]] = field(default_factory=dict, repr=False,
                                                        compare=False)

    @property
    def roots(self) -> list[str]:
        return [d for d in self.dcs if self.perf.get(d, 0.0) > 0]

    def shares(self) -> dict[str, float]:
        total = sum(self.perf.values())
        return {r: self.perf[r] / total for r in self.roots}

    def children(self, root: str, dc: str) -> list[str]:
        """``dc``'s children in ``root``'s tree, in DC order."""
        key = (root, dc)
        out = self._children.get(key)
        if out is None:
            tree = self.parent.get(root, {})
            out = self._children[key] = [j for j in self.dcs if tree.get(j) == dc]
        return out

    def routes_of(self, src: str, dst: str) -> list[list[str]]:
        try:
            return self.routes[route_key(src, dst)]
        except KeyError:
            raise KeyError(f"plan {self.plan_id} has no route {src} -> {dst}") from None

    def tree_edges(self, root: str) -> list[tuple[str, str]]:
        """(child, parent) pairs of ``root``'s tree."""
        return [(j, p) for j, p in self.parent.get(root, {}).items()]

    def to_json(self) -> dict[str, Any]:
        return {"plan_id": self.plan_id, "dcs": list(self.dcs), "perf": dict(self.perf),
                "parent": {r: dict(t) for r, t in self.parent.items()},
                "routes": {k: [list(p) for p in v] for k, v in self.routes.items()},
                "kind": self.kind}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MeshPlan":
        return cls(plan_id=int(d["plan_id"]), dcs=[str(x) for x in d["dcs"]],
                   perf={str(k): float(v) for k, v in d["perf"].items()},
                   parent={str(r): {str(a): str(b) for a, b in t.items()}
                           for r, t in d["parent"].items()},
                   routes={str(k): [[str(x) for x in p] for p in v]
                           for k, v in d["routes"].items()},
                   kind=str(d.get("kind", "netstorm")))


@dataclass(frozen=True)
class Chunk:
    """Elements ``[lo, hi)`` of key ``key`` (its ``index``-th chunk), owned by ``root``."""

    key: int
    index: int
    lo: int
    hi: int
    root: str


def initial_rates(links: Iterable[Link], seed: int) -> dict[tuple[str, str], float]:
    """The controller's throughput matrix before any measurement (bit/s): NETSTORM draws
    pseudo-random values in [0, 100) MB/s, symmetric, from a fixed seed (docs/papers.md §1,
    "Controller state"), so the first plan is effectively random. Never exactly 0."""
    rng = random.Random(seed)
    out: dict[tuple[str, str], float] = {}
    for ln in links:
        mbyte_s = max(rng.random() * 100.0, 0.01)
        out[(ln.a, ln.b)] = out[(ln.b, ln.a)] = mbyte_s * 8e6
    return out


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


def _aux_routes(g: nx.DiGraph, src: str, dst: str, main: list[str], max_aux: int) -> list[list[str]]:
    """Main route first, then interior-node-disjoint auxiliary routes in cost order.

    Accepting, in increasing cost, each path whose interior avoids the interiors accepted
    so far (the repo's greedy rule over its exhaustive list) is the same as repeatedly
    taking the cheapest path that avoids them: one Dijkstra per accepted route, with the
    used interior nodes (and an already used direct link) hidden."""
    out = [main]
    hidden_nodes = set(main[1:-1])
    hidden_edges = {(src, dst)} if len(main) == 2 else set()

    def weight(u: str, v: str, d: dict[str, Any]) -> float | None:
        if v in hidden_nodes or u in hidden_nodes or (u, v) in hidden_edges:
            return None
        return d["weight"]

    import networkx as nx

    for _ in range(max_aux):
        try:
            _, path = nx.bidirectional_dijkstra(g, src, dst, weight=weight)
        except nx.NetworkXNoPath:
            break
        out.append(list(path))
        if len(path) == 2:
            hidden_edges.add((src, dst))
        hidden_nodes |= set(path[1:-1])
    return out


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
                  max_aux: int = DEFAULT_MAX_AUX) -> MeshPlan:
    """NETSTORM's plan for the current rate matrix (directed, bit/s; missing or 0 = down).

    ``roots``: how many of the best roots keep a share (0 = all, the demo's R = N);
    ``dynamic_roots`` picks R by the link-load estimate instead. Raises ``ValueError`` when
    the live links do not connect the DCs.
    """
    if cost not in ("bandwidth", "latency"):
        raise ValueError(f"cost = {cost!r}; allowed: 'bandwidth', 'latency'")
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
    for r in parent:
        for j, p in parent[r].items():
            for u, v in ((j, p), (p, j)):
                k = route_key(u, v)
                if k in routes:
                    continue
                main = paths[u][v]
                routes[k] = (_aux_routes(g, u, v, main, max_aux) if multipath
                             else [main])
    return MeshPlan(plan_id=plan_id, dcs=dcs, perf=perf, parent=parent, routes=routes,
                    kind="netstorm")


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


def chunk_table(key_sizes: Mapping[int, int], chunk_elements: int,
                perf: Mapping[str, float]) -> list[Chunk]:
    """Cut every key (in key order) into chunks of ``chunk_elements`` (the last one of a key
    shorter) and give them to the roots in proportion to ``perf`` (round-robin, skipping
    roots whose quota ``ceil(perf_r / sum perf * total)`` is full): NETSTORM's task
    division."""
    if chunk_elements < 1:
        raise ValueError(f"chunk_elements = {chunk_elements}; allowed: >= 1")
    roots = [r for r, p in perf.items() if p > 0]
    if not roots:
        raise ValueError("no root has a positive perf")
    total = sum(key_sizes.values())
    psum = sum(perf[r] for r in roots)
    quota = {r: math.ceil(perf[r] / psum * total) for r in roots}
    given = {r: 0 for r in roots}
    out: list[Chunk] = []
    turn = 0
    for key in sorted(key_sizes):
        n = key_sizes[key]
        pieces = max(1, math.ceil(n / chunk_elements))
        for i in range(pieces):
            # full chunks, then the rest: a full chunk is a full-size awareness sample
            lo, hi = i * chunk_elements, min(n, (i + 1) * chunk_elements)
            for _ in range(len(roots)):
                r = roots[turn % len(roots)]
                turn += 1
                if given[r] < quota[r]:
                    break
            else:  # unreachable while sum(quota) >= total; keep the last root tried
                pass
            given[r] += hi - lo
            out.append(Chunk(key, i, lo, hi, r))
    return out
