"""The scenario's WAN table as per-peer shapes for the real transport's own shaper.

The emulator routes a message over the WAN graph; the real runtime has no graph, so each
node shapes its traffic to a peer in another DC by that route's bottleneck bandwidth,
summed one-way delay and jitter, and combined loss. Traffic inside a DC is not shaped.

Fidelity to the emulator (``geomx/sim/network.py``), which is the reference:

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


def dc_link_shapes(s: Scenario) -> dict[tuple[str, str], LinkShape]:
    """(src DC, dst DC) -> the :class:`LinkShape` a sender in src uses for a peer in dst."""
    routes = dc_routes(s)
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
