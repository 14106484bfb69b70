"""Compare runs: a table of their headline figures, ratios to the first, overlaid plots.

`compare(["runs/a", "runs/b"])` (or a sweep folder) answers "which one wins": final
accuracy, time to the target accuracy, WAN bytes, emulated and wall time, and each
cost as a ratio to the first run (the baseline the user names first). It returns a
pandas DataFrame when pandas is installed and a `Table` (columns of numpy arrays)
otherwise; `compare_table` always returns the `Table`. `plot_comparison` overlays
accuracy against runtime-clock time and against cumulative WAN bytes, and draws the
bytes each run put on each WAN link. `geomx compare` is the command-line face of both.

Inputs are run folders (`summary.json`, `progress.csv`; see docs/architecture.md) or
one sweep folder (`sweep.csv`, written by `geomx sweep`), whose runs are compared with
their swept values as columns. Run folders of both runtimes compare alike; a field a
runtime cannot know (emulated time over real sockets) is NaN.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from geomx.metrics.summary import SUMMARY_FILE, Run, load_run, time_to_target
from geomx.metrics.sweep_results import SWEEP_CSV, read_sweep, sweep_keys
from geomx.metrics.table import Table

#: Figures compared, in table order.
FIGURES = ("final_accuracy", "time_to_target_s", "bytes_wan", "emulated_seconds",
           "wall_seconds", "iterations")
#: Costs shown as a ratio to the first run (`<figure>_vs_first`).
RATIO_FIGURES = ("time_to_target_s", "bytes_wan", "emulated_seconds", "wall_seconds")

_TEXT_HEADERS = {
    "final_accuracy": "accuracy",
    "time_to_target_s": "to target s",
    "bytes_wan": "WAN MB",
    "emulated_seconds": "emulated s",
    "wall_seconds": "wall s",
    "iterations": "iters",
    "time_to_target_s_vs_first": "target x1st",
    "bytes_wan_vs_first": "WAN x1st",
    "emulated_seconds_vs_first": "emu x1st",
    "wall_seconds_vs_first": "wall x1st",
}


def _is_sweep(path: Path) -> bool:
    return path.is_dir() and (path / SWEEP_CSV).exists() and not (path / SUMMARY_FILE).exists()


def _short_key(key: str) -> str:
    """`wan.0.bandwidth` -> `bandwidth` for labels (the full key stays the column name)."""
    return key.rsplit(".", 1)[-1]


def collect_runs(
    sources: Sequence[str | os.PathLike | Run],
) -> tuple[list[Run], list[str], dict[str, list[Any]]]:
    """(runs, labels, extra columns) from run folders or one sweep folder.

    A sweep contributes its swept keys and the seed as extra columns; its runs are
    labelled by them. Run folders are labelled by scenario name (made unique with
    the folder name when two share one). Raises ValueError naming a bad source.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not sources:
        raise ValueError("nothing to compare: give run folders or a sweep folder")
    extra: dict[str, list[Any]] = {}
    if len(sources) == 1 and not isinstance(sources[0], Run) and _is_sweep(Path(sources[0])):
        sweep_dir = Path(sources[0])
        table = read_sweep(sweep_dir)
        keys = sweep_keys(table)
        done = [i for i, status in enumerate(table["status"]) if status == "done"]
        if not done:
            raise ValueError(f"{sweep_dir}: the sweep has no finished run yet")
        runs = [load_run(sweep_dir / str(table["run"][i])) for i in done]
        for key in keys + ["seed"]:
            extra[key] = [_cell(table[key][i]) for i in done]
        labels = [" ".join(f"{_short_key(k)}={extra[k][j]}" for k in keys + ["seed"])
                  for j in range(len(done))]
        return runs, labels, extra
    runs = []
    for src in sources:
        if isinstance(src, Run):
            runs.append(src)
            continue
        path = Path(src)
        if _is_sweep(path):
            raise ValueError(f"{path} is a sweep folder: compare it on its own, or give run folders")
        if not (path / SUMMARY_FILE).exists():
            raise ValueError(f"{path}: not a run folder (no {SUMMARY_FILE})")
        runs.append(load_run(path))
    labels = [r.name for r in runs]
    if len(set(labels)) != len(labels):
        labels = [f"{r.name} ({r.path.name})" for r in runs]
    return runs, labels, extra


def _cell(v: Any) -> Any:
    if isinstance(v, (float, np.floating)) and math.isnan(float(v)):
        return None
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return int(v)
    return v


def _figure(run: Run, name: str, target_accuracy: float | None) -> float | None:
    s = run.summary
    if name == "time_to_target_s" and target_accuracy is not None:
        return time_to_target(run.progress, target_accuracy)
    value = getattr(s, name, None) if s is not None else None
    return None if value is None else float(value)


def compare_table(
    sources: Sequence[str | os.PathLike | Run] | str | os.PathLike,
    labels: Sequence[str] | None = None,
    target_accuracy: float | None = None,
) -> Table:
    """The comparison as a `Table` (see the module docstring).

    `target_accuracy` recomputes the time to target from each run's progress.csv
    (default: each run's own summary, i.e. its scenario's `run.target_accuracy`).
    """
    runs, default_labels, extra = collect_runs(sources)
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"labels has {len(labels)} entries for {len(runs)} runs")
    table = Table({"run": list(labels or default_labels)})
    for key, values in extra.items():
        table[key] = values
    for name in FIGURES:
        table[name] = np.array([np.nan if (v := _figure(r, name, target_accuracy)) is None else v
                                for r in runs], dtype=np.float64)
    for name in RATIO_FIGURES:
        col = table[name]
        base = col[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            table[f"{name}_vs_first"] = (col / base if base and not math.isnan(base)
                                         else np.full(len(col), np.nan))
    table["path"] = [str(r.path) for r in runs]
    return table


def compare(
    sources: Sequence[str | os.PathLike | Run] | str | os.PathLike,
    labels: Sequence[str] | None = None,
    target_accuracy: float | None = None,
    as_frame: bool | None = None,
):
    """`compare_table` as a pandas DataFrame when pandas is installed (or `as_frame`
    is True), else as a `Table` of numpy columns."""
    table = compare_table(sources, labels, target_accuracy)
    if as_frame is None:
        try:
            import pandas  # noqa: F401
        except ImportError:
            as_frame = False
        else:
            as_frame = True
    return table.to_pandas() if as_frame else table


def format_comparison(table: Table) -> str:
    """The terminal view: figures in readable units, ratios to the first run."""
    shown = Table({k: v for k, v in table.columns.items() if k != "path"})
    shown["bytes_wan"] = shown["bytes_wan"] / 1e6
    formats = {"final_accuracy": ".4f", "time_to_target_s": ".3f", "bytes_wan": ".3f",
               "emulated_seconds": ".3f", "wall_seconds": ".2f", "iterations": ".0f"}
    formats.update({f"{n}_vs_first": ".3f" for n in RATIO_FIGURES})
    return shown.to_text(formats, _TEXT_HEADERS)


def plot_comparison(
    sources: Sequence[str | os.PathLike | Run] | str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    labels: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Overlaid plots: accuracy vs runtime-clock time, accuracy vs cumulative WAN bytes,
    bytes per WAN link per run. Returns {file name: Figure}; writes the PNGs into
    `out_dir` when given (compare_accuracy_time.png, compare_accuracy_wan.png,
    compare_wan_links.png)."""
    from geomx.metrics.figure import is_wan_link, new_figure, save_figure
    from geomx.metrics.plots import byte_unit, series

    runs, default_labels, _ = collect_runs(sources)
    labels = list(labels or default_labels)
    figs: dict[str, Any] = {}
    many = len(runs) > 8
    colours = [f"C{i % 10}" if not many else None for i in range(len(runs))]

    fig = new_figure(8.0, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    for run, label, c in zip(runs, labels, colours):
        xs, ys = series(run.progress, "t", "accuracy")
        ax.plot(xs, ys, marker="." if not many else None, label=label, color=c, linewidth=1)
    ax.set_xlabel("time (s, runtime clock: emulated in the emulator, wall over sockets)")
    ax.set_ylabel("test accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6 if many else 8, loc="lower right", ncols=2 if many else 1)
    ax.set_title("accuracy over time")
    fig.tight_layout()
    figs["compare_accuracy_time.png"] = fig

    fig = new_figure(8.0, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    top = max((r.progress[-1].bytes_wan or 0) for r in runs if r.progress) if any(
        r.progress for r in runs) else 0
    div, unit = byte_unit(float(top))
    for run, label, c in zip(runs, labels, colours):
        xs, ys = series(run.progress, "bytes_wan", "accuracy")
        ax.plot([x / div for x in xs], ys, marker="." if not many else None, label=label,
                color=c, linewidth=1)
    ax.set_xlabel(f"cumulative WAN bytes sent ({unit})")
    ax.set_ylabel("test accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6 if many else 8, loc="lower right", ncols=2 if many else 1)
    ax.set_title("accuracy per WAN byte")
    fig.tight_layout()
    figs["compare_accuracy_wan.png"] = fig

    links = sorted({k for r in runs if r.summary for k in r.summary.bytes_per_link
                    if is_wan_link(k)})
    fig = new_figure(8.0, max(2.5, 0.25 * len(links) * min(len(runs), 6) + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    values = [[(r.summary.bytes_per_link.get(k, 0) if r.summary else 0) for k in links]
              for r in runs]
    div, unit = byte_unit(float(max([max(v, default=0) for v in values], default=0)))
    height = 0.8 / max(len(runs), 1)
    for i, (vals, label, c) in enumerate(zip(values, labels, colours)):
        ys = [j + (i - (len(runs) - 1) / 2) * height for j in range(len(links))]
        ax.barh(ys, [v / div for v in vals], height=height, label=label, color=c)
    ax.set_yticks(range(len(links)), links, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"bytes sent over the run ({unit})")
    ax.grid(True, axis="x", alpha=0.3)
    if runs and links:
        ax.legend(fontsize=6 if many else 8, loc="lower right", ncols=2 if many else 1)
    ax.set_title("bytes per WAN link")
    fig.tight_layout()
    figs["compare_wan_links.png"] = fig

    if out_dir is not None:
        for name, f in figs.items():
            save_figure(f, Path(out_dir) / name)
    return figs
