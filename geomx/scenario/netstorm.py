"""``[netstorm]``: the NETSTORM controller and servers (docs/papers.md §1, the demo's env).

Only read when ``[topology] kind`` is ``netstorm`` (and ``mlnet`` for ``mlnet_fan_in``).
Defaults are the authors' demo (``scripts/demo/muti_server_resnet.sh``): R = all roots,
1,000,000-element chunks, 4 MB measurement samples, 4 samples per estimate, report and
update thresholds 0, a 2 s check period, multipath on, awareness on; and geomx's own
multipath rule and link probes (docs/papers.md §1 (b) Steps 4-5), whose authors' settings
are ``aux_rule = "queue"`` and ``probe_after = 0``.

These two topologies take their options from this section alone: every field of their
options dataclass is a key here (:data:`SECTION_OPTION_KEYS`), so ``[topology.options]``
is refused for them (:func:`topology_options_error`) rather than being a second spelling
that silently replaces this section. Scenario schema 2 files that used it are converted
as they load (:func:`move_topology_options`, a step of :mod:`geomx.scenario.schema`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from geomx.scenario.errors import ScenarioError, show_value
from geomx.scenario.kinds import (Choice, Duration, Flag, Integer, Real, Section, Size,
                                  setting)
from geomx.topology import topology_class
from geomx.topology.netstorm_multipath import AUX_RULES
from geomx.topology.netstorm_plan import DEFAULT_MAX_AUX

COSTS = ("bandwidth", "latency")


@dataclass(frozen=True)
class NetstormConfig(Section):
    """NETSTORM's planning, awareness and multipath settings (and MLNET's fan-in)."""

    roots: int = setting(Integer(min=0, max=100000), 0,
                         "R: how many of the best roots own parameters (NUM_ENABLE_SERVER); "
                         "0 = every DC (the demo's R = N).")
    chunk_elements: int = setting(Integer(min=1, counts=True), 1000000,
                                  "Chunk size in elements; chunks are what roots own and what "
                                  "travels (MXNET_KVSTORE_BIGARRAY_BOUND).")
    report_bytes: int | None = setting(Size(auto=True), "auto",
                                       "A data message of at least this many bytes is a "
                                       "throughput sample (SIZE_MSG_REPORT). `auto` = a full "
                                       "chunk's bytes (4 x chunk_elements), at most 4 MB. "
                                       "Larger than a full chunk, no link would ever be "
                                       "measured, so a topology that measures links refuses it.")
    report_samples: int = setting(Integer(min=1, max=1000), 4,
                                  "Samples per link estimate (NUM_MSG_REPORT).")
    report_rate: float = setting(Real(min=0), 0.0,
                                 "Relative change of a link estimate that triggers a "
                                 "SPEED_REPORT to the controller (REPORT_RATE; 0 = every estimate).")
    check_period_s: float = setting(Duration(), "2s",
                                    "How often the controller considers replanning "
                                    "(CHECK_PERIOD), checked at iteration boundaries; 0 = at "
                                    "every boundary.",
                                    key="check_period")
    update_rate: float = setting(Real(min=0), 0.0,
                                 "Mean relative change of the rate matrix since the last plan "
                                 "above which the controller replans (UPDATE_RATE).")
    multipath: bool = setting(Flag(), True,
                              "Auxiliary routes for chunks whose main first-hop queue is busy "
                              "(ENABLE_MUTI_TRACE).")
    aux_rule: str = setting(Choice(*AUX_RULES), AUX_RULES[0],
                            "How a chunk takes an auxiliary route: `arrival` (routes over "
                            "links the trees leave idle, each chunk where it is expected to "
                            "arrive first) or `queue` (the authors' rule: any "
                            "interior-disjoint path once the main first-hop queue is busy).")
    max_aux: int = setting(Integer(min=0, max=64), DEFAULT_MAX_AUX,
                           "Auxiliary routes kept per tree edge, beyond the main route.")
    awareness: bool = setting(Flag(), True,
                              "Passive network awareness; off = keep the random first plan "
                              "(the ablation's baseline).")
    probe_after_s: float = setting(Duration(), "10s",
                                   "Probe a link direction no SPEED_REPORT covered for this "
                                   "long, so a link the plans stopped using (or one back from a "
                                   "fault) is measured again; 0 = never (the authors' passive "
                                   "measurement only). Only with `awareness`.",
                                   key="probe_after")
    cost: str = setting(Choice(*COSTS), "bandwidth",
                        "`bandwidth`: path cost sum 1/bw (NETSTORM); `latency`: sum "
                        "(delay + chunk bytes/bw).")
    dynamic_roots: bool = setting(Flag(), False,
                                  "Let the planner choose R (lowest busiest-link load) instead "
                                  "of `roots`.")
    send_window: int = setting(Integer(min=1, max=64), 2,
                               "Unacknowledged data messages in flight per neighbour; the rest "
                               "wait in that neighbour's FIFO queue (what multipath looks at).")
    mlnet_fan_in: int = setting(Integer(min=1, max=1000), 5,
                                "MLNET baseline: fan-in of its static tree (the demo's IN_DEGREE).")


#: The built-in topology kinds whose options are this section's keys: option field (of
#: the kind's options dataclass) -> key in ``[netstorm]``.
SECTION_OPTION_KEYS: dict[str, dict[str, str]] = {
    "netstorm": {"roots": "roots", "dynamic_roots": "dynamic_roots", "multipath": "multipath",
                 "cost": "cost", "awareness": "awareness", "max_aux": "max_aux",
                 "aux_rule": "aux_rule", "probe_after_s": "probe_after"},
    "mlnet": {"fan_in": "mlnet_fan_in"},
}

#: The scenario schema from which these kinds' options are read from ``[netstorm]`` only.
OPTIONS_IN_SECTION_SINCE = 3


def _toml_text(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else show_value(value)


def topology_options_error(kind: str, options: Mapping[str, Any]) -> ScenarioError | None:
    """The error for ``[topology.options]`` given to a kind that reads ``[netstorm]``
    (``None`` for any other kind, or no options): the key to write instead, and that a
    file written for scenario schema 2 is converted when it says so."""
    keys = SECTION_OPTION_KEYS.get(kind)
    if not keys or not options:
        return None
    option, value = next(iter(sorted(options.items())))
    path = f"topology.options.{option}"
    older = (f", or put `schema = {OPTIONS_IN_SECTION_SINCE - 1}` at the top of a file "
             "written for the older format to have it converted as it loads")
    if option not in keys:
        allowed = ", ".join(sorted(set(keys.values())))
        return ScenarioError(
            f"topology kind {kind!r} takes no [topology.options]; its settings are keys of "
            f"[netstorm]; allowed: {allowed}", path=path, value=value, allowed=allowed)
    key = keys[option]
    return ScenarioError(
        f"{path} has moved to netstorm.{key} (scenario schema {OPTIONS_IN_SECTION_SINCE}); "
        f"allowed: write {key} = {_toml_text(value)} in [netstorm] (or --set "
        f"netstorm.{key}=...) instead{older}", path=path, value=value,
        allowed=f"netstorm.{key}")


def move_topology_options(raw: dict[str, Any]) -> None:
    """Scenario schema 2 -> 3, in place: ``[topology.options]`` of a ``netstorm`` or
    ``mlnet`` topology becomes ``[netstorm]`` keys, with the meaning it had. Under schema 2
    options, when given, replaced the section's planning settings: a field the table did
    not name took its dataclass default, whatever ``[netstorm]`` said, so the converted
    file states those defaults. An option and its ``[netstorm]`` key both given is
    refused; an option the kind does not have is left for the check to name."""
    topology = raw.get("topology")
    if not isinstance(topology, dict):
        return
    kind, options = topology.get("kind"), topology.get("options")
    keys = SECTION_OPTION_KEYS.get(kind) if isinstance(kind, str) else None
    if not keys or not isinstance(options, dict) or not options:
        return
    section = raw.setdefault("netstorm", {})
    if not isinstance(section, dict):
        raise ScenarioError("expected a table ([netstorm])", path="netstorm")
    defaults = topology_class(kind).Options()
    for option, key in keys.items():
        if option in options and key in section:
            raise ScenarioError(
                f"topology.options.{option} and netstorm.{key} are the same setting (schema "
                f"{OPTIONS_IN_SECTION_SINCE} writes netstorm.{key}); allowed: one of them",
                path=f"topology.options.{option}", value=options[option],
                allowed=f"netstorm.{key}")
        section[key] = options.pop(option) if option in options else getattr(defaults, option)
    if not options:
        del topology["options"]
