"""``[metrics]``: what a run records in its directory."""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import Flag, Section, setting


@dataclass(frozen=True)
class MetricsConfig(Section):
    """What a run records in its directory."""

    events: bool = setting(Flag(), True, "Write events.jsonl.")
    trace: bool = setting(Flag(), True, "Write trace.json (Chrome trace event format).")
    plot: bool = setting(Flag(), True, "Write accuracy plots (PNG).")

