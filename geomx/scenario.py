"""TOML scenario files -> validated, frozen dataclasses: the one config model of geomx.

A scenario describes a whole geo-distributed run: the data centres (``[[dc]]``), the WAN
links between them (``[[wan]]``), the model and data (``[training]``), the
synchronisation algorithm (``[sync]``), gradient compression (``[codec]``), transfer
scheduling (``[sched]``), what to record (``[metrics]``) and when to stop (``[run]``);
for the real runtime also where the schedulers listen (``[real]``) and who may join
(``[security]``). The same file drives the emulator and the real runtime.

Design, and why:

* **One table per section.** Every setting is declared once, as a dataclass field whose
  metadata (:func:`setting`) holds its TOML key, its :class:`Kind` (how it is parsed,
  range-checked and written back), its default as a person would write it, and its
  documentation. The parser, the validator's per-field checks, the TOML emitter, the
  ``--set`` override resolver and ``docs/scenario.md`` all read that table, so they
  cannot disagree. Adding a field is one line; adding a section is a dataclass plus one
  line in :class:`Scenario`.
* **Units are converted at parse time** into fields whose names carry the unit
  (``WanConfig.bandwidth_bps``, ``latency_s``, ``NetworkConfig.tcp_window_bytes``) while
  the TOML keys stay short (``bandwidth = "100Mbps"``); see :mod:`geomx.units`.
* **Errors a user can act on.** :class:`ScenarioError` names the field path as it
  appears in the file (``wan[0].bandwidth``), the bad value and what is allowed, with a
  "did you mean" from :mod:`difflib` for misspelt keys and enum values.
* **Resolved scenarios round-trip.** :func:`scenario_to_toml` writes every setting,
  defaults included, in readable units; loading that text gives an equal
  :class:`Scenario`. A run directory's ``scenario.toml`` is therefore a complete recipe.

Public API: :func:`load_scenario`, :func:`parse_scenario`, :func:`apply_override`,
:func:`override_scenario`, :func:`scenario_to_dict`, :func:`scenario_to_toml`,
:func:`reference_markdown`, :class:`Scenario` and its section dataclasses,
:class:`ScenarioError`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

from geomx import units

__all__ = [
    "ScenarioError",
    "Scenario",
    "RunConfig",
    "NetworkConfig",
    "DCConfig",
    "WanConfig",
    "TrainingConfig",
    "SyncConfig",
    "CodecConfig",
    "SchedConfig",
    "MetricsConfig",
    "MembershipConfig",
    "FaultConfig",
    "RealConfig",
    "SecurityConfig",
    "Setting",
    "SectionSpec",
    "load_scenario",
    "parse_scenario",
    "apply_override",
    "override_scenario",
    "scenario_check",
    "scenario_to_dict",
    "scenario_to_toml",
    "settings_of",
    "sections",
    "reference_markdown",
]

_MISSING: Any = object()


# ============================================================================ errors

class ScenarioError(ValueError):
    """A scenario that cannot be run, with what a person needs to fix it.

    ``path`` is the field as written in the file (``"wan[0].bandwidth"``, ``"training"``
    for a whole section, ``""`` for the file), ``value`` the offending value (or
    ``None``), ``allowed`` a short description of what is accepted, ``source`` the file
    (or ``"<string>"``, or the ``--set`` expression).
    """

    def __init__(self, problem: str, *, path: str = "", value: Any = None,
                 allowed: str | None = None, source: str | None = None):
        self.problem = problem
        self.path = path
        self.value = value
        self.allowed = allowed
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = ": ".join(part for part in (self.source, self.path) if part)
        return f"{where}: {self.problem}" if where else self.problem

    def with_source(self, source: str) -> ScenarioError:
        if self.source is None:
            self.source = source
            self.args = (self._render(),)
        return self


def _quote_list(options: Iterable[str]) -> str:
    return ", ".join(repr(o) for o in options)


def _did_you_mean(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value!r}"


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


# ============================================================================ kinds

class Kind:
    """How one setting is read from TOML, checked, and written back.

    ``parse`` turns a TOML value into the dataclass value (raising :class:`ScenarioError`
    that names ``path``); ``emit`` turns the dataclass value into a TOML value that
    ``parse`` maps back to an equal value; ``type_name``/``unit``/``allowed()`` feed the
    error messages and ``docs/scenario.md``.
    """

    type_name = "value"
    unit = ""
    textual = False  # an override value for this kind is kept as the raw text

    def parse(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def emit(self, value: Any) -> Any:
        return value

    def allowed(self) -> str:
        return self.type_name

    def doc_allowed(self) -> str:
        """The 'allowed' column of docs/scenario.md (formats are explained once, up front)."""
        return self.allowed()

    def fail(self, path: str, value: Any, problem: str) -> ScenarioError:
        return ScenarioError(f"{problem}; allowed: {self.allowed()}", path=path, value=value,
                             allowed=self.allowed())

    def wrong_type(self, path: str, value: Any) -> ScenarioError:
        return self.fail(path, value, f"expected {self.type_name}, got {_type_name(value)} {_show(value)}")


@dataclass(frozen=True)
class _Range:
    """Bounds on a number, inclusive unless ``*_open``."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False

    def describe(self, fmt: Callable[[Any], str] = str) -> str:
        if self.min is not None and self.max is not None:
            left = "(" if self.min_open else "["
            right = ")" if self.max_open else "]"
            return f"in {left}{fmt(self.min)}, {fmt(self.max)}{right}"
        if self.min is not None:
            return f"{'>' if self.min_open else '>='} {fmt(self.min)}"
        if self.max is not None:
            return f"{'<' if self.max_open else '<='} {fmt(self.max)}"
        return ""

    def check(self, number: float) -> bool:
        if self.min is not None and (number < self.min or (self.min_open and number == self.min)):
            return False
        if self.max is not None and (number > self.max or (self.max_open and number == self.max)):
            return False
        return True


class Text(Kind):
    """A string, optionally restricted to a regular expression."""

    type_name = "string"
    textual = True

    def __init__(self, pattern: str | None = None, pattern_doc: str = "", non_empty: bool = False):
        self.pattern = re.compile(pattern) if pattern else None
        self.pattern_doc = pattern_doc
        self.non_empty = non_empty

    def allowed(self) -> str:
        if self.pattern_doc:
            return f"a string of {self.pattern_doc}"
        return "a non-empty string" if self.non_empty else "a string"

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self.wrong_type(path, value)
        if self.non_empty and not value:
            raise self.fail(path, value, "must not be empty")
        if self.pattern and not self.pattern.fullmatch(value):
            raise self.fail(path, value, f"{value!r} is not allowed")
        return value


class Choice(Kind):
    """One of a fixed list of names (an enum)."""

    type_name = "enum"
    textual = True

    def __init__(self, *options: str):
        self.options = tuple(options)

    def allowed(self) -> str:
        return "one of " + _quote_list(self.options)

    def doc_allowed(self) -> str:
        return ", ".join(f'`"{o}"`' for o in self.options)

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self.wrong_type(path, value)
        if value not in self.options:
            hint = _did_you_mean(value, self.options)
            raise self.fail(path, value, f"{value!r} is not a valid choice{hint}")
        return value


class Flag(Kind):
    type_name = "boolean"

    def allowed(self) -> str:
        return "true or false"

    def parse(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.wrong_type(path, value)
        return value


class Integer(Kind):
    """An integer; with ``counts=True`` also ``"25.6M"``/``"178k"`` (see :func:`units.parse_count`)."""

    def __init__(self, min: int | None = None, max: int | None = None, counts: bool = False):
        self.range = _Range(min, max)
        self.counts = counts
        self.type_name = "count" if counts else "integer"

    def allowed(self) -> str:
        bound = self.range.describe()
        text = f"an integer {bound}" if bound else "an integer"
        return text + (" (also a count like '25.6M', '178k')" if self.counts else "")

    def doc_allowed(self) -> str:
        return (self.range.describe() or "any") + (", `k`/`M`/`G` suffixes" if self.counts else "")

    def parse(self, value: Any, path: str) -> int:
        if isinstance(value, bool):
            raise self.wrong_type(path, value)
        if isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, int):
            number = value
        elif isinstance(value, str) and self.counts:
            try:
                number = units.parse_count(value)
            except ValueError as exc:
                raise self.fail(path, value, str(exc)) from None
        else:
            raise self.wrong_type(path, value)
        if not self.range.check(number):
            raise self.fail(path, value, f"{_show(value)} is out of range")
        return number

    def emit(self, value: int) -> Any:
        if self.counts and abs(value) >= 1_000_000:  # "25.6M" reads better; "200k" not much
            text = units.format_count(value)
            return value if text.lstrip("-").isdigit() else text
        return value


class Real(Kind):
    type_name = "float"

    def __init__(self, min: float | None = None, max: float | None = None,
                 min_open: bool = False, max_open: bool = False):
        self.range = _Range(min, max, min_open, max_open)

    def allowed(self) -> str:
        bound = self.range.describe()
        return f"a number {bound}" if bound else "a number"

    def doc_allowed(self) -> str:
        return self.range.describe() or "any"

    def parse(self, value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.wrong_type(path, value)
        number = float(value)
        if not math.isfinite(number) or not self.range.check(number):
            raise self.fail(path, value, f"{_show(value)} is out of range")
        return number


class _Quantity(Kind):
    """A number with a unit, converted by a :mod:`geomx.units` parser."""

    examples = ""

    def __init__(self, parser: Callable[[Any], Any], formatter: Callable[[Any], str],
                 fmt_bound: Callable[[Any], str], range: _Range, optional: bool = False,
                 auto: bool = False):
        self.parser = parser
        self.formatter = formatter
        self.fmt_bound = fmt_bound
        self.range = range
        self.optional = optional
        self.auto = auto  # "auto" is allowed and held as None (derived where it is used)

    def allowed(self) -> str:
        text = self.examples
        bound = self.range.describe(self.fmt_bound)
        if bound:
            text += f", {bound}"
        if self.optional:
            text += ', or "" for none'
        if self.auto:
            text += ', or "auto"'
        return text

    def doc_allowed(self) -> str:
        bound = self.range.describe(self.fmt_bound)
        parts = [bound] if bound else []
        if self.optional:
            parts.append('`""` = none')
        if self.auto:
            parts.append('`"auto"`')
        return ", ".join(parts) or "any"

    def parse(self, value: Any, path: str) -> Any:
        if self.optional and value == "":
            return None
        if self.auto and value == "auto":
            return None
        try:
            quantity = self.parser(value)
        except ValueError as exc:
            # geomx.units ends its messages with examples; ours (with the range) replace them.
            raise self.fail(path, value, str(exc).split("; use e.g.")[0]) from None
        if not self.range.check(quantity):
            raise self.fail(path, value, f"{_show(value)} is out of range")
        return quantity

    def emit(self, value: Any) -> Any:
        if value is None:
            return "auto" if self.auto else ""
        return self.formatter(value)


class Bandwidth(_Quantity):
    type_name = "bandwidth"
    unit = "bit/s"
    examples = "a bandwidth like '100Mbps', '1Gbps', '10 Gbit/s', '12.5MB/s' (bytes/s) or a number of bit/s"

    def __init__(self, optional: bool = False):
        super().__init__(units.parse_bandwidth, units.format_bps, units.format_bps,
                         _Range(0, None, min_open=True), optional)


class Duration(_Quantity):
    type_name = "duration"
    unit = "s"
    examples = "a duration like '30ms', '250us', '2s', '5min' or a number of seconds"

    def __init__(self, positive: bool = False, auto: bool = False):
        super().__init__(units.parse_seconds, units.format_seconds, units.format_seconds,
                         _Range(0, None, min_open=positive), auto=auto)


class Fraction(_Quantity):
    type_name = "fraction"
    unit = "fraction"
    examples = "a fraction like '1%', '0.5%' or 0.01"

    def __init__(self, min_open: bool = False, max_open: bool = False, percent: bool = True):
        super().__init__(units.parse_fraction, units.format_fraction if percent else float,
                         units.format_fraction, _Range(0.0, 1.0, min_open, max_open))


class Size(_Quantity):
    type_name = "size"
    unit = "bytes"
    examples = "a size like '4MiB', '1MB', '64KiB' or a number of bytes"

    def __init__(self, positive: bool = True):
        super().__init__(units.parse_size, units.format_size, units.format_size,
                         _Range(0, None, min_open=positive))

    def emit(self, value: int) -> Any:
        text = units.format_size(value)
        return value if text[:-1].isdigit() and text.endswith("B") else text


class ListOf(Kind):
    """A TOML array of one kind, held as a tuple (so sections stay hashable and frozen)."""

    def __init__(self, item: Kind):
        self.item = item
        self.type_name = f"list of {item.type_name}"
        self.unit = item.unit

    def allowed(self) -> str:
        return f"an array of {self.item.allowed()}"

    def parse(self, value: Any, path: str) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise self.wrong_type(path, value)
        return tuple(self.item.parse(v, f"{path}[{i}]") for i, v in enumerate(value))

    def emit(self, value: tuple) -> list:
        return [self.item.emit(v) for v in value]

    def doc_allowed(self) -> str:
        return f"each {self.item.doc_allowed()}"


# ============================================================================ settings table

AUTO: Any = object()
"""Default marker for a setting whose default depends on other settings (resolved in
the section's ``__post_init__``; ``default_doc`` says how)."""


@dataclass(frozen=True)
class Setting:
    """One row of a section's field table (read from the dataclass field metadata)."""

    key: str             # TOML key, e.g. "bandwidth"
    attr: str            # dataclass attribute, e.g. "bandwidth_bps"
    kind: Kind
    default: Any         # as a person writes it in TOML (AUTO: see default_doc)
    doc: str
    required: bool = False
    default_doc: str | None = None

    def default_text(self) -> str:
        """The default as shown in docs/scenario.md (markdown)."""
        if self.required:
            return "required"
        if self.default_doc:
            return self.default_doc
        return f"`{_toml_value(self.default)}`"


def setting(kind: Kind, default: Any = _MISSING, doc: str = "", *, key: str | None = None,
            default_doc: str | None = None) -> Any:
    """Declare a scenario setting as a dataclass field.

    ``default`` is written as in TOML (``"100Mbps"``); the dataclass default is its parsed
    value. No default makes the setting required. ``key`` is the TOML key when it differs
    from the attribute (``bandwidth_bps`` is written ``bandwidth``).
    """
    meta = {"geomx.setting": (kind, default, doc, key, default_doc)}
    if default is _MISSING:
        return dataclasses.field(metadata=meta)
    if default is AUTO:
        return dataclasses.field(default=None, metadata=meta)
    return dataclasses.field(default=kind.parse(default, "<default>"), metadata=meta)


@cache
def settings_of(cls: type) -> tuple[Setting, ...]:
    """The field table of a section dataclass, in declaration order."""
    rows = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("geomx.setting")
        if meta is None:
            continue
        kind, default, doc, key, default_doc = meta
        rows.append(Setting(key=key or f.name, attr=f.name, kind=kind,
                            default=None if default is _MISSING else default, doc=doc,
                            required=default is _MISSING, default_doc=default_doc))
    return tuple(rows)


def _setting_by_key(cls: type) -> dict[str, Setting]:
    return {s.key: s for s in settings_of(cls)}


# ============================================================================ sections

class _Section:
    """Base of the section dataclasses: arrays given as lists (code, not TOML) become
    tuples, so a section built in Python equals the one parsed from a file."""

    def __post_init__(self) -> None:
        for row in settings_of(type(self)):
            value = getattr(self, row.attr)
            if isinstance(row.kind, ListOf) and isinstance(value, list):
                object.__setattr__(self, row.attr, tuple(value))


@dataclass(frozen=True)
class RunConfig(_Section):
    """Identity of the run, which runtime executes it, and when it stops.

    The run stops at the first stop condition met. ``epochs > 0`` replaces the
    ``iterations`` limit. At least one stop condition must be set.
    """

    name: str = setting(Text(r"[A-Za-z0-9_.-]+", "letters, digits, '_', '.', '-'"), "geomx",
                        "Run name; the run directory is `<out_dir>/<name>-<time>`.")
    seed: int = setting(Integer(min=0), 0, "Seed for every random choice (data, init, jitter, traces).")
    runtime: str = setting(Choice("emu", "real"), "emu",
                           "`emu`: virtual-time WAN emulator in one process; `real`: sockets, one process per node.")
    iterations: int = setting(Integer(min=0, counts=True), 100,
                              "Per-worker training iterations to run; 0 = unlimited.")
    epochs: int = setting(Integer(min=0), 0,
                          "If > 0, stop after this many epochs of each worker's partition (instead of `iterations`).")
    target_accuracy: float = setting(Fraction(percent=False), 0.0,
                                     "If > 0, stop when test accuracy reaches it (checked at evaluations).")
    max_emulated_time_s: float = setting(Duration(), "0s", "If > 0, stop at this emulated time (emu only).",
                                         key="max_emulated_time")
    max_wall_time_s: float = setting(Duration(), "0s", "If > 0, stop after this much wall-clock time.",
                                     key="max_wall_time")
    eval_every: int = setting(Integer(min=0), 10,
                              "Evaluate test accuracy every N iterations (0 = only at the end).")
    out_dir: str = setting(Text(non_empty=True), "runs", "Directory that receives run directories.")
    progress: bool = setting(Flag(), True, "Show a progress bar on stderr.")


@dataclass(frozen=True)
class NetworkConfig(_Section):
    """Transport-level constants shared by every link."""

    tcp_window_bytes: int = setting(Size(), "4MiB",
                                    "Per-flow cap = window / RTT on reliable channels.", key="tcp_window")
    mss_bytes: int = setting(Size(), 1460,
                             "Maximum segment size; used by the loss -> throughput model (Mathis et al.).",
                             key="mss")


@dataclass(frozen=True)
class DCConfig(_Section):
    """A data centre: its nodes, its LAN, and the compute speed of its workers.

    Exactly one DC is central: it hosts the global scheduler, the global servers and the
    master worker. Every other DC (a *party*) has a local scheduler, a local server and
    at least one worker.
    """

    name: str = setting(Text(r"[A-Za-z0-9_-]+", "letters, digits, '_', '-'"), doc="Unique DC name.")
    central: bool = setting(Flag(), False,
                            "The central DC hosts the global scheduler, global servers and master worker.")
    global_servers: int = setting(Integer(min=1), 1,
                                  "Global servers (central DC only); MultiGPS key sharding when > 1.")
    workers: int = setting(Integer(min=0), AUTO,
                           "Training workers. The central DC must have 0 (central workers are not supported yet).",
                           default_doc="2 (0 on the central DC)")
    lan_bandwidth_bps: float = setting(Bandwidth(), "10Gbps", "Host NIC capacity inside the DC.",
                                       key="lan_bandwidth")
    lan_latency_s: float = setting(Duration(), "50us", "One-way host <-> switch delay.", key="lan_latency")
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
class WanConfig(_Section):
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


_MODELS = ("softmax", "mlp", "cnn", "phantom")
DGT_MODES = ("off", "udp", "tcp", "quant")
DGT_MIN_BLOCK_BYTES = 64
#: a block is one datagram message; 1 MiB keeps a lost UDP block a small loss
DGT_MAX_BLOCK_BYTES = 1 << 20
_IMAGE_DATASETS = ("digits", "mnist", "fashion_mnist")
_SERVER_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "dcasgd", "dcasgd_shared", "none")
_WORKER_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "none")


@dataclass(frozen=True)
class TrainingConfig(_Section):
    """The model, the data and how they are split, and the optimizers."""

    model: str = setting(Choice(*_MODELS), "mlp",
                         "`phantom`: tensors with sizes only (no data), for emulating large models.")
    hidden: tuple[int, ...] = setting(ListOf(Integer(min=1)), [64], "Hidden layer sizes of the mlp.")
    dataset: str = setting(Choice(*_IMAGE_DATASETS, "synthetic"), "digits",
                           "`digits`: scikit-learn 8x8 digits; `synthetic`: seeded generated data (see synthetic_*).")
    data_path: str = setting(Text(), "",
                             "mnist / fashion_mnist: directory with the IDX files, or an .npz file.")
    partition: str = setting(Choice("iid", "by_class", "dirichlet"), "iid",
                             "How training data is split across workers.")
    dirichlet_alpha: float = setting(Real(min=0, min_open=True), 0.5,
                                     "Concentration for partition = dirichlet (smaller = more skewed).")
    batch_size: int = setting(Integer(min=1), 32, "Samples per worker per iteration.")
    lr: float = setting(Real(min=0, min_open=True), 0.01, "Learning rate of the global-server optimizer.")
    optimizer: str = setting(Choice(*_SERVER_OPTIMIZERS), "adam",
                             "Optimizer run by the global servers (`none`: store the pushed values).")
    momentum: float = setting(Real(min=0, max=1, max_open=True), 0.9, "Momentum for momentum / nesterov.")
    weight_decay: float = setting(Real(min=0), 0.0, "L2 weight decay.")
    worker_optimizer: str = setting(Choice(*_WORKER_OPTIMIZERS), "sgd",
                                    "Optimizer for local steps on workers (HFA, ESync).")
    worker_lr: float = setting(Real(min=0), 0.0, "Learning rate of local steps; 0 = same as `lr`.")
    mode: str = setting(Choice("hips", "flat_ps"), "hips",
                        "`hips`: two-tier (workers -> local server -> global servers); `flat_ps`: every "
                        "worker pushes across the WAN to the global servers (vanilla MXNet baseline).")
    phantom_params: int = setting(Integer(min=0, counts=True), 0,
                                  "Phantom model: total parameter count, e.g. \"25.6M\".")
    phantom_layers: tuple[int, ...] = setting(ListOf(Integer(min=1, counts=True)), [],
                                              "Phantom model: explicit tensor sizes (elements).")
    phantom_preset: str = setting(Choice("", "resnet50", "vgg16"), "", "Phantom model: tensor sizes of a known network.")
    synthetic_samples: int = setting(Integer(min=1, counts=True), 4000, "Samples of the synthetic dataset.")
    synthetic_features: int = setting(Integer(min=1), 32, "Features of the synthetic dataset.")
    synthetic_classes: int = setting(Integer(min=2), 10, "Classes of the synthetic dataset.")

    @property
    def effective_worker_lr(self) -> float:
        """Learning rate for local steps (``worker_lr``, or ``lr`` when 0)."""
        return self.worker_lr or self.lr

    def _check(self, path: str) -> None:
        if self.model == "phantom":
            given = [k for k, v in (("phantom_params", self.phantom_params),
                                    ("phantom_layers", self.phantom_layers),
                                    ("phantom_preset", self.phantom_preset)) if v]
            if len(given) != 1:
                problem = ("model = 'phantom' needs its tensor sizes" if not given
                           else f"set only one of them, got {', '.join(given)}")
                raise ScenarioError(
                    f"{problem}; allowed: exactly one of phantom_params, phantom_layers, phantom_preset",
                    path=f"{path}.model", value=self.model,
                    allowed="exactly one of phantom_params, phantom_layers, phantom_preset")
        if self.model == "cnn" and self.dataset not in _IMAGE_DATASETS:
            raise ScenarioError(
                f"model = 'cnn' needs an image dataset, got {self.dataset!r}; allowed: {_quote_list(_IMAGE_DATASETS)}",
                path=f"{path}.dataset", value=self.dataset, allowed=_quote_list(_IMAGE_DATASETS))


_ALGORITHMS = ("fsa", "mixed", "hfa", "esync")


@dataclass(frozen=True)
class SyncConfig(_Section):
    """When servers aggregate and reply: the synchronisation algorithm and its parameters."""

    algorithm: str = setting(Choice(*_ALGORITHMS), "fsa",
                             "`fsa`: fully synchronous; `mixed`: sync in a DC, async across DCs; "
                             "`hfa`: hierarchical frequency aggregation; `esync`: ESync.")
    staleness: int = setting(Integer(min=0), 0,
                             "mixed: a DC more than this many versions ahead of the slowest DC "
                             "waits for it (0 = unbounded, as in GeoMX).")
    k1: int = setting(Integer(min=1), 20, "hfa: local steps per local sync.")
    k2: int = setting(Integer(min=1), 10, "hfa: local syncs per global sync.")
    dcasgd_lambda: float = setting(Real(min=0), 0.04,
                                   "Variance-control factor (lambda) of the dcasgd / dcasgd_shared "
                                   "global optimizers (GeoMX/MXNet default 0.04).")
    esync_epsilon_s: float = setting(Duration(), "0s",
                                     "esync: slack of the ready rule -- a worker stops taking local "
                                     "steps once one more step plus this would end after the slowest "
                                     "worker's step (the paper uses 0.5s for second-long steps; scale "
                                     "it with your step times).",
                                     key="esync_epsilon")
    esync_max_local_steps: int = setting(Integer(min=1), 64, "esync: upper bound on local steps per round.")


@dataclass(frozen=True)
class CodecConfig(_Section):
    """What bytes leave: gradient compression."""

    type: str = setting(Choice("none", "bsc", "fp16", "bf16", "mpq", "onebit"), "none",
                        "`bsc`: bi-sparse compression; `mpq`: mixed-precision quantisation; "
                        "`fp16` / `bf16`: half precision; `onebit`: 1-bit quantisation.")
    threshold: float = setting(Fraction(min_open=True, max_open=True, percent=False), 0.01,
                               "bsc / mpq: fraction of elements kept.")
    size_lower_bound: int = setting(Integer(min=0, counts=True), 200000,
                                    "Tensors with fewer elements are sent dense.")


@dataclass(frozen=True)
class SchedConfig(_Section):
    """In which order and over which path transfers leave.

    (P3, TSEngine and NETSTORM will add their settings here when they are built; until
    then a scenario that names them is refused as an unknown key.)"""

    bigarray_bound: int = setting(Integer(min=1, counts=True), 1000000,
                                  "Tensors with more elements are split across the global servers.")
    # DGT (geomx/sched/dgt.py; GeoMX's ENABLE_DGT, DMLC_K, ... -- geomx-behaviour.md §4.4)
    dgt: str = setting(Choice(*DGT_MODES), "off",
                       "Differential gradient transmission of local -> global server pushes: "
                       "`udp`: low-contribution blocks on unreliable datagram channels "
                       "(GeoMX ENABLE_DGT=1); `tcp`: on deprioritised reliable channels (2); "
                       "`quant`: deprioritised and 4-bit quantised with error feedback (3).")
    dgt_block_bytes: int = setting(Size(), 4096,
                                   "DGT block size in bytes of the sent values (GeoMX DGT_BLOCK_SIZE).",
                                   key="dgt_block_size")
    dgt_k: float = setting(Fraction(percent=False), 0.5,
                           "DGT: fraction of blocks (by contribution) sent on the reliable, highest-"
                           "priority channel 0 (GeoMX DMLC_K; its scripts use 0.8).")
    dgt_k_min: float = setting(Fraction(percent=False), 0.2,
                               "DGT adaptive K: lower bound of K (DMLC_K_MIN).")
    dgt_adaptive_k: bool = setting(Flag(), True,
                                   "DGT: K_t = max(k_min, k * loss_t / loss_0) from the workers' "
                                   "training loss (ADAPTIVE_K_FLAG; GeoMX parses it but never uses it).")
    dgt_channels: int = setting(Integer(min=1, max=7), 3,
                                "DGT: low-priority channels C the rest of the blocks are banded over "
                                "(DMLC_UDP_CHANNEL_NUM).")
    dgt_alpha: float = setting(Fraction(percent=False), 0.3,
                               "DGT: weight of the old value in the per-block contribution EWMA "
                               "(DGT_CONTRIBUTION_ALPHA).")

    def _check(self, path: str) -> None:
        if not DGT_MIN_BLOCK_BYTES <= self.dgt_block_bytes <= DGT_MAX_BLOCK_BYTES:
            raise ScenarioError(
                f"block size {self.dgt_block_bytes} B is out of range; allowed: "
                f"{DGT_MIN_BLOCK_BYTES} .. {DGT_MAX_BLOCK_BYTES} bytes",
                path=f"{path}.dgt_block_size", value=self.dgt_block_bytes)
        if self.dgt_k_min > self.dgt_k:
            raise ScenarioError(
                f"dgt_k_min = {self.dgt_k_min:g} is above dgt_k = {self.dgt_k:g}; allowed: "
                "dgt_k_min <= dgt_k", path=f"{path}.dgt_k_min", value=self.dgt_k_min)


@dataclass(frozen=True)
class MetricsConfig(_Section):
    """What a run records in its directory."""

    events: bool = setting(Flag(), True, "Write events.jsonl.")
    trace: bool = setting(Flag(), True, "Write trace.json (Chrome trace event format).")
    plot: bool = setting(Flag(), True, "Write accuracy plots (PNG).")


@dataclass(frozen=True)
class MembershipConfig(_Section):
    """Liveness: registration and heartbeats (ps-lite's PS_HEARTBEAT_*, on both tiers)."""

    heartbeat_interval_s: float = setting(Duration(), "1s",
                                          "Each node heartbeats its scheduler(s) this often "
                                          "(0 = off).", key="heartbeat_interval")
    heartbeat_timeout_s: float = setting(Duration(), "10s",
                                         "A node not heard from for this long is declared "
                                         "dead, reported by name, and the job stops.",
                                         key="heartbeat_timeout")
    register_timeout_s: float = setting(Duration(), "120s",
                                        "A scheduler gives up (naming the missing nodes) if "
                                        "not every node has registered by then (0 = wait "
                                        "forever).", key="register_timeout")
    request_timeout_s: float | None = setting(
        Duration(auto=True), "auto",
        "A request (push, pull, init, command, barrier) that gets no reply for this long fails "
        "its node with an error naming the peer, instead of hanging. `auto` = 10 x the "
        "scenario's slowest round (compute, local steps and the model's transfer over the "
        "slowest link), at least 30 s; 0 = wait forever. Active where heartbeats are.",
        key="request_timeout")
    in_emulator: bool = setting(Flag(), False,
                                "Run heartbeats in the emulator too (off by default: they "
                                "add traffic and hide deadlocks behind endless timers).")


@dataclass(frozen=True)
class FaultConfig(_Section):
    """A fault to inject, the same way in both runtimes (testing failure handling)."""

    node: str = setting(Text(non_empty=True), doc="Node to crash, e.g. `w:party-a:1`, `ls:party-b`.")
    at_s: float = setting(Duration(), "1s", "When, from the job's start (emulated or wall seconds).",
                          key="at")
    kind: str = setting(Choice("crash"), "crash",
                        "`crash`: the node stops dead (its process is killed with SIGKILL in the "
                        "real runtime; its task is cancelled and its messages dropped in the emulator).")


#: A host:port address (host: a name, an IPv4 address, or an IPv6 address in brackets).
_ADDRESS = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}"
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


@dataclass(frozen=True)
class RealConfig(_Section):
    """Real runtime: where the schedulers listen and how nodes reach each other.

    Every node finds its schedulers from these settings (or from the environment, see
    docs/real-runtime.md), so nodes started separately on different hosts meet without a
    launcher: the GeoMX/ps-lite rendezvous (geomx-behaviour.md §1.4). The global scheduler
    listens on `port_base` and DC number i (file order) on `port_base + 1 + i`, which with
    the default 9092 gives GeoMX's demo ports (global 9092, central 9093, parties 9094, ...).
    """

    global_scheduler: str = setting(Text(rf"({_ADDRESS})?", "'host:port' or empty"), "",
                                    "Address of the global scheduler (GeoMX's DMLC_PS_GLOBAL_ROOT_URI/"
                                    "PORT); \"\" = the central DC's host and scheduler port.")
    port_base: int = setting(Integer(min=0, max=65535 - 64), 0,
                             "First rendezvous port (see above). 0 = automatic: free ports when one "
                             "launcher starts every node on this host (`geomx run`, `geomx launch`), "
                             "9092 otherwise.")
    bind_host: str = setting(Text(), "",
                             "Address every node binds to; \"\" = the address it advertises (its DC's "
                             "`host`); \"0.0.0.0\" = every interface.")
    shape: bool = setting(Flag(), True,
                          "Reproduce the scenario's WAN links with the transport's own shaper (turn "
                          "off when the DCs really are far apart).")
    connect_timeout_s: float = setting(Duration(positive=True), "30s",
                                       "How long a node retries reaching a peer that is not up yet.",
                                       key="connect_timeout")


@dataclass(frozen=True)
class SecurityConfig(_Section):
    """Who may join the job: a shared-secret handshake and TLS (real runtime only).

    The secret itself never goes in this file: `secret_env` names the environment variable
    that holds it. Relative certificate paths are read next to the scenario file when they
    exist there, else from the working directory.
    """

    secret_env: str = setting(Text(_ENV_NAME, "an environment variable name"), "GEOMX_SECRET",
                              "Environment variable holding the shared secret (HMAC handshake); "
                              "unset or empty = no authentication.")
    require_secret: bool = setting(Flag(), False,
                                   "Refuse to start a node when the variable named by `secret_env` "
                                   "is unset or empty.")
    tls: bool = setting(Flag(), False, "Encrypt every connection with TLS (needs `tls_cert` and `tls_key`).")
    tls_cert: str = setting(Text(), "", "PEM certificate (chain) each node presents.")
    tls_key: str = setting(Text(), "", "PEM private key of `tls_cert`.")
    tls_ca: str = setting(Text(), "",
                          "PEM CA bundle peers' certificates must chain to; \"\" = the system trust store.")
    tls_verify_clients: bool = setting(Flag(), False,
                                       "Mutual TLS: a node also requires a certificate from the nodes that "
                                       "connect to it (signed by `tls_ca`).")
    tls_check_hostname: bool = setting(Flag(), True,
                                       "Check that a peer's certificate names the address it was dialled at.")


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
    training: TrainingConfig = _section("training", TrainingConfig)
    sync: SyncConfig = _section("sync", SyncConfig)
    codec: CodecConfig = _section("codec", CodecConfig)
    sched: SchedConfig = _section("sched", SchedConfig)
    metrics: MetricsConfig = _section("metrics", MetricsConfig)
    membership: MembershipConfig = _section("membership", MembershipConfig)
    faults: tuple[FaultConfig, ...] = _section("fault", FaultConfig, array=True, default=())
    real: RealConfig = _section("real", RealConfig)
    security: SecurityConfig = _section("security", SecurityConfig)
    source: str = dataclasses.field(default="<defaults>", compare=False)

    def __post_init__(self) -> None:
        for spec in sections():
            if spec.array and isinstance(getattr(self, spec.attr), list):
                object.__setattr__(self, spec.attr, tuple(getattr(self, spec.attr)))

    @property
    def central_dc(self) -> DCConfig:
        """The DC that hosts the global scheduler, the global servers and the master worker."""
        return next(dc for dc in self.dcs if dc.central)

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
        raise KeyError(f"no DC named {name!r}; DCs: {_quote_list(d.name for d in self.dcs)}")

    def wan_between(self, a: str, b: str) -> WanConfig | None:
        """The direct link joining DCs ``a`` and ``b`` (either order), or None."""
        for wan in self.wans:
            if {wan.a, wan.b} == {a, b}:
                return wan
        return None

    def to_dict(self) -> dict[str, Any]:
        return scenario_to_dict(self)

    def to_toml(self) -> str:
        return scenario_to_toml(self)


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


def _section_by_key() -> dict[str, SectionSpec]:
    return {s.key: s for s in sections()}


# ============================================================================ parsing

def _parse_table(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"expected a table, got {_type_name(raw)} {_show(raw)}", path=path, value=raw)
    table = _setting_by_key(cls)
    for key in raw:
        if key not in table:
            hint = _did_you_mean(key, table)
            raise ScenarioError(f"unknown key {key!r}{hint}; allowed keys: {', '.join(table)}",
                                path=path, value=key, allowed=", ".join(table))
    values = {}
    for row in table.values():
        if row.key in raw:
            values[row.attr] = row.kind.parse(raw[row.key], f"{path}.{row.key}")
        elif row.required:
            raise ScenarioError(f"missing required key {row.key!r} ({row.doc.rstrip('.')})",
                                path=path, allowed=row.kind.allowed())
    obj = cls(**values)
    check = getattr(obj, "_check", None)
    if check is not None:
        check(path)
    return obj


def _resolve_relative(path_text: str, base_dir: Path | None) -> str:
    """Relative paths in a scenario file mean "next to the file" when that exists."""
    if not path_text or base_dir is None or os.path.isabs(path_text):
        return path_text
    candidate = base_dir / path_text
    return str(candidate.resolve()) if candidate.exists() else path_text


def parse_scenario(raw: Mapping[str, Any], source: str = "<string>") -> Scenario:
    """Validate a scenario given as a dict (the shape ``tomllib`` returns).

    Raises :class:`ScenarioError` naming ``source`` and the field path. ``source`` is also
    used to resolve relative file paths when it names an existing file.
    """
    try:
        return _parse(raw, source)
    except ScenarioError as exc:
        raise exc.with_source(source) from None


def _parse(raw: Mapping[str, Any], source: str) -> Scenario:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"expected a table of sections, got {_type_name(raw)}")
    by_key = _section_by_key()
    for key in raw:
        if key not in by_key:
            hint = _did_you_mean(key, by_key)
            raise ScenarioError(f"unknown section [{key}]{hint}; allowed sections: {', '.join(by_key)}",
                                value=key, allowed=", ".join(by_key))
    security = raw.get("security")
    if isinstance(security, Mapping) and "secret" in security:
        raise ScenarioError("a secret never goes in the scenario file; put it in the environment "
                            "variable named by secret_env (default GEOMX_SECRET); allowed keys: "
                            + ", ".join(_setting_by_key(SecurityConfig)),
                            path="security.secret", allowed="secret_env")
    base_dir = Path(source).parent if source and os.path.isfile(source) else None
    values: dict[str, Any] = {}
    for spec in sections():
        if spec.key not in raw:
            if spec.array and spec.key == "wan" and "dc" in raw:
                values[spec.attr] = ()  # own DCs but no links: the connectivity check explains
            continue
        value = raw[spec.key]
        if spec.array:
            if isinstance(value, Mapping):
                raise ScenarioError(f"expected an array of tables ([[{spec.key}]]), got a single table",
                                    path=spec.key)
            if not isinstance(value, list):
                raise ScenarioError(f"expected an array of tables ([[{spec.key}]]), got {_type_name(value)}",
                                    path=spec.key, value=value)
            values[spec.attr] = tuple(_parse_table(spec.cls, item, f"{spec.key}[{i}]")
                                      for i, item in enumerate(value))
        else:
            if isinstance(value, list):
                raise ScenarioError(f"expected one table ([{spec.key}]), got an array of tables", path=spec.key)
            values[spec.attr] = _parse_table(spec.cls, value, spec.key)
    scenario = Scenario(**values, source=source)
    scenario = _resolve_paths(scenario, base_dir)
    for check in SCENARIO_CHECKS:
        check(scenario)
    return scenario


def _resolve_paths(s: Scenario, base_dir: Path | None) -> Scenario:
    if base_dir is None:
        return s
    wans = tuple(w if w.trace in ("", "uniform")
                 else dataclasses.replace(w, trace=_resolve_relative(w.trace, base_dir)) for w in s.wans)
    training = dataclasses.replace(s.training, data_path=_resolve_relative(s.training.data_path, base_dir))
    sec = s.security
    security = dataclasses.replace(sec, tls_cert=_resolve_relative(sec.tls_cert, base_dir),
                                   tls_key=_resolve_relative(sec.tls_key, base_dir),
                                   tls_ca=_resolve_relative(sec.tls_ca, base_dir))
    return dataclasses.replace(s, wans=wans, training=training, security=security)


# ---------------------------------------------------------------- whole-scenario checks

SCENARIO_CHECKS: list[Callable[[Scenario], None]] = []
"""Checks that need more than one section; each raises :class:`ScenarioError`. Other
modules may append their own (e.g. a [security] section's)."""


def scenario_check(fn: Callable[[Scenario], None]) -> Callable[[Scenario], None]:
    SCENARIO_CHECKS.append(fn)
    return fn


@scenario_check
def _check_dcs(s: Scenario) -> None:
    if not s.dcs:
        raise ScenarioError("no [[dc]] given; allowed: one central DC and at least one party DC", path="dc")
    seen: dict[str, int] = {}
    for i, dc in enumerate(s.dcs):
        if dc.name in seen:
            raise ScenarioError(f"duplicate DC name {dc.name!r} (also dc[{seen[dc.name]}]); "
                                f"allowed: unique names", path=f"dc[{i}].name", value=dc.name)
        seen[dc.name] = i
    central = [i for i, dc in enumerate(s.dcs) if dc.central]
    names = _quote_list(dc.name for dc in s.dcs)
    if not central:
        raise ScenarioError(f"no central DC among {names}; allowed: exactly one DC with central = true",
                            path="dc", allowed="exactly one DC with central = true")
    if len(central) > 1:
        first, second = central[:2]
        raise ScenarioError(
            f"two central DCs, {s.dcs[first].name!r} (dc[{first}]) and {s.dcs[second].name!r} "
            f"(dc[{second}]); allowed: exactly one DC with central = true",
            path=f"dc[{second}].central", value=True, allowed="exactly one DC with central = true")
    if not s.party_dcs:
        raise ScenarioError("only the central DC is given; allowed: at least one non-central DC with workers",
                            path="dc")
    for i, dc in enumerate(s.dcs):
        if dc.central and dc.workers != 0:
            raise ScenarioError(f"the central DC {dc.name!r} has {dc.workers} workers; allowed: 0 "
                                f"(workers in the central DC are not supported yet)",
                                path=f"dc[{i}].workers", value=dc.workers, allowed="0")
        if not dc.central and dc.workers < 1:
            raise ScenarioError(f"party DC {dc.name!r} has no workers; allowed: an integer >= 1",
                                path=f"dc[{i}].workers", value=dc.workers, allowed="an integer >= 1")
        if not dc.central and dc.global_servers != 1:
            raise ScenarioError(f"only the central DC hosts global servers; set global_servers on "
                                f"{s.central_dc.name!r} instead; allowed: 1 (the default) on party DCs",
                                path=f"dc[{i}].global_servers", value=dc.global_servers, allowed="1")


@scenario_check
def _check_wans(s: Scenario) -> None:
    names = [dc.name for dc in s.dcs]
    pairs: dict[frozenset, int] = {}
    for i, wan in enumerate(s.wans):
        for end in ("a", "b"):
            name = getattr(wan, end)
            if name not in names:
                raise ScenarioError(
                    f"unknown DC {name!r}{_did_you_mean(name, names)}; allowed: {_quote_list(names)}",
                    path=f"wan[{i}].{end}", value=name, allowed=_quote_list(names))
        pair = frozenset((wan.a, wan.b))
        if pair in pairs:
            raise ScenarioError(f"a second link between {wan.a!r} and {wan.b!r} (also wan[{pairs[pair]}]); "
                                f"allowed: one [[wan]] per pair (use bandwidth_ba for asymmetric links)",
                                path=f"wan[{i}]")
        pairs[pair] = i
        if wan.trace not in ("", "uniform") and not os.path.isfile(wan.trace):
            raise ScenarioError(f"trace file {wan.trace!r} not found; allowed: \"\", \"uniform\" "
                                f"or the path of a CSV file of time_s,bandwidth rows",
                                path=f"wan[{i}].trace", value=wan.trace)
    # Every DC must reach the central one over WAN links (possibly through other DCs).
    neighbours: dict[str, set[str]] = {n: set() for n in names}
    for wan in s.wans:
        neighbours[wan.a].add(wan.b)
        neighbours[wan.b].add(wan.a)
    centre = s.central_dc.name
    reached, frontier = {centre}, [centre]
    while frontier:
        for nxt in neighbours[frontier.pop()] - reached:
            reached.add(nxt)
            frontier.append(nxt)
    cut = [n for n in names if n not in reached]
    if cut:
        raise ScenarioError(
            f"DC {cut[0]!r} is not connected to the central DC {centre!r}; add a [[wan]] with "
            f"a = {cut[0]!r}, b = {centre!r}; allowed: a WAN graph that joins every DC to the central one",
            path="wan", value=cut[0])


@scenario_check
def _check_run(s: Scenario) -> None:
    r = s.run
    limits = [r.iterations, r.epochs, r.target_accuracy, r.max_wall_time_s]
    if r.runtime == "emu":
        limits.append(r.max_emulated_time_s)
    if not any(limits):
        raise ScenarioError(
            "no stop condition: the run would never end; allowed: set one of iterations, epochs, "
            "target_accuracy, max_wall_time" + (", max_emulated_time" if r.runtime == "emu" else ""),
            path="run.iterations", value=r.iterations)
    if r.runtime == "real" and s.training.model == "phantom":
        raise ScenarioError("the real runtime cannot run phantom models (they have no data); "
                            f"allowed with runtime = 'real': {_quote_list(m for m in _MODELS if m != 'phantom')}",
                            path="training.model", value="phantom")


@scenario_check
def _check_faults(s: Scenario) -> None:
    if not s.faults:
        return
    from geomx.cluster import plan_job

    nodes = plan_job(s).nodes
    for i, f in enumerate(s.faults):
        if f.node not in nodes:
            raise ScenarioError(f"unknown node {f.node!r}{_did_you_mean(f.node, nodes)}; "
                                f"allowed: {_quote_list(nodes)}", path=f"fault[{i}].node",
                                value=f.node, allowed=_quote_list(nodes))


@scenario_check
def _check_membership(s: Scenario) -> None:
    m = s.membership
    if m.heartbeat_interval_s > 0 and m.heartbeat_timeout_s <= m.heartbeat_interval_s:
        raise ScenarioError(
            f"heartbeat_timeout ({m.heartbeat_timeout_s:g}s) must exceed heartbeat_interval "
            f"({m.heartbeat_interval_s:g}s); allowed: a timeout of several intervals",
            path="membership.heartbeat_timeout", value=m.heartbeat_timeout_s)


@scenario_check
def _check_sync(s: Scenario) -> None:
    if s.training.mode == "flat_ps" and s.sync.algorithm not in ("fsa", "mixed"):
        raise ScenarioError(
            f"{s.sync.algorithm!r} needs local servers, which training.mode = 'flat_ps' does not have; "
            "allowed with flat_ps: 'fsa', 'mixed'",
            path="sync.algorithm", value=s.sync.algorithm, allowed="'fsa', 'mixed'")
    if s.sync.algorithm == "mixed" and s.training.optimizer == "none":
        # GeoMX hits a check failure mid-run here (geomx-behaviour.md §6, bug 12)
        allowed = _quote_list(o for o in _SERVER_OPTIMIZERS if o != "none")
        raise ScenarioError(
            "sync.algorithm = 'mixed' applies each DC's push as its own global step and needs a "
            f"global optimizer, got 'none'; allowed: {allowed}",
            path="training.optimizer", value="none", allowed=allowed)
    if s.sync.algorithm in ("hfa", "esync") and s.training.worker_optimizer == "none":
        allowed = _quote_list(o for o in _WORKER_OPTIMIZERS if o != "none")
        raise ScenarioError(
            f"sync.algorithm = {s.sync.algorithm!r} takes local steps on the workers, which need "
            f"an optimizer, got 'none'; allowed: {allowed}",
            path="training.worker_optimizer", value="none", allowed=allowed)



@scenario_check
def _check_dgt(s: Scenario) -> None:
    if s.sched.dgt == "off":
        return
    if s.training.mode == "flat_ps":
        raise ScenarioError(
            f"sched.dgt = {s.sched.dgt!r} acts on local -> global server pushes, which "
            "training.mode = 'flat_ps' does not have; allowed with flat_ps: 'off'",
            path="sched.dgt", value=s.sched.dgt, allowed="'off'")
    if s.training.model == "phantom":
        raise ScenarioError(
            f"sched.dgt = {s.sched.dgt!r} ranks blocks by their gradient values, which a phantom "
            "model does not have; allowed with DGT: a real model", path="training.model",
            value="phantom", allowed="'softmax', 'mlp', 'cnn'")
    if s.codec.type not in DGT_CODECS:
        # a sparse or 1-bit payload has no fixed-size blocks to rank and drop
        raise ScenarioError(
            f"sched.dgt = {s.sched.dgt!r} cuts dense values into blocks and does not compose "
            f"with codec.type = {s.codec.type!r}; allowed with DGT: {_quote_list(DGT_CODECS)}",
            path="codec.type", value=s.codec.type, allowed=_quote_list(DGT_CODECS))


DGT_CODECS = ("none", "fp16", "bf16")


@scenario_check
def _check_real(s: Scenario) -> None:
    r = s.real
    central_i = next(i for i, d in enumerate(s.dcs) if d.central)
    central = s.dcs[central_i]
    if r.global_scheduler and central.scheduler_port:
        port = int(r.global_scheduler.rpartition(":")[2])
        if port != central.scheduler_port:
            raise ScenarioError(
                f"real.global_scheduler = {r.global_scheduler!r} disagrees with the central DC's "
                f"scheduler_port = {central.scheduler_port} (the central DC's scheduler is the global "
                "one); allowed: set only one of them, or the same port",
                path=f"dc[{central_i}].scheduler_port", value=central.scheduler_port)
    if r.global_scheduler and not 0 < int(r.global_scheduler.rpartition(":")[2]) < 65536:
        raise ScenarioError("port out of range; allowed: 'host:port' with a port in 1..65535",
                            path="real.global_scheduler", value=r.global_scheduler)
    if r.port_base and r.port_base + len(s.dcs) > 65535:
        raise ScenarioError(f"port_base + {len(s.dcs)} DCs passes 65535; allowed: a lower port_base",
                            path="real.port_base", value=r.port_base)
    seen: dict[tuple[str, int], int] = {}
    for i, d in enumerate(s.dcs):
        if not d.scheduler_port:
            continue
        key = (d.host, d.scheduler_port)
        if key in seen:
            raise ScenarioError(
                f"port {d.scheduler_port} on host {d.host!r} is also dc[{seen[key]}]'s scheduler port; "
                "allowed: one scheduler per host and port", path=f"dc[{i}].scheduler_port",
                value=d.scheduler_port)
        seen[key] = i

# ============================================================================ overrides

_INDEX_BRACKETS = re.compile(r"\[([^\]]*)\]")


def _override_value(text: str, kind: Kind) -> Any:
    """A TOML value, or the bare text when it is not one (or the setting is textual)."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if kind.textual and not isinstance(value, str):
        return text
    return value


def _default_items(spec: SectionSpec) -> list[dict[str, Any]]:
    return [_table_to_dict(item) for item in getattr(Scenario(), spec.attr)]


def _select_item(items: list, selector: str, spec: SectionSpec, path: str) -> dict:
    if selector.isdigit():
        index = int(selector)
        if index < len(items):
            return items[index]
        raise ScenarioError(f"index {index} is out of range; allowed: 0..{len(items) - 1}"
                            if items else f"there is no [[{spec.key}]] to change", path=path, value=index)
    if spec.key == "dc":
        names = [str(item.get("name")) for item in items]
        if selector in names:
            return items[names.index(selector)]
        raise ScenarioError(f"no DC named {selector!r}{_did_you_mean(selector, names)}; "
                            f"allowed: an index or one of {_quote_list(names)}", path=path, value=selector)
    if spec.key == "wan":
        pairs = [f"{item.get('a')}:{item.get('b')}" for item in items]
        ends = set(selector.split(":"))
        for item in items:
            if len(ends) == 2 and ends == {item.get("a"), item.get("b")}:
                return item
        raise ScenarioError(f"no link {selector!r}; allowed: an index or 'a:b' of {_quote_list(pairs)}",
                            path=path, value=selector)
    raise ScenarioError(f"[[{spec.key}]] items are selected by index; got {selector!r}", path=path)


def apply_override(raw: Mapping[str, Any], assignment: str) -> dict[str, Any]:
    """Return a copy of the raw scenario dict with one ``PATH=VALUE`` assignment applied.

    ``PATH`` is ``section.key`` (``training.lr``), or ``section.SELECTOR.key`` for arrays
    of tables where SELECTOR is an index (``dc.1.workers``, also ``dc[1].workers``), a DC
    name (``dc.party-a.workers``) or, for links, ``a:b`` (``wan.party-a:central.loss``).
    ``VALUE`` is read as a TOML value (``0.05``, ``true``, ``[1, 10]``, ``"x"``), falling
    back to the bare text (``100Mbps``). The value itself is checked by
    :func:`parse_scenario`; an unknown path raises :class:`ScenarioError` here.
    """
    source = f"--set {assignment}"
    try:
        return _apply_override(raw, assignment)
    except ScenarioError as exc:
        raise exc.with_source(source) from None


def _apply_override(raw: Mapping[str, Any], assignment: str) -> dict[str, Any]:
    path_text, sep, value_text = assignment.partition("=")
    path_text = _INDEX_BRACKETS.sub(r".\1", path_text.strip())
    if not sep or not path_text:
        raise ScenarioError("expected PATH=VALUE, e.g. training.lr=0.05 or dc.party-a.workers=4",
                            value=assignment)
    parts = path_text.split(".")
    by_key = _section_by_key()
    spec = by_key.get(parts[0])
    if spec is None:
        raise ScenarioError(f"unknown section {parts[0]!r}{_did_you_mean(parts[0], by_key)}; "
                            f"allowed sections: {', '.join(by_key)}", path=path_text, value=parts[0],
                            allowed=", ".join(by_key))
    table = _setting_by_key(spec.cls)
    expected = 3 if spec.array else 2
    if len(parts) != expected:
        shape = f"{spec.key}.INDEX_OR_NAME.KEY" if spec.array else f"{spec.key}.KEY"
        raise ScenarioError(f"expected a path like {shape}; allowed keys: {', '.join(table)}",
                            path=path_text, allowed=", ".join(table))
    key = parts[-1]
    if key not in table:
        raise ScenarioError(f"unknown key {key!r}{_did_you_mean(key, table)}; "
                            f"allowed keys in [{spec.key}]: {', '.join(table)}",
                            path=path_text, value=key, allowed=", ".join(table))
    value = _override_value(value_text.strip(), table[key].kind)
    new = copy.deepcopy(dict(raw))
    if spec.array:
        if spec.key not in new:
            # The default topology becomes explicit so that it can be edited.
            if spec.key == "dc" or "dc" not in new:
                for other in sections():
                    if other.array and other.key not in new:
                        new[other.key] = _default_items(other)
            else:
                new[spec.key] = []
        items = new[spec.key]
        if not isinstance(items, list):
            raise ScenarioError(f"expected an array of tables ([[{spec.key}]])", path=spec.key)
        target = _select_item(items, parts[1], spec, path_text)
        if not isinstance(target, dict):
            raise ScenarioError("expected a table", path=f"{spec.key}[{parts[1]}]")
        target[key] = value
    else:
        section = new.setdefault(spec.key, {})
        if not isinstance(section, dict):
            raise ScenarioError(f"expected a table ([{spec.key}])", path=spec.key)
        section[key] = value
    return new


def override_scenario(scenario: Scenario, overrides: Iterable[str]) -> Scenario:
    """A new, validated Scenario with ``--set`` style overrides applied to ``scenario``."""
    raw = scenario_to_dict(scenario)
    for assignment in overrides:
        raw = apply_override(raw, assignment)
    return parse_scenario(raw, source=scenario.source)


def load_scenario(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Scenario:
    """Read, override and validate a scenario file."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ScenarioError("scenario file not found", source=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"not valid TOML: {exc}", source=path) from None
    for assignment in overrides:
        raw = apply_override(raw, assignment)
    return parse_scenario(raw, source=path)


# ============================================================================ emitting

def _table_to_dict(obj: Any) -> dict[str, Any]:
    return {row.key: row.kind.emit(getattr(obj, row.attr)) for row in settings_of(type(obj))}


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """The resolved scenario as TOML-ready data: every key, units written readably."""
    out: dict[str, Any] = {}
    for spec in sections():
        value = getattr(s, spec.attr)
        out[spec.key] = [_table_to_dict(v) for v in value] if spec.array else _table_to_dict(value)
    return out


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    """A TOML literal for a scalar or an array of scalars (all the emitter needs)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest text that reads back to the same float; valid TOML
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_dumps(data: Mapping[str, Any]) -> str:
    """Tables of scalars and arrays of such tables: the shape of a scenario file."""
    lines: list[str] = []
    for name, body in data.items():
        if isinstance(body, Mapping):
            tables = [(f"[{_toml_key(name)}]", body)]
        elif isinstance(body, list) and all(isinstance(item, Mapping) for item in body):
            tables = [(f"[[{_toml_key(name)}]]", item) for item in body]
        else:
            raise TypeError(f"top-level {name!r} must be a table or an array of tables")
        for header, table in tables:
            if lines:
                lines.append("")
            lines.append(header)
            width = max((len(_toml_key(k)) for k in table), default=0)
            for key, value in table.items():
                lines.append(f"{_toml_key(key).ljust(width)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def scenario_to_toml(s: Scenario) -> str:
    """The resolved scenario as TOML text; ``parse_scenario(tomllib.loads(text)) == s``."""
    header = (f"# geomx scenario, resolved from {s.source}: every setting, defaults included.\n"
              f"# Reference: docs/scenario.md\n\n")
    return header + _toml_dumps(scenario_to_dict(s))


# ============================================================================ reference docs

DOC_BEGIN = "<!-- BEGIN GENERATED FIELD REFERENCE (python -m geomx.scenario --write-docs docs/scenario.md) -->"
DOC_END = "<!-- END GENERATED FIELD REFERENCE -->"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """Markdown tables of every section and setting (the generated part of docs/scenario.md)."""
    out: list[str] = []
    for spec in sections():
        header = f"[[{spec.key}]]" if spec.array else f"[{spec.key}]"
        out.append(f"### `{header}`")
        out.append("")
        doc = " ".join((spec.cls.__doc__ or "").split())
        if doc:
            out.append(doc)
            out.append("")
        out.append("| key | type | default | unit | meaning | allowed |")
        out.append("|---|---|---|---|---|---|")
        for row in settings_of(spec.cls):
            attr = f" (`{row.attr}`)" if row.attr != row.key else ""
            out.append(
                f"| `{row.key}`{attr} | {row.kind.type_name} | {_md_cell(row.default_text())} "
                f"| {row.kind.unit} | {_md_cell(row.doc)} | {_md_cell(row.kind.doc_allowed())} |")
        out.append("")
    return "\n".join(out)


def write_reference(doc_path: str | os.PathLike) -> None:
    """Replace the generated part of ``doc_path`` (between the markers) with :func:`reference_markdown`."""
    text = Path(doc_path).read_text(encoding="utf-8")
    start, end = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    Path(doc_path).write_text(text[:start] + "\n\n" + reference_markdown() + "\n" + text[end:], encoding="utf-8")


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m geomx.scenario",
                                     description="Print a resolved scenario, or regenerate docs/scenario.md.")
    parser.add_argument("scenario", nargs="?", help="scenario TOML file (omit for the default scenario)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--write-docs", metavar="MD", help="regenerate the field reference in this file")
    args = parser.parse_args(argv)
    if args.write_docs:
        write_reference(args.write_docs)
        return 0
    try:
        if args.scenario:
            s = load_scenario(args.scenario, args.overrides)
        else:
            s = override_scenario(Scenario(), args.overrides)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(scenario_to_toml(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
