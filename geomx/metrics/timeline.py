"""`timeline.png`: one iteration of a run, who sends what when, per link.

A quick look at the schedule without opening the Chrome trace in Perfetto: one row per
link that carried traffic during the iteration (WAN links first, then LAN links), one
bar per message crossing it coloured by message type, and one row per worker for its
compute spans. The window is one worker's iteration: from the start of its compute for
iteration k to the start of its compute for k + 1 (k = the middle iteration by default,
away from start-up and shutdown).

Transfers are drawn from `xfer` events (`t`, `dur`, `path`): a message occupies every
link of its path for its whole transfer time. That is the flow-level view the emulator
works in (a message is one flow over its path, geomx/sim/network.py), not a per-hop
packet trace. The real runtime records `send` events instead (when a node handed a
message to its transport; it knows no path or arrival time): those are drawn as ticks
on one row per sending node, after the link rows.

The events file is streamed twice (first the compute spans to choose the window, then
the transfers inside it), so memory stays bounded by the transfers of one iteration.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from geomx.metrics.figure import is_wan_link, new_figure, save_figure
from geomx.metrics.summary import EVENTS_FILE

#: Colours of message types; anything else is grey.
MSG_COLOURS = {
    "PUSH": "tab:orange",
    "PUSH_ACK": "tab:olive",
    "PULL": "tab:cyan",
    "PULL_REPLY": "tab:blue",
}
COMPUTE_COLOUR = "tab:green"
#: Row prefix of the real runtime's send ticks.
SENDS = "sends by"
OTHER_COLOUR = "tab:gray"


@dataclass
class Timeline:
    """The spans of one iteration: `rows` maps a row label to (start, end, kind) spans."""

    node: str
    iteration: int
    t0: float
    t1: float
    rows: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)


def _events_path(source: str | os.PathLike) -> Path:
    p = Path(source)
    return p / EVENTS_FILE if p.is_dir() else p


def _lines_with(path: Path, needle: str):
    """Parsed events whose line contains `needle` (a cheap filter before json.loads)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if needle in line:
                yield json.loads(line)


def _compute_starts(path: Path) -> dict[str, dict[int, tuple[float, float]]]:
    """node -> iteration -> (start, end) of its compute spans."""
    spans: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for ev in _lines_with(path, '"compute"'):
        if ev.get("ev") != "compute" or "iteration" not in ev:
            continue
        end = float(ev["t"])
        start = float(ev.get("t_start", end - float(ev.get("dur", 0.0))))
        spans[str(ev["node"])].setdefault(int(ev["iteration"]), (start, end))
    return spans


def build_timeline(
    source: str | os.PathLike,
    iteration: int | None = None,
    node: str | None = None,
) -> Timeline:
    """The spans of one iteration of `node` (default: the first worker by name) from a
    run folder or an events.jsonl file. Raises ValueError when the run recorded no
    compute spans (events off, or no worker) or the iteration does not exist."""
    path = _events_path(source)
    if not path.exists():
        raise ValueError(f"{path}: no events file (run with [metrics] events = true)")
    spans = _compute_starts(path)
    if not spans:
        raise ValueError(f"{path}: no compute events, so no iteration to show")
    if node is None:
        node = sorted(spans)[0]
    if node not in spans:
        raise ValueError(f"node {node!r} has no compute events; nodes: {', '.join(sorted(spans))}")
    iters = sorted(spans[node])
    if iteration is None:
        iteration = iters[len(iters) // 2]
    if iteration not in spans[node]:
        raise ValueError(f"iteration {iteration} of {node} not in the events; "
                         f"allowed: {iters[0]}..{iters[-1]}")
    t0 = spans[node][iteration][0]
    nxt = [i for i in iters if i > iteration]
    t1 = spans[node][nxt[0]][0] if nxt else spans[node][iteration][1]
    tl = Timeline(node=node, iteration=iteration, t0=t0, t1=t1)
    for ev in _lines_with(path, '"xfer"'):
        if ev.get("ev") != "xfer":
            continue
        start = float(ev["t"])
        end = start + float(ev.get("dur", 0.0))
        if start >= t1 or end <= t0 or ev.get("dropped"):
            continue
        kind = str(ev.get("msg", "?"))
        for link in ev.get("path") or [f"{ev.get('src')}->{ev.get('dst')}"]:
            tl.rows.setdefault(str(link), []).append((max(start, t0), min(end, t1), kind))
    for ev in _lines_with(path, '"send"'):
        if ev.get("ev") == "send" and t0 <= float(ev["t"]) < t1:
            t = float(ev["t"])
            tl.rows.setdefault(f"{SENDS} {ev.get('src', ev.get('node'))}", []).append(
                (t, t, str(ev.get("msg", "?"))))
    for worker, by_iter in spans.items():
        for start, end in by_iter.values():
            if start < t1 and end > t0:
                tl.rows.setdefault(f"compute {worker}", []).append(
                    (max(start, t0), min(end, t1), "compute"))
    return tl


def _row_order(labels) -> list[str]:
    links = [k for k in labels if not k.startswith(("compute ", SENDS))]
    wan = sorted(k for k in links if is_wan_link(k))
    lan = sorted(k for k in links if not is_wan_link(k))
    sends = sorted(k for k in labels if k.startswith(SENDS))
    compute = sorted(k for k in labels if k.startswith("compute "))
    return wan + lan + sends + compute


def plot_timeline(
    source: str | os.PathLike | Timeline,
    out_png: str | os.PathLike | None = None,
    iteration: int | None = None,
    node: str | None = None,
    max_rows: int = 40,
    title: str | None = None,
) -> Figure:
    """Gantt chart of one iteration (see the module docstring); returns the Figure and
    writes `out_png` when given. Shows at most `max_rows` rows (WAN links first)."""
    tl = source if isinstance(source, Timeline) else build_timeline(source, iteration, node)
    order = _row_order(tl.rows)[:max_rows]
    fig = new_figure(9.0, max(2.5, 0.22 * len(order) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    scale, unit = (1e3, "ms") if tl.t1 - tl.t0 < 2.0 else (1.0, "s")
    seen: dict[str, str] = {}
    for y, label in enumerate(reversed(order)):
        by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
        tick = (tl.t1 - tl.t0) * scale * 0.003  # instants (sends) stay visible
        for start, end, kind in tl.rows[label]:
            by_kind[kind].append(((start - tl.t0) * scale, max((end - start) * scale, tick)))
        for kind, bars in sorted(by_kind.items()):
            colour = COMPUTE_COLOUR if kind == "compute" else MSG_COLOURS.get(kind, OTHER_COLOUR)
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=colour, edgecolors="black",
                           linewidth=0.2, alpha=0.85)
            seen.setdefault(kind if kind == "compute" or kind in MSG_COLOURS else "other",
                            colour)
    ax.set_yticks(range(len(order)), list(reversed(order)), fontsize=7)
    ax.set_ylim(-0.6, len(order) - 0.4)
    ax.set_xlim(0, (tl.t1 - tl.t0) * scale)
    ax.set_xlabel(f"time since the start of iteration {tl.iteration} of {tl.node} ({unit}; "
                  f"t0 = {tl.t0:.4g} s)")
    ax.grid(True, axis="x", alpha=0.3)
    if seen:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=c, label=k) for k, c in seen.items()],
                  loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=7, frameon=False,
                  ncols=min(len(seen), 6))
    fig.suptitle(title or "one iteration: who sends what when (WAN links first)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_png)
