"""NETSTORM's auxiliary routes over idle links, and the per-chunk choice between routes.

docs/papers.md §1 (b) Step 5. The paper offloads chunks onto *idle* links outside the
trees. The authors' code accepts as auxiliary any interior-disjoint path and moves a chunk
to one whenever the main first-hop queue holds more than 2·L messages and the auxiliary
first-hop queue fewer than L. Both halves of that can slow a round where the links off the
trees are much slower than those on them (the authors' static table: 100 against
500 Mbit/s): an auxiliary path that rejoins a tree link takes capacity from the trees' own
traffic there, and a 4 MB chunk moved from a queue of three 500 Mbit/s chunks onto a
100 Mbit/s hop arrives later than it would have by waiting. ``[netstorm] aux_rule =
"arrival"`` (the default) keeps the mechanism and fixes both:

* **idle routes only** (:func:`idle_aux_routes`): past its first hop an auxiliary route
  uses only link directions the plan's trees keep busy for at most half the time of the
  busiest one (:func:`busy_links`; a link off the trees carries nothing of theirs) and
  that no other pair's auxiliary route uses past its first hop. The first hop may be a
  busy link: the sender sees that queue, relayed chunks included, and counts it;
* **earliest expected arrival** (:func:`pick_by_arrival`): a chunk takes the route on
  which it is expected to arrive first: the queue ahead of it on the first hop (its
  bytes at that link's rate, or a round trip per send window of messages, whichever is
  longer), on the later hops the chunks this sender already put there (which only it
  sends there), and on every hop the chunk's store-and-forward time and delay, at the
  rates the plan was made from (the measured ones once awareness has reported). The main
  route wins ties, so a chunk leaves it only when the detour is expected to deliver it
  sooner: a pair's chunks spread over its routes so that they finish together.

``aux_rule = "queue"`` is the authors' rule, for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from geomx.policy.mesh_plan import MeshPlan, route_key
from geomx.policy.topology import SendQueue

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["AUX_RULES", "Detours", "busy_links", "idle_aux_routes", "pick_by_arrival"]

#: A tree link busy for more than this fraction of the busiest link's time per iteration
#: is not idle: auxiliary routes do not cross it past their first hop.
BUSY_FRACTION = 0.5

#: ``[netstorm] aux_rule`` values: NETSTORM over idle links by expected arrival,
#: or the authors' queue-length rule over any interior-disjoint path.
AUX_RULES = ("arrival", "queue")


def busy_links(parent: Mapping[str, Mapping[str, str]], perf: Mapping[str, float],
               rates_bps: Mapping[tuple[str, str], float]) -> set[tuple[str, str]]:
    """The directed links the plan's trees keep busy: those whose time per iteration
    (root r's share of the model up or down each edge of r's tree, at the edge's rate) is
    more than :data:`BUSY_FRACTION` of the busiest link's. The others have room for
    auxiliary chunks while the busiest link still works through its own."""
    total = sum(perf.values()) or 1.0
    load: dict[tuple[str, str], float] = {}
    for root, tree in parent.items():
        share = perf.get(root, 0.0) / total
        for j, p in tree.items():
            for e in ((j, p), (p, j)):
                bps = rates_bps.get(e, 0.0)
                load[e] = load.get(e, 0.0) + (share / bps if bps > 0 else math.inf)
    peak = max(load.values(), default=0.0)
    return {e for e, t in load.items() if t > BUSY_FRACTION * peak}


def idle_aux_routes(g: nx.DiGraph, src: str, dst: str, main: list[str], max_aux: int,
                    busy: set[tuple[str, str]]) -> list[list[str]]:
    """``main`` then up to ``max_aux`` auxiliary routes from ``src`` to ``dst`` in cost
    order, each interior-disjoint from the routes before it and, past its first hop, off
    the ``busy`` link directions (an empty set: the authors' routes).

    Accepting, in increasing cost, each path whose interior avoids the interiors accepted
    so far (the authors' greedy rule over their exhaustive list) is the same as repeatedly
    taking the cheapest path that avoids them: one Dijkstra per accepted route, with the
    used interior nodes (and an already used direct link) hidden."""
    import networkx as nx

    out = [main]
    hidden_nodes = set(main[1:-1])
    hidden_edges = {(src, dst)} if len(main) == 2 else set()

    def weight(u: str, v: str, d: dict[str, Any]) -> float | None:
        if u in hidden_nodes or v in hidden_nodes or (u, v) in hidden_edges:
            return None
        if u != src and (u, v) in busy:
            return None
        return float(d["weight"])

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


@dataclass
class Detours:
    """What one server has put on its auxiliary routes under plan ``plan_id``: until when
    each link past a route's first hop is expected to be busy with those chunks. Those
    links carry no tree traffic and serve this pair alone (:func:`idle_aux_routes`), so
    the sender's own account of them is their queue."""

    plan_id: int
    busy_until_s: dict[str, float] = field(default_factory=dict)


def expected_arrival_s(plan: MeshPlan, route: Sequence[str], first: SendQueue,
                       chunk_bytes: int, now_s: float,
                       detours: Detours | None = None) -> float | None:
    """When a chunk put on ``route`` at ``now_s`` is expected at its end (on the same
    clock); None when the plan has no rate for a hop. On the first hop it waits for the
    queue ahead of it (``first``): for its bytes at the link's rate, or, when that is
    longer, for one round trip per ``window`` of messages ahead (each window must be
    acknowledged before the next goes). On every further hop it waits until the chunks
    this sender put there before have gone (``detours``). Each hop costs the chunk's
    store-and-forward time and the hop's delay."""
    t = now_s
    for i, (u, v) in enumerate(zip(route, route[1:])):
        k = route_key(u, v)
        bps = plan.rates_bps.get(k, 0.0)
        if bps <= 0:
            return None
        delay_s = plan.delays_s.get(k, 0.0)
        if i == 0:
            ahead = first.waiting + first.in_flight
            t += max(first.bytes * 8.0 / bps, (ahead // first.window) * 2.0 * delay_s)
        elif detours is not None:
            t = max(t, detours.busy_until_s.get(k, t))
        t += chunk_bytes * 8.0 / bps + delay_s
    return t


def _book(plan: MeshPlan, route: Sequence[str], first: SendQueue, chunk_bytes: int,
          now_s: float, detours: Detours) -> None:
    """Note the chunk just put on ``route`` in ``detours``: the links past its first hop
    are busy with it until it is expected to have left them."""
    t = expected_arrival_s(plan, route[:2], first, chunk_bytes, now_s)
    assert t is not None
    for u, v in zip(route[1:], route[2:]):
        k = route_key(u, v)
        start = max(t, detours.busy_until_s.get(k, t))
        detours.busy_until_s[k] = start + chunk_bytes * 8.0 / plan.rates_bps[k]
        t = detours.busy_until_s[k] + plan.delays_s.get(k, 0.0)


def pick_by_arrival(plan: MeshPlan, routes: Sequence[Sequence[str]],
                    queue: Callable[[str], SendQueue], chunk_bytes: int, now_s: float,
                    detours: Detours | None = None) -> int:
    """The index of the route on which a chunk of ``chunk_bytes`` is expected to arrive
    first (``queue(dc)``: the send queue to the neighbour ``dc``; ``detours``: this
    sender's chunks already on auxiliary routes, updated with this one's); the main route
    (0) on ties and whenever its arrival cannot be estimated."""
    best_t = expected_arrival_s(plan, routes[0], queue(routes[0][1]), chunk_bytes, now_s,
                                detours)
    if best_t is None:
        return 0
    best = 0
    for i, route in enumerate(routes[1:], start=1):
        t = expected_arrival_s(plan, route, queue(route[1]), chunk_bytes, now_s, detours)
        if t is not None and t < best_t:
            best, best_t = i, t
    if best and detours is not None:
        _book(plan, routes[best], queue(routes[best][1]), chunk_bytes, now_s, detours)
    return best
