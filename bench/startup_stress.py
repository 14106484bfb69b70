"""Start the real runtime many times in a row under CPU load: no start may hang.

The race it looks for: a peer can send a request before this node's copy of the address
book has arrived; a reply dropped for want of the peer's address leaves its requester
waiting forever (``geomx/runtime/membership.py`` makes the reply wait for the book
instead). On a loaded 2-core machine, dropping such replies hangs about one real start
in six. This bench starts ``geomx run SCENARIO --runtime real`` ``--runs`` times while a
busy loop spins on every core, and reports per run: exit code, wall seconds, and the
start-up time (launch to the first worker's first compute span, from the run's merged
event log). A run that does not finish within ``--timeout`` counts as a hang.

    python bench/startup_stress.py --runs 30            # 30 starts under load
    python bench/startup_stress.py --runs 5 --no-load   # baseline without the busy loops

The baseline for the figures is the same command without load (``--no-load``), measured in
the same way; nothing is asserted on wall time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _spin() -> None:  # pragma: no cover - runs in a child process
    while True:
        pass


def first_compute_s(run_dir: Path) -> float | None:
    """Seconds from launch to the first ``compute`` span of any worker (None if none)."""
    events = run_dir / "events.jsonl"
    if not events.exists():
        return None
    with events.open() as f:
        for line in f:
            ev = json.loads(line)
            if ev.get("ev") == "compute":
                return float(ev.get("t_start", ev["t"]))
    return None


def one_run(scenario: str, out_dir: Path, timeout_s: float) -> dict:
    before = set(out_dir.iterdir()) if out_dir.exists() else set()
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "geomx", "run", scenario, "--runtime", "real",
           "--set", "run.progress=false", "--set", f"run.out_dir={out_dir}"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        rc = proc.returncode
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] if rc else []
    except subprocess.TimeoutExpired:
        rc, tail = "hang", []
    wall = time.perf_counter() - t0
    new = sorted(set(out_dir.iterdir()) - before) if out_dir.exists() else []
    start = first_compute_s(new[-1]) if new else None
    return {"rc": rc, "wall_s": wall, "startup_s": start, "tail": tail}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "quickstart.toml"))
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds before a run is a hang")
    ap.add_argument("--no-load", action="store_true", help="no busy loops (baseline)")
    args = ap.parse_args(argv)
    spinners = [] if args.no_load else [mp.Process(target=_spin, daemon=True)
                                        for _ in range(os.cpu_count() or 1)]
    for p in spinners:
        p.start()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="geomx-startup-") as tmp:
            for i in range(args.runs):
                r = one_run(args.scenario, Path(tmp), args.timeout)
                rows.append(r)
                start = "-" if r["startup_s"] is None else f"{r['startup_s']:.2f}"
                print(f"run {i + 1:3d}: rc={r['rc']!s:4} wall {r['wall_s']:6.2f} s  "
                      f"start-up {start} s {' '.join(r['tail'])}", flush=True)
    finally:
        for p in spinners:
            p.terminate()
    hangs = sum(1 for r in rows if r["rc"] == "hang")
    failed = sum(1 for r in rows if r["rc"] not in (0, "hang"))
    starts = [r["startup_s"] for r in rows if r["startup_s"] is not None]
    walls = [r["wall_s"] for r in rows if r["rc"] == 0]
    print(f"\n{len(rows)} runs ({'no load' if args.no_load else f'{len(spinners)} busy loops'}):"
          f" {hangs} hung, {failed} failed")
    if starts:
        print(f"start-up s: median {statistics.median(starts):.2f}, slowest {max(starts):.2f}")
    if walls:
        print(f"wall s:     median {statistics.median(walls):.2f}, slowest {max(walls):.2f}")
    return 1 if hangs or failed else 0


if __name__ == "__main__":
    sys.exit(main())
