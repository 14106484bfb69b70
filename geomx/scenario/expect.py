"""``[expect]``: what the run's figures must be for ``geomx run`` to exit 0 (docs/ci.md).

One key per scalar of ``summary.json`` (the same names), each a condition written as
``OP VALUE`` in the figure's unit, as quantities are written elsewhere in a scenario::

    [expect]
    final_accuracy = ">= 0.93"
    time_to_target_s = "<= 6s"
    bytes_wan = "<= 2MB"
    also = ["bytes_per_dc_pair.party-a->central <= 1MB", "extra.final_eval.loss < 0.6"]

The run itself ignores the table; ``geomx run`` checks it (with any ``--expect``) against
the summary when the job ends (:mod:`geomx.expect`), and the pytest plugin
(geomx/testing) does too. An empty condition (the default) checks nothing, and keys left
at their default are not written to a run folder's ``scenario.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from geomx.expect import (FIGURES, OPERATORS, Expectation, ExpectationError,
                                  parse_condition, parse_expectation)
from geomx.scenario.kinds import Kind, ListOf, Section, setting

__all__ = ["ExpectConfig", "Condition", "ExpressionText"]

_UNIT_WORDS = {"fraction": "fraction", "seconds": "s", "bytes": "bytes", "count": "count",
               "number": ""}
_EXAMPLE_BOUNDS = {"fraction": "0.93", "seconds": "6s", "bytes": "2MB", "count": "100",
                   "number": "0.5"}


class Condition(Kind):
    """``"OP VALUE"`` for one figure (``">= 0.93"``, ``"<= 2MB"``), or ``""`` for none."""

    type_name = "condition"
    textual = True

    def __init__(self, figure: str):
        self.figure = figure
        self.unit = _UNIT_WORDS[FIGURES[figure].unit]

    def example(self) -> str:
        figure = FIGURES[self.figure]
        op = "<=" if figure.better == "lower" else ">="
        return f'"{op} {_EXAMPLE_BOUNDS[figure.unit]}"'

    def allowed(self) -> str:
        return (f"'' or an operator ({' '.join(OPERATORS)}) and a value, e.g. "
                f"{self.example()}")

    def doc_allowed(self) -> str:
        return f"`{' '.join(OPERATORS)}` and a value, e.g. `{self.example()}`"

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self.wrong_type(path, value)
        if value.strip():
            try:
                parse_condition(self.figure, value)
            except ExpectationError as e:
                raise self.fail(path, value, str(e)) from None
        return value.strip()


class ExpressionText(Kind):
    """A whole expectation, ``"FIGURE OP VALUE"``, for figures inside summary.json's
    tables (``bytes_per_link``, ``bytes_per_dc_pair``, ``extra``)."""

    type_name = "expectation"
    textual = True

    def allowed(self) -> str:
        return "FIGURE OP VALUE, e.g. 'bytes_per_dc_pair.party-a->central <= 1MB'"

    def doc_allowed(self) -> str:
        return "`FIGURE OP VALUE`, e.g. `\"extra.final_eval.loss < 0.6\"`"

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self.wrong_type(path, value)
        try:
            parse_expectation(value)
        except ExpectationError as e:
            raise self.fail(path, value, str(e)) from None
        return value.strip()


def _condition(figure: str, doc: str) -> Any:
    return setting(Condition(figure), "", doc)


@dataclass(frozen=True)
class ExpectConfig(Section):
    """Conditions on the run's figures (summary.json) that `geomx run` checks when the job
    ends: it exits 3, with one line per failed condition and the measured value, when one
    fails (docs/ci.md). A figure that is null (never reached) fails. Nothing is checked
    by default."""

    #: keys at their default are left out of a written scenario (nothing to check)
    omit_defaults = True

    final_accuracy: str = _condition("final_accuracy", "Final test accuracy.")
    final_loss: str = _condition("final_loss", "Final test loss.")
    iterations: str = _condition("iterations", "Iterations run.")
    emulated_seconds: str = _condition("emulated_seconds",
                                       "Emulated time at the end (null over real sockets).")
    wall_seconds: str = _condition("wall_seconds", "Wall-clock time of the run.")
    bytes_wan: str = _condition("bytes_wan", "Bytes over all WAN links.")
    bytes_lan: str = _condition("bytes_lan", "Bytes over all LAN links.")
    wan_bytes_per_iteration: str = _condition("wan_bytes_per_iteration",
                                              "WAN bytes per iteration.")
    messages: str = _condition("messages", "Messages sent.")
    seed: str = _condition("seed", "The run's seed.")
    time_to_target_s: str = _condition(
        "time_to_target_s", "Runtime-clock time at which `run.target_accuracy` was first "
                            "reached (null, so failing, when it was not).")
    target_accuracy: str = _condition("target_accuracy", "The target accuracy of the run.")
    also: tuple[str, ...] = setting(
        ListOf(ExpressionText()), [],
        "Expectations on entries of summary.json's tables: `bytes_per_link.<link>`, "
        "`bytes_per_dc_pair.<pair>`, `extra.<key>[.<key>...]`.")

    def expectations(self) -> list[Expectation]:
        """Every condition set here, in table order."""
        out = [parse_condition(name, getattr(self, name)) for name in FIGURES
               if getattr(self, name)]
        return out + [parse_expectation(text) for text in self.also]
