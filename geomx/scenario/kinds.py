"""How one setting is read from TOML, checked, written back and documented.

Every setting of a scenario is declared once, as a dataclass field whose metadata
(:func:`setting`) holds its TOML key, its :class:`Kind`, its default as a person would
write it, and its documentation. The parser, the per-field checks, the TOML writer, the
``--set`` resolver and ``docs/scenario.md`` all read that table (:func:`settings_of`),
so they cannot disagree.

Units are converted at parse time into fields whose names carry the unit
(``bandwidth_bps``, ``latency_s``, ``tcp_window_bytes``) while the TOML keys stay short
(``bandwidth = "100Mbps"``); see :mod:`geomx.units`. Every numeric kind refuses
non-finite values (``inf``, ``nan``, ``"1e999s"``): no setting means "infinite", and a
NaN would slip through every range check. Absurdly large ones are refused too, each kind
with a ceiling no real job comes near (:data:`MAX_INTEGER`, :data:`MAX_SECONDS`,
:data:`MAX_BPS`, :data:`MAX_BYTES`): a 10^30-worker DC or a 1e308-second delay is a typo,
and finding out at run time (out of memory, an overflow deep in the emulator) loses work.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

import tomli_w

from geomx import units
from geomx.scenario.errors import ScenarioError, did_you_mean, quote_list, show_value, type_name_of

__all__ = [
    "Kind", "Range", "Text", "Choice", "Flag", "Integer", "Real", "Quantity", "Bandwidth",
    "Duration", "Fraction", "Size", "ListOf", "PolicyName", "OptionsTable", "AUTO", "MISSING",
    "Setting", "setting",
    "settings_of", "setting_by_key", "Section", "toml_literal",
]

MISSING: Any = object()

#: Ceilings of the numeric kinds (a field may set a lower ``max``): integers stay exact in
#: a float64; durations under ~31 years; bandwidths under 1 Pbit/s; sizes under 1 PiB.
MAX_INTEGER = 2**53
MAX_SECONDS = 1e9
MAX_BPS = 1e15
MAX_BYTES = 2**50


def toml_literal(value: Any) -> str:
    """``value`` as it is written in a TOML file, on one line (for docs and messages)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).partition(" = ")[2].rstrip("\n")


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
    #: beyond this magnitude a value is a typo, whatever the field (see the module doc);
    #: not part of the described range, which stays what a person needs to know
    ceiling: float | None = None

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
        return self.fail(path, value, f"expected {self.type_name}, got {type_name_of(value)} {show_value(value)}")

    def check_number(self, number: float, bounds: Range, path: str, value: Any) -> None:
        """Refuse a non-finite ``number`` (parsed from ``value``), then one outside ``bounds``."""
        if not is_finite(number):
            raise self.fail(path, value, f"{show_value(value)} is not a finite number")
        if not bounds.check(number):
            raise self.fail(path, value, f"{show_value(value)} is out of range")
        if self.ceiling is not None and abs(number) > self.ceiling:
            raise self.fail(path, value, f"{show_value(value)} is absurdly large (more than "
                                         f"{self.format_ceiling()}, surely a typo)")

    def format_ceiling(self) -> str:
        return f"{self.ceiling:g}"


def is_finite(number: float) -> bool:
    """False for inf, nan and integers too large for a float (``"1e999MiB"`` as bytes)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Range:
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
        return "one of " + quote_list(self.options)

    def doc_allowed(self) -> str:
        return ", ".join(f'`"{o}"`' for o in self.options)

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self.wrong_type(path, value)
        if value not in self.options:
            hint = did_you_mean(value, self.options)
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

    ceiling = MAX_INTEGER

    def __init__(self, min: int | None = None, max: int | None = None, counts: bool = False):
        self.range = Range(min, max)
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
        if isinstance(value, float) and not math.isfinite(value):
            number = value
        elif isinstance(value, float) and value.is_integer():
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
        self.check_number(number, self.range, path, value)
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
        self.range = Range(min, max, min_open, max_open)

    def allowed(self) -> str:
        bound = self.range.describe()
        return f"a number {bound}" if bound else "a number"

    def doc_allowed(self) -> str:
        return self.range.describe() or "any"

    def parse(self, value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.wrong_type(path, value)
        number = float(value)
        self.check_number(number, self.range, path, value)
        return number


class Quantity(Kind):
    """A number with a unit, converted by a :mod:`geomx.units` parser."""

    examples = ""

    def __init__(self, parser: Callable[[Any], Any], formatter: Callable[[Any], str],
                 fmt_bound: Callable[[Any], str], range: Range, optional: bool = False,
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
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(path, value, f"{show_value(value)} is not a finite number")
        try:
            quantity = self.parser(value)
        except ValueError as exc:
            # geomx.units ends its messages with examples; ours (with the range) replace them.
            raise self.fail(path, value, str(exc).split("; use e.g.")[0]) from None
        self.check_number(quantity, self.range, path, value)
        return quantity

    def emit(self, value: Any) -> Any:
        if value is None:
            return "auto" if self.auto else ""
        return self.formatter(value)

    def format_ceiling(self) -> str:
        return self.fmt_bound(self.ceiling)


class Bandwidth(Quantity):
    ceiling = MAX_BPS
    type_name = "bandwidth"
    unit = "bit/s"
    examples = "a bandwidth like '100Mbps', '1Gbps', '10 Gbit/s', '12.5MB/s' (bytes/s) or a number of bit/s"

    def __init__(self, optional: bool = False):
        super().__init__(units.parse_bandwidth, units.format_bps, units.format_bps,
                         Range(0, None, min_open=True), optional)


class Duration(Quantity):
    ceiling = MAX_SECONDS
    type_name = "duration"
    unit = "s"
    examples = "a duration like '30ms', '250us', '2s', '5min' or a number of seconds"

    def __init__(self, positive: bool = False, auto: bool = False):
        super().__init__(units.parse_seconds, units.format_seconds, units.format_seconds,
                         Range(0, None, min_open=positive), auto=auto)


class Fraction(Quantity):
    type_name = "fraction"
    unit = "fraction"
    examples = "a fraction like '1%', '0.5%' or 0.01"

    def __init__(self, min_open: bool = False, max_open: bool = False, percent: bool = True):
        super().__init__(units.parse_fraction, units.format_fraction if percent else float,
                         units.format_fraction, Range(0.0, 1.0, min_open, max_open))


class Size(Quantity):
    ceiling = MAX_BYTES
    type_name = "size"
    unit = "bytes"
    examples = "a size like '4MiB', '1MB', '64KiB' or a number of bytes"

    def __init__(self, positive: bool = True, max: int | None = None, auto: bool = False):
        super().__init__(units.parse_size, units.format_size, units.format_size,
                         Range(0, max, min_open=positive), auto=auto)

    def emit(self, value: int | None) -> Any:
        if value is None:
            return super().emit(value)
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
        return f"`{toml_literal(self.default)}`"


def setting(kind: Kind, default: Any = MISSING, doc: str = "", *, key: str | None = None,
            default_doc: str | None = None) -> Any:
    """Declare a scenario setting as a dataclass field.

    ``default`` is written as in TOML (``"100Mbps"``); the dataclass default is its parsed
    value. No default makes the setting required. ``key`` is the TOML key when it differs
    from the attribute (``bandwidth_bps`` is written ``bandwidth``).
    """
    meta = {"geomx.setting": (kind, default, doc, key, default_doc)}
    if default is MISSING:
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
                            default=None if default is MISSING else default, doc=doc,
                            required=default is MISSING, default_doc=default_doc))
    return tuple(rows)


def setting_by_key(cls: type) -> dict[str, Setting]:
    return {s.key: s for s in settings_of(cls)}


class Section:
    """Base of the section dataclasses: arrays given as lists (code, not TOML) become
    tuples, so a section built in Python equals the one parsed from a file."""

    def __post_init__(self) -> None:
        for row in settings_of(type(self)):
            value = getattr(self, row.attr)
            if isinstance(row.kind, ListOf) and isinstance(value, list):
                object.__setattr__(self, row.attr, tuple(value))



class PolicyName(Choice):
    """The name of a policy (docs/extending.md): one of the built-in names, or one of
    the user's own -- ``"file.py:Class"`` (next to the scenario file),
    ``"package.module:Class"``, or a plug-in installed in the ``geomx.policies``
    entry-point group. Only the spelling is checked here; whether the class imports and
    its ``[<section>.options]`` fit is checked once the file's folder is known
    (:mod:`geomx.scenario.policies`)."""

    type_name = "policy"

    def __init__(self, policy_kind: str, *builtins: str):
        super().__init__(*builtins)
        self.policy_kind = policy_kind

    def allowed(self) -> str:
        return (super().allowed() + ", 'file.py:Class', 'package.module:Class' or an "
                "installed 'geomx.policies' plug-in name")

    def doc_allowed(self) -> str:
        return (super().doc_allowed() + ', `"file.py:Class"`, `"package.module:Class"`, '
                "a `geomx.policies` plug-in name")

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self.wrong_type(path, value)
        if value in self.options or ":" in value.strip():
            return value
        from geomx.policy.registry import entry_point_names

        if value in entry_point_names():
            return value
        hint = did_you_mean(value, self.options)
        raise self.fail(path, value, f"{value!r} is neither a built-in {self.policy_kind} "
                                     f"policy nor 'file.py:Class'{hint}")


class OptionsTable(Kind):
    """A policy's options sub-table (``[sync.options]``), held as sorted ``(key, value)``
    pairs (arrays as tuples) so the section stays frozen and hashable. Its keys and
    values are checked against the named policy's options dataclass when the scenario
    loads (:func:`geomx.policy.options.options_from_table`)."""

    type_name = "table"

    def allowed(self) -> str:
        return "a table of the policy's options"

    def doc_allowed(self) -> str:
        return "the named policy's options (docs/extending.md)"

    def parse(self, value: Any, path: str) -> tuple[tuple[str, Any], ...]:
        if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
            value = dict(value)
        if not isinstance(value, dict):
            raise self.wrong_type(path, value)
        for k, v in value.items():
            if isinstance(v, dict) or (isinstance(v, list) and any(isinstance(i, dict) for i in v)):
                raise self.fail(f"{path}.{k}", v, "a nested table is not an option value; "
                                "allowed: booleans, numbers, strings and arrays of them")
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))

    def emit(self, value: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
        return {k: _thaw(v) for k, v in value}


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def _thaw(value: Any) -> Any:
    return [_thaw(v) for v in value] if isinstance(value, tuple) else value
