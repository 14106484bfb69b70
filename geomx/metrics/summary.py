"""`summary.json` (a run's final figures) and `load_run` (a run folder, for notebooks).

The summary has the same fields in both runtimes; the ones a runtime cannot know are
None (`emulated_seconds` over real sockets, `time_to_target_s` when the target was not
reached). Anything else a run wants to report goes into `extra`, so that the fixed
fields stay comparable across runs and versions.

`load_run` reads what a run leaves behind (see docs/architecture.md, "What a run leaves
behind"): summary.json, progress.csv and, lazily, events.jsonl.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geomx.metrics.counters import ByteCounters
from geomx.metrics.progress import PROGRESS_COLUMNS, ProgressRow, read_progress
from geomx.metrics.recorder import Event, canonical_dumps, iter_events

SUMMARY_FILE = "summary.json"
PROGRESS_FILE = "progress.csv"
EVENTS_FILE = "events.jsonl"
TRACE_FILE = "trace.json"
SCENARIO_FILE = "scenario.toml"


@dataclass
class Summary:
    """Final figures of one run. Times in seconds, sizes in bytes."""

    final_accuracy: float | None = None
    final_loss: float | None = None
    iterations: int = 0
    emulated_seconds: float | None = None
    wall_seconds: float | None = None
    bytes_wan: int = 0
    bytes_lan: int = 0
    bytes_per_link: dict[str, int] = field(default_factory=dict)
    bytes_per_dc_pair: dict[str, int] = field(default_factory=dict)
    wan_bytes_per_iteration: float | None = None
    messages: int = 0
    runtime: str = ""
    scenario_name: str = ""
    seed: int | None = None
    time_to_target_s: float | None = None
    target_accuracy: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: what produced the run: geomx's version, commit and source digest, its build, the
    #: library versions and the machine (geomx/provenance.py)
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """Build from a dict; unknown keys (from a newer writer) are kept in `extra`."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        unknown = {k: v for k, v in data.items() if k not in known}
        if unknown:
            kwargs["extra"] = {**unknown, **dict(kwargs.get("extra") or {})}
        return cls(**kwargs)


SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(Summary))


def time_to_target(rows: Sequence[ProgressRow], target_accuracy: float) -> float | None:
    """Runtime-clock time `t` of the first evaluation with accuracy >= target."""
    for row in rows:
        if row.accuracy is not None and row.accuracy >= target_accuracy:
            return row.t
    return None


def build_summary(
    counters: ByteCounters,
    rows: Sequence[ProgressRow],
    *,
    runtime: str,
    scenario_name: str = "",
    seed: int | None = None,
    iterations: int | None = None,
    emulated_seconds: float | None = None,
    wall_seconds: float | None = None,
    target_accuracy: float | None = None,
    extra: dict[str, Any] | None = None,
) -> Summary:
    """Summary from the byte counters and the progress rows of a finished run.

    `iterations` defaults to the last evaluated iteration; the final accuracy and loss
    are those of the last evaluation that has them.
    """
    if iterations is None:
        iterations = rows[-1].iteration if rows else 0
    final_acc = next((r.accuracy for r in reversed(rows) if r.accuracy is not None), None)
    final_loss = next((r.loss for r in reversed(rows) if r.loss is not None), None)
    return Summary(
        final_accuracy=final_acc,
        final_loss=final_loss,
        iterations=iterations,
        emulated_seconds=emulated_seconds,
        wall_seconds=wall_seconds,
        bytes_wan=counters.bytes_wan,
        bytes_lan=counters.bytes_lan,
        bytes_per_link=dict(counters.bytes_per_link),
        bytes_per_dc_pair=dict(counters.bytes_per_dc_pair),
        wan_bytes_per_iteration=(counters.bytes_wan / iterations) if iterations else None,
        messages=counters.messages,
        runtime=runtime,
        scenario_name=scenario_name,
        seed=seed,
        time_to_target_s=(
            time_to_target(rows, target_accuracy) if target_accuracy is not None else None
        ),
        target_accuracy=target_accuracy,
        extra=dict(extra or {}),
    )


def write_summary(
    path: str | os.PathLike[str], summary: Summary | None = None, **fields: Any
) -> Summary:
    """Write `summary.json` (canonical, indented JSON) and return the Summary written.

    Pass a `Summary`, or its fields as keywords (fields given with a Summary override
    it). An unknown keyword is an error: put free-form figures in `extra`.
    """
    unknown = set(fields) - set(SUMMARY_FIELDS)
    if unknown:
        raise TypeError(
            f"write_summary: unknown field(s) {sorted(unknown)}; allowed: "
            f"{', '.join(SUMMARY_FIELDS)} (put other figures in extra={{...}})"
        )
    if summary is None:
        summary = Summary(**fields)
    elif fields:
        summary = dataclasses.replace(summary, **fields)
    out = os.fspath(path)
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(out, "w", encoding="ascii", newline="\n") as f:
        f.write(canonical_dumps(summary.to_dict(), indent=2))
        f.write("\n")
    return summary


def read_summary(path: str | os.PathLike[str]) -> Summary:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{os.fspath(path)}: expected a JSON object")
    return Summary.from_dict(data)


@dataclass
class Run:
    """A run folder loaded for analysis. Missing files give None / empty values."""

    path: Path
    summary: Summary | None
    progress: list[ProgressRow]

    @property
    def name(self) -> str:
        """The scenario name if the summary has one, else the folder name."""
        if self.summary is not None and self.summary.scenario_name:
            return self.summary.scenario_name
        return self.path.name

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS_FILE

    @property
    def trace_path(self) -> Path:
        return self.path / TRACE_FILE

    def events(self) -> Iterator[Event]:
        """Stream events.jsonl (empty if the run recorded none)."""
        if not self.events_path.exists():
            return iter(())
        return iter_events(self.events_path)

    def scenario_toml(self) -> str | None:
        p = self.path / SCENARIO_FILE
        return p.read_text(encoding="utf-8") if p.exists() else None

    def column(self, name: str) -> list[Any]:
        """One progress.csv column as a list (None where a cell was empty)."""
        if name not in PROGRESS_COLUMNS:
            raise KeyError(f"no progress column {name!r}; columns: {', '.join(PROGRESS_COLUMNS)}")
        return [getattr(r, name) for r in self.progress]

    def columns(self) -> dict[str, Any]:
        """progress.csv as numpy arrays (float, NaN for empty cells) per column."""
        import numpy as np

        return {
            name: np.array(
                [float("nan") if v is None else v for v in self.column(name)], dtype=float
            )
            for name in PROGRESS_COLUMNS
        }


def load_run(run_dir: str | os.PathLike[str]) -> Run:
    """Load a run folder (summary.json, progress.csv; events are read on demand)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run folder {os.fspath(path)!r} does not exist")
    summary_path = path / SUMMARY_FILE
    progress_path = path / PROGRESS_FILE
    return Run(
        path=path,
        summary=read_summary(summary_path) if summary_path.exists() else None,
        progress=read_progress(progress_path) if progress_path.exists() else [],
    )
