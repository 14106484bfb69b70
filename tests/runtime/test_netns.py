"""The real runtime under a kernel-shaped WAN: network namespaces, a veth pair, ``tc tbf``.

Skipped, with the reason, where that is impossible (not root, no iproute2, no tbf).
The namespaces, their veth ends and qdiscs are deleted even when a test fails
(``geomx.runtime.netns.NetnsPair``); only 10.x addresses inside them are used.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geomx.runtime.netns import NetnsPair, unavailable_reason

pytestmark = [pytest.mark.netns, pytest.mark.slow]

_REASON = unavailable_reason()
if _REASON is not None:
    pytestmark.append(pytest.mark.skip(reason=f"kernel-shaped namespaces unavailable: {_REASON}"))

RATE_MBIT = 20.0


def _subnet() -> str:
    return f"10.{random.randrange(200, 250)}.{random.randrange(0, 255)}"


def _run_all(procs: dict[str, subprocess.Popen], logs: Path, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    try:
        for name, p in procs.items():
            code = p.wait(max(1.0, deadline - time.time()))
            assert code == 0, (name, (logs / f"{name.replace(':', '_')}.log").read_text()[-3000:])
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


TRANSFER = r"""
import asyncio, sys, time
import numpy as np
from geomx.runtime import eventloop
from geomx.runtime.tcp import TcpTransport
from geomx.wire import Kind, Message, Payload
role, me_addr, peer_addr, nbytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
async def main():
    host, port = me_addr.split(":")
    t = TcpTransport(role, host=host, port=int(port), udp=False)
    await t.start()
    peer = "b" if role == "a" else "a"
    t.set_address_book({peer: peer_addr})
    if role == "b":
        m = await t.recv()
        await t.send(Message(Kind.PUSH_ACK, "b", "a", request_id=m.request_id))
        await asyncio.sleep(0.5)
    else:
        await t.connect("b")
        blob = Payload.of(np.zeros(nbytes // 4, np.float32))
        t0 = time.perf_counter()
        await t.send(Message(Kind.PUSH, "a", "b", request_id=1, payloads=[blob]))
        await t.recv()
        print("ELAPSED", time.perf_counter() - t0, flush=True)
    await t.close()
eventloop.run(main())
"""


def test_transfer_is_paced_by_the_kernel_tbf(tmp_path):
    """4 MB from namespace a to b over a 20 Mbit/s tbf takes about 1.6 s, not loopback speed."""
    nbytes = 4_000_000
    ideal_s = nbytes * 8 / (RATE_MBIT * 1e6)
    script = tmp_path / "transfer.py"
    script.write_text(TRANSFER)
    with NetnsPair(rate_mbit=RATE_MBIT, subnet=_subnet()) as net:
        a, b = f"{net.addr_a}:7001", f"{net.addr_b}:7002"
        recv = subprocess.Popen(net.exec_argv("b", [sys.executable, str(script), "b", b, a,
                                                    str(nbytes)]),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            send = subprocess.run(net.exec_argv("a", [sys.executable, str(script), "a", a, b,
                                                      str(nbytes)]),
                                  capture_output=True, text=True, timeout=60)
            recv.wait(30)
        finally:
            if recv.poll() is None:
                os.killpg(recv.pid, signal.SIGKILL)
                recv.wait()
    assert send.returncode == 0, send.stdout + send.stderr
    elapsed = float(send.stdout.split("ELAPSED")[1].split()[0])
    print(f"\n4 MB over a {RATE_MBIT:g} Mbit/s tbf: {elapsed:.2f} s (ideal {ideal_s:.2f} s)")
    assert elapsed >= 0.8 * ideal_s          # the kernel did the shaping ...
    assert elapsed <= 3 * ideal_s + 2.0      # ... and the transport kept up with it


def test_two_dc_job_across_namespaces(tmp_path):
    """Central DC in namespace a, party DC in b; nodes started one by one with `geomx node`."""
    with NetnsPair(rate_mbit=RATE_MBIT, subnet=_subnet()) as net:
        scenario = tmp_path / "two_dc.toml"
        scenario.write_text(f"""
[run]
name = "netns"
seed = 3
iterations = 10
eval_every = 5
[[dc]]
name = "central"
central = true
workers = 0
host = "{net.addr_a}"
[[dc]]
name = "party-a"
workers = 2
host = "{net.addr_b}"
[[wan]]
a = "party-a"
b = "central"
[real]
shape = false       # the kernel shapes this WAN
[metrics]
plot = false
""")
        run_dir = tmp_path / "run"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GEOMX_RUN_DIR": str(run_dir),
               "GEOMX_START_EPOCH": repr(time.time())}
        placement = {"gh": "a", "gs:0": "a", "mw": "a", "lh:party-a": "b", "ls:party-a": "b",
                     "w:party-a:0": "b", "w:party-a:1": "b"}
        procs = {}
        for name, side in placement.items():
            log = open(tmp_path / f"{name.replace(':', '_')}.log", "w")
            procs[name] = subprocess.Popen(
                net.exec_argv(side, [sys.executable, "-m", "geomx", "node", str(scenario),
                                     "--name", name]),
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _run_all(procs, tmp_path, 120)
    result = json.loads((run_dir / "nodes" / "w_party-a_0.result.json").read_text())
    assert result["iterations"] == 10 and result["result"]["accuracy"] is not None
    gh = json.loads((run_dir / "nodes" / "gh.result.json").read_text())
    assert gh["counters"]  # the global scheduler ran in its own namespace and finished


def test_pair_shapes_and_tunes_tcp_as_the_kernel_wan_does():
    """A pair with ``burst_bytes`` has that bucket on both ends, and both namespaces run
    without slow start after idle, as geomx's kernel WAN sets its DCs' (so a program
    measured in the pair and geomx's nodes there meet the same TCP)."""
    with NetnsPair(rate_mbit=RATE_MBIT, burst_bytes=26380, latency_ms=100,
                   subnet=_subnet()) as net:
        for side, ns, dev in (("a", net.ns_a, net.if_a), ("b", net.ns_b, net.if_b)):
            qdisc = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev",
                                    dev], capture_output=True, text=True, check=True).stdout
            assert "tbf" in qdisc and "burst 26380b" in qdisc, (side, qdisc)
            sysctl = subprocess.run(net.exec_argv(side, ["sysctl", "-n",
                                                         "net.ipv4.tcp_slow_start_after_idle"]),
                                    capture_output=True, text=True, check=True).stdout
            assert sysctl.strip() == "0", side
