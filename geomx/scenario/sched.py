"""``[sched]``: transfer scheduling and placement (the policies of :mod:`geomx.sched`)."""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import Integer, Section, setting


@dataclass(frozen=True)
class SchedConfig(Section):
    """In which order and over which path transfers leave.

    (P3, TSEngine, DGT and NETSTORM will add their settings here when they are built; until
    then a scenario that names them is refused as an unknown key.)"""

    bigarray_bound: int = setting(Integer(min=1, counts=True), 1000000,
                                  "Tensors with more elements are split across the global servers.")

