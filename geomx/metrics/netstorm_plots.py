"""Run-folder plots of a NETSTORM / MLNET job, from its ``events.jsonl``.

* ``topology.png``: the trees of each plan the controller published (its ``plan``
  events: per-root parents and shares), drawn over the mesh with networkx and matplotlib.
  Node labels give each root's share of the parameters; edge labels the share of the
  parameters whose trees use that link (what crosses it, up and down, every iteration).
* ``link_estimates.png``: per link direction, the receivers' passive estimates
  (``link_estimate`` events) against the true rate over time (the scenario's constant
  rate or trace, handed in by the caller: this module reads run folders only).

Plan switches are also instant events in ``trace.json`` (``plan``, ``plan_switch``,
``plan_commit``), i.e. Perfetto markers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["write_netstorm_plots", "plot_plans", "plot_link_estimates"]

TrueRate = Callable[[str, str, float], float]


def _events(path: Path, kinds: set[str]) -> list[dict[str, Any]]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if any(f'"ev":"{k}"' in line or f'"ev": "{k}"' in line for k in kinds):
                ev = json.loads(line)
                if ev.get("ev") in kinds:
                    out.append(ev)
    return out


def plot_plans(plans: Sequence[dict[str, Any]], links: Sequence[tuple[str, str]],
               out: Path, max_plans: int = 6) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    if len(plans) > max_plans:  # the first, the last and evenly spaced ones between
        idx = sorted({round(i * (len(plans) - 1) / (max_plans - 1)) for i in range(max_plans)})
        plans = [plans[i] for i in idx]
    g = nx.Graph()
    g.add_edges_from(links)
    pos = nx.spring_layout(g, seed=7)
    cols = min(3, len(plans))
    rows = math.ceil(len(plans) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.8 * rows), squeeze=False)
    for ax in axes.flat[len(plans):]:
        ax.axis("off")
    for ax, ev in zip(axes.flat, plans):
        shares: dict[str, float] = ev.get("shares") or {}
        crossing: dict[frozenset, float] = {}
        for root, parent in (ev.get("parent") or {}).items():
            for child, par in parent.items():
                e = frozenset((child, par))
                crossing[e] = crossing.get(e, 0.0) + shares.get(root, 0.0)
        widths = [0.5 + 6 * crossing.get(frozenset(e), 0.0) for e in g.edges]
        colours = ["tab:blue" if frozenset(e) in crossing else "lightgrey" for e in g.edges]
        nx.draw_networkx_edges(g, pos, ax=ax, width=widths, edge_color=colours)
        nx.draw_networkx_nodes(g, pos, ax=ax, node_color=[
            "tab:orange" if shares.get(n, 0) > 0 else "white" for n in g.nodes],
            edgecolors="black", node_size=700)
        nx.draw_networkx_labels(g, pos, ax=ax, font_size=8, labels={
            n: f"{n}\n{shares[n]:.0%}" if n in shares else n for n in g.nodes})
        nx.draw_networkx_edge_labels(g, pos, ax=ax, font_size=7, edge_labels={
            tuple(e): f"{s:.0%}" for e, s in crossing.items() if len(e) == 2})
        ax.set_title(f"plan {ev.get('plan')} ({ev.get('kind', '')}) from iteration "
                     f"{ev.get('iteration')}, t = {ev.get('t', 0):.1f} s", fontsize=9)
        ax.axis("off")
    fig.suptitle("trees per plan: node = root share, edge = share of parameters crossing it")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot_link_estimates(estimates: Sequence[dict[str, Any]], true_bps: TrueRate | None,
                        end_s: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_link: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for ev in estimates:
        a, b = ev["link"]
        by_link.setdefault((a, b), []).append((float(ev["t"]), float(ev["bps"])))
    links = sorted(by_link)
    cols = min(5, len(links))
    rows = math.ceil(len(links) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False,
                             sharex=True)
    for ax in axes.flat[len(links):]:
        ax.axis("off")
    for ax, link in zip(axes.flat, links):
        pts = by_link[link]
        ax.plot([t for t, _ in pts], [b / 1e6 for _, b in pts], ".", color="tab:orange",
                label="estimate")
        if true_bps is not None:
            ts = [end_s * i / 400 for i in range(401)]
            ax.step(ts, [true_bps(link[0], link[1], t) / 1e6 for t in ts], where="post",
                    color="black", lw=1, label="true")
        ax.set_title(f"{link[0]} -> {link[1]}", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("time (s)")
    fig.supylabel("Mbit/s")
    fig.suptitle("passive link estimates vs true rate")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def write_netstorm_plots(run_dir: str | Path, links: Sequence[tuple[str, str]],
                         true_bps: TrueRate | None = None) -> list[Path]:
    """Write ``topology.png`` and ``link_estimates.png`` when the run's events have plans
    and estimates; returns the paths written."""
    run_dir = Path(run_dir)
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    evs = _events(path, {"plan", "link_estimate"})
    written = []
    plans = [e for e in evs if e["ev"] == "plan"]
    if plans:
        plot_plans(plans, links, run_dir / "topology.png")
        written.append(run_dir / "topology.png")
    estimates = [e for e in evs if e["ev"] == "link_estimate"]
    if estimates:
        end = max(float(e["t"]) for e in evs)
        plot_link_estimates(estimates, true_bps, end, run_dir / "link_estimates.png")
        written.append(run_dir / "link_estimates.png")
    return written
