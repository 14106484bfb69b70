"""Nothing a stranger sends can make a transport hold unbounded memory.

Without a secret (the default) anyone completes the handshake. Two ways in were open:
thousands of connections that never finish their handshake (64 KiB of buffer each), and
large frames announced and half sent on many connections (each held in full). Now a
connection costs 8 KiB until its handshake is done, handshakes in progress and
connections are capped, and bodies of large frames held while they arrive share one
budget: a frame past it waits (its connection stops reading) until another completes or
its connection goes away. A message too long for one frame travels as a stream of pieces,
held within the same budget.
"""

from __future__ import annotations

import asyncio
import json
import os
import tracemalloc

import numpy as np

from geomx.runtime import eventloop
from geomx.runtime.framing import (PREAMBLE, STREAM_HEAD, STREAM_PIECE, FrameType, control_frame,
                                   pack_preamble)
from geomx.runtime.tcp import TcpTransport, parse_address
from geomx.wire import Kind, Message, Payload


def hello(name: str, to: str = "victim") -> bytes:
    return control_frame(FrameType.HELLO, v=1, name=name, to=to, ch=0, auth=False)


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, dict]:
    _, ftype, _, n = PREAMBLE.unpack(await reader.readexactly(PREAMBLE.size))
    return ftype, json.loads(await reader.readexactly(n))


def test_connections_that_never_handshake_are_capped_and_cheap():
    async def main():
        victim = TcpTransport("victim", handshake_timeout_s=30, max_pending_handshakes=32,
                              max_incoming_connections=100, udp=False)
        await victim.start()
        host, port = parse_address(victim.local_address())
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        conns = [await asyncio.open_connection(host, port) for _ in range(300)]
        await asyncio.sleep(0.5)
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        stats = victim.stats()
        assert stats["connections_in"] == 32             # the rest were refused at once
        assert stats["refused_connections"] >= 268
        assert stats["rejected"].get("conn_limit", 0) >= 268
        assert held < 32 * 8192 + 3_000_000, held       # ~8 KiB each, not 64 KiB
        for _, w in conns:
            w.close()
        # a real peer still gets in once they are gone
        await asyncio.sleep(0.3)
        peer = TcpTransport("peer", udp=False)
        await peer.start()
        peer.set_address_book({"victim": victim.local_address()})
        await peer.send(Message(Kind.PUSH, "peer", "victim", key=1, request_id=7))
        got = await asyncio.wait_for(victim.recv(), 10)
        assert got.request_id == 7
        await peer.close()
        await victim.close()
    eventloop.run(main())


def test_half_sent_large_frames_share_one_budget():
    async def main():
        budget = 4 << 20
        victim = TcpTransport("victim", max_partial_frame_bytes=budget, udp=False)
        await victim.start()
        host, port = parse_address(victim.local_address())
        attackers = []
        for i in range(6):  # each announces 3 MiB and sends 2 MiB of it
            r, w = await asyncio.open_connection(host, port)
            w.write(hello(name=f"evil{i}"))
            assert (await read_frame(r))[0] == FrameType.WELCOME
            w.write(pack_preamble(FrameType.MESSAGE, 3 << 20) + b"\0" * (2 << 20))
            attackers.append(w)
        await asyncio.sleep(1.0)
        held = victim.stats()["partial_frame_bytes"]
        assert 0 < held <= budget, held  # one 3 MiB frame admitted; the others wait
        # an honest 3 MiB message waits its turn, then arrives when the budget frees
        peer = TcpTransport("peer", udp=False)
        await peer.start()
        peer.set_address_book({"victim": victim.local_address()})
        arr = np.arange(3 << 18, dtype=np.float32)  # 3 MiB
        await peer.send(Message(Kind.PUSH, "peer", "victim", key=2, request_id=9,
                                payloads=[Payload.of(arr)]))
        for w in attackers:
            w.close()
        got = await asyncio.wait_for(victim.recv(), 20)
        assert got.request_id == 9 and np.array_equal(got.payloads[0].array(), arr)
        await asyncio.sleep(0.3)
        assert victim.stats()["partial_frame_bytes"] == 0
        await peer.close()
        await victim.close()
    eventloop.run(main())


def test_half_sent_streams_share_the_same_budget():
    """A message too long for one frame travels as a stream of pieces; streams announced
    and half sent wait for the same budget as large frames, and an honest stream gets
    its turn once they are gone."""
    async def main():
        budget = 4 << 20
        victim = TcpTransport("victim", max_partial_frame_bytes=budget, udp=False)
        await victim.start()
        host, port = parse_address(victim.local_address())
        attackers = []
        for i in range(6):  # each announces a 3 MiB stream and sends 2 MiB of it
            r, w = await asyncio.open_connection(host, port)
            w.write(hello(name=f"evil{i}"))
            assert (await read_frame(r))[0] == FrameType.WELCOME
            w.write(pack_preamble(FrameType.STREAM_HEAD, STREAM_HEAD.size + 1)
                    + STREAM_HEAD.pack(1, FrameType.MESSAGE, 0, 0, 3 << 20) + b"G"
                    + pack_preamble(FrameType.STREAM_PIECE, STREAM_PIECE.size + (2 << 20))
                    + STREAM_PIECE.pack(1) + b"\0" * (2 << 20))
            attackers.append(w)
        await asyncio.sleep(1.0)
        held = victim.stats()["partial_frame_bytes"]
        assert 0 < held <= budget, held  # one 3 MiB stream admitted; the others wait
        peer = TcpTransport("peer", udp=False)
        await peer.start()
        peer.set_address_book({"victim": victim.local_address()})
        arr = np.arange(6 << 18, dtype=np.float32)  # 6 MiB: a stream of two pieces
        await peer.send(Message(Kind.PUSH, "peer", "victim", key=2, request_id=9,
                                payloads=[Payload.of(arr)]))
        for w in attackers:
            w.close()
        got = await asyncio.wait_for(victim.recv(), 20)
        assert got.request_id == 9 and np.array_equal(got.payloads[0].array(), arr)
        await asyncio.sleep(0.3)
        assert victim.stats()["partial_frame_bytes"] == 0
        assert victim.stats()["rejected"].get("truncated", 0) >= 1  # the half-sent streams
        await peer.close()
        await victim.close()
    eventloop.run(main())


def test_a_node_transport_is_bounded_by_its_job(scenario_of):
    """No UDP socket unless DGT sends datagrams; no frame longer than a stream's piece
    (longer messages travel as streams of them); no message larger than the job's largest
    (twice the model plus headers; a training program's keys are unknown up front, so for
    it this host's memory); large frames and streams in flight within 64 MiB (or one
    message), whatever the largest message."""
    from geomx.cluster import plan_job
    from geomx.node.trainer import initial_params
    from geomx.runtime.framing import STREAM_FRAME_BYTES
    from geomx.runtime.node_main import transport_limits

    s = scenario_of("quickstart.toml")
    plan = plan_job(s, "real")
    model = sum(p.nbytes for p in initial_params(plan.train))
    limits = transport_limits(s, plan)
    assert limits == {"udp": False, "max_frame_bytes": STREAM_FRAME_BYTES,
                      "max_message_bytes": 2 * model + (16 << 20),
                      "max_partial_frame_bytes": 64 << 20,
                      "shm_ring_bytes": 32 << 20}
    s = scenario_of("quickstart.toml", "real.shm=false")
    assert transport_limits(s, plan_job(s, "real"))["shm_ring_bytes"] == 0
    s = scenario_of("quickstart.toml", "sched.dgt=udp")
    assert transport_limits(s, plan_job(s, "real"))["udp"] is True
    s = scenario_of("quickstart.toml", "training.program=examples.mnist:main")
    limits = transport_limits(s, plan_job(s, "real"))
    assert limits["max_frame_bytes"] == STREAM_FRAME_BYTES
    assert limits["max_message_bytes"] == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert limits["max_partial_frame_bytes"] == 64 << 20
    # the scenario can set the bound, either way
    s = scenario_of("quickstart.toml", "training.program=examples.mnist:main",
                    "real.max_message=2GiB")
    assert transport_limits(s, plan_job(s, "real"))["max_message_bytes"] == 2 << 30
