"""One bandwidth budget per scenario link in the real runtime.

The fidelity suite's shared-link shapes (a flat PS, two global servers, a chain) depend on
it: flows crossing one scenario link -- from different processes, or from one process to
different peers -- share it, as the emulator shares a link max-min between its flows.
The arithmetic is checked with explicit times (deterministic); the cross-process file
with real processes hammering one slot; the wire with two sender processes whose shared
link makes their messages arrive no earlier than the link allows.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time

import pytest

from geomx.cluster import plan_job
from geomx.runtime.link_budget import (BudgetError, LinkBudget, SharedLinkBudget,
                                       create_budget_file)
from geomx.runtime.node_main import build_shaper
from geomx.runtime.shaper import LinkShape, ShapedLink
from geomx.runtime.wan_shapes import NIC_SHAPED_MAX_BPS, LinkTable
from geomx.scenario import parse_scenario


def _three_dc(**kw):
    raw = {"run": {"iterations": 3, "progress": False},
           "dc": [{"name": "central", "central": True, "workers": 0},
                  {"name": "party-a", "workers": 2}, {"name": "party-b", "workers": 2}],
           "wan": [{"a": "party-a", "b": "central", "bandwidth": "20Mbps", "latency": "80ms"},
                   {"a": "party-b", "b": "central", "bandwidth": "200Mbps", "latency": "10ms"}]}
    for path, value in kw.items():
        section, _, key = path.partition("__")
        raw.setdefault(section, {})[key] = value
    return raw


def test_reservations_are_a_shared_virtual_finish_time():
    b = LinkBudget(2)
    # an idle link gives at most burst_s of credit
    assert b.reserve(0, 1.0, 0.1, now=10.0) == pytest.approx(10.9)
    # back to back: the second waits for the first
    assert b.reserve(0, 1.0, 0.1, now=10.0) == pytest.approx(11.9)
    # another link is independent
    assert b.reserve(1, 0.5, 0.0, now=10.0) == pytest.approx(10.5)


def test_two_senders_on_one_link_take_turns_a_third_elsewhere_is_not_held():
    """8 Mbit/s link shared by two peers' pieces: 1 MB each takes 2 s for both together."""
    budget = LinkBudget(2)
    shape = LinkShape(8e6, burst_bytes=1)
    a = ShapedLink("a", shape, 0, hops=((0, 1e6),), budget=budget)
    b = ShapedLink("b", shape, 0, hops=((0, 1e6),), budget=budget)
    other = ShapedLink("c", shape, 0, hops=((1, 1e6),), budget=budget)
    piece = 65536
    done_a = done_b = 0.0
    for _ in range(16):  # interleaved 64 KiB pieces, as two pacing writers would send them
        done_a = a.transmit(piece, 0.0)
        done_b = b.transmit(piece, 0.0)
    assert max(done_a, done_b) == pytest.approx(2 * 16 * piece / 1e6, rel=1e-3)
    assert abs(done_a - done_b) <= piece / 1e6 + 1e-9  # they shared it, neither went first
    credit = 1460 / 1e6  # an idle link's one segment of credit
    assert other.transmit(16 * piece, 0.0) == pytest.approx(16 * piece / 1e6 - credit)
    # without a budget each peer has its own bucket: the old behaviour, the whole link each
    alone = [ShapedLink(p, shape, 0) for p in "ab"]
    assert all(link.transmit(16 * piece, 0.0) == pytest.approx(16 * piece / 1e6, rel=1e-3)
               for link in alone)


def test_a_route_takes_as_long_as_its_busiest_link():
    budget = LinkBudget(2)
    budget.reserve(1, 3.0, 0.0, now=0.0)  # someone else keeps link 1 busy until t = 3
    link = ShapedLink("p", LinkShape(8e6), 0, hops=((0, 1e6), (1, 1e7)), budget=budget)
    assert link.transmit(1_000_000, 0.0) == pytest.approx(3.1)


WORKER = textwrap.dedent("""
    import sys
    from geomx.runtime.link_budget import SharedLinkBudget
    b = SharedLinkBudget(sys.argv[1], 3)
    for _ in range(int(sys.argv[2])):
        b.reserve(1, 0.001, 0.0, 0.0)
""")


def test_the_shared_file_loses_no_reservation_across_processes(tmp_path):
    path = create_budget_file(tmp_path / "budget.bin", 3)
    n = 3000
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(path), str(n)])
             for _ in range(3)]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    b = SharedLinkBudget(path, 3)
    # every one of the 9,000 reservations moved the finish time on by 1 ms, from t = 0
    assert b.finish(1) == pytest.approx(3 * n * 0.001, rel=1e-9)
    assert b.finish(0) == -math.inf and b.finish(2) == -math.inf
    b.close()


def test_a_foreign_budget_file_is_refused_by_name(tmp_path):
    path = create_budget_file(tmp_path / "budget.bin", 4)
    with pytest.raises(BudgetError, match="budget.bin.*expected"):
        SharedLinkBudget(path, 5)
    (tmp_path / "junk.bin").write_bytes(b"x" * (16 + 8 * 4))
    with pytest.raises(BudgetError, match="not a geomx link budget"):
        SharedLinkBudget(tmp_path / "junk.bin", 4)
    with pytest.raises(BudgetError, match="cannot open"):
        SharedLinkBudget(tmp_path / "missing.bin", 4)


def test_the_link_table_is_the_same_everywhere_and_routes_cross_shared_links():
    raw = _three_dc()
    raw["wan"][1] = {"a": "party-b", "b": "party-a", "bandwidth": "200Mbps", "latency": "10ms"}
    s = parse_scenario(raw)  # a chain: party-b reaches the centre through party-a's link
    plan = plan_job(s, "real")
    shapers = {n: build_shaper(s, plan, n) for n in ("ls:party-a", "ls:party-b")}
    a_link = LinkTable(s, list(plan.nodes), plan.job.dc_of).index[("wan", "party-a", "central")]
    for name, shaper in shapers.items():
        hops = [i for i, _ in shaper.hops["gs:0"]]
        assert a_link in hops, (name, hops)
    assert dict(shapers["ls:party-b"].hops["gs:0"])[a_link] == pytest.approx(20e6 / 8)
    # default 10 Gbit/s NICs are not modelled; a DC's slow LAN is, inside the DC too
    assert ("up", "w:party-a:0") not in LinkTable(s, list(plan.nodes), plan.job.dc_of).index
    raw["dc"][1]["lan_bandwidth"] = "50Mbps"
    s = parse_scenario(raw)
    table = LinkTable(s, list(plan.nodes), plan.job.dc_of)
    assert table.nic_bps == {n: 50e6 for n in plan.nodes if plan.job.dc_of[n] == "party-a"}
    assert 50e6 <= NIC_SHAPED_MAX_BPS
    w0 = build_shaper(s, plan, "w:party-a:0")
    assert [i for i, _ in w0.hops["ls:party-a"]] == [table.index[("up", "w:party-a:0")],
                                                     table.index[("down", "ls:party-a")]]
    assert w0.shapes["ls:party-a"].delay_s == pytest.approx(s.dcs[1].lan_latency_s)


def test_inter_dc_delay_is_the_emulators(scenario_of):
    """Host to host across DCs: half of each DC's LAN latency plus the WAN's (the emulator's
    NIC links carry half each)."""
    from geomx.experiment import build_network

    s = parse_scenario(_three_dc())
    plan = plan_job(s, "real")
    net = build_network(s, plan_job(s))
    shaper = build_shaper(s, plan, "ls:party-a")
    assert shaper.shapes["gs:0"].delay_s == pytest.approx(net.path_delay_s("ls:party-a", "gs:0"),
                                                          abs=1e-12)


SENDER = textwrap.dedent("""
    import asyncio, json, sys
    import numpy as np
    from geomx.runtime import eventloop
    from geomx.runtime.link_budget import SharedLinkBudget
    from geomx.runtime.shaper import LinkShape, Shaper
    from geomx.runtime.tcp import TcpTransport
    from geomx.wire import Kind, Message, Payload
    name, budget_path, dst_addr, nbytes, done = (sys.argv[1], sys.argv[2], sys.argv[3],
                                                 int(sys.argv[4]), sys.argv[5])
    async def main():
        shaper = Shaper({"rx": LinkShape(20e6, burst_bytes=1460)}, hops={"rx": ((0, 20e6 / 8),)},
                        budget=SharedLinkBudget(budget_path, 1))
        t = TcpTransport(name, host="127.0.0.1", port=0, udp=False, shaper=shaper)
        await t.start()
        t.set_address_book({"rx": dst_addr})
        await t.connect("rx")
        import time
        print("START", time.monotonic(), flush=True)
        await t.send(Message(Kind.PUSH, name, "rx", request_id=1,
                             payloads=[Payload.of(np.zeros(nbytes // 4, np.float32))]))
        import os
        for _ in range(600):  # until the receiver has both messages (it writes `done`)
            if os.path.exists(done):
                break
            await asyncio.sleep(0.05)
        await t.close()
    eventloop.run(main())
""")

RECEIVER = textwrap.dedent("""
    import asyncio, sys, time
    from geomx.runtime import eventloop
    from geomx.runtime.tcp import TcpTransport
    from geomx.wire import Kind, Message
    async def main():
        t = TcpTransport("rx", host="127.0.0.1", port=0, udp=False)
        await t.start()
        print("ADDR", t.local_address(), flush=True)
        for _ in range(2):
            m = await t.recv()
            print("GOT", m.src, time.monotonic(), flush=True)
        open(sys.argv[1], "w").close()
        await t.close()
    eventloop.run(main())
""")


@pytest.mark.slow
def test_two_processes_share_one_shaped_link_over_sockets(tmp_path):
    """2 x 1 MB from two processes over one 20 Mbit/s scenario link: the second arrives no
    earlier than 0.8 s after the first started sending (2 MB at 20 Mbit/s); with a bucket
    each (the old shaper), both were in ~0.4 s after they started."""
    budget = create_budget_file(tmp_path / "budget.bin", 1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = tmp_path / "done"
    rx = subprocess.Popen([sys.executable, "-c", RECEIVER, str(done)], stdout=subprocess.PIPE,
                          text=True, env=env)
    try:
        addr = rx.stdout.readline().split()[1]
        senders = [subprocess.Popen([sys.executable, "-c", SENDER, f"tx{i}", str(budget), addr,
                                     str(1_000_000), str(done)], env=env, stdout=subprocess.PIPE,
                                    text=True) for i in range(2)]
        outs = [p.communicate(timeout=60)[0] for p in senders]
        assert [p.returncode for p in senders] == [0, 0], outs
        t0 = min(float(o.split("START")[1].split()[0]) for o in outs)
        lines = [rx.stdout.readline() for _ in range(2)]
        rx.wait(30)
    finally:
        if rx.poll() is None:
            rx.kill()
    arrivals = sorted(float(line.split()[2]) for line in lines)
    b = SharedLinkBudget(budget, 1)
    reserved_s = b.finish(0)
    b.close()
    # the link was reserved for both megabytes, back to back ...
    print(f"\narrivals {arrivals[0] - t0:.2f} s and {arrivals[-1] - t0:.2f} s after the first "
          "send (ideal shared: both ~0.80 s)")
    assert arrivals[-1] >= reserved_s - 0.01
    # ... and the second arrival could not beat 2 MB at 20 Mbit/s after the first piece
    assert arrivals[-1] - t0 >= 0.75
