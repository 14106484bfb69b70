"""Where the job runs: ``[[dc]]``, ``[[wan]]``, ``[network]`` and ``[topology]``.

``[[dc]]`` and ``[[wan]]`` describe the data centres and the links between them,
``[network]`` the transport constants every link shares, and ``[topology]`` which
planner of :mod:`geomx.topology` lays the nodes out over the DCs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from geomx import units
from geomx.scenario.errors import ScenarioError
from geomx.scenario.kinds import (AUTO, Bandwidth, Choice, Duration, Flag, Fraction, Integer,
                                  ListOf, OptionsTable, PolicyName, Real, Section, Size, Text,
                                  setting)
from geomx.scenario.netstorm import topology_options_error
from geomx.topology import KINDS as TOPOLOGY_KINDS


@dataclass(frozen=True)
class NetworkConfig(Section):
    """Transport-level constants shared by every link."""

    tcp_window_bytes: int = setting(Size(max=2**30), "4MiB",
                                    "Per-flow cap = window / RTT on reliable channels (at most "
                                    "1 GiB, TCP's largest scaled window).", key="tcp_window")
    mss_bytes: int = setting(Size(max=65535), 1460,
                             "Maximum segment size; used by the loss -> throughput model (Mathis et al.).",
                             key="mss")


@dataclass(frozen=True)
class DCConfig(Section):
    """A data centre: its nodes, its LAN, and the compute speed of its workers.

    Exactly one DC is central: it hosts the global scheduler, the global servers and the
    master worker. Every other DC (a *party*) has a local scheduler, a local server and
    at least one worker.
    """

    name: str = setting(Text(r"[A-Za-z0-9_-]+", "letters, digits, '_', '-'"), doc="Unique DC name.")
    central: bool = setting(Flag(), False,
                            "The central DC hosts the global scheduler, global servers and master worker.")
    global_servers: int = setting(Integer(min=1, max=4096), 1,
                                  "Global servers (central DC only); MultiGPS key sharding when > 1.")
    workers: int = setting(Integer(min=0, max=100_000), AUTO,
                           "Training workers. The central DC must have 0 (central workers are not supported yet).",
                           default_doc="2 (0 on the central DC)")
    lan_bandwidth_bps: float = setting(Bandwidth(), "10Gbps", "Host NIC capacity inside the DC.",
                                       key="lan_bandwidth")
    lan_latency_s: float = setting(Duration(), "50us", "One-way host-to-host delay inside the DC (half of it on each NIC link).", key="lan_latency")
    compute_s_per_iter: float = setting(Duration(), "10ms",
                                        "Emulated compute time per training iteration per worker.",
                                        key="compute_per_iter")
    heterogeneity: float = setting(Real(min=0, min_open=True), 1.0,
                                   "Multiplies the compute time of every worker in the DC.")
    worker_slowdown: tuple[float, ...] = setting(ListOf(Real(min=0, min_open=True)), [],
                                                 "Optional extra compute factor per worker, e.g. [1.0, 10.0] "
                                                 "(missing entries = 1.0).")
    host: str = setting(Text(non_empty=True), "127.0.0.1", "Real runtime: host where this DC's nodes run.")
    scheduler_port: int = setting(Integer(min=0, max=65535), 0,
                                  "Real runtime: port of this DC's scheduler (GeoMX's DMLC_PS_ROOT_PORT; "
                                  "on the central DC: the global scheduler, DMLC_PS_GLOBAL_ROOT_PORT). "
                                  "0 = from `[real].port_base`.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.workers is None:
            object.__setattr__(self, "workers", 0 if self.central else 2)

    def worker_compute_s(self, index: int) -> float:
        """Emulated compute seconds per iteration of worker ``index`` of this DC."""
        factor = self.worker_slowdown[index] if index < len(self.worker_slowdown) else 1.0
        return self.compute_s_per_iter * self.heterogeneity * factor

    def _check(self, path: str) -> None:
        if len(self.worker_slowdown) > self.workers:
            raise ScenarioError(
                f"has {len(self.worker_slowdown)} entries but the DC has {self.workers} workers; "
                f"allowed: at most one factor per worker",
                path=f"{path}.worker_slowdown", value=list(self.worker_slowdown),
                allowed=f"at most {self.workers} entries")


@dataclass(frozen=True)
class WanConfig(Section):
    """A WAN link between two DCs (both directions)."""

    a: str = setting(Text(non_empty=True), doc="DC name of one end.")
    b: str = setting(Text(non_empty=True), doc="DC name of the other end.")
    bandwidth_bps: float = setting(Bandwidth(), "100Mbps",
                                   "Capacity in both directions (a -> b only when `bandwidth_ba` is given).",
                                   key="bandwidth")
    bandwidth_ba_bps: float | None = setting(Bandwidth(optional=True), "",
                                             "Optional capacity of the b -> a direction.", key="bandwidth_ba")
    latency_s: float = setting(Duration(), "30ms", "One-way propagation delay.", key="latency")
    loss: float = setting(Fraction(max_open=True), "0%", "Packet loss rate.")
    jitter_s: float = setting(Duration(), "0ms", "Random extra delay per message (seeded).", key="jitter")
    trace: str = setting(Text(), "",
                         '`""`: constant bandwidth; `"uniform"`: redrawn uniformly in [trace_low, trace_high] '
                         "every trace_period; otherwise a CSV file of `time_s,bandwidth` rows "
                         "(relative paths: next to the scenario file if there, else the working directory).")
    trace_low_bps: float = setting(Bandwidth(), "20Mbps", 'Lower bound for trace = "uniform".', key="trace_low")
    trace_high_bps: float = setting(Bandwidth(), "155Mbps", 'Upper bound for trace = "uniform".', key="trace_high")
    trace_period_s: float = setting(Duration(positive=True), "180s", 'Redraw period for trace = "uniform".',
                                    key="trace_period")

    @property
    def endpoints(self) -> tuple[str, str]:
        return (self.a, self.b)

    def capacity_bps(self, src: str, dst: str) -> float:
        """Capacity of the ``src -> dst`` direction of this link."""
        if (src, dst) == (self.a, self.b):
            return self.bandwidth_bps
        if (src, dst) == (self.b, self.a):
            return self.bandwidth_bps if self.bandwidth_ba_bps is None else self.bandwidth_ba_bps
        raise KeyError(f"link {self.a}<->{self.b} does not join {src!r} and {dst!r}")

    def _check(self, path: str) -> None:
        if self.a == self.b:
            raise ScenarioError(f"a link must join two different DCs, got a = b = {self.a!r}",
                                path=f"{path}.b", value=self.b)
        if self.trace == "uniform" and self.trace_low_bps > self.trace_high_bps:
            raise ScenarioError(
                f"trace_low ({units.format_bps(self.trace_low_bps)}) is above trace_high "
                f"({units.format_bps(self.trace_high_bps)}); allowed: trace_low <= trace_high",
                path=f"{path}.trace_low", value=units.format_bps(self.trace_low_bps))


# Used when a scenario has no [[dc]] at all (and its [[wan]] too when that is missing):
# a central DC and two parties of two workers, each 100 Mbit/s, 30 ms from the centre.
DEFAULT_DCS: tuple[DCConfig, ...] = (
    DCConfig(name="central", central=True),
    DCConfig(name="party-a"),
    DCConfig(name="party-b"),
)
DEFAULT_WANS: tuple[WanConfig, ...] = (
    WanConfig(a="party-a", b="central"),
    WanConfig(a="party-b", b="central"),
)


@dataclass(frozen=True)
class TopologyConfig(Section):
    """How the nodes are laid out over the DCs (a planner of `geomx/topology/`)."""

    kind: str = setting(PolicyName("topology", *TOPOLOGY_KINDS), "hips",
                        "`hips`: two tiers (workers -> their DC's local server -> global servers); "
                        "`flat`: every worker pushes across the WAN to the global servers (the "
                        "vanilla parameter-server baseline); over a mesh of DCs with no central DC "
                        "(docs/papers.md §1): `netstorm` (multi-root network-aware trees, "
                        "`[netstorm]`), `mlnet` (a static bounded fan-in tree), `mxnet` (one "
                        "global server per DC, every worker pushes to every server).")
    options: tuple = setting(OptionsTable(), {},
                             "The options of the topology `kind` names when it is a user "
                             "policy (`[topology.options]`, docs/extending.md), checked once "
                             "at load against its options dataclass. `netstorm` and `mlnet` "
                             "take none: their settings are `[netstorm]`'s keys.",
                             default_doc="`{}`")

    def _check(self, path: str) -> None:
        refused = topology_options_error(self.kind, self.options_table)
        if refused is not None:
            raise refused

    @property
    def options_table(self) -> dict[str, Any]:
        """``[topology.options]`` as a plain table (arrays as lists)."""
        return OptionsTable().emit(self.options)
