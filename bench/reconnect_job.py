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
import sys

from fault_pair import load_line, print_pair, run_pair
from test_runtime_reconnect import ConnectionKiller, ss_kill_works


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between kills")
    ns = ap.parse_args()
    if not ss_kill_works():
        sys.exit("needs root and a kernel that lets `ss -K` destroy sockets")
    rows = run_pair(ns.iterations, "killed",
                    lambda ready: ConnectionKiller(ready, times=ns.kills, every_s=ns.every))
    kills = rows["killed"][3].kills
    print(load_line(ns.iterations))
    print(f"kills: {len(kills)} x, sockets destroyed {kills}")
    print_pair(rows, "killed")


if __name__ == "__main__":
    main()
