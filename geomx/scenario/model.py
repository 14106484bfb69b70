"""The whole scenario: the :class:`Scenario` dataclass, whose fields are the section table.

Each field of :class:`Scenario` declared with :func:`_section` is one top-level TOML
section (``[key]``, or ``[[key]]`` for an array of tables); :func:`sections` reads them
in file order for the parser, the writer, ``--set`` and the docs. Adding a section is a
module with its dataclass (see ``run.py``) plus one line here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from typing import Any

from geomx.scenario.checkpoint import CheckpointConfig
from geomx.scenario.codec import CodecConfig
from geomx.scenario.expect import ExpectConfig
from geomx.scenario.host import HostConfig
from geomx.scenario.sweep import SweepConfig
from geomx.scenario.errors import quote_list
from geomx.scenario.kinds import settings_of
from geomx.scenario.membership import FaultConfig, MembershipConfig
from geomx.scenario.metrics import MetricsConfig
from geomx.scenario.netstorm import NetstormConfig
from geomx.scenario.real import RealConfig, SecurityConfig
from geomx.scenario.run import RunConfig
from geomx.scenario.sched import SchedConfig
from geomx.scenario.sync import SyncConfig
from geomx.scenario.topology import (DEFAULT_DCS, DEFAULT_WANS, DCConfig, NetworkConfig,
                                     TopologyConfig, WanConfig)
from geomx.scenario.training import TrainingConfig

__all__ = ["Scenario", "SectionSpec", "sections", "section_by_key", "table_to_dict",
           "scenario_to_dict"]


@dataclass(frozen=True)
class SectionSpec:
    """A top-level TOML section: ``[key]`` (one table) or ``[[key]]`` (``array``)."""

    key: str
    attr: str
    cls: type
    array: bool


def _section(key: str, cls: type, *, array: bool = False, default: Any = None) -> Any:
    meta = {"geomx.section": (key, cls, array)}
    if array:
        return dataclasses.field(default=default, metadata=meta)
    return dataclasses.field(default_factory=cls, metadata=meta)


@dataclass(frozen=True)
class Scenario:
    """A whole, validated scenario. Build one with :func:`load_scenario` or
    :func:`parse_scenario`; ``Scenario()`` is the default scenario."""

    run: RunConfig = _section("run", RunConfig)
    network: NetworkConfig = _section("network", NetworkConfig)
    dcs: tuple[DCConfig, ...] = _section("dc", DCConfig, array=True, default=DEFAULT_DCS)
    wans: tuple[WanConfig, ...] = _section("wan", WanConfig, array=True, default=DEFAULT_WANS)
    topology: TopologyConfig = _section("topology", TopologyConfig)
    netstorm: NetstormConfig = _section("netstorm", NetstormConfig)
    training: TrainingConfig = _section("training", TrainingConfig)
    sync: SyncConfig = _section("sync", SyncConfig)
    codec: CodecConfig = _section("codec", CodecConfig)
    sched: SchedConfig = _section("sched", SchedConfig)
    metrics: MetricsConfig = _section("metrics", MetricsConfig)
    membership: MembershipConfig = _section("membership", MembershipConfig)
    faults: tuple[FaultConfig, ...] = _section("fault", FaultConfig, array=True, default=())
    checkpoint: CheckpointConfig = _section("checkpoint", CheckpointConfig)
    real: RealConfig = _section("real", RealConfig)
    security: SecurityConfig = _section("security", SecurityConfig)
    host: HostConfig = _section("host", HostConfig)
    expect: ExpectConfig = _section("expect", ExpectConfig)
    sweep: SweepConfig = _section("sweep", SweepConfig)
    source: str = dataclasses.field(default="<defaults>", compare=False)

    def __post_init__(self) -> None:
        for spec in sections():
            if spec.array and isinstance(getattr(self, spec.attr), list):
                object.__setattr__(self, spec.attr, tuple(getattr(self, spec.attr)))

    @property
    def central_dc(self) -> DCConfig:
        """The DC that hosts the global scheduler, the global servers and the master worker
        (a mesh topology has none: its first DC hosts the controller and master worker)."""
        return next((dc for dc in self.dcs if dc.central), self.dcs[0])

    @property
    def party_dcs(self) -> tuple[DCConfig, ...]:
        """The non-central DCs, in file order."""
        return tuple(dc for dc in self.dcs if not dc.central)

    @property
    def num_all_workers(self) -> int:
        """Training workers over all DCs (GeoMX's ``DMLC_NUM_ALL_WORKER``)."""
        return sum(dc.workers for dc in self.dcs)

    def dc(self, name: str) -> DCConfig:
        for dc in self.dcs:
            if dc.name == name:
                return dc
        raise KeyError(f"no DC named {name!r}; DCs: {quote_list(d.name for d in self.dcs)}")

    def wan_between(self, a: str, b: str) -> WanConfig | None:
        """The direct link joining DCs ``a`` and ``b`` (either order), or None."""
        for wan in self.wans:
            if {wan.a, wan.b} == {a, b}:
                return wan
        return None

    def to_dict(self) -> dict[str, Any]:
        return scenario_to_dict(self)


@cache
def sections() -> tuple[SectionSpec, ...]:
    """The top-level sections of a scenario file, in file order."""
    out = []
    for f in dataclasses.fields(Scenario):
        meta = f.metadata.get("geomx.section")
        if meta:
            key, cls, array = meta
            out.append(SectionSpec(key=key, attr=f.name, cls=cls, array=array))
    return tuple(out)


def section_by_key() -> dict[str, SectionSpec]:
    return {s.key: s for s in sections()}


def table_to_dict(obj: Any) -> dict[str, Any]:
    """A section as TOML-ready data; a section class with ``omit_defaults`` (``[expect]``,
    whose defaults mean "nothing to check") leaves out the keys at their default."""
    rows = settings_of(type(obj))
    if getattr(type(obj), "omit_defaults", False):
        rows = tuple(r for r in rows
                     if getattr(obj, r.attr) != r.kind.parse(r.default, "<default>"))
    return {row.key: row.kind.emit(getattr(obj, row.attr)) for row in rows}


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """The resolved scenario as TOML-ready data: every key, units written readably."""
    out: dict[str, Any] = {}
    for spec in sections():
        value = getattr(s, spec.attr)
        out[spec.key] = [table_to_dict(v) for v in value] if spec.array else table_to_dict(value)
    return out

