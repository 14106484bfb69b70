"""The scenario's WAN table as per-peer shapes for the real transport's own shaper.

The emulator routes a message over the WAN graph; the real runtime has no graph, so each
node shapes its traffic to a peer in another DC by that route's bottleneck bandwidth,
summed one-way delay and jitter, and combined loss. Traffic inside a DC is not shaped.

Fidelity to the emulator (``geomx/sim/network.py``), which is the reference:

* **route** -- the emulator's, from the routing module both runtimes share
  (:mod:`geomx.topology.routes`): fewest WAN hops, ties broken by the lower delay, and
  the same path loss;
* **traces and failed links** -- ``[[wan]] trace`` and ``[[fault]] kind = "link_down"``
  give a pair's shape phases (:func:`dc_link_phases`): the route's lowest current rate;
  stalled, then the route around a failed link, then back;
* **delay** -- the emulator's path from a node to a node in another DC crosses the
  sender's NIC link, the WAN links and the receiver's NIC link, each with its delay (a
  NIC link carries half its DC's ``lan_latency``, so host to host inside a DC takes
  ``lan_latency``); so the shaped delay is ``lan_latency(src DC) / 2 + WAN route delay +
  lan_latency(dst DC) / 2``;
* **shared links** -- every directed WAN link, and every NIC link whose DC's
  ``lan_bandwidth`` is at most :data:`NIC_SHAPED_MAX_BPS`, is one entry of a
  :class:`LinkTable`; a sender reserves each piece's bytes on every link of its route
  in a budget all senders share (:mod:`geomx.runtime.link_budget`), as the emulator
  shares a link between the flows crossing it;
* **no burst credit** -- an emulated link delivers a message at the end of its
  transmission plus the delay, even when it was idle; the shaper's default credit
  (10 ms of traffic) let every message under ~125 KB (at 100 Mbit/s) through without
  paying for its bytes, so scenario links get one segment of credit instead;
* **per-flow caps** -- the emulator caps every reliable flow at ``tcp_window / RTT`` (and
  Mathis et al. on lossy paths) with RTT = forward + reverse path delay and the
  scenario's ``[network]`` window and MSS; the shaper applies the same caps.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator

from geomx.runtime.shaper import LinkShape
from geomx.scenario import Scenario, link_faults
from geomx.topology.link_faults import link_timeline
from geomx.topology.routes import WanGraph, path_loss
from geomx.traces import wan_traces


@dataclasses.dataclass(frozen=True)
class _WanEdge:
    bw: float
    delay: float
    jitter: float
    loss: float


def _wan_graph(s: Scenario) -> tuple[WanGraph, dict[tuple[str, str], _WanEdge]]:
    """The scenario's WAN in the emulator's order (DCs, then links in file order, each
    as a->b then b->a, so ties break alike), and each directed link's figures."""
    g = WanGraph()
    for d in s.dcs:
        g.add_dc(d.name)
    edges: dict[tuple[str, str], _WanEdge] = {}
    for w in s.wans:
        bw_ba = w.bandwidth_ba_bps or w.bandwidth_bps
        for a, b, bw in ((w.a, w.b, w.bandwidth_bps), (w.b, w.a, bw_ba)):
            g.add_link(a, b, w.latency_s)
            edges[(a, b)] = _WanEdge(bw, w.latency_s, w.jitter_s, w.loss)
    return g, edges


def dc_routes(s: Scenario, avoid: frozenset[frozenset[str]] = frozenset()
              ) -> dict[tuple[str, str], dict[str, float]]:
    """(dc_a, dc_b) -> {bandwidth_bps, delay_s, jitter_s, loss, route} along the emulator's
    route (:class:`geomx.topology.routes.WanGraph`: fewest hops, then lowest delay; around
    the ``avoid`` links where possible)."""
    g, edges = _wan_graph(s)
    out: dict[tuple[str, str], dict[str, float]] = {}
    names = [d.name for d in s.dcs]
    for a in names:
        for b in names:
            path = None if a == b else g.route(a, b, avoid)
            if path is None:
                continue
            hops = list(zip(path, path[1:]))
            on_route = [edges[h] for h in hops]
            out[(a, b)] = {"bandwidth_bps": min(e.bw for e in on_route),
                           "delay_s": sum(e.delay for e in on_route),
                           "jitter_s": sum(e.jitter for e in on_route),
                           "loss": path_loss(e.loss for e in on_route), "route": path,
                           "bw": {h: edges[h].bw for h in hops}}
    return out


def dc_link_shapes(s: Scenario, avoid: frozenset[frozenset[str]] = frozenset(),
                   routes: dict | None = None) -> dict[tuple[str, str], LinkShape]:
    """(src DC, dst DC) -> the :class:`LinkShape` a sender in src uses for a peer in dst
    (with the ``avoid`` links failed and routed around; ``routes``: :func:`dc_routes`'s
    answer for them, when the caller has it already)."""
    if routes is None:
        routes = dc_routes(s, avoid)
    lan = {d.name: d.lan_latency_s for d in s.dcs}

    def one_way(a: str, b: str) -> float:
        return lan[a] / 2 + routes[(a, b)]["delay_s"] + lan[b] / 2

    out = {}
    for (a, b), r in routes.items():
        fwd = one_way(a, b)
        rev = one_way(b, a) if (b, a) in routes else fwd
        out[(a, b)] = LinkShape(bandwidth_bps=r["bandwidth_bps"], delay_s=fwd,
                                jitter_s=r["jitter_s"], loss=r["loss"],
                                burst_bytes=s.network.mss_bytes, rtt_s=fwd + rev,
                                tcp_window_bytes=s.network.tcp_window_bytes,
                                mss_bytes=s.network.mss_bytes)
    return out


#: NIC links faster than this are not modelled over sockets: at 1 Gbit/s and above a
#: node's NIC is not what limits a Python process on loopback (it moves a few Gbit/s at
#: most), and shaping every message inside a DC would add a timer wake-up per message
#: for a delay of microseconds. Slower NICs (``[[dc]] lan_bandwidth``) are shaped like
#: WAN links, shared by every flow through them.
NIC_SHAPED_MAX_BPS = 1e9

#: A route's links as ``((src DC, dst DC), bandwidth_bps)`` per WAN hop.
WanHops = tuple[tuple[tuple[str, str], float], ...]


def route_hops(route: dict) -> WanHops:
    """The WAN hops of one :func:`dc_routes` entry, in route order."""
    return tuple((hop, float(bw)) for hop, bw in route["bw"].items())


class LinkTable:
    """Every directed link a sender may reserve bandwidth on, by index.

    Every process of a job builds the same table from the scenario and the plan's node
    list (so an index names the same link everywhere): first both directions of each
    ``[[wan]]`` in file order, then the NIC up- and downlink of each node (plan order)
    whose DC's ``lan_bandwidth`` is at most :data:`NIC_SHAPED_MAX_BPS`.
    """

    def __init__(self, s: Scenario, nodes: list[str], dc_of: dict[str, str]):
        self.index: dict[tuple[str, ...], int] = {}
        for w in s.wans:
            for a, b in ((w.a, w.b), (w.b, w.a)):
                self.index[("wan", a, b)] = len(self.index)
        lan = {d.name: d.lan_bandwidth_bps for d in s.dcs}
        self.nic_bps: dict[str, float] = {}
        for node in nodes:
            bw = lan[dc_of[node]]
            if bw <= NIC_SHAPED_MAX_BPS:
                self.nic_bps[node] = bw
                self.index[("up", node)] = len(self.index)
                self.index[("down", node)] = len(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def hops(self, src: str, dst: str, wan: WanHops) -> tuple[tuple[int, float], ...]:
        """``(index, rate in bytes/s)`` of each modelled link from node ``src`` over the
        WAN hops ``wan`` to node ``dst``."""
        out = []
        if src in self.nic_bps:
            out.append((self.index[("up", src)], self.nic_bps[src] / 8.0))
        out += [(self.index[("wan", a, b)], bw / 8.0) for (a, b), bw in wan]
        if dst in self.nic_bps:
            out.append((self.index[("down", dst)], self.nic_bps[dst] / 8.0))
        return tuple(out)


def lan_shape(s: Scenario, dc: str) -> LinkShape:
    """The shape of a node-to-node path inside ``dc`` (for DCs whose NICs are modelled):
    the emulator's ``lan_latency`` host to host, its window cap, no burst credit."""
    d = next(d for d in s.dcs if d.name == dc)
    return LinkShape(bandwidth_bps=d.lan_bandwidth_bps, delay_s=d.lan_latency_s,
                     burst_bytes=s.network.mss_bytes, rtt_s=2 * d.lan_latency_s,
                     tcp_window_bytes=s.network.tcp_window_bytes,
                     mss_bytes=s.network.mss_bytes)


Phases = Iterator[tuple[float, "LinkShape | None", WanHops]]


def dc_link_phases(s: Scenario) -> dict[tuple[str, str], Callable[[], Phases]]:
    """(src DC, dst DC) -> a fresh reading of the times (job seconds) its shape changes,
    generated lazily: ``(t, shape, hops)`` (the route's WAN hops at their current rates),
    or ``(t, None, ())`` while it carries nothing. Only pairs whose shape can change are
    listed; call the value once per shaped peer.

    Two things change a pair's shape, as they change the emulator's links:

    * **traces** (``[[wan]] trace``): the shape's bandwidth is the lowest current rate on
      its route (:func:`geomx.traces.wan_traces`, the emulator's seeds, so a "uniform"
      link draws the same rates in both runtimes); an endless trace gives endless phases,
      generated as time goes by;
    * **failed links** (:func:`geomx.topology.link_faults.link_timeline`): stalled while
      the route crosses a failed link routing has not converged around, then the route
      around it, then the original route when the link returns.
    """
    timeline = link_timeline(link_faults(s.faults, s.wans))
    traces = wan_traces(s.wans, s.run.seed)
    if not timeline and not traces:
        return {}
    cache: dict[frozenset, tuple[dict, dict]] = {}

    def routing(rerouted: frozenset) -> tuple[dict, dict]:
        if rerouted not in cache:
            routes = dc_routes(s, rerouted)
            cache[rerouted] = (routes, dc_link_shapes(s, rerouted, routes))
        return cache[rerouted]

    base_routes, base = routing(frozenset())
    state_routes = [routing(st.rerouted)[0] for st in timeline]
    failed = {e for st in timeline for e in st.down}
    out: dict[tuple[str, str], Callable[[], Phases]] = {}
    for pair in base:
        routes = [base_routes[pair]["route"]]
        routes += [r[pair]["route"] for r in state_routes if pair in r]
        hops = {e for r in routes for e in zip(r, r[1:])}
        if len({tuple(r) for r in routes}) > 1 or {frozenset(h) for h in hops} & failed \
                or hops & set(traces):
            out[pair] = functools.partial(_phases, pair, base[pair], timeline, traces, routing)
    return out


def _phases(pair: tuple[str, str], base: LinkShape, timeline: list, traces: dict,
            routing: Callable[[frozenset], tuple[dict, dict]]) -> Phases:
    fault_times = [st.t_s for st in timeline]
    last: tuple = (base, route_hops(routing(frozenset())[0][pair]))  # what a peer starts with
    t = 0.0
    while True:
        i = bisect.bisect_right(fault_times, t) - 1
        state = timeline[i] if i >= 0 else None
        routes, shapes = routing(state.rerouted if state else frozenset())
        route = routes.get(pair, {}).get("route")
        hops = list(zip(route, route[1:])) if route else []
        shape: LinkShape | None = None
        wan: WanHops = ()
        if route and not (state and {frozenset(h) for h in hops} & state.down):
            shape = shapes[pair]
            wan = tuple((h, traces[h].rate_at(t) if h in traces else float(routes[pair]["bw"][h]))
                        for h in hops)
            if any(h in traces for h in hops):
                bw = min(rate for _, rate in wan)
                # a trace at 0 bit/s carries nothing (a LinkShape of 0 means unlimited)
                shape = dataclasses.replace(shape, bandwidth_bps=bw) if bw > 0 else None
            if shape is None:
                wan = ()
        if (shape, wan) != last:
            yield (t, shape, wan)
            last = (shape, wan)
        later = fault_times[i + 1:i + 2]  # the next fault state (bisect_right: strictly later)
        later += [traces[h].next_change_after(t) for h in hops if h in traces]
        t = min(later, default=math.inf)
        if math.isinf(t):
            return
