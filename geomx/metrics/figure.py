"""Figure helpers shared by every plot of a run (plots, timeline, compare, sweep).

Figures are built on matplotlib's object API with an Agg canvas, never through
``pyplot``: no global state, no GUI backend, safe in worker threads and notebooks.
"""

from __future__ import annotations

import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["new_figure", "save_figure", "is_wan_link"]


def new_figure(width_in: float = 7.0, height_in: float = 4.0) -> Figure:
    """An empty figure with its own Agg canvas."""
    fig = Figure(figsize=(width_in, height_in))
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, out_png: str | os.PathLike | None) -> Figure:
    """Write ``fig`` to ``out_png`` (creating its folder) unless it is None; return it."""
    if out_png is not None:
        out = os.fspath(out_png)
        parent = os.path.dirname(out)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fig.savefig(out, dpi=100)
    return fig


def is_wan_link(name: str) -> bool:
    """Whether a link name from `bytes_per_link` is a WAN link.

    Host links attach a node to its DC's switch (`host->sw:DC`, `sw:DC->host`, see
    geomx/sim/network.py); every other link joins two DCs (`a->b`). So a link is LAN
    exactly when one of its ends is a switch.
    """
    return not any(end.startswith("sw:") for end in name.split("->"))
