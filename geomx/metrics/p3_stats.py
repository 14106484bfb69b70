"""What P3 did in a run, from its events: slice queueing delay and bytes per priority.

The kvstore records one ``p3_slice`` span per pushed slice (``t_start`` = the moment its
gradient was ready, ``dur`` = until its fused acknowledgement came back, ``prio``, ``bytes``,
``skey`` = the slice key on the wire). The first byte of the slice leaving is the start of
the matching PUSH transfer: an ``xfer`` event in the emulator (when the network started
sending it) or a ``send`` event over sockets (when the node handed it to the transport,
which then serves its queue by priority). The difference is the slice's *queueing delay*
-- what P3's priority queue shortens for the early layers.

The result goes into ``summary.json`` under ``extra.p3`` (geomx/experiment.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    return {"mean": sum(v) / len(v), "p50": v[len(v) // 2],
            "p95": v[min(len(v) - 1, int(0.95 * len(v)))], "max": v[-1]}


def p3_stats(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """P3 figures of a run, or None when no slice was pushed under P3."""
    slices: list[dict[str, Any]] = []
    starts: dict[tuple[str, int], list[float]] = {}
    for ev in events:
        kind = ev.get("ev")
        if kind == "p3_slice":
            slices.append(ev)
        elif kind in ("xfer", "send") and ev.get("msg") == "PUSH":
            starts.setdefault((str(ev.get("src")), int(ev.get("key", -1))), []).append(
                float(ev.get("t_start", ev.get("t", 0.0))))
    if not slices:
        return None
    for times in starts.values():
        times.sort()
    queue: list[float] = []
    ack: list[float] = []
    per_prio: dict[int, dict[str, Any]] = {}
    for s in slices:
        ready = float(s["t_start"])
        prio = int(s.get("prio", 0))
        row = per_prio.setdefault(prio, {"slices": 0, "bytes": 0, "_q": [], "_a": []})
        row["slices"] += 1
        row["bytes"] += int(s.get("bytes", 0))
        done = float(s.get("dur", 0.0))
        ack.append(done)
        row["_a"].append(done)
        times = starts.get((str(s["node"]), int(s["skey"])))
        if times:
            i = bisect.bisect_left(times, ready - 1e-12)
            if i < len(times):
                q = times[i] - ready
                queue.append(q)
                row["_q"].append(q)
    out_prio = {}
    for prio in sorted(per_prio, reverse=True):
        row = per_prio[prio]
        q, a = row.pop("_q"), row.pop("_a")
        row["queue_delay_mean_s"] = sum(q) / len(q) if q else None
        row["ready_to_ack_mean_s"] = sum(a) / len(a) if a else None
        out_prio[str(prio)] = row
    return {"slices": len(slices), "queue_delay_s": _stats(queue),
            "ready_to_ack_s": _stats(ack), "per_priority": out_prio}
