"""A scenario as data (the dict ``tomllib`` returns) -> a validated :class:`Scenario`.

Each section's table is read through its field table (:func:`settings_of`), each
section's own ``_check`` runs, relative paths are resolved next to the file, and then
every whole-scenario check of :mod:`geomx.scenario.checks`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from geomx.scenario.checks import SCENARIO_CHECKS
from geomx.scenario.errors import ScenarioError, did_you_mean, show_value, type_name_of
from geomx.scenario.kinds import setting_by_key
from geomx.scenario.model import Scenario, section_by_key, sections
from geomx.scenario.policies import check_policies, resolve_policies
from geomx.scenario.real import SecurityConfig
from geomx.scenario.schema import moved_key_error, upgrade_raw

__all__ = ["parse_scenario"]


def _parse_table(cls: type, raw: Any, path: str, section: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"expected a table, got {type_name_of(raw)} {show_value(raw)}", path=path, value=raw)
    table = setting_by_key(cls)
    for key in raw:
        if key not in table:
            moved = moved_key_error(section, key, raw[key], f"{path}.{key}")
            if moved is not None:
                raise moved
            hint = did_you_mean(key, table)
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
    try:
        return str(candidate.resolve()) if candidate.exists() else path_text
    except OSError:  # a name no file system takes (too long, ...): the checks say "not found"
        return path_text


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
        raise ScenarioError(f"expected a table of sections, got {type_name_of(raw)}")
    raw = upgrade_raw(raw)
    by_key = section_by_key()
    for key in raw:
        if key not in by_key:
            hint = did_you_mean(key, by_key)
            raise ScenarioError(f"unknown section [{key}]{hint}; allowed sections: {', '.join(by_key)}",
                                value=key, allowed=", ".join(by_key))
    security = raw.get("security")
    if isinstance(security, Mapping) and "secret" in security:
        raise ScenarioError("a secret never goes in the scenario file; put it in the environment "
                            "variable named by secret_env (default GEOMX_SECRET); allowed keys: "
                            + ", ".join(setting_by_key(SecurityConfig)),
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
                raise ScenarioError(f"expected an array of tables ([[{spec.key}]]), got {type_name_of(value)}",
                                    path=spec.key, value=value)
            values[spec.attr] = tuple(_parse_table(spec.cls, item, f"{spec.key}[{i}]", spec.key)
                                      for i, item in enumerate(value))
        else:
            if isinstance(value, list):
                raise ScenarioError(f"expected one table ([{spec.key}]), got an array of tables", path=spec.key)
            values[spec.attr] = _parse_table(spec.cls, value, spec.key, spec.key)
    scenario = Scenario(**values, source=source)
    scenario = resolve_policies(_resolve_paths(scenario, base_dir), base_dir)
    check_policies(scenario)
    for check in SCENARIO_CHECKS:
        check(scenario)
    return scenario


def _resolve_program(spec: str, base_dir: Path | None) -> str:
    """``train.py[:fn]`` next to the scenario file becomes an absolute path (node processes
    read the resolved scenario from the run folder); module names stay as they are."""
    where, sep, fn = spec.rpartition(":")
    if not sep or not fn.isidentifier():
        where, sep, fn = spec, "", ""
    if not where.endswith(".py"):
        return spec
    return _resolve_relative(where, base_dir) + (sep + fn if sep else "")


def _resolve_paths(s: Scenario, base_dir: Path | None) -> Scenario:
    if base_dir is None:
        return s
    wans = tuple(w if w.trace in ("", "uniform")
                 else dataclasses.replace(w, trace=_resolve_relative(w.trace, base_dir)) for w in s.wans)
    training = dataclasses.replace(s.training, data_path=_resolve_relative(s.training.data_path, base_dir),
                                   program=_resolve_program(s.training.program, base_dir))
    sec = s.security
    security = dataclasses.replace(sec, tls_cert=_resolve_relative(sec.tls_cert, base_dir),
                                   tls_key=_resolve_relative(sec.tls_key, base_dir),
                                   tls_ca=_resolve_relative(sec.tls_ca, base_dir))
    topology = dataclasses.replace(s.topology, kind=_resolve_program(s.topology.kind, base_dir))
    host = dataclasses.replace(s.host, profile=_resolve_relative(s.host.profile, base_dir))
    return dataclasses.replace(s, wans=wans, training=training, security=security,
                               topology=topology, host=host)

