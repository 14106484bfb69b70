"""A real quickstart job run twice, clean and under a network fault, and the comparison.

Shared by ``bench/reconnect_job.py`` (connections reset with ``ss -K``) and
``bench/blackhole_job.py`` (connections silently blackholed): both run the quickstart
over real sockets, once left alone and once with a fault thread striking once training
is under way, and print the nodes' stream counters (reconnects, resends, duplicates),
the wall time lost and whether the two final models agree to the last bit.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from geomx.experiment import run_scenario  # noqa: E402
from geomx.scenario import load_scenario  # noqa: E402
from tests.runtime.test_reconnect import training_started  # noqa: E402

#: (wall seconds, summary, summed stream counters, the fault thread or None)
Row = tuple[float, Any, dict[str, int], Any]


def run_pair(iterations: int, label: str, fault_for: Callable[[Callable[[], bool]], threading.Thread],
             sets: tuple[str, ...] = ()) -> dict[str, Row]:
    """The quickstart clean, then as ``label`` with ``fault_for(ready)``'s thread running
    (``ready()`` turns true once a worker has taken 5 steps; the thread has a ``halt``
    event). Rows by ``"clean"`` and ``label``."""
    rows: dict[str, Row] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("clean", label):
            runs = Path(tmp) / name
            s = load_scenario(ROOT / "scenarios" / "quickstart.toml",
                              [f"run.out_dir={runs}", "run.progress=false", "metrics.plot=false",
                               f"run.iterations={iterations}", "run.target_accuracy=0", *sets])
            fault = fault_for(training_started(runs)) if name == label else None
            if fault is not None:
                fault.start()
            t0 = time.perf_counter()
            try:
                r = run_scenario(s, runtime="real").summary
            finally:
                if fault is not None:
                    fault.halt.set()
                    fault.join()
            streams = [t["streams"] for t in r.extra["transport"].values()]
            total = {k: sum(st[k] for st in streams) for k in streams[0]}
            rows[name] = (time.perf_counter() - t0, r, total, fault)
    return rows


def print_pair(rows: dict[str, Row], label: str) -> None:
    """Stream counters of the faulted run, wall time lost, and both final models."""
    (tc, rc, _, _), (tf, rf, total, _) = rows["clean"], rows[label]
    print(f"reconnects {total['reconnects']}, resent messages {total['resent_messages']} "
          f"({total['resent_bytes']} bytes), duplicates dropped {total['duplicates_dropped']}, "
          f"given up {total['reconnect_failures']}, dropped {total['unacked_dropped']}")
    print(f"wall: clean {tc:.2f} s, {label} {tf:.2f} s, lost {tf - tc:+.2f} s "
          f"(ratio {tf / tc:.3f})")
    print(f"accuracy: clean {rc.final_accuracy!r}, {label} {rf.final_accuracy!r}; loss: clean "
          f"{rc.final_loss!r}, {label} {rf.final_loss!r}; equal: "
          f"{rc.final_accuracy == rf.final_accuracy and rc.final_loss == rf.final_loss}")


def load_line(iterations: int, what: str = "") -> str:
    return (f"quickstart, {iterations} iterations, real runtime{what}; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
