"""A real job whose connections die *silently* mid-run, against the same job left alone.

``bench/reconnect_job.py`` resets connections (``ss -K``): both ends learn at once. Here
the path forgets them instead, as a NAT or a stateful firewall does: once a worker has
taken 5 steps, every established connection between the job's nodes is blackholed
(``ip rule ... blackhole`` on its client port, both directions; new connections pass),
so no FIN or RST ever arrives. Each node notices within ``[real]
dead_connection_timeout`` (keepalive probes, TCP user timeout;
``geomx/runtime/tcp_liveness.py``), dials again and resends. The whole bench runs in a
private network namespace (root). Prints the connections blackholed, reconnects and
resends, the wall time of both runs (time lost against the bound) and both final
accuracies and losses (equal: nothing is lost or applied twice).

    sudo PYTHONPATH=$PWD python bench/blackhole_job.py [--iterations 40] [--dead-after 2s]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ports(state: str) -> list[tuple[int, int]]:
    """(local port, peer port) of this namespace's TCP sockets in ``state``."""
    out = subprocess.run(["ss", "-Htn", "state", state], capture_output=True, text=True,
                         check=True).stdout
    rows = []
    for line in out.splitlines():
        cols = line.split()
        local, peer = cols[-2], cols[-1]
        port = peer.rpartition(":")[2]
        rows.append((int(local.rpartition(":")[2]), int(port) if port.isdigit() else 0))
    return rows


def blackhole_all() -> int:
    """Blackhole every established connection's flow (by its client port); how many."""
    listening = {p for p, _ in _ports("listening")}
    clients = {lp for lp, pp in _ports("established") if lp not in listening and pp in listening}
    for port in sorted(clients):
        for d in ("sport", "dport"):
            subprocess.run(["ip", "rule", "add", "pref", "10", "ipproto", "tcp", d, str(port),
                            "blackhole"], check=True)
    return len(clients)


class Blackholer(threading.Thread):
    """Blackholes every connection of the job once ``ready()`` (once; ``holed`` says how
    many), unless halted first."""

    def __init__(self, ready) -> None:
        super().__init__(daemon=True)
        self.ready = ready
        self.halt = threading.Event()
        self.holed: list[int] = []

    def run(self) -> None:
        while not self.halt.is_set() and not self.ready():
            time.sleep(0.05)
        if not self.halt.is_set():
            self.holed.append(blackhole_all())


def inner(ns: argparse.Namespace) -> None:
    from fault_pair import load_line, print_pair, run_pair

    # loopback consults policy rules only once the local table's rule comes after ours
    subprocess.run(["ip", "rule", "add", "pref", "100", "table", "local"], check=True)
    subprocess.run(["ip", "rule", "del", "pref", "0"], check=True)
    rows = run_pair(ns.iterations, "blackholed", Blackholer,
                    (f"real.dead_connection_timeout={ns.dead_after}",))
    print(load_line(ns.iterations, f", dead_connection_timeout {ns.dead_after}"))
    print(f"connections blackholed: {rows['blackholed'][3].holed}")
    print_pair(rows, "blackholed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--dead-after", default="2s", help="[real] dead_connection_timeout")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.inner:
        inner(ns)
        return
    if os.geteuid() != 0:
        sys.exit("needs root: the job runs in a private network namespace")
    name = f"geomx-bh-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        code = subprocess.run(["ip", "netns", "exec", name, sys.executable, __file__, "--inner",
                               "--iterations", str(ns.iterations), "--dead-after",
                               ns.dead_after], env=env).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
