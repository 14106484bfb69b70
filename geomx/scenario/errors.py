"""The error a scenario raises, and the helpers that make its messages actionable.

:class:`ScenarioError` names the field path as it appears in the file
(``wan[0].bandwidth``), the bad value and what is allowed, with a "did you mean" from
:mod:`difflib` for misspelt keys and enum values. Keys that moved to another section get
an error that says where they went (:func:`geomx.scenario.schema.moved_key_error`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = ["ScenarioError", "quote_list", "did_you_mean", "show_value", "type_name_of"]


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


def quote_list(options: Iterable[str]) -> str:
    return ", ".join(repr(o) for o in options)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def show_value(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value!r}"


def type_name_of(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)
