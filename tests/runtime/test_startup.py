"""Start-up without lost messages: a reply to a peer whose address has not arrived yet waits
for the address book (bounded), a message that cannot be delivered fails its node by name,
and a request without a reply fails by name after ``membership.request_timeout``.

The race these pin down: the scheduler answers every member's registration at
once; one member gets its answer first and sends a request to another whose own answer
(with the address book) is still in flight. The reply used to be dropped with a warning
and the requester waited forever.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from geomx.node.base import Node, NodeFailure
from geomx.runtime.tcp import TcpTransport, UnknownPeer
from geomx.transport import BaseServices
from geomx.wire import Kind, Message

from tests.helpers.aio import arun


class Echo(Node):
    """Answers COMMAND with COMMAND_ACK; ``main`` waits until told to stop."""

    role = "echo"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.on(Kind.COMMAND, lambda m: self.post(m.reply(Kind.COMMAND_ACK)))
        self.done = asyncio.Event()

    async def main(self) -> None:
        await self.done.wait()


class Silent(Echo):
    """Takes COMMANDs and never answers (a lost reply, as far as the requester knows)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.on(Kind.COMMAND, lambda m: None)


def services() -> BaseServices:
    return BaseServices(0, None, None, {})


async def transports(*names: str, **kw) -> list[TcpTransport]:
    out = [TcpTransport(n, **kw) for n in names]
    for t in out:
        await t.start()
    return out


def test_a_send_waits_for_the_peers_address_then_goes_out():
    async def main():
        a, b = await transports("a", "b")
        a.set_address_book({"b": b.local_address()})  # b does not know a yet
        await a.send(Message(Kind.COMMAND, "a", "b", request_id=1))
        got = await b.recv()
        reply = asyncio.ensure_future(b.send(got.reply(Kind.COMMAND_ACK)))
        await asyncio.sleep(0.3)
        assert not reply.done(), "the reply must wait for a's address, not fail or vanish"
        t_book = time.monotonic()
        b.set_address_book({"a": a.local_address()})
        await reply
        ack = await a.recv()
        assert ack.kind == Kind.COMMAND_ACK and ack.request_id == 1
        assert time.monotonic() >= t_book
        await a.close()
        await b.close()
    arun(main())


def test_an_address_that_never_comes_fails_by_name_after_the_bound():
    async def main():
        (b,) = await transports("b", address_wait_s=0.2)
        t0 = time.monotonic()
        with pytest.raises(UnknownPeer, match=r"b: no address for peer 'ghost' after waiting"):
            await b.send(Message(Kind.COMMAND, "b", "ghost"))
        assert 0.15 < time.monotonic() - t0 < 5
        await b.close()
    arun(main())


def test_close_wakes_sends_waiting_for_an_address():
    async def main():
        (b,) = await transports("b", address_wait_s=60)
        send = asyncio.ensure_future(b.send(Message(Kind.COMMAND, "b", "ghost")))
        await asyncio.sleep(0.05)
        await b.close()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(send, 5)
    arun(main())


def test_a_node_answers_a_request_that_beats_its_address_book():
    """The exact start-up race: the requester knows us, we learn its address later."""
    async def main():
        ta, tb = await transports("a", "b")
        ta.set_address_book({"b": tb.local_address()})
        a, b = Echo("a", "dc", ta, services()), Echo("b", "dc", tb, services())
        runs = [asyncio.ensure_future(a.run()), asyncio.ensure_future(b.run())]
        await asyncio.sleep(0.05)
        pending = asyncio.ensure_future(a.request(Message(Kind.COMMAND, "a", "b")))
        await asyncio.sleep(0.3)
        assert not pending.done() and b.failure is None
        tb.set_address_book({"a": ta.local_address()})
        reply = await asyncio.wait_for(pending, 5)
        assert reply.kind == Kind.COMMAND_ACK
        a.done.set()
        b.done.set()
        await asyncio.gather(*runs)
        await ta.close()
        await tb.close()
    arun(main())


def test_a_reply_that_cannot_be_delivered_fails_the_node_by_name():
    async def main():
        ta, tb = await transports("a", "b")
        tb.address_wait_s = 0.2
        ta.set_address_book({"b": tb.local_address()})
        b = Echo("b", "dc", tb, services())
        run_b = asyncio.ensure_future(b.run())
        await ta.send(Message(Kind.COMMAND, "a", "b", request_id=7))
        with pytest.raises(NodeFailure, match=r"b: could not deliver COMMAND_ACK to a: .*"
                                              r"no address for peer 'a'"):
            await asyncio.wait_for(run_b, 10)
        await ta.close()
        await tb.close()
    arun(main())


def test_a_request_without_reply_fails_by_name_at_the_request_timeout():
    """In the emulator, in virtual time: deterministic to the microsecond."""
    from geomx.sim.loop import run_virtual
    from geomx.sim.network import Network
    from geomx.sim.transport import SimFabric

    net = Network(seed=0)
    net.add_dc("dc", lan_delay_s=1e-4)
    for n in ("a", "b"):
        net.add_host(n, "dc", nic_bandwidth_bps=1e9)
    fabric = SimFabric(net)

    async def main():
        a = Echo("a", "dc", fabric.transport("a"), services())
        b = Silent("b", "dc", fabric.transport("b"), services())
        a.request_timeout_s = 7.5
        runs = [asyncio.ensure_future(a.run()), asyncio.ensure_future(b.run())]
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(NodeFailure, match=r"a: no reply from b to COMMAND within 7.5 s"):
            await a.request(Message(Kind.COMMAND, "a", "b"))
        assert loop.time() - t0 == pytest.approx(7.5)
        # an explicit bound raises TimeoutError to the caller instead (it handles it)
        with pytest.raises(asyncio.TimeoutError):
            await a.request(Message(Kind.COMMAND, "a", "b"), timeout_s=1.0)
        a.done.set()
        b.done.set()
        await asyncio.gather(*runs)

    run_virtual(main())


def test_request_timeout_is_derived_from_the_scenario(scenario_of):
    from geomx.cluster import AUTO_REQUEST_TIMEOUT_FLOOR_S, plan_job

    quick = scenario_of("quickstart.toml")
    assert plan_job(quick, "real").job.request_timeout_s == AUTO_REQUEST_TIMEOUT_FLOOR_S
    # liveness timers are off in the emulator unless asked for (they hide deadlocks)
    assert plan_job(quick, "emu").job.request_timeout_s == 0.0
    assert plan_job(scenario_of("quickstart.toml", "membership.in_emulator=true"),
                    "emu").job.request_timeout_s == AUTO_REQUEST_TIMEOUT_FLOOR_S
    assert plan_job(scenario_of("quickstart.toml", "membership.request_timeout=12s"),
                    "real").job.request_timeout_s == 12.0
    assert plan_job(scenario_of("quickstart.toml", "membership.request_timeout=0"),
                    "real").job.request_timeout_s == 0.0
    # 100 MB through a 1 Gbit/s in-cast takes long: auto grows with the model and the WAN
    big = plan_job(scenario_of("resnet50_phantom.toml"), "real").job.request_timeout_s
    slow = plan_job(scenario_of("resnet50_phantom.toml", "wan.0.bandwidth=100Mbps"),
                    "real").job.request_timeout_s
    assert AUTO_REQUEST_TIMEOUT_FLOOR_S < big < slow
    # a lossy link is as slow as the Mathis cap makes it
    lossy = plan_job(scenario_of("resnet50_phantom.toml", "wan.0.loss=1%"),
                     "real").job.request_timeout_s
    assert lossy > slow
