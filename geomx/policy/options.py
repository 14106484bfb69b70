"""A policy's options: a frozen dataclass, filled once from a scenario sub-table.

Every policy class names its options type (``Options = MyOptions``, a frozen dataclass
subclassing :class:`PolicyOptions`). The scenario's sub-table (``[sync.options]``,
``[codec.options]``, ``[sched.options]``, ``[topology.options]``) is checked against that
dataclass exactly once, when the scenario is loaded, by :func:`options_from_table`:
an unknown key, a missing required field or a value of the wrong type is an error that
names the policy, the field and what is allowed, before any node starts. Nodes receive
the built object and never parse a dict again.

Field types understood: ``bool``, ``int``, ``float`` (an integer is accepted), ``str``,
``typing.Literal[...]`` choices, and ``tuple[T, ...]`` / ``list[T]`` of those. Anything
else is passed through unchanged (the policy checks it in ``__post_init__``; a
``ValueError`` raised there is reported with the policy's name, like the checks here).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

__all__ = ["PolicyOptions", "NoOptions", "OptionsError", "options_from_table",
           "options_to_table", "params_from_table"]


class OptionsError(ValueError):
    """A policy's options that cannot be used; the message is one line naming the field."""


@dataclass(frozen=True)
class PolicyOptions:
    """Base of every policy's options dataclass (frozen: options are built once)."""


@dataclass(frozen=True)
class NoOptions(PolicyOptions):
    """The options of a policy that takes none."""


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (tuple, list):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"an array of {_type_name(args[0]) if args else 'values'}"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        for arg in args:
            try:
                return _convert(value, arg, where)
            except OptionsError:
                continue
        raise OptionsError(f"{where} = {value!r}; allowed: "
                           + " or ".join(_type_name(a) for a in args))
    if origin is Literal:
        if value in get_args(tp):
            return value
    elif origin in (tuple, list):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        if isinstance(value, (list, tuple)):
            items = [_convert(v, args[0], f"{where}[{i}]") if args else v
                     for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(float(value)):
                return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise OptionsError(f"{where} = {value!r}; allowed: {_type_name(tp)}")


def options_from_table(cls: type, table: Mapping[str, Any] | None, *, policy: str,
                       where: str = "options") -> Any:
    """``cls`` (a :class:`PolicyOptions` dataclass) built from the TOML table ``table``.

    ``policy`` names the policy in errors (``"sync policy 'lab/ssp.py:Ssp'"``); ``where``
    is the table's path in the scenario (``"sync.options"``). Raises
    :class:`OptionsError` with one line: the field, the bad value and what is allowed.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise OptionsError(f"{policy}: its Options must be a dataclass, got {cls!r}")
    raw = dict(table or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        allowed = ", ".join(fields) or "none"
        raise OptionsError(f"{policy}: unknown option {where}.{unknown[0]}; allowed: {allowed}")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise OptionsError(f"{policy}: {where}.{name} is required "
                                   f"({_type_name(hints.get(name, Any))})")
            continue
        try:
            values[name] = _convert(raw[name], hints.get(name, Any), f"{where}.{name}")
        except OptionsError as e:
            raise OptionsError(f"{policy}: {e}") from None
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise OptionsError(f"{policy}: {where}: {e}") from None


def options_to_table(options: Any) -> dict[str, Any]:
    """The TOML table that :func:`options_from_table` maps back to ``options``."""
    if options is None or not dataclasses.is_dataclass(options):
        return {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        v = getattr(options, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def params_from_table(cls: type, table: Mapping[str, Any] | None, *, policy: str,
                      where: str = "options") -> dict[str, Any]:
    """A codec's ``[codec.options]``: the keyword arguments of ``cls`` named in its
    ``params``, each converted to the type its ``__init__`` annotation gives (the same
    rules as :func:`options_from_table`). Raises :class:`OptionsError` with one line."""
    raw = dict(table or {})
    allowed = tuple(getattr(cls, "params", ()))
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise OptionsError(f"{policy}: unknown option {where}.{unknown[0]}; allowed: "
                           f"{', '.join(allowed) or 'none'}")
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # annotations that do not evaluate: values pass through unchecked
        hints = {}
    params = inspect.signature(cls.__init__).parameters
    out: dict[str, Any] = {}
    for name, value in raw.items():
        tp = hints.get(name, Any)
        if tp is Any and name in params and params[name].default not in (None, inspect.Parameter.empty):
            tp = type(params[name].default)  # unannotated: the default's type
        try:
            out[name] = _convert(value, tp, f"{where}.{name}")
        except OptionsError as e:
            raise OptionsError(f"{policy}: {e}") from None
    return out
