"""The scenario's WAN table as per-peer shapes for the real transport's own shaper.

The emulator routes a message over the WAN graph; the real runtime has no graph, so each
node shapes its traffic to a peer in another DC by that route's bottleneck bandwidth,
summed one-way delay and jitter, and combined loss. Traffic inside a DC is not shaped.
"""

from __future__ import annotations

import networkx as nx

from geomx.scenario import Scenario


def dc_routes(s: Scenario) -> dict[tuple[str, str], dict[str, float]]:
    """(dc_a, dc_b) -> {bandwidth_bps, delay_s, jitter_s, loss} along the lowest-delay route."""
    g = nx.DiGraph()
    for w in s.wans:
        bw_ba = w.bandwidth_ba_bps or w.bandwidth_bps
        g.add_edge(w.a, w.b, bw=w.bandwidth_bps, delay=w.latency_s, jitter=w.jitter_s, loss=w.loss)
        g.add_edge(w.b, w.a, bw=bw_ba, delay=w.latency_s, jitter=w.jitter_s, loss=w.loss)
    out: dict[tuple[str, str], dict[str, float]] = {}
    names = [d.name for d in s.dcs]
    for a in names:
        for b in names:
            if a == b or a not in g or b not in g or not nx.has_path(g, a, b):
                continue
            path = nx.shortest_path(g, a, b, weight="delay")
            edges = [g.edges[u, v] for u, v in zip(path, path[1:])]
            keep = 1.0
            for e in edges:
                keep *= 1.0 - e["loss"]
            out[(a, b)] = {"bandwidth_bps": min(e["bw"] for e in edges),
                           "delay_s": sum(e["delay"] for e in edges),
                           "jitter_s": sum(e["jitter"] for e in edges),
                           "loss": 1.0 - keep}
    return out
