"""Every transfer scheduler's bench in one run: each against the same scenario
with the scheduler off, measured in the same run, next to its paper's band.

Each scheduler has a ``bench/sched_<name>.py`` with ``rows(...)`` (its figures, a list of
dicts; ``quick=True`` for a short sweep where the bench offers one) and either
``table(rows) -> str`` or ``print_table(rows)``. This driver runs them in turn, so the
figures of every scheduler come from one command. Add a scheduler by adding its name to
``SCHEDULERS``; a bench that does not exist yet is skipped with a note.

    python bench/sched_compare.py [--quick] [--only p3 --only dgt]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: Scheduler benches, in the order they run (missing ones are skipped).
SCHEDULERS = ("p3", "tsengine", "dgt")


def _load(name: str) -> Any | None:
    path = HERE / f"sched_{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"sched_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_bench(module: Any, quick: bool) -> None:
    """Run one scheduler bench and print its table."""
    kwargs = {"quick": True} if quick and "quick" in inspect.signature(module.rows).parameters else {}
    rows = module.rows(**kwargs)
    if hasattr(module, "table"):
        print(module.table(rows))
    else:
        module.print_table(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="each bench's short sweep, if it has one")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    choices=SCHEDULERS, help=f"run only these schedulers ({', '.join(SCHEDULERS)})")
    args = ap.parse_args(argv)
    for name in SCHEDULERS:
        if args.only and name not in args.only:
            continue
        module = _load(name)
        if module is None:
            print(f"{name}: no bench/sched_{name}.py yet, skipped\n", file=sys.stderr)
            continue
        print(f"== {name} (emulated, deterministic) ==")
        run_bench(module, args.quick)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
