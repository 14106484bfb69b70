"""Scenario files: read one (:func:`load_scenario`) and write one (:func:`scenario_to_toml`).

A resolved scenario is written with the schema it follows (geomx/scenario/schema.py) and
every setting, defaults included, in readable units
(by ``tomli-w``, so the text is TOML by construction); loading that text gives an equal
:class:`Scenario`, so a run directory's ``scenario.toml`` is a complete recipe.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence

import tomli_w

from geomx.scenario.errors import ScenarioError
from geomx.scenario.model import Scenario, scenario_to_dict
from geomx.scenario.overrides import apply_override
from geomx.scenario.parse import parse_scenario
from geomx.scenario.schema import SCHEMA_KEY, SCHEMA_VERSION, upgrade_raw

__all__ = ["load_scenario", "scenario_to_toml"]


def load_scenario(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Scenario:
    """Read, upgrade to the current schema, override and validate a scenario file."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ScenarioError("scenario file not found", source=path) from None
    except IsADirectoryError:
        raise ScenarioError("this is a directory; give a scenario file (.toml)",
                            source=path) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                            f"{exc.start}); TOML files are UTF-8: save it as UTF-8",
                            source=path) from None
    except RecursionError:
        raise ScenarioError("values nested too deeply to read", source=path) from None
    except OSError as exc:
        raise ScenarioError(f"cannot read it: {exc.strerror or exc}", source=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"not valid TOML: {exc}", source=path) from None
    try:
        raw = upgrade_raw(raw)  # overrides are written in the current schema
    except ScenarioError as exc:
        raise exc.with_source(path) from None
    for assignment in overrides:
        raw = apply_override(raw, assignment)
    return parse_scenario(raw, source=path)


def scenario_to_toml(s: Scenario) -> str:
    """The resolved scenario as TOML text; ``parse_scenario(tomllib.loads(text)) == s``."""
    header = (f"# geomx scenario, resolved from {s.source}: every setting, defaults included.\n"
              f"# Reference: docs/scenario.md\n\n")
    # An empty array of tables ([[fault]] without faults) is left out, as a file would
    # leave it out: tomli-w would write it as "fault = []" above every table; so is an
    # empty table ([expect] with nothing to check).
    data = {SCHEMA_KEY: SCHEMA_VERSION}
    data.update((key, value) for key, value in scenario_to_dict(s).items()
                if value not in ([], {}))
    return header + tomli_w.dumps(data)
