"""``[checkpoint]``: periodic, consistent snapshots of a job's state, and resuming from one.

What is saved and when is :mod:`geomx.node.checkpoint`'s; this section only says how
often (``every``: global rounds, or a duration), how many complete checkpoints to keep,
and which checkpoint a run starts from (``resume_from``, written by ``--resume``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from geomx import units
from geomx.scenario.errors import show_value
from geomx.scenario.kinds import Integer, Kind, Section, Text, setting


@dataclass(frozen=True)
class Every:
    """A checkpoint period: every ``rounds`` global rounds, or the first round boundary
    ``seconds`` after the previous checkpoint (0 and 0 = off)."""

    rounds: int = 0
    seconds: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.rounds > 0 or self.seconds > 0


#: Most rounds between checkpoints (a sanity bound: more is as good as "off").
MAX_ROUNDS = 10**9
#: Longest period, one year.
MAX_SECONDS = 365 * 86400.0


class RoundsOrDuration(Kind):
    """An integer number of rounds (``10``) or a duration string (``"30s"``, ``"5min"``)."""

    type_name = "rounds or duration"

    def allowed(self) -> str:
        return (f"an integer number of global rounds in [0, {MAX_ROUNDS}] (0 = off) or a "
                f"duration like '30s', '5min' in (0s, {units.format_seconds(MAX_SECONDS)}]")

    def doc_allowed(self) -> str:
        return f"rounds in [0, {MAX_ROUNDS}] (0 = off), or a duration > 0s"

    def parse(self, value: Any, path: str) -> Every:
        if isinstance(value, Every):
            return value
        if isinstance(value, bool):
            raise self.wrong_type(path, value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int):
            if not 0 <= value <= MAX_ROUNDS:
                raise self.fail(path, value, f"{show_value(value)} is out of range")
            return Every(rounds=value)
        if isinstance(value, str):
            text = value.strip()
            if text.isdigit():
                return self.parse(int(text), path)
            try:
                seconds = units.parse_seconds(text)
            except ValueError as exc:
                raise self.fail(path, value, str(exc).split("; use e.g.")[0]) from None
            if not math.isfinite(seconds):
                raise self.fail(path, value, f"{show_value(value)} is not a finite number")
            if not 0 < seconds <= MAX_SECONDS:
                raise self.fail(path, value, f"{show_value(value)} is out of range")
            return Every(seconds=seconds)
        raise self.wrong_type(path, value)

    def emit(self, value: Every) -> Any:
        return units.format_seconds(value.seconds) if value.seconds > 0 else value.rounds


@dataclass(frozen=True)
class CheckpointConfig(Section):
    """Snapshots of every server's and worker's state, taken at a global round every node
    agrees on, into `<run folder>/checkpoints/<round>/`; `geomx run --resume RUN_DIR`
    continues a job from the latest complete one (docs/reliability.md)."""

    every: Every = setting(RoundsOrDuration(), 0,
                           "How often: a number of global rounds (FSA: iterations; HFA: "
                           "global syncs, every k1 x k2 iterations), or a duration (the "
                           "first global round that ends that long after the previous "
                           "checkpoint). 0 = no checkpoints.")
    keep: int = setting(Integer(min=1, max=1000), 2,
                        "How many complete checkpoints to keep (older ones are deleted).")
    resume_from: str = setting(Text(), "",
                               "The checkpoint folder this run starts from "
                               "(`<run>/checkpoints/<round>`); set by `--resume`. \"\" = "
                               "start from scratch.")

    @property
    def enabled(self) -> bool:
        return self.every.enabled
