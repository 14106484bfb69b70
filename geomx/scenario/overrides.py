"""``--set PATH=VALUE``: change one setting of a scenario before it is validated.

Overrides edit the raw data (the dict ``tomllib`` returns), so a value given on the
command line is parsed and checked exactly like one in the file.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

from geomx.scenario.errors import ScenarioError, did_you_mean, quote_list
from geomx.scenario.kinds import Kind, OptionsTable, setting_by_key
from geomx.scenario.model import Scenario, SectionSpec, scenario_to_dict, section_by_key, sections, table_to_dict
from geomx.scenario.parse import parse_scenario
from geomx.scenario.schema import moved_key_error

__all__ = ["apply_override", "override_scenario"]


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
    return [table_to_dict(item) for item in getattr(Scenario(), spec.attr)]


def _select_item(items: list, selector: str, spec: SectionSpec, path: str) -> dict:
    if selector.isdigit():
        index = int(selector)
        if index < len(items):
            return items[index]
        if spec.key == "fault" and index == len(items):
            items.append({})  # faults are added from the command line: the next index
            return items[-1]
        if spec.key == "fault":
            raise ScenarioError(f"index {index} is out of range; allowed: 0..{len(items)} "
                                f"({len(items)} adds a fault)", path=path, value=index)
        raise ScenarioError(f"index {index} is out of range; allowed: 0..{len(items) - 1}"
                            if items else f"there is no [[{spec.key}]] to change", path=path, value=index)
    if spec.key == "dc":
        names = [str(item.get("name")) for item in items]
        if selector in names:
            return items[names.index(selector)]
        raise ScenarioError(f"no DC named {selector!r}{did_you_mean(selector, names)}; "
                            f"allowed: an index or one of {quote_list(names)}", path=path, value=selector)
    if spec.key == "wan":
        pairs = [f"{item.get('a')}:{item.get('b')}" for item in items]
        ends = set(selector.split(":"))
        for item in items:
            if len(ends) == 2 and ends == {item.get("a"), item.get("b")}:
                return item
        raise ScenarioError(f"no link {selector!r}; allowed: an index or 'a:b' of {quote_list(pairs)}",
                            path=path, value=selector)
    raise ScenarioError(f"[[{spec.key}]] items are selected by index; got {selector!r}", path=path)


def apply_override(raw: Mapping[str, Any], assignment: str) -> dict[str, Any]:
    """Return a copy of the raw scenario dict with one ``PATH=VALUE`` assignment applied.

    ``PATH`` is ``section.key`` (``training.lr``), ``section.options.NAME`` for one
    option of a policy (``codec.options.ratio``), or ``section.SELECTOR.key`` for arrays
    of tables where SELECTOR is an index (``dc.1.workers``, also ``dc[1].workers``), a DC
    name (``dc.party-a.workers``) or, for links, ``a:b`` (``wan.party-a:central.loss``);
    the next free index adds a ``[[fault]]`` (``fault.0.kind=link_down``).
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
    by_key = section_by_key()
    spec = by_key.get(parts[0])
    if spec is None:
        raise ScenarioError(f"unknown section {parts[0]!r}{did_you_mean(parts[0], by_key)}; "
                            f"allowed sections: {', '.join(by_key)}", path=path_text, value=parts[0],
                            allowed=", ".join(by_key))
    table = setting_by_key(spec.cls)
    if (not spec.array and len(parts) == 3 and parts[1] in table
            and isinstance(table[parts[1]].kind, OptionsTable)):
        return _set_option(raw, spec.key, parts[1], parts[2], value_text.strip())
    expected = 3 if spec.array else 2
    if len(parts) != expected:
        shape = f"{spec.key}.INDEX_OR_NAME.KEY" if spec.array else f"{spec.key}.KEY"
        raise ScenarioError(f"expected a path like {shape}; allowed keys: {', '.join(table)}",
                            path=path_text, allowed=", ".join(table))
    key = parts[-1]
    if key not in table:
        moved = moved_key_error(spec.key, key, value_text.strip(), path_text)
        if moved is not None:
            raise moved
        raise ScenarioError(f"unknown key {key!r}{did_you_mean(key, table)}; "
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


def _set_option(raw: Mapping[str, Any], section_key: str, table_key: str, key: str,
                text: str) -> dict[str, Any]:
    """``codec.options.ratio=0.05``: one entry of a policy's options table (its value is
    checked against the policy's options when the scenario is parsed)."""
    if not key:
        raise ScenarioError(f"expected {section_key}.{table_key}.NAME=VALUE",
                            path=f"{section_key}.{table_key}")
    new = copy.deepcopy(dict(raw))
    section = new.setdefault(section_key, {})
    if not isinstance(section, dict):
        raise ScenarioError(f"expected a table ([{section_key}])", path=section_key)
    options = section.setdefault(table_key, {})
    if not isinstance(options, dict):
        raise ScenarioError(f"expected a table ([{section_key}.{table_key}])",
                            path=f"{section_key}.{table_key}")
    options[key] = _override_value(text, OptionsTable())
    return new


def override_scenario(scenario: Scenario, overrides: Iterable[str]) -> Scenario:
    """A new, validated Scenario with ``--set`` style overrides applied to ``scenario``."""
    raw = scenario_to_dict(scenario)
    for assignment in overrides:
        raw = apply_override(raw, assignment)
    return parse_scenario(raw, source=scenario.source)

