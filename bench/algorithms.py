"""The 16 machine-learning algorithms of ``geomx/algorithms`` against scikit-learn.

Runs every case of ``tests/algorithms/cases.py`` -- the same scenarios, overrides and
tolerances the tests assert -- through geomx in the emulator (quickstart shape: central
DC + 2 parties x 2 workers, WAN 100 Mbps / 30 ms) and fits scikit-learn's centralised
equivalent on the same training split; prints the table of docs/algorithms.md: the
score through geomx, the reference's, their difference, whether it is within the
tolerance, emulated seconds and WAN megabytes. Scores and emulated times are
deterministic; the CPU seconds are this machine's (the load is printed).

    python bench/algorithms.py [NAME ...] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.algorithms.cases import CASES, run_case  # noqa: E402

from geomx.algorithms import ALGORITHMS  # noqa: E402

HIGHER = {"accuracy": "accuracy", "r2": "R^2", "explained_variance": "test variance kept",
          "inertia": "test inertia (lower is better)"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="algorithms (default: all)")
    p.add_argument("--markdown", action="store_true", help="print the docs table")
    a = p.parse_args(argv)
    names = a.names or sorted(CASES, key=lambda n: (list(ALGORITHMS).index(n)))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {len(names)} algorithms, load average {load:.2f} on {os.cpu_count()} CPUs",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            case = CASES[name]
            t0 = time.perf_counter()
            r = run_case(case, Path(tmp) / name)
            rows.append((case, r, time.perf_counter() - t0))
            if not a.markdown:
                s = r["summary"]
                print(f"{name:20s} {r['metric']:18s} geomx {r['geomx']:8.4f}  sklearn "
                      f"{r['sklearn']:8.4f}  within={r['ok']}  emu {s.emulated_seconds:7.2f} s  "
                      f"WAN {s.bytes_wan / 1e6:7.2f} MB  cpu {r['geomx_cpu_s']:5.2f} s", flush=True)
    if a.markdown:
        print("| algorithm | category | scenario | test | metric | geomx | scikit-learn "
              "(centralised) | difference | tolerance | emulated s | WAN MB | reference |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for case, r, _ in rows:
            info = ALGORITHMS[case.algorithm]
            s = r["summary"]
            diff = r["geomx"] - r["sklearn"]
            tol = (f"<= +{case.tolerance:.0%}" if case.lower_is_better
                   else f">= -{case.tolerance:g}")
            setting = " ".join(o for o in case.overrides if not o.startswith("training.algorithm"))
            print(f"| `{case.algorithm}` | {info.category.replace('_', ' ')} | "
                  f"`{case.scenario}`{' ' + setting if setting else ''} | `{case.test}` | "
                  f"{HIGHER[r['metric']]} | {r['geomx']:.4f} | {r['sklearn']:.4f} | "
                  f"{diff:+.4f} | {tol}{'' if r['ok'] else ' **missed**'} | "
                  f"{s.emulated_seconds:.1f} | {s.bytes_wan / 1e6:.2f} | {case.why} |")
    missed = [c.algorithm for c, r, _ in rows if not r["ok"]]
    print(f"# within tolerance: {len(rows) - len(missed)}/{len(rows)}"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
