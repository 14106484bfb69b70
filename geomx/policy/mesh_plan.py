"""What a mesh topology's plan says: who aggregates whose values, over which trees and routes.

Over a mesh of DCs (docs/papers.md §1 (b)) every DC hosts one server. A mesh
:class:`~geomx.policy.topology.MeshTopology` answers the job's controller with a
:class:`MeshPlan`: which DCs are roots and with what share of the model (``perf``), each
root's aggregation tree (``parent``) and, for every tree edge, the DC routes a chunk
takes (``routes``: main route first, then auxiliary ones the servers may switch to when
the main route's first hop is congested, Step 5). The servers cut every key into
:class:`Chunk` s and give them to the roots by share (:func:`chunk_table`, Step 2's task
division); a chunk is summed up its root's tree and its sum comes back down the same
tree. A plan travels from the controller to the servers as JSON
(:meth:`MeshPlan.to_json`), and :meth:`MeshPlan.problem` is the check the controller runs
on every plan a topology returns before any server sees it.

These are plain data types and the task-division rule; planners (NETSTORM's routes and
trees, MLNET's static overlay, a user's own) live in their topology modules.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Link", "MeshPlan", "Chunk", "chunk_table", "initial_rates", "route_key",
           "AUX_QUEUE_LIMIT"]

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
    both directions. ``kind`` names the topology that planned it (the controller's
    ``plan`` event shows it; empty: the controller fills in the topology's name).
    ``rates_bps["u>v"]`` and ``delays_s["u>v"]`` (optional, empty unless the planner fills
    them) are the rate estimate and one-way delay of each directed link the plan was made
    from, for a topology that picks between a pair's routes by their expected arrival
    (:meth:`~geomx.policy.topology.MeshTopology.pick_route`).
    JSON-able: :meth:`to_json` / :meth:`from_json`.
    """

    plan_id: int
    dcs: list[str]
    perf: dict[str, float]
    parent: dict[str, dict[str, str]]
    routes: dict[str, list[list[str]]]
    kind: str = ""
    rates_bps: dict[str, float] = field(default_factory=dict)
    delays_s: dict[str, float] = field(default_factory=dict)
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
        out: dict[str, Any] = {
            "plan_id": self.plan_id, "dcs": list(self.dcs), "perf": dict(self.perf),
            "parent": {r: dict(t) for r, t in self.parent.items()},
            "routes": {k: [list(p) for p in v] for k, v in self.routes.items()},
            "kind": self.kind}
        if self.rates_bps:  # only plans that carry them: the others' JSON stays as it was
            out["rates_bps"] = dict(self.rates_bps)
            out["delays_s"] = dict(self.delays_s)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MeshPlan":
        return cls(plan_id=int(d["plan_id"]), dcs=[str(x) for x in d["dcs"]],
                   perf={str(k): float(v) for k, v in d["perf"].items()},
                   parent={str(r): {str(a): str(b) for a, b in t.items()}
                           for r, t in d["parent"].items()},
                   routes={str(k): [[str(x) for x in p] for p in v]
                           for k, v in d["routes"].items()},
                   kind=str(d.get("kind", "")),
                   rates_bps={str(k): float(v) for k, v in d.get("rates_bps", {}).items()},
                   delays_s={str(k): float(v) for k, v in d.get("delays_s", {}).items()})

    def problem(self, links: Iterable[Link]) -> str:
        """Why the servers could not run this plan over ``links`` ("" when they can): every
        root's tree must reach the root from every DC without a cycle, and every tree edge
        needs routes both ways, each a walk over ``links`` from one end to the other."""
        dcs = set(self.dcs)
        if len(dcs) != len(self.dcs):
            return f"plan {self.plan_id}: dcs {self.dcs} lists a DC twice"
        if any(d not in dcs for d in self.perf) or any(p < 0 for p in self.perf.values()):
            return f"plan {self.plan_id}: perf must map DCs of the plan to shares >= 0"
        if not self.roots:
            return f"plan {self.plan_id}: no root has a positive perf"
        linked = {(ln.a, ln.b) for ln in links} | {(ln.b, ln.a) for ln in links}
        for root in self.roots:
            tree = self.parent.get(root)
            if tree is None:
                return f"plan {self.plan_id}: root {root!r} has no tree in parent"
            for dc in self.dcs:
                seen = {dc}
                node = dc
                while node != root:
                    node = tree.get(node, "")
                    if node not in dcs or node in seen:
                        return (f"plan {self.plan_id}: in root {root!r}'s tree, {dc!r} does "
                                "not reach the root (a missing parent or a cycle)")
                    seen.add(node)
            for child, par in tree.items():
                for u, v in ((child, par), (par, child)):
                    routes = self.routes.get(route_key(u, v))
                    if not routes:
                        return f"plan {self.plan_id}: no route {u} -> {v} for a tree edge"
                    for r in routes:
                        if len(r) < 2 or r[0] != u or r[-1] != v or \
                                any((a, b) not in linked for a, b in zip(r, r[1:])):
                            return (f"plan {self.plan_id}: route {r} is not a walk over the "
                                    f"mesh's links from {u} to {v}")
        return ""


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
