"""Plots of a run: accuracy over time, cumulative bytes over time, link utilisation,
and an overlay of several runs.

Figures are built on matplotlib's object API with an Agg canvas attached directly
(`Figure` + `FigureCanvasAgg`) instead of `pyplot`: no display is needed, and the
global backend of a notebook or a test session is left alone. Every function returns
the `Figure` (a notebook shows it) and writes a PNG when `out_png` is given.

Data sources are `progress.csv` files, lists of `ProgressRow`, or run folders.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Union

from matplotlib.figure import Figure

from geomx.metrics.figure import is_wan_link, new_figure, save_figure
from geomx.metrics.progress import ProgressRow, read_progress
from geomx.metrics.summary import PROGRESS_FILE, Run, load_run

ProgressSource = Union[str, os.PathLike, Sequence[ProgressRow]]

TIME_AXES = {"t": "time (s, runtime clock)", "wall_s": "wall time (s)", "iteration": "iteration"}

_BYTE_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))


def _rows(source: ProgressSource) -> list[ProgressRow]:
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        return read_progress(p / PROGRESS_FILE if p.is_dir() else p)
    return list(source)


def _check_axis(time_axis: str) -> None:
    if time_axis not in TIME_AXES:
        raise ValueError(f"time_axis={time_axis!r}; allowed: {', '.join(TIME_AXES)}")


def series(
    rows: Sequence[ProgressRow], x: str, y: str
) -> tuple[list[float], list[float]]:
    """Points where both x and y are present and finite."""
    xs: list[float] = []
    ys: list[float] = []
    for r in rows:
        xv, yv = getattr(r, x), getattr(r, y)
        if xv is None or yv is None:
            continue
        xv, yv = float(xv), float(yv)
        if math.isfinite(xv) and math.isfinite(yv):
            xs.append(xv)
            ys.append(yv)
    return xs, ys


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit name) that keeps `max_bytes` readable."""
    for div, name in _BYTE_UNITS:
        if max_bytes >= div:
            return div, name
    return 1.0, "B"


def plot_accuracy(
    progress_csv: ProgressSource,
    out_png: str | os.PathLike | None = None,
    time_axis: str = "t",
    title: str | None = None,
) -> Figure:
    """Accuracy (left axis) and loss (right axis) against `time_axis`
    ("t", "wall_s" or "iteration")."""
    _check_axis(time_axis)
    rows = _rows(progress_csv)
    fig = new_figure()
    ax = fig.add_subplot(1, 1, 1)
    xs, acc = series(rows, time_axis, "accuracy")
    ax.plot(xs, acc, color="tab:blue", marker=".", label="accuracy")
    ax.set_xlabel(TIME_AXES[time_axis])
    ax.set_ylabel("accuracy", color="tab:blue")
    ax.grid(True, alpha=0.3)
    lx, loss = series(rows, time_axis, "loss")
    if loss:
        ax2 = ax.twinx()
        ax2.plot(lx, loss, color="tab:red", linestyle="--", label="loss")
        ax2.set_ylabel("loss", color="tab:red")
    ax.set_title(title or "accuracy and loss")
    fig.tight_layout()
    return save_figure(fig, out_png)


def plot_bytes(
    progress_csv: ProgressSource,
    out_png: str | os.PathLike | None = None,
    time_axis: str = "t",
    title: str | None = None,
) -> Figure:
    """Cumulative bytes sent on LAN and WAN against `time_axis`."""
    _check_axis(time_axis)
    rows = _rows(progress_csv)
    xl, lan = series(rows, time_axis, "bytes_lan")
    xw, wan = series(rows, time_axis, "bytes_wan")
    div, unit = byte_unit(max(lan + wan + [0.0]))
    fig = new_figure()
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(xl, [b / div for b in lan], label="LAN", color="tab:green")
    ax.plot(xw, [b / div for b in wan], label="WAN", color="tab:orange")
    ax.set_xlabel(TIME_AXES[time_axis])
    ax.set_ylabel(f"cumulative bytes sent ({unit})")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title(title or "bytes on LAN and WAN")
    fig.tight_layout()
    return save_figure(fig, out_png)


def _utilisation_panel(ax, links: Sequence[str], mbps: Sequence[float],
                       capacities_bps: Mapping[str, float], duration_s: float,
                       bytes_per_link: Mapping[str, int], color: str, label: str) -> None:
    ax.barh(links, mbps, color=color)
    top = max(mbps + [0.0]) or 1.0
    for y, (link, rate) in enumerate(zip(links, mbps)):
        cap = capacities_bps.get(link)
        text = f"{rate:.3g} Mbit/s"
        if cap:
            text += f" ({100.0 * bytes_per_link[link] * 8 / duration_s / float(cap):.3g}%)"
        ax.text(rate + top * 0.01, y, text, va="center", fontsize=7)
    ax.set_xlim(0, top * 1.35)  # room for the labels
    ax.set_xlabel("mean throughput (Mbit/s)")
    ax.set_title(label, loc="left", fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="x", alpha=0.3)


def plot_link_utilisation(
    bytes_per_link: Mapping[str, int],
    duration_s: float,
    capacities_bps: Mapping[str, float] | None = None,
    out_png: str | os.PathLike | None = None,
    top: int = 30,
    title: str | None = None,
) -> Figure:
    """Mean throughput of each link over `duration_s`, WAN links first.

    WAN and LAN links get separate panels, each on its own scale: on one axis the
    10 Gbit/s LAN links flatten the 100 Mbit/s WAN bars (the links the study is about)
    to nothing. Each bar is labelled with its rate and, when the capacity is known,
    its mean utilisation in percent. At most `top` links per panel (the busiest).
    """
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    capacities_bps = capacities_bps or {}
    groups = []
    for label, wan, color in (("WAN links", True, "tab:orange"), ("LAN links", False, "tab:green")):
        links = [k for k in bytes_per_link if is_wan_link(k) == wan]
        links = sorted(links, key=lambda k: (-bytes_per_link[k], k))[:top]
        if links:
            links.reverse()  # busiest at the top of a horizontal bar chart
            groups.append((label, links, color))
    if not groups:
        groups.append(("links", [], "tab:purple"))
    heights = [max(1.0, 0.28 * len(links) + 0.6) for _, links, _ in groups]
    fig = new_figure(8.0, sum(heights) + 0.8)
    spec = fig.add_gridspec(len(groups), 1, height_ratios=heights)
    for i, (label, links, color) in enumerate(groups):
        ax = fig.add_subplot(spec[i, 0])
        mbps = [bytes_per_link[k] * 8 / duration_s / 1e6 for k in links]
        _utilisation_panel(ax, links, mbps, capacities_bps, duration_s, bytes_per_link,
                           color, f"{label} ({len(links)})")
    fig.suptitle(title or f"link utilisation over {duration_s:.4g} s")
    fig.tight_layout()
    return save_figure(fig, out_png)


def compare_runs(
    run_dirs: Sequence[str | os.PathLike | Run],
    out_png: str | os.PathLike | None = None,
    time_axis: str = "t",
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Accuracy against `time_axis` for several runs on one plot."""
    _check_axis(time_axis)
    runs = [r if isinstance(r, Run) else load_run(r) for r in run_dirs]
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"labels has {len(labels)} entries for {len(runs)} runs")
    fig = new_figure()
    ax = fig.add_subplot(1, 1, 1)
    for i, run in enumerate(runs):
        xs, acc = series(run.progress, time_axis, "accuracy")
        ax.plot(xs, acc, marker=".", label=labels[i] if labels else run.name)
    ax.set_xlabel(TIME_AXES[time_axis])
    ax.set_ylabel("accuracy")
    ax.grid(True, alpha=0.3)
    if runs:
        ax.legend(loc="lower right")
    ax.set_title(title or "accuracy over time")
    fig.tight_layout()
    return save_figure(fig, out_png)


def write_run_plots(
    run_dir: str | os.PathLike,
    capacities_bps: Mapping[str, float] | None = None,
) -> list[Path]:
    """Write the standard plots of a run folder (accuracy.png, bytes.png; when the
    summary has per-link bytes and a duration, link_utilisation.png; when events.jsonl
    has compute spans, timeline.png of one iteration); returns the paths."""
    run = load_run(run_dir)
    written: list[Path] = []
    if run.progress:
        for name, fn in (("accuracy.png", plot_accuracy), ("bytes.png", plot_bytes)):
            fn(run.progress, run.path / name)
            written.append(run.path / name)
    s = run.summary
    if s is not None and s.bytes_per_link:
        duration = s.emulated_seconds if s.emulated_seconds else s.wall_seconds
        if duration:
            out = run.path / "link_utilisation.png"
            plot_link_utilisation(s.bytes_per_link, duration, capacities_bps, out)
            written.append(out)
    if run.events_path.exists():
        from geomx.metrics.timeline import build_timeline, plot_timeline

        try:
            timeline = build_timeline(run.events_path)
        except ValueError:  # no compute spans recorded: nothing to draw
            timeline = None
        if timeline is not None:
            plot_timeline(timeline, run.path / "timeline.png")
            written.append(run.path / "timeline.png")
    return written
