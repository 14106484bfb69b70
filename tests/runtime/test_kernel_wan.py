"""``[real] shaper = "kernel"``: the scenario's WAN as namespaces, veth pairs and ``tc tbf``.

What cannot be kernel-shaped is refused with the reason (always tested). The rest needs
root and iproute2 and is skipped, with the reason, where they are missing; whatever a
test builds is deleted again, also when it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from geomx.runtime.kernel_wan import FRAME_OVERHEAD, KernelWan, kernel_mode_problem
from geomx.runtime.netns import NetnsUnavailable, unavailable_reason
from geomx.scenario import parse_scenario

_REASON = unavailable_reason()
needs_root = pytest.mark.skipif(_REASON is not None,
                                reason=f"kernel-shaped namespaces unavailable: {_REASON}")


def _chain(**extra):
    """central <- 20 Mbit/s -> party-a <- 200 Mbit/s -> party-b: party-b's traffic to the
    centre crosses party-a's link (two hops, forwarded by party-a's namespace)."""
    raw = {"run": {"iterations": 6, "eval_every": 3, "progress": False, "seed": 3},
           "metrics": {"plot": False, "trace": False},
           "dc": [{"name": "central", "central": True, "workers": 0},
                  {"name": "party-a", "workers": 1, "compute_per_iter": "5ms"},
                  {"name": "party-b", "workers": 1, "compute_per_iter": "5ms"}],
           "wan": [{"a": "party-a", "b": "central", "bandwidth": "20Mbps", "latency": "5ms"},
                   {"a": "party-b", "b": "party-a", "bandwidth": "200Mbps", "latency": "5ms"}],
           "training": {"model": "mlp", "hidden": [32], "dataset": "digits", "batch_size": 32}}
    raw.update(extra)
    return raw


def test_what_the_kernel_mode_cannot_shape_is_refused_with_the_reason():
    raw = _chain()
    raw["wan"][0]["trace"] = "uniform"
    assert "trace" in kernel_mode_problem(parse_scenario(raw))
    raw = _chain(fault=[{"kind": "link_down", "link": ["party-a", "central"], "at": "1s"}])
    assert "link_down" in kernel_mode_problem(parse_scenario(raw))
    with pytest.raises(NetnsUnavailable, match='shaper = "kernel".*trace'):
        raw = _chain()
        raw["wan"][0]["trace"] = "uniform"
        KernelWan(parse_scenario(raw))


def test_a_kernel_shaped_launch_over_a_hostfile_is_refused(tmp_path):
    from geomx.runtime.launcher import RemoteOptions, run_real

    s = parse_scenario(_chain(real={"shaper": "kernel"}))
    with pytest.raises(ValueError, match="kernel.*hostfile"):
        run_real(s, tmp_path, progress=False, remote=RemoteOptions(hostfile=str(tmp_path / "hosts")))


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


SEND = textwrap.dedent("""
    import socket, sys, time
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    t0 = time.monotonic()
    s.sendall(b"x" * int(sys.argv[3]))
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    print("ELAPSED", time.monotonic() - t0)
""")

RECV = textwrap.dedent("""
    import socket, sys
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((sys.argv[1], int(sys.argv[2])))
    srv.listen(1)
    print("READY", flush=True)
    c, _ = srv.accept()
    while c.recv(1 << 16):
        pass
    c.sendall(b"k")
""")


@pytest.mark.slow
@needs_root
def test_a_two_hop_route_crosses_the_shaped_link_and_everything_is_deleted():
    s = parse_scenario(_chain())
    with KernelWan(s) as kw:
        tag = kw.tag
        assert _namespaces().count(f"gx{tag}d") == 3
        rates = [c for c in kw.commands if "tbf" in c]
        want = f"{20e6 * FRAME_OVERHEAD:.0f}bit"
        assert sum(want in c for c in rates) == 2  # both directions of the 20 Mbit/s link
        nbytes = 2_000_000
        rx = subprocess.Popen(kw.exec_argv("central", [sys.executable, "-c", RECV,
                                                       kw.address("central"), "7100"]),
                              stdout=subprocess.PIPE, text=True)
        try:
            assert rx.stdout.readline().strip() == "READY"
            tx = subprocess.run(kw.exec_argv("party-b", [sys.executable, "-c", SEND,
                                                         kw.address("central"), "7100",
                                                         str(nbytes)]),
                                capture_output=True, text=True, timeout=60)
        finally:
            rx.wait(30)
        assert tx.returncode == 0, tx.stderr
        elapsed = float(tx.stdout.split("ELAPSED")[1])
        ideal = nbytes * 8 / 20e6
        print(f"\n2 MB party-b -> central over 200 then 20 Mbit/s: {elapsed:.2f} s "
              f"(ideal {ideal:.2f} s)")
        assert elapsed >= 0.85 * ideal  # paced by the 20 Mbit/s hop, not loopback speed
    assert f"gx{tag}" not in _namespaces()


@needs_root
@pytest.mark.slow
def test_a_kernel_shaped_job_runs_and_leaves_nothing_behind(tmp_path):
    from geomx.experiment import run_scenario

    s = parse_scenario(_chain(real={"shaper": "kernel"}, run={
        "iterations": 6, "eval_every": 3, "progress": False, "seed": 3,
        "out_dir": str(tmp_path)}))
    before = _namespaces()
    r = run_scenario(s, runtime="real", progress=False)
    assert r.summary.iterations == 6
    assert r.summary.final_accuracy is not None and r.summary.final_accuracy > 0.3
    script = (r.run_dir / "kernel_wan.sh").read_text()
    assert "tbf rate" in script and "route add" in script
    assert _namespaces() == before
