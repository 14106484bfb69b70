"""SimTransport.listen: the emulator's receive path without a task switch per wake-up.

It must call the handler exactly as a ``while True: handler(await recv())`` task would (same
messages, same order, same places in the loop's FIFO), so a whole job's event log is the
same byte for byte with and without it.
"""

from __future__ import annotations

import asyncio

import pytest

from geomx.experiment import run_scenario
from geomx.node.base import Node
from geomx.sim.loop import run_virtual
from geomx.sim.network import Network
from geomx.sim.transport import SimFabric, SimTransport, TransportClosed
from geomx.transport import TransportDefaults
from geomx.wire import Kind, Message


def _pair():
    net = Network(seed=0)
    net.add_dc("a", lan_delay_s=0.001)
    for h in ("x", "y"):
        net.add_host(h, "a", nic_bandwidth_bps=1e9)
    fabric = SimFabric(net)
    return fabric.transport("x"), fabric.transport("y")


def _m(i: int) -> Message:
    return Message(Kind.PUSH, "x", "y", key=i)


def test_listen_handles_queued_then_later_messages_in_order_until_cancelled():
    async def main():
        x, y = _pair()
        got: list[int] = []
        for i in range(3):
            x.send_nowait(_m(i))
        await asyncio.sleep(0.01)  # all three delivered before anyone listens
        task = asyncio.ensure_future(y.listen(lambda m: got.append(m.key)))
        await asyncio.sleep(0)
        assert got == [0, 1, 2]
        for i in range(3, 6):
            x.send_nowait(_m(i))
        await asyncio.sleep(0.01)
        assert got == [0, 1, 2, 3, 4, 5]
        x.send_nowait(_m(6))
        await asyncio.sleep(0.01)
        task.cancel()  # a delivered message not yet handled stays queued
        with pytest.raises(asyncio.CancelledError):
            await task
        assert got == [0, 1, 2, 3, 4, 5, 6]
        x.send_nowait(_m(7))
        await asyncio.sleep(0.01)
        assert y.pending() == 1 and (await y.recv()).key == 7

    run_virtual(main())


def test_cancel_between_delivery_and_drain_hands_nothing_over():
    async def main():
        x, y = _pair()
        got: list[int] = []
        task = asyncio.ensure_future(y.listen(lambda m: got.append(m.key)))
        await asyncio.sleep(0)
        y._inbox.put(_m(1))  # the drain is scheduled ...
        task.cancel()        # ... and the listener cancelled before it runs
        await asyncio.gather(task, return_exceptions=True)
        assert got == [] and y.pending() == 1

    run_virtual(main())


def test_a_failing_handler_fails_the_listener_and_stops_handing_over():
    async def main():
        x, y = _pair()
        got: list[int] = []

        def handler(m: Message) -> None:
            got.append(m.key)
            if m.key == 1:
                raise ValueError("bad")

        task = asyncio.ensure_future(y.listen(handler))
        for i in range(3):
            x.send_nowait(_m(i))
        with pytest.raises(ValueError, match="bad"):
            await task
        await asyncio.sleep(0.01)
        assert got == [0, 1] and y.pending() == 1

    run_virtual(main())


def test_closing_the_transport_fails_the_listener():
    async def main():
        x, y = _pair()
        task = asyncio.ensure_future(y.listen(lambda m: None))
        await asyncio.sleep(0)
        await y.close()
        with pytest.raises(TransportClosed):
            await task

    run_virtual(main())


def test_event_log_is_the_same_with_the_receive_loop(scenario_of, tmp_path, monkeypatch):
    """A whole emulated job: listen() and the task-per-wake-up receive loop give the same
    event log byte for byte, and the same global sequence of dispatches across all nodes
    (the loop is TransportDefaults.listen, what a transport without its own listen has)."""
    original = Node.dispatch
    runs = []
    for i, listen in enumerate((SimTransport.listen, TransportDefaults.listen)):
        seen: list[tuple[str, int, str, int, float]] = []

        def dispatch(node, msg, seen=seen):
            seen.append((node.name, int(msg.kind), msg.src, msg.key, node.now()))
            original(node, msg)

        monkeypatch.setattr(Node, "dispatch", dispatch)
        monkeypatch.setattr(SimTransport, "listen", listen)
        s = scenario_of("quickstart.toml", "run.iterations=6", "run.target_accuracy=0",
                        f"run.out_dir={tmp_path / str(i)}", "metrics.plot=false")
        runs.append(((run_scenario(s).run_dir / "events.jsonl").read_bytes(), seen))
    assert len(runs[0][0]) > 10_000 and len(runs[0][1]) > 500
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
