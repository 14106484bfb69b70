"""Scenario schema versions: which format a file was written for, and how an older one loads.

A scenario file may state, above its first section, the schema it was written for::

    schema = 3

A file that states no schema is read as the current one (:data:`SCHEMA_VERSION`); the
run folder's ``scenario.toml`` always states it, so a recipe saved today still says what
it meant after the format moves on. A file that states an older schema is upgraded as it
loads, one step at a time (:data:`STEPS`), before ``--set`` overrides apply; a key that
an older schema had and the current one moved, met in a file that states no schema, fails
with where it went and how to have it converted. The versioning policy (CHANGELOG.md)
says when the schema number changes: whenever a file that loaded before would now be
refused or mean something else.

The idea is the one of Compose files' ``version`` and Alembic's chained revisions: the
file names its format, and each format change is one small, named, tested step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from geomx.scenario.errors import ScenarioError, show_value, type_name_of
from geomx.scenario.netstorm import move_topology_options

__all__ = ["SCHEMA_VERSION", "SCHEMA_KEY", "MovedKey", "SchemaStep", "STEPS",
           "upgrade_raw", "moved_key_error"]

#: The schema this geomx writes and reads without conversion.
SCHEMA_VERSION = 3

#: The top-level key that states a file's schema.
SCHEMA_KEY = "schema"


@dataclass(frozen=True)
class MovedKey:
    """``old`` (``section.key``) is written as ``new`` from some schema on; string values
    are translated through ``values`` (a value not listed there is kept as it is)."""

    old: str
    new: str
    values: Mapping[str, str] = field(default_factory=dict)

    def new_value(self, value: Any) -> Any:
        return self.values.get(value, value) if isinstance(value, str) else value


@dataclass(frozen=True)
class SchemaStep:
    """What changed from schema ``to - 1`` to schema ``to``: keys ``moved`` one for one,
    then ``convert`` (in place) for a change that depends on other keys of the file."""

    to: int
    summary: str
    moved: tuple[MovedKey, ...] = ()
    convert: Callable[[dict[str, Any]], None] | None = None


#: Every format change, oldest first. Schema 1 is the format of the first scenario files
#: (geomx 0.1.0 up to 2026-11-24); schema 2 is the one of geomx 0.2.0 to 0.5.0.
STEPS: tuple[SchemaStep, ...] = (
    SchemaStep(to=2, summary="the node layout moved from [training] mode to [topology] kind",
               moved=(MovedKey("training.mode", "topology.kind",
                               {"hips": "hips", "flat_ps": "flat"}),)),
    SchemaStep(to=3, summary="the options of the netstorm and mlnet topologies moved from "
                             "[topology.options] to [netstorm]",
               convert=move_topology_options),
)


def _moved_by_old() -> dict[str, tuple[MovedKey, int]]:
    return {m.old: (m, step.to) for step in STEPS for m in step.moved}


def _schema_of(raw: Mapping[str, Any]) -> int:
    stated = raw[SCHEMA_KEY]
    allowed = f"an integer from 1 to {SCHEMA_VERSION}"
    if isinstance(stated, bool) or not isinstance(stated, int):
        raise ScenarioError(f"expected an integer, got {type_name_of(stated)} "
                            f"{show_value(stated)}; allowed: {allowed}",
                            path=SCHEMA_KEY, value=stated, allowed=allowed)
    if stated > SCHEMA_VERSION:
        from geomx import __version__

        raise ScenarioError(f"this file was written for scenario schema {stated}, newer than "
                            f"this geomx ({__version__}) reads; allowed: {allowed}. Upgrade "
                            f"geomx (CHANGELOG.md lists each schema)",
                            path=SCHEMA_KEY, value=stated, allowed=allowed)
    if stated < 1:
        raise ScenarioError(f"there is no scenario schema {stated}; allowed: {allowed}",
                            path=SCHEMA_KEY, value=stated, allowed=allowed)
    return stated


def _apply_move(raw: dict[str, Any], moved: MovedKey) -> None:
    old_section, old_key = moved.old.split(".")
    new_section, new_key = moved.new.split(".")
    table = raw.get(old_section)
    if not isinstance(table, dict) or old_key not in table:
        return
    value = table.pop(old_key)
    if not table:
        del raw[old_section]
    target = raw.setdefault(new_section, {})
    if not isinstance(target, dict):
        raise ScenarioError(f"expected a table ([{new_section}])", path=new_section)
    if new_key in target:
        raise ScenarioError(f"{moved.old} and {moved.new} are the same setting (schema "
                            f"{SCHEMA_VERSION} writes {moved.new}); allowed: one of them",
                            path=moved.old, value=value, allowed=moved.new)
    target[new_key] = moved.new_value(value)


def upgrade_raw(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """``raw`` (the data a scenario file holds) in the current schema, without its
    ``schema`` key; a file that states no schema is returned as it is."""
    if not isinstance(raw, Mapping) or SCHEMA_KEY not in raw:
        return raw
    stated = _schema_of(raw)
    out = copy.deepcopy(dict(raw))
    del out[SCHEMA_KEY]
    for step in STEPS:
        if step.to > stated:
            for moved in step.moved:
                _apply_move(out, moved)
            if step.convert is not None:
                step.convert(out)
    return out


def moved_key_error(section: str, key: str, value: Any, path: str) -> ScenarioError | None:
    """The error for a key that an older schema had (``None`` for any other key): where
    it lives now, and that stating the old schema converts the file as it loads."""
    found = _moved_by_old().get(f"{section}.{key}")
    if found is None:
        return None
    moved, since = found
    new_section, new_key = moved.new.split(".")
    new_value = moved.new_value(value)
    shown = f'"{new_value}"' if isinstance(new_value, str) else show_value(new_value)
    return ScenarioError(
        f"{section}.{key} has moved to {moved.new} (scenario schema {since}); allowed: write "
        f"{new_key} = {shown} in [{new_section}] (or --set {moved.new}=...) instead, or put "
        f"`schema = {since - 1}` at the top of a file written for the older format to have "
        f"it converted as it loads", path=path, value=value, allowed=moved.new)
