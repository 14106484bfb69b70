"""A real job whose TCP connections are killed mid-run, against the same job left alone.

Runs the quickstart (``--runtime real``, one process per node on 127.0.0.1) twice in one
go: clean, then with every connection between its nodes destroyed ``--kills`` times,
``--every`` seconds apart, once a worker has taken 5 steps (``ss -K``: needs root and a
kernel that allows it). Prints the sockets killed, the reconnects and resends the nodes
counted, the wall time of both runs (time lost, ratio) and both final accuracies and
losses (equal: resumable streams lose nothing; see geomx/runtime/tcp_resume.py).

    sudo PYTHONPATH=$PWD python bench/reconnect_job.py [--iterations 40] [--kills 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from geomx.experiment import run_scenario  # noqa: E402
from geomx.scenario import load_scenario  # noqa: E402
from test_runtime_reconnect import (ConnectionKiller, ss_kill_works,  # noqa: E402
                                    training_started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between kills")
    ns = ap.parse_args()
    if not ss_kill_works():
        sys.exit("needs root and a kernel that lets `ss -K` destroy sockets")
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for label in ("clean", "killed"):
            runs = Path(tmp) / label
            s = load_scenario(ROOT / "scenarios" / "quickstart.toml",
                              [f"run.out_dir={runs}", "run.progress=false", "metrics.plot=false",
                               f"run.iterations={ns.iterations}", "run.target_accuracy=0"])
            killer = None
            if label == "killed":
                killer = ConnectionKiller(training_started(runs), times=ns.kills,
                                          every_s=ns.every)
                killer.start()
            t0 = time.perf_counter()
            try:
                r = run_scenario(s, runtime="real").summary
            finally:
                if killer is not None:
                    killer.halt.set()
                    killer.join()
            streams = [t["streams"] for t in r.extra["transport"].values()]
            total = {k: sum(st[k] for st in streams) for k in streams[0]}
            rows[label] = (time.perf_counter() - t0, r, total, killer.kills if killer else [])
        load = os.getloadavg()[0]
    (tc, rc, _, _), (tk, rk, total, kills) = rows["clean"], rows["killed"]
    print(f"quickstart, {ns.iterations} iterations, real runtime; load average {load:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"kills: {len(kills)} x, sockets destroyed {kills}")
    print(f"reconnects {total['reconnects']}, resent messages {total['resent_messages']} "
          f"({total['resent_bytes']} bytes), duplicates dropped {total['duplicates_dropped']}, "
          f"given up {total['reconnect_failures']}, dropped {total['unacked_dropped']}")
    print(f"wall: clean {tc:.2f} s, killed {tk:.2f} s, lost {tk - tc:+.2f} s "
          f"(ratio {tk / tc:.3f})")
    print(f"accuracy: clean {rc.final_accuracy!r}, killed {rk.final_accuracy!r}; loss: clean "
          f"{rc.final_loss!r}, killed {rk.final_loss!r}; equal: "
          f"{rc.final_accuracy == rk.final_accuracy and rc.final_loss == rk.final_loss}")


if __name__ == "__main__":
    main()
