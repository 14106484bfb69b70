"""A finished run's events, read the way analysis code reads them (geomx.metrics)."""

from __future__ import annotations

import os
from typing import Any

from geomx.metrics import load_run


def run_events(run_dir: str | os.PathLike[str], kind: str | None = None) -> list[dict[str, Any]]:
    """The events of ``run_dir/events.jsonl`` in file order, only those whose ``ev`` is
    ``kind`` when one is given; empty when the run recorded no events file."""
    events = load_run(run_dir).events()
    if kind is None:
        return list(events)
    return [e for e in events if e.get("ev") == kind]
