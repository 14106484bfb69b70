"""Connections that die silently: noticed within ``[real] dead_connection_timeout``.

A NAT or firewall that forgets a flow drops its packets without a word: neither end
sees a FIN or an RST. The blackhole test makes exactly that in a private network
namespace: an ``ip rule ... blackhole`` for the established connection's port (both
directions), while new connections still pass. With the bound on, the sender's kernel
gives up on the dead connection, geomx dials again and writes the message again; with
it off (the kernel's defaults), the message does not arrive (Linux would retry for
about 15 minutes).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest

from geomx.runtime import eventloop
from geomx.runtime.tcp import TcpTransport
from geomx.runtime.tcp_liveness import apply_dead_after, keepalive_schedule
from geomx.scenario import ScenarioError
from geomx.wire import Kind, Message, Payload

from tests.helpers.paths import ROOT


def test_keepalive_schedule_spends_about_the_bound():
    assert keepalive_schedule(20.0) == (10, 3, 3)
    assert keepalive_schedule(1.0) == (1, 1, 3)
    idle, interval, probes = keepalive_schedule(60.0)
    assert idle + interval * probes == 60


def test_options_set_on_a_socket_and_left_alone_at_zero():
    with socket.socket() as s:
        assert apply_dead_after(s, 4.0)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 4000
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
    with socket.socket() as s:
        assert not apply_dead_after(s, 0.0)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 0


def test_transport_sets_the_bound_on_both_ends_of_a_connection():
    async def main():
        a = TcpTransport("a", udp=False, dead_after_s=3.0)
        b = TcpTransport("b", udp=False, dead_after_s=3.0)
        for t in (a, b):
            await t.start()
        book = {t.name: t.local_address() for t in (a, b)}
        for t in (a, b):
            t.set_address_book(book)
        await a.send(Message(Kind.PUSH, "a", "b", key=1, request_id=1,
                             payloads=[Payload.of(np.ones(4, np.float32))]))
        await asyncio.wait_for(b.recv(), 10)
        socks = [o.proto.transport.get_extra_info("socket") for o in a._out.values()]
        socks += [c.transport.get_extra_info("socket") for c in b._incoming]
        got = [(s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)) for s in socks]
        for t in (a, b):
            await t.close(flush_timeout_s=1.0)
        return got
    got = eventloop.run(main())
    assert got == [(1, 3000), (1, 3000)]


def test_transport_refuses_a_negative_bound():
    with pytest.raises(ValueError, match="dead_after_s"):
        TcpTransport("a", dead_after_s=-1.0)


def test_scenario_field_range():
    from geomx.scenario import load_scenario as load
    base = ROOT / "scenarios" / "quickstart.toml"
    assert load(base).real.dead_connection_timeout_s == 20.0
    assert load(base, ["real.dead_connection_timeout=0"]).real.dead_connection_timeout_s == 0.0
    with pytest.raises(ScenarioError, match="real.dead_connection_timeout.*at least 1s"):
        load(base, ["real.dead_connection_timeout=200ms"])


# -- the blackhole: a flow forgotten on the path ------------------------------------------

PROBE = r"""
import asyncio, json, subprocess, sys, time
import numpy as np
from geomx.runtime import eventloop
from geomx.runtime.tcp import TcpTransport
from geomx.wire import Kind, Message, Payload

dead_after_s, wait_s = float(sys.argv[1]), float(sys.argv[2])

def msg(i):
    return Message(Kind.PUSH, "a", "b", key=i, request_id=i,
                   payloads=[Payload.of(np.full(1024, i, np.float32))])

def ip(*args):
    subprocess.run(["ip", *args], check=True)

async def main():
    a = TcpTransport("a", udp=False, dead_after_s=dead_after_s)
    b = TcpTransport("b", udp=False, dead_after_s=dead_after_s)
    for t in (a, b):
        await t.start()
    book = {t.name: t.local_address() for t in (a, b)}
    for t in (a, b):
        t.set_address_book(book)
    await a.send(msg(1))
    first = await asyncio.wait_for(b.recv(), 10)
    (out,) = a._out.values()
    port = out.proto.transport.get_extra_info("sockname")[1]
    # the path forgets this flow (both directions); new connections still pass. The
    # local table's rule moves behind ours, or loopback would never consult them.
    ip("rule", "add", "pref", "100", "table", "local")
    ip("rule", "del", "pref", "0")
    for d in ("sport", "dport"):
        ip("rule", "add", "pref", "10", "ipproto", "tcp", d, str(port), "blackhole")
    t0 = time.monotonic()
    await a.send(msg(2))
    try:
        second = await asyncio.wait_for(b.recv(), wait_s)
        arrived_s = time.monotonic() - t0
        value = float(second.payloads[0].array()[0])
    except asyncio.TimeoutError:
        arrived_s = value = None
    print(json.dumps({"first": int(first.key), "arrived_s": arrived_s, "value": value,
                      "a": a.stats()["streams"], "b": b.stats()["streams"]}), flush=True)
    for t in (a, b):
        await t.close(flush_timeout_s=0.2)

eventloop.run(main())
"""


def _blackhole_unavailable() -> str | None:
    if sys.platform != "linux":
        return "Linux only"
    if os.geteuid() != 0:
        return "needs root (a network namespace)"
    if shutil.which("ip") is None:
        return "no iproute2"
    return None


def _probe(dead_after_s: float, wait_s: float) -> dict:
    ns = f"geomx-ka-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE,
                            str(dead_after_s), str(wait_s)],
                           capture_output=True, text=True, env=env, timeout=wait_s + 60)
        if r.returncode != 0 and "rule" in r.stderr and "RTNETLINK" in r.stderr:
            pytest.skip(f"policy routing by port unavailable: {r.stderr.strip()[-200:]}")
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(_blackhole_unavailable() is not None,
                    reason=f"blackhole test unavailable: {_blackhole_unavailable()}")
def test_a_silently_dead_connection_is_replaced_and_its_message_resent():
    got = _probe(dead_after_s=1.0, wait_s=15.0)
    assert got["first"] == 1
    assert got["arrived_s"] is not None, got           # delivered over a new connection
    assert got["value"] == 2.0
    assert got["a"]["reconnects"] == 1 and got["a"]["resent_messages"] >= 1, got
    assert got["b"]["duplicates_dropped"] == 0, got


@pytest.mark.slow
@pytest.mark.skipif(_blackhole_unavailable() is not None,
                    reason=f"blackhole test unavailable: {_blackhole_unavailable()}")
def test_without_the_bound_the_dead_connection_holds_the_message():
    # the control: the same blackhole with the kernel's defaults swallows the message
    got = _probe(dead_after_s=0.0, wait_s=4.0)
    assert got["arrived_s"] is None, got
    assert got["a"]["reconnects"] == 0, got
