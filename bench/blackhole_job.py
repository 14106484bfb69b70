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
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


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


def inner(ns: argparse.Namespace) -> None:
    from geomx.experiment import run_scenario
    from geomx.scenario import load_scenario
    from test_runtime_reconnect import training_started

    # loopback consults policy rules only once the local table's rule comes after ours
    subprocess.run(["ip", "rule", "add", "pref", "100", "table", "local"], check=True)
    subprocess.run(["ip", "rule", "del", "pref", "0"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for label in ("clean", "blackholed"):
            runs = Path(tmp) / label
            s = load_scenario(ROOT / "scenarios" / "quickstart.toml",
                              [f"run.out_dir={runs}", "run.progress=false", "metrics.plot=false",
                               f"run.iterations={ns.iterations}", "run.target_accuracy=0",
                               f"real.dead_connection_timeout={ns.dead_after}"])
            holed: list[int] = []
            halt = threading.Event()

            def strike(ready=training_started(runs)) -> None:
                while not halt.is_set() and not ready():
                    time.sleep(0.05)
                if not halt.is_set():
                    holed.append(blackhole_all())
            striker = threading.Thread(target=strike, daemon=True)
            if label == "blackholed":
                striker.start()
            t0 = time.perf_counter()
            try:
                r = run_scenario(s, runtime="real").summary
            finally:
                halt.set()
                if striker.is_alive():
                    striker.join()
            streams = [t["streams"] for t in r.extra["transport"].values()]
            total = {k: sum(st[k] for st in streams) for k in streams[0]}
            rows[label] = (time.perf_counter() - t0, r, total, holed)
        load = os.getloadavg()[0]
    (tc, rc, _, _), (tb, rb, total, holed) = rows["clean"], rows["blackholed"]
    print(f"quickstart, {ns.iterations} iterations, real runtime, dead_connection_timeout "
          f"{ns.dead_after}; load average {load:.1f} on {os.cpu_count()} cores")
    print(f"connections blackholed: {holed}")
    print(f"reconnects {total['reconnects']}, resent messages {total['resent_messages']} "
          f"({total['resent_bytes']} bytes), duplicates dropped {total['duplicates_dropped']}, "
          f"given up {total['reconnect_failures']}, dropped {total['unacked_dropped']}")
    print(f"wall: clean {tc:.2f} s, blackholed {tb:.2f} s, lost {tb - tc:+.2f} s "
          f"(ratio {tb / tc:.3f})")
    print(f"accuracy: clean {rc.final_accuracy!r}, blackholed {rb.final_accuracy!r}; loss: "
          f"clean {rc.final_loss!r}, blackholed {rb.final_loss!r}; equal: "
          f"{rc.final_accuracy == rb.final_accuracy and rc.final_loss == rb.final_loss}")


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
