"""Every transfer scheduler's bench in one run (issue 10): each against the same scenario
with the scheduler off, measured in the same run, next to its paper's band.

Each scheduler has a ``bench/sched_<name>.py`` with ``rows()`` (the figures, a list of
dicts) and ``print_table(rows)``; this driver runs them in turn. Add a scheduler by adding
its module name to ``BENCHES``.

    python bench/sched_compare.py [--only dgt]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: scheduler name -> bench module (in bench/)
BENCHES = {
    "dgt": "sched_dgt",
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHES), default=sorted(BENCHES))
    a = ap.parse_args(argv)
    for name in a.only:
        mod = importlib.import_module(BENCHES[name])
        mod.print_table(mod.rows())
        print()


if __name__ == "__main__":
    main()
