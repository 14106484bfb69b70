"""TOML scenario files -> validated, frozen dataclasses: the one config model of geomx.

A scenario describes a whole geo-distributed run: the data centres (``[[dc]]``), the WAN
links between them (``[[wan]]``), how the nodes are laid out over them (``[topology]``),
the model and data (``[training]``), the synchronisation algorithm (``[sync]``), gradient
compression (``[codec]``), transfer scheduling (``[sched]``), what to record
(``[metrics]``), liveness and injected faults (``[membership]``, ``[[fault]]``) and when
to stop (``[run]``); for the real runtime also where the schedulers listen (``[real]``)
and who may join (``[security]``). The same file drives the emulator and the real runtime.

One module per concern:

* ``kinds.py``: how a setting is parsed, range-checked, written back and documented
  (:func:`setting`, :func:`settings_of`); ``errors.py``: :class:`ScenarioError`.
* one module per group of sections, each a frozen dataclass whose fields are declared
  with :func:`setting`: ``run.py``, ``topology.py`` (``[[dc]]``, ``[[wan]]``,
  ``[network]``, ``[topology]``), ``training.py``, ``sync.py``, ``codec.py``,
  ``sched.py``, ``metrics.py``, ``membership.py`` (``[membership]``, ``[[fault]]``),
  ``real.py`` (``[real]``, ``[security]``).
* ``model.py``: :class:`Scenario`, whose fields are the section table (adding a section
  is its module plus one line there); ``checks.py``: the rules that span sections;
  ``parse.py``: data -> Scenario; ``overrides.py``: ``--set``; ``toml_io.py``: load and
  write files (``tomli-w``); ``reference.py``: the generated part of docs/scenario.md;
  ``command.py``/``__main__.py``: ``python -m geomx.scenario``.

Why: every setting is declared once, and the parser, the per-field checks, the writer,
the ``--set`` resolver and ``docs/scenario.md`` all read that declaration, so they cannot
disagree. Errors name the field path as it appears in the file (``wan[0].bandwidth``),
the bad value and what is allowed. Resolved scenarios round-trip: loading the text
:func:`scenario_to_toml` writes gives an equal :class:`Scenario`.
"""

from geomx.scenario.checks import SCENARIO_CHECKS, scenario_check
from geomx.scenario.codec import CodecConfig
from geomx.scenario.errors import ScenarioError
from geomx.scenario.kinds import AUTO, Setting, setting, settings_of
from geomx.scenario.membership import FaultConfig, MembershipConfig, link_faults
from geomx.scenario.metrics import MetricsConfig
from geomx.scenario.model import Scenario, SectionSpec, scenario_to_dict, sections
from geomx.scenario.overrides import apply_override, override_scenario
from geomx.scenario.parse import parse_scenario
from geomx.scenario.real import RealConfig, SecurityConfig
from geomx.scenario.reference import DOC_BEGIN, DOC_END, reference_markdown, write_reference
from geomx.scenario.run import RunConfig
from geomx.scenario.sched import SchedConfig
from geomx.scenario.sync import SyncConfig
from geomx.scenario.toml_io import load_scenario, scenario_to_toml
from geomx.scenario.topology import (DEFAULT_DCS, DEFAULT_WANS, DCConfig, NetworkConfig,
                                     TopologyConfig, WanConfig)
from geomx.scenario.training import TrainingConfig

__all__ = [
    "ScenarioError",
    "Scenario",
    "RunConfig",
    "NetworkConfig",
    "DCConfig",
    "WanConfig",
    "TopologyConfig",
    "TrainingConfig",
    "SyncConfig",
    "CodecConfig",
    "SchedConfig",
    "MetricsConfig",
    "MembershipConfig",
    "FaultConfig",
    "link_faults",
    "RealConfig",
    "SecurityConfig",
    "Setting",
    "SectionSpec",
    "AUTO",
    "DEFAULT_DCS",
    "DEFAULT_WANS",
    "DOC_BEGIN",
    "DOC_END",
    "SCENARIO_CHECKS",
    "load_scenario",
    "parse_scenario",
    "apply_override",
    "override_scenario",
    "scenario_check",
    "scenario_to_dict",
    "scenario_to_toml",
    "setting",
    "settings_of",
    "sections",
    "reference_markdown",
    "write_reference",
]
