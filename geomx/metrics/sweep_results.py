"""A sweep's results: `sweep.csv` (one row per run) and its default plots.

`geomx sweep` (geomx/sweep.py) runs the points; this module owns the file format, so
that analysis code (`geomx.metrics.compare`, notebooks) reads sweeps without importing
the runner. `sweep.csv` columns, in order:

    index, run, status, <swept key>..., seed, <every scalar of summary.json>...

`run` is the run folder relative to the sweep folder, `status` is `done` or `failed`
(then `error` says why), the swept keys are the `--grid` paths with the values as
typed, and summary scalars include `extra.<name>` for the scalars a runtime adds under
`extra`. The columns between `status` and `seed` are the swept keys, so the file
describes itself.

Default plots: for each swept key, one figure with a panel per metric against that
key's values, one line per combination of the other swept keys, the mean over seeds
with the standard deviation as error bars.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from geomx.metrics.table import Table

SWEEP_CSV = "sweep.csv"
SWEEP_MANIFEST = "sweep.json"
LEAD_COLUMNS = ("index", "run", "status")

#: Metrics plotted against each swept key by default.
SWEEP_METRICS = ("final_accuracy", "time_to_target_s", "bytes_wan", "emulated_seconds",
                 "wall_seconds")
_METRIC_LABELS = {
    "final_accuracy": "final accuracy",
    "time_to_target_s": "time to target (s)",
    "bytes_wan": "WAN bytes (MB)",
    "emulated_seconds": "emulated time (s)",
    "wall_seconds": "wall time (s)",
}
_METRIC_SCALE = {"bytes_wan": 1e-6}


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def summary_scalars(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Every scalar of a summary.json dict; scalars under `extra` as `extra.<name>`."""
    out = {k: v for k, v in summary.items() if k != "extra" and _scalar(v)}
    for k, v in (summary.get("extra") or {}).items():
        if _scalar(v):
            out[f"extra.{k}"] = v
    return out


def sweep_keys(table: Table) -> list[str]:
    """The swept keys of a sweep table: the columns between `status` and `seed`."""
    names = table.keys()
    if "status" not in names or "seed" not in names:
        raise ValueError("not a sweep table: it needs the columns status and seed")
    return names[names.index("status") + 1:names.index("seed")]


def read_sweep(sweep_dir: str | os.PathLike) -> Table:
    """`sweep.csv` of a sweep folder as a `Table`."""
    path = Path(sweep_dir) / SWEEP_CSV
    if not path.exists():
        raise ValueError(f"{sweep_dir}: no {SWEEP_CSV} (not a sweep folder, or it has not "
                         f"finished a run yet)")
    return Table.read_csv(path)


def _group_label(keys: Sequence[str], values: Sequence[Any]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(keys, values)) or "all"


def _xs(values: Sequence[Any]) -> tuple[list[float], list[str] | None]:
    """Numeric x when every value is a number, else positions with tick labels."""
    if all(isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
           for v in values):
        return [float(v) for v in values], None
    return list(range(len(values))), [str(v) for v in values]


def plot_sweep(
    table: Table,
    out_dir: str | os.PathLike | None = None,
    metrics: Sequence[str] = SWEEP_METRICS,
) -> dict[str, Any]:
    """One figure per swept key (`sweep_<key>.png`): each metric against the key's
    values, a line per combination of the other keys, mean +- std over seeds.
    Returns {file name: Figure}; writes the PNGs into `out_dir` when given."""
    from geomx.metrics.figure import new_figure, save_figure

    keys = sweep_keys(table)
    done = [i for i, s in enumerate(table["status"]) if s == "done"]
    metrics = [m for m in metrics if m in table and table[m].dtype != object
               and not np.all(np.isnan(table[m][done].astype(float)))] if done else []
    figs: dict[str, Any] = {}
    if not done or not metrics:
        return figs
    rows = list(table.rows())
    for key in keys:
        others = [k for k in keys if k != key]
        order: list[Any] = []
        for i in done:
            if rows[i][key] not in order:
                order.append(rows[i][key])
        groups: list[tuple] = []
        for i in done:
            g = tuple(rows[i][k] for k in others)
            if g not in groups:
                groups.append(g)
        xs, ticks = _xs(order)
        ncols = min(len(metrics), 3)
        nrows = math.ceil(len(metrics) / ncols)
        fig = new_figure(4.0 * ncols, 3.0 * nrows + 0.6)
        for m_i, metric in enumerate(metrics):
            ax = fig.add_subplot(nrows, ncols, m_i + 1)
            scale = _METRIC_SCALE.get(metric, 1.0)
            for g_i, g in enumerate(groups):
                means, stds, gx = [], [], []
                for x, v in zip(xs, order):
                    vals = [rows[i][metric] for i in done
                            if rows[i][key] == v and tuple(rows[i][k] for k in others) == g]
                    vals = [float(a) * scale for a in vals if a is not None]
                    if vals:
                        gx.append(x + (g_i - (len(groups) - 1) / 2) * 0.04 * (ticks is not None))
                        means.append(float(np.mean(vals)))
                        stds.append(float(np.std(vals)))
                if gx:
                    ax.errorbar(gx, means, yerr=stds, marker="o", markersize=3, capsize=3,
                                linewidth=1, linestyle="-" if ticks is None else ":",
                                label=_group_label(others, g))
            ax.set_xlabel(key)
            ax.set_ylabel(_METRIC_LABELS.get(metric, metric))
            if ticks is not None:
                ax.set_xticks(xs, ticks, fontsize=8)
            ax.grid(True, alpha=0.3)
            if m_i == 0 and len(groups) > 1:
                ax.legend(fontsize=6)
        seeds = len({rows[i]["seed"] for i in done})
        fig.suptitle(f"sweep over {key} (mean +- std over {seeds} seed{'s' * (seeds != 1)})",
                     fontsize=10)
        fig.tight_layout()
        name = "sweep_" + "".join(c if c.isalnum() or c in "-_." else "_" for c in key) + ".png"
        figs[name] = fig
    if out_dir is not None:
        for name, f in figs.items():
            save_figure(f, Path(out_dir) / name)
    return figs
