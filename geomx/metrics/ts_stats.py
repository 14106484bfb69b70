"""What TSEngine did in a run, from its coordinators' events (geomx/sched/ts_overlay.py).

The coordinators record one ``ts_pair`` per aggregation decision (``src`` sends its merge
buffer to ``dst``; ``rule`` = ``root``, ``throughput`` or ``fifo``), one ``ts_choose`` per
broadcast decision (``src`` sends the model to ``dst``; ``mode`` = ``exploit`` or
``explore``, with ``p_greedy`` and the known/unknown candidate counts) and one
``ts_measure`` per reported relay (``thr`` bytes/s over ``bytes``). This module turns
them into ``summary.json`` ``extra.tsengine``: per overlay, how often it exploited and
explored, how pushes were paired, and per edge how often it was chosen, its measured
throughput (median over the transfers of the largest tensor, where latency matters
least) next to the bandwidth of the link it crossed -- so a reader can check that
exploration found the faster edges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def _median(v: list[float]) -> float | None:
    if not v:
        return None
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def ts_stats(events: Iterable[dict[str, Any]],
             link_bps: Callable[[str, str], float | None] | None = None) -> dict[str, Any] | None:
    """TSEngine figures of a run, or None when no overlay decision was recorded.

    ``link_bps(src_node, dst_node)`` gives the bandwidth of the link an edge crosses
    (None when unknown, e.g. a path over several links)."""
    per: dict[str, dict[str, Any]] = {}
    measures: dict[str, list[tuple[str, str, int, float]]] = {}
    for ev in events:
        kind = ev.get("ev")
        if kind not in ("ts_pair", "ts_choose", "ts_measure"):
            continue
        o = per.setdefault(str(ev.get("overlay")), {
            "broadcast_decisions": 0, "exploit": 0, "explore": 0,
            "pairings": {"root": 0, "throughput": 0, "fifo": 0}, "_edges": {},
            "_push_edges": {}, "_first": {}, "_rounds": set()})
        src, dst = str(ev.get("src")), str(ev.get("dst"))
        if kind == "ts_pair":
            o["pairings"][str(ev.get("rule"))] = o["pairings"].get(str(ev.get("rule")), 0) + 1
            o["_push_edges"][(src, dst)] = o["_push_edges"].get((src, dst), 0) + 1
        elif kind == "ts_choose":
            o["broadcast_decisions"] += 1
            mode = str(ev.get("mode"))
            o[mode] = o.get(mode, 0) + 1
            e = o["_edges"].setdefault((src, dst), {"chosen": 0, "exploit": 0})
            e["chosen"] += 1
            e["exploit"] += mode == "exploit"
            rnd = (ev.get("key"), ev.get("part"), ev.get("round"))
            if rnd not in o["_rounds"]:
                # the round's first decision is the root's first hop (the root asks first)
                o["_rounds"].add(rnd)
                f = o["_first"].setdefault((src, dst), {"exploit": 0, "explore": 0})
                f[mode] = f.get(mode, 0) + 1
        else:
            measures.setdefault(str(ev.get("overlay")), []).append(
                (src, dst, int(ev.get("bytes", 0)), float(ev.get("thr", 0.0))))
    if not per:
        return None
    out: dict[str, Any] = {}
    for name, o in sorted(per.items()):
        ms = measures.get(name, [])
        biggest = max((b for _, _, b, _ in ms), default=0)
        thr: dict[tuple[str, str], list[float]] = {}
        for s, d, b, t in ms:
            if b == biggest:
                thr.setdefault((s, d), []).append(t)
        edges = []
        for (s, d), e in o.pop("_edges").items():
            med = _median(thr.get((s, d), []))
            bw = link_bps(s, d) if link_bps is not None else None
            edges.append({"src": s, "dst": d, "chosen": e["chosen"], "exploit": e["exploit"],
                          "measured_mbps": None if med is None else med * 8 / 1e6,
                          "link_mbps": None if bw is None else bw / 1e6})
        edges.sort(key=lambda e: (-e["chosen"], e["src"], e["dst"]))
        push = [{"src": s, "dst": d, "merges": n,
                 "link_mbps": None if link_bps is None or link_bps(s, d) is None
                 else link_bps(s, d) / 1e6}  # type: ignore[operator]
                for (s, d), n in sorted(o.pop("_push_edges").items(), key=lambda x: -x[1])]
        o.pop("_rounds")
        o["root_first_hop"] = [
            {"src": s, "dst": d, **f,
             "link_mbps": None if link_bps is None or link_bps(s, d) is None
             else link_bps(s, d) / 1e6}  # type: ignore[operator]
            for (s, d), f in sorted(o.pop("_first").items())]
        o["measured_tensor_bytes"] = biggest
        o["edges"] = edges
        o["push_edges"] = push
        out[name] = o
    return out
