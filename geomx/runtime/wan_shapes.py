"""The scenario's WAN table as per-peer shapes for the real transport's own shaper.

The emulator routes a message over the WAN graph; the real runtime has no graph, so each
node shapes its traffic to a peer in another DC by that route's bottleneck bandwidth,
summed one-way delay and jitter, and combined loss. Traffic inside a DC is not shaped.

Fidelity to the emulator (``geomx/sim/network.py``), which is the reference:

* **route** -- the emulator's: fewest WAN hops, ties broken by the lower delay;
* **failed links** -- ``[[fault]] kind = "link_down"``: each pair's shape has phases
  (:func:`dc_link_phases`): stalled, then the route around the link, then back;
* **delay** -- the emulator's path from a node to a node in another DC crosses the
  sender's NIC link, the WAN links and the receiver's NIC link, each with its delay; so
  the shaped delay is ``lan_latency(src DC) + WAN route delay + lan_latency(dst DC)``;
* **no burst credit** -- an emulated link delivers a message at the end of its
  transmission plus the delay, even when it was idle; the shaper's default credit
  (10 ms of traffic) let every message under ~125 KB (at 100 Mbit/s) through without
  paying for its bytes, so scenario links get one segment of credit instead;
* **per-flow caps** -- the emulator caps every reliable flow at ``tcp_window / RTT`` (and
  Mathis et al. on lossy paths) with RTT = forward + reverse path delay and the
  scenario's ``[network]`` window and MSS; the shaper applies the same caps.
"""

from __future__ import annotations

import networkx as nx

from geomx.runtime.shaper import LinkShape
from geomx.scenario import Scenario, link_faults
from geomx.topology.link_faults import link_timeline


def _wan_graph(s: Scenario) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(d.name for d in s.dcs)  # the emulator's order, so ties break alike
    for w in s.wans:
        bw_ba = w.bandwidth_ba_bps or w.bandwidth_bps
        # the emulator's routing rule: fewest hops first, then lowest delay
        weight = 1.0 + w.latency_s * 1e-6
        g.add_edge(w.a, w.b, bw=w.bandwidth_bps, delay=w.latency_s, jitter=w.jitter_s,
                   loss=w.loss, weight=weight)
        g.add_edge(w.b, w.a, bw=bw_ba, delay=w.latency_s, jitter=w.jitter_s, loss=w.loss,
                   weight=weight)
    return g


def _route(g: nx.DiGraph, a: str, b: str,
           avoid: frozenset[frozenset[str]] = frozenset()) -> list[str] | None:
    """The emulator's route from DC a to DC b (``Network._dc_route``): around the
    ``avoid`` links when the rest still connects a and b, else over them; None if none."""
    if a not in g or b not in g:
        return None
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


def dc_routes(s: Scenario, avoid: frozenset[frozenset[str]] = frozenset()
              ) -> dict[tuple[str, str], dict[str, float]]:
    """(dc_a, dc_b) -> {bandwidth_bps, delay_s, jitter_s, loss, route} along the emulator's
    route (fewest hops, then lowest delay; around the ``avoid`` links where possible)."""
    g = _wan_graph(s)
    out: dict[tuple[str, str], dict[str, float]] = {}
    names = [d.name for d in s.dcs]
    for a in names:
        for b in names:
            path = None if a == b else _route(g, a, b, avoid)
            if path is None:
                continue
            edges = [g.edges[u, v] for u, v in zip(path, path[1:])]
            keep = 1.0
            for e in edges:
                keep *= 1.0 - e["loss"]
            out[(a, b)] = {"bandwidth_bps": min(e["bw"] for e in edges),
                           "delay_s": sum(e["delay"] for e in edges),
                           "jitter_s": sum(e["jitter"] for e in edges),
                           "loss": 1.0 - keep, "route": path}
    return out


def dc_link_shapes(s: Scenario, avoid: frozenset[frozenset[str]] = frozenset()
                   ) -> dict[tuple[str, str], LinkShape]:
    """(src DC, dst DC) -> the :class:`LinkShape` a sender in src uses for a peer in dst
    (with the ``avoid`` links failed and routed around)."""
    routes = dc_routes(s, avoid)
    lan = {d.name: d.lan_latency_s for d in s.dcs}

    def one_way(a: str, b: str) -> float:
        return lan[a] + routes[(a, b)]["delay_s"] + lan[b]

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


def dc_link_phases(s: Scenario) -> dict[tuple[str, str], list[tuple[float, LinkShape | None]]]:
    """(src DC, dst DC) -> ``[(job seconds, shape or None = stalled), ...]`` for the pairs
    whose shape the ``link_down`` faults change (:func:`geomx.topology.link_faults.link_timeline`,
    the emulator's reading of the same faults): stalled while their route crosses a failed
    link that routing has not converged around, then the shape of the route around it,
    then the original shape when the link returns."""
    timeline = link_timeline(link_faults(s.faults))
    if not timeline:
        return {}
    base = dc_link_shapes(s)
    out: dict[tuple[str, str], list[tuple[float, LinkShape | None]]] = {}
    for state in timeline:
        routes = dc_routes(s, state.rerouted)
        shapes = dc_link_shapes(s, state.rerouted)
        for pair in base:
            r = routes.get(pair)
            crossed = {frozenset(e) for e in zip(r["route"], r["route"][1:])} if r else set()
            shape = None if r is None or crossed & state.down else shapes[pair]
            phases = out.setdefault(pair, [])
            last = phases[-1][1] if phases else base[pair]
            if shape != last:
                phases.append((state.t_s, shape))
    return {pair: ph for pair, ph in out.items() if ph}
