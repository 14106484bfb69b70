"""``python -m geomx.scenario``: print a resolved scenario, or regenerate docs/scenario.md."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from geomx.scenario.errors import ScenarioError
from geomx.scenario.model import Scenario
from geomx.scenario.overrides import override_scenario
from geomx.scenario.reference import write_reference
from geomx.scenario.toml_io import load_scenario, scenario_to_toml

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0, or 2 for a scenario that does not validate (the error on stderr)."""
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
