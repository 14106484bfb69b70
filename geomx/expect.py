"""Expectations on a run's figures, and regressions against a stored run: what a CI job
gates on (docs/ci.md).

An expectation is ``FIGURE OP VALUE``: ``final_accuracy >= 0.93``, ``time_to_target_s <= 6s``,
``bytes_wan <= 2MB``. ``FIGURE`` is a scalar of ``summary.json`` (:data:`FIGURES`), or one
entry of its tables (``bytes_per_dc_pair.party-a->central``, ``extra.final_eval.loss``);
``OP`` is one of ``>= <= > < ==``; ``VALUE`` is written in the figure's unit as a scenario
writes quantities (:mod:`geomx.units`): a fraction (``0.93``, ``93%``), a duration
(``6``, ``6s``, ``500ms``), a size (``2MB``, ``1.5MiB``, bytes when bare), a count
(``40``, ``1.2k``) or a plain number.

The same checks come from ``geomx run --expect``, a scenario's ``[expect]`` table
(geomx/scenario/expect.py) and the pytest plugin (geomx/testing); a figure that is null
in the summary (``time_to_target_s`` when the target was never reached, emulated time over
real sockets) fails its expectation as "not reached".

:func:`regressions` compares a run with a baseline run figure by figure, each in its own
good direction (:attr:`Figure.better`: accuracy up, times and bytes down), within a
relative tolerance.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geomx import units

__all__ = ["EXIT_EXPECTATION", "Figure", "FIGURES", "TABLE_FIGURES", "OPERATORS", "Expectation", "Outcome",
           "ExpectationError", "parse_expectation", "parse_condition", "figure_of", "lookup",
           "check_expectations", "format_outcome", "parse_tolerance", "regressions",
           "REGRESSION_FIGURES", "format_value"]


#: Exit status of `geomx run` when an expectation fails and of `geomx compare --baseline`
#: when a figure regressed (docs/ci.md): distinct from 1 (the job failed) and 2 (bad input).
EXIT_EXPECTATION = 3


class ExpectationError(ValueError):
    """An expectation that cannot be read: an unknown figure, operator or value (one line)."""


@dataclass(frozen=True)
class Figure:
    """A figure of ``summary.json``: its unit (how a bound is written) and which way is
    better (``"higher"``, ``"lower"``, or ``""`` where neither is)."""

    name: str
    unit: str
    better: str = ""


#: The scalars of summary.json (geomx/metrics/summary.py, :class:`Summary`), in its order.
FIGURES: dict[str, Figure] = {f.name: f for f in (
    Figure("final_accuracy", "fraction", "higher"),
    Figure("final_loss", "number", "lower"),
    Figure("iterations", "count"),
    Figure("emulated_seconds", "seconds", "lower"),
    Figure("wall_seconds", "seconds", "lower"),
    Figure("bytes_wan", "bytes", "lower"),
    Figure("bytes_lan", "bytes", "lower"),
    Figure("wan_bytes_per_iteration", "bytes", "lower"),
    Figure("messages", "count", "lower"),
    Figure("seed", "count"),
    Figure("time_to_target_s", "seconds", "lower"),
    Figure("target_accuracy", "fraction"),
)}

#: The tables of summary.json whose entries are figures too, named ``TABLE.KEY``.
TABLE_FIGURES: dict[str, str] = {"bytes_per_link": "<link>", "bytes_per_dc_pair": "<pair>",
                                 "extra": "<key>[.<key>...]"}

#: What a regression check compares by default: the figures an emulated run reproduces
#: exactly (wall time varies from run to run; name it with ``--figure`` to gate it).
REGRESSION_FIGURES = ("final_accuracy", "time_to_target_s", "bytes_wan", "emulated_seconds")

#: Comparison operators, longest first (so ``>=`` is not read as ``>``).
OPERATORS = (">=", "<=", "==", ">", "<")

_UNIT_EXAMPLES = {
    "fraction": "a fraction such as 0.93 or 93%",
    "seconds": "a duration such as 6, 6s or 500ms",
    "bytes": "a size such as 2MB, 1.5MiB or a number of bytes",
    "count": "a count such as 40 or 1.2k",
    "number": "a number such as 0.5",
}

_EXPRESSION = re.compile(r"^\s*(?P<figure>.*\S)\s*(?P<op>>=|<=|==|>|<)\s*(?P<value>[^<>=]*?)\s*$")


def _allowed_names() -> list[str]:
    return [*FIGURES, *(f"{t}.{k}" for t, k in TABLE_FIGURES.items())]


def figure_of(name: str) -> Figure:
    """The :class:`Figure` called ``name``; an entry of a table (``extra.x_s``) takes its
    unit from its name (``_s``/``seconds``: seconds, ``bytes``: bytes, ``accuracy``:
    fraction, else a plain number). Raises :class:`ExpectationError` naming close matches
    and every allowed figure."""
    if name in FIGURES:
        return FIGURES[name]
    head, dot, rest = name.partition(".")
    if head in TABLE_FIGURES and dot and rest:
        if head != "extra":
            return Figure(name, "bytes", "lower")
        leaf = rest.rsplit(".", 1)[-1]
        if leaf.endswith("_s") or "seconds" in leaf:
            return Figure(name, "seconds")
        if "bytes" in leaf:
            return Figure(name, "bytes")
        if "accuracy" in leaf:
            return Figure(name, "fraction")
        return Figure(name, "number")
    if head in TABLE_FIGURES:
        raise ExpectationError(f"{name!r} is a table of figures; name one of its entries: "
                               f"{head}.{TABLE_FIGURES[head]}")
    close = difflib.get_close_matches(name, [*FIGURES, *TABLE_FIGURES], n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise ExpectationError(f"unknown figure {name!r}{hint}; figures: "
                           f"{', '.join(_allowed_names())}")


def _parse_bound(figure: Figure, text: str) -> float:
    """The bound ``text`` in the figure's base unit (fraction, seconds, bytes, count)."""
    try:
        if figure.unit == "fraction":
            return units.parse_fraction(text)
        if figure.unit == "seconds":
            return units.parse_seconds(text)
        if figure.unit == "bytes":
            return float(units.parse_size(text))
        if figure.unit == "count":
            return float(units.parse_count(text))
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(f"{text!r} is not a finite number")
        return number
    except ValueError as e:
        raise ExpectationError(f"{figure.name}: bound {text!r}: expected "
                               f"{_UNIT_EXAMPLES[figure.unit]} ({e})") from None


@dataclass(frozen=True)
class Expectation:
    """``figure op bound``; ``text`` is how it was written (shown in every message)."""

    figure: str
    op: str
    bound: float
    text: str

    def holds(self, value: float) -> bool:
        return {">=": value >= self.bound, "<=": value <= self.bound, "==": value == self.bound,
                ">": value > self.bound, "<": value < self.bound}[self.op]


def parse_condition(figure: str, condition: str) -> Expectation:
    """``figure`` with a condition as an ``[expect]`` table writes it: ``">= 0.93"``."""
    if not isinstance(condition, str):
        raise ExpectationError(f"{figure}: expected a condition text such as '>= 0.93' or "
                               f"'<= 2MB', got {condition!r}")
    return parse_expectation(f"{figure} {condition}")


def parse_expectation(text: str) -> Expectation:
    """``"final_accuracy >= 0.93"`` -> :class:`Expectation`; raises
    :class:`ExpectationError` with one line that names what is wrong and what is allowed."""
    match = _EXPRESSION.match(text)
    if not match:
        raise ExpectationError(f"{text!r}: expected FIGURE OP VALUE, e.g. 'final_accuracy >= "
                               f"0.93', 'bytes_wan <= 2MB'; operators: {' '.join(OPERATORS)}")
    name, op, value = match.group("figure").strip(), match.group("op"), match.group("value")
    if not value:
        raise ExpectationError(f"{text!r}: no value after {op!r}")
    if name[-1] in "=<>!":
        raise ExpectationError(f"{text!r}: unknown operator; operators: {' '.join(OPERATORS)}")
    figure = figure_of(name)
    return Expectation(name, op, _parse_bound(figure, value), f"{name} {op} {value}")


def lookup(summary: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """(present, value) of figure ``name`` in a summary dict (summary.json's shape)."""
    if name in summary:
        return True, summary[name]
    head, _, rest = name.partition(".")
    node = summary.get(head)
    if head == "extra":
        for part in rest.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return False, None
            node = node[part]
        return True, node
    if isinstance(node, Mapping) and rest in node:
        return True, node[rest]
    return False, None


def format_value(figure: Figure, value: Any) -> str:
    """A measured value in its unit, readable: ``3.29 MB (3289968 B)``, ``5.45 s``."""
    if value is None:
        return "null"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    if figure.unit == "bytes":
        return f"{value / 1e6:.3g} MB ({value:.0f} B)" if value >= 1e4 else f"{value:.0f} B"
    if figure.unit == "seconds":
        return f"{value:.4g} s"
    if figure.unit == "count":
        return f"{value:.0f}"
    return f"{value:.6g}"


@dataclass(frozen=True)
class Outcome:
    """One checked expectation: whether it ``held``, the ``measured`` value and why not."""

    expectation: Expectation
    held: bool
    measured: Any
    reason: str = ""


def check_expectations(expectations: Iterable[Expectation],
                       summary: Mapping[str, Any]) -> list[Outcome]:
    """Each expectation against ``summary`` (summary.json as a dict), in order."""
    out = []
    for e in expectations:
        present, value = lookup(summary, e.figure)
        if not present:
            head = e.figure.partition(".")[0]
            table = summary.get(head)
            keys = ", ".join(sorted(table)) if isinstance(table, Mapping) else ""
            out.append(Outcome(e, False, None, "no such figure in summary.json"
                               + (f" ({head} has: {keys})" if keys else "")))
        elif value is None and e.figure == "emulated_seconds" and summary.get("runtime") == "real":
            out.append(Outcome(e, False, None, "not reached: the real runtime has no "
                                               "emulated time (null in summary.json)"))
        elif value is None:
            out.append(Outcome(e, False, None, "not reached (null in summary.json)"))
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            out.append(Outcome(e, False, value, "not a number"))
        else:
            out.append(Outcome(e, e.holds(float(value)), value))
    return out


def format_outcome(outcome: Outcome) -> str:
    """``ok   final_accuracy >= 0.93: measured 0.9415`` or
    ``FAIL bytes_wan <= 2MB: measured 3.29 MB (3289968 B)``."""
    e = outcome.expectation
    status = "ok  " if outcome.held else "FAIL"
    if outcome.reason:
        return f"{status} {e.text}: {outcome.reason}"
    return f"{status} {e.text}: measured {format_value(figure_of(e.figure), outcome.measured)}"


def parse_tolerance(text: str | float, what: str = "--max-regression") -> float:
    """``"5%"`` -> 0.05, ``"0.05"`` -> 0.05; any non-negative amount (``"150%"`` too)."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ExpectationError(f"{what} {text!r}: expected a non-negative percentage such as "
                               f"5% (or a fraction such as 0.05)")
    return value


@dataclass(frozen=True)
class Regression:
    """One figure of a run against the baseline's: the limit it had to stay within."""

    figure: str
    baseline: float
    limit: float
    measured: Any
    held: bool
    reason: str = ""

    def line(self, tolerance: float) -> str:
        f = figure_of(self.figure)
        word = "at least" if f.better == "higher" else "at most"
        status = "ok  " if self.held else "FAIL"
        what = self.reason or f"measured {format_value(f, self.measured)}"
        return (f"{status} {self.figure}: {what}, baseline {format_value(f, self.baseline)} "
                f"({f.better} is better; {word} {format_value(f, self.limit)} within "
                f"{tolerance * 100:g}%)")


def regressions(baseline: Mapping[str, Any], current: Mapping[str, Any], tolerance: float,
                figures: Sequence[str] = REGRESSION_FIGURES) -> list[Regression]:
    """Each of ``figures`` of ``current`` against ``baseline`` (summary dicts): a figure
    that is better when higher must stay >= baseline * (1 - tolerance), one better when
    lower <= baseline * (1 + tolerance). A figure null in the baseline is not compared;
    one null now but not in the baseline fails as "not reached"."""
    out = []
    for name in figures:
        f = figure_of(name)
        if not f.better:
            raise ExpectationError(f"{name} has no better direction; figures with one: "
                                   f"{', '.join(n for n, g in FIGURES.items() if g.better)}")
        _, base = lookup(baseline, name)
        if not isinstance(base, (int, float)) or isinstance(base, bool):
            continue
        limit = base * (1 - tolerance) if f.better == "higher" else base * (1 + tolerance)
        _, now = lookup(current, name)
        if now is None:
            out.append(Regression(name, base, limit, None, False, "not reached (null now)"))
            continue
        held = now >= limit if f.better == "higher" else now <= limit
        out.append(Regression(name, base, limit, now, held))
    return out
