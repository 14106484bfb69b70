"""Same-host transfers through shared-memory rings (geomx/runtime/shm_ring.py): values
arrive exact through a ring (straight into a receiver's sink too), a ring far smaller
than the value wraps and waits, a ring the receiver will not or cannot map leaves the
socket carrying everything, a lying sender's pieces close its connection, shaped
traffic never takes a ring, the mapped bytes stay within their bound, and nothing is
left behind -- in /dev/shm or mapped -- when the sending process is killed with -9."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from geomx.runtime import framing, shm_ring
from geomx.runtime.framing import (FrameDecoder, FramingError, sequenced_frames,
                                   shm_piece_frame, stamp_sequence, stream_head)
from geomx.runtime.shaper import LinkShape, Shaper
from geomx.runtime.shm_ring import (MIN_RING_BYTES, RecvRing, RingBudget, RingRefused,
                                    SendRing)
from geomx.runtime.tcp import TcpTransport
from geomx.wire import Kind, Message, Payload

from tests.helpers.aio import arun, start_pair
from tests.helpers.rings import ring_fds, ring_maps, tcp_pair

ROOT = Path(__file__).resolve().parents[2]


def big_msg(n: int, *, kind: Kind = Kind.PUSH, rid: int = 1, seed: int = 0,
            parts: int = 1, channel: int = 0) -> Message:
    rng = np.random.default_rng(seed)
    payloads = [Payload.of(rng.standard_normal(n + i).astype(np.float32))
                for i in range(parts)]
    return Message(kind, "a", "b", key=3, request_id=rid, channel=channel,
                   payloads=payloads)


def same(got: Message, sent: Message) -> None:
    assert len(got.payloads) == len(sent.payloads)
    for g, s in zip(got.payloads, sent.payloads):
        np.testing.assert_array_equal(g.data, s.data)


def test_values_pass_through_the_ring_exactly_and_the_socket_carries_small_ones():
    """Messages of several arrays (odd lengths, so pieces straddle arrays) arrive exact;
    a reply read into the caller's sink too; the ring carried the large ones only, and
    both ends count the same bytes."""
    async def main():
        a, b = await tcp_pair()
        sent = [big_msg(3_000_001, rid=1, seed=1, parts=3), big_msg(10, rid=2, seed=2),
                big_msg(200_000, rid=3, seed=3)]
        for m in sent:
            await a.send(m)
        for m in sent:
            same(await b.recv(), m)
        sink = np.zeros(2_000_000, np.float32)
        assert b.receive_into("a", 99, sink)
        reply = big_msg(2_000_000, kind=Kind.PULL_REPLY, rid=99, seed=5)
        await a.send(reply)
        await b.recv()
        b.forget_receive(99)
        np.testing.assert_array_equal(sink, reply.payloads[0].data)
        sa, sb = a.stats(), b.stats()
        assert sa["shm"]["rings_out"] == 1 and sb["shm"]["rings_in"] == 1
        # 36 MB and 8 MB in 4 MiB pieces; the 0.8 MB message is under the ring's minimum
        assert sb["shm"]["pieces_in"] == sa["shm"]["pieces_out"] == 9 + 2
        assert sb["rejected_frames"] == 0 and sb["partial_frame_bytes"] == 0
        assert sb["peers"]["a"]["bytes_received"] == sa["peers"]["b"]["bytes_sent"]
        await a.close()
        await b.close()
    arun(main())


def test_a_small_ring_wraps_and_the_sender_waits_for_room():
    async def main():
        a, b = await tcp_pair(shm_ring_bytes=MIN_RING_BYTES)
        sent = [big_msg(700_000 + i, rid=i, seed=i) for i in range(3)]
        for m in sent:
            await a.send(m)
        for m in sent:
            same(await b.recv(), m)
        # 8 KiB pieces: hundreds of them through a 64 KiB ring
        assert b.stats()["shm"]["pieces_in"] > 3 * 2_800_000 // MIN_RING_BYTES
        await a.close()
        await b.close()
    arun(main())


def test_rings_off_every_byte_takes_the_socket():
    async def main():
        a, b = await tcp_pair(shm_ring_bytes=0)
        m = big_msg(2_000_000)
        await a.send(m)
        same(await b.recv(), m)
        assert a.stats()["shm"]["rings_out"] == 0 and b.stats()["shm"]["rings_in"] == 0
        await a.close()
        await b.close()
    arun(main())


def test_with_a_shared_secret_the_ring_is_mapped_only_for_the_authenticated_peer():
    async def main():
        a, b = await tcp_pair(secret="s3cret")
        offers_from: list[str] = []
        attach = b.attach_ring

        def recording(conn, offer):
            offers_from.append(conn.label)
            return attach(conn, offer)

        b.attach_ring = recording  # the handshake asks it only once the peer is proven
        m = big_msg(2_000_000)
        await a.send(m)
        same(await b.recv(), m)
        assert b.stats()["shm"]["rings_in"] == 1
        await a.close()
        intruder = TcpTransport("a", udp=False, secret="wrong")
        await intruder.start()
        intruder.set_address_book({"b": b.local_address()})
        with pytest.raises(ConnectionError):
            await intruder.send(big_msg(2_000_000))
        assert len(offers_from) == 1 and b.stats()["shm"]["mapped_bytes"] == 0
        await intruder.close()
        await b.close()
    arun(main())


def test_a_ring_the_receiver_declines_is_closed_by_the_sender():
    """The receiver has rings off: it declines the offer, the value takes the socket,
    and the sender keeps neither a mapping of its ring nor its fd."""
    async def main():
        a = TcpTransport("a", udp=False)
        b = TcpTransport("b", udp=False, shm_ring_bytes=0)
        await start_pair(a, b)
        m = big_msg(2_000_000)
        await a.send(m)
        same(await b.recv(), m)
        assert a.stats()["shm"]["rings_out"] == 0
        assert not ring_maps() and not ring_fds()
        await a.close()
        await b.close()
    arun(main())


def test_shaped_traffic_never_takes_a_ring():
    async def main():
        a = TcpTransport("a", udp=False, shaper=Shaper({"b": LinkShape(2e9, 0.0)}, seed=1))
        b = TcpTransport("b", udp=False)
        await start_pair(a, b)
        m = big_msg(1_000_000)
        await a.send(m)
        same(await b.recv(), m)
        assert b.stats()["shm"]["rings_in"] == 0
        await a.close()
        await b.close()
    arun(main())


def test_mapped_rings_stay_within_the_receivers_bound_and_the_rest_use_the_socket():
    """Room for one ring: the first connection maps it, the second carries its value
    through the socket; both arrive."""
    async def main():
        a, b = await tcp_pair(shm_ring_bytes=1 << 20, max_shm_mapped_bytes=1 << 20)
        m0, m1 = big_msg(600_000, rid=1), big_msg(600_000, rid=2, seed=1, channel=1)
        await a.send(m0)
        await a.send(m1)
        got = {m.request_id: m for m in [await b.recv(), await b.recv()]}
        same(got[1], m0)
        same(got[2], m1)
        st = b.stats()["shm"]
        assert st["rings_in"] == 1 and st["mapped_bytes"] == 1 << 20
        assert st["refused_offers"] == 1
        await a.close()
        await b.close()
        assert b.stats()["shm"]["mapped_bytes"] == 0
    arun(main())


def unsealed_memfd(size: int) -> int:
    fd = os.memfd_create("not-a-ring", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def test_offers_that_are_not_this_hosts_sealed_ring_are_refused():
    ring = SendRing(MIN_RING_BYTES)
    budget = RingBudget(1 << 30)
    good = ring.offer()
    fd = unsealed_memfd(shm_ring.HEADER_BYTES + MIN_RING_BYTES)
    try:
        bad = [("another host", {**good, "host": "elsewhere"}),
               ("token", {**good, "token": "00" * 16}),
               ("sealed", {**good, "fd": fd}),
               ("size", {**good, "bytes": 2 * MIN_RING_BYTES}),
               ("open", {**good, "pid": 2 ** 22 + 1}),
               ("field", {**good, "fd": "3"}),
               ("object", "a ring")]
        for what, offer in bad:
            with pytest.raises(RingRefused):
                RecvRing(offer, budget)
            assert budget.used_bytes == 0, what
        with pytest.raises(RingRefused, match="mapped already"):
            RecvRing(good, RingBudget(MIN_RING_BYTES - 1))
        mapped = RecvRing(good, budget)
        assert budget.used_bytes == MIN_RING_BYTES
        mapped.close()
        assert budget.used_bytes == 0
    finally:
        os.close(fd)
        ring.close()


RINGS: list = []


def decoder_with_ring(ring_bytes: int = MIN_RING_BYTES):
    """A decoder reading from a ring this test writes, and the frames it hands on (the
    rings are closed at the end of the test)."""
    got: list = []
    send = SendRing(ring_bytes)
    recv = RecvRing(send.offer(), RingBudget())
    RINGS.extend((recv, send))
    dec = FrameDecoder(lambda t, f, body: got.append(body), max_frame_bytes=1 << 20)
    dec.max_stream_bytes = 1 << 30
    dec.shm = recv
    return dec, send, recv, got


def feed(dec: FrameDecoder, data: bytes) -> None:
    buf = dec.get_buffer(-1)
    buf[:len(data)] = data
    dec.buffer_updated(len(data))


def test_the_decoder_copies_ring_pieces_into_place_and_refuses_lying_ones():
    try:
        decoder_cases()
    finally:
        while RINGS:
            RINGS.pop().close()
    assert not ring_fds()


def decoder_cases() -> None:
    m = big_msg(50_000)
    frames, _ = sequenced_frames(m)
    stamp_sequence(frames, 1)
    body = b"".join(bytes(f) for f in frames)[framing.PREAMBLE_BYTES:]

    def head_and_rest(dec, send):
        head, views, left = stream_head(frames, 5, 1 << 20)
        feed(dec, head)
        return b"".join(bytes(v) for v in views)

    # a well-formed stream: two pieces, then the whole body is handed on
    dec, send, recv, got = decoder_with_ring(1 << 20)
    rest = head_and_rest(dec, send)
    half = len(rest) // 2
    for chunk in (rest[:half], rest[half:]):
        pos = send.alloc(len(chunk))
        send.data[pos % send.size:pos % send.size + len(chunk)] = chunk
        feed(dec, shm_piece_frame(5, pos, len(chunk)))
    assert bytes(got[0]) == body
    assert recv.take_unreported() == len(rest)

    lies = [("outside the ring", lambda send, rest: shm_piece_frame(5, MIN_RING_BYTES - 10,
                                                                    100)),
            ("another stream", lambda send, rest: shm_piece_frame(6, 0, 100)),
            ("past the stream", lambda send, rest: shm_piece_frame(5, 0, len(rest) + 1))]
    for what, frame in lies:
        dec, send, recv, got = decoder_with_ring()
        rest = head_and_rest(dec, send)
        with pytest.raises(FramingError):
            feed(dec, frame(send, rest))
        assert not got, what
    # behind what it already freed
    dec, send, recv, got = decoder_with_ring()
    rest = head_and_rest(dec, send)
    feed(dec, shm_piece_frame(5, 0, 100))
    with pytest.raises(FramingError, match="freed up to 100"):
        feed(dec, shm_piece_frame(5, 0, 100))
    # no ring on this connection
    dec = FrameDecoder(lambda *a: None, max_frame_bytes=1 << 20)
    dec.max_stream_bytes = 1 << 30
    feed(dec, stream_head(frames, 5, 1 << 20)[0])
    with pytest.raises(FramingError, match="without a ring"):
        feed(dec, shm_piece_frame(5, 0, 100))


def test_the_sender_refuses_a_freed_position_it_never_handed_out():
    ring = SendRing(MIN_RING_BYTES)
    pos = ring.alloc(1000)
    assert pos == 0 and ring.alloc(MIN_RING_BYTES) is None
    with pytest.raises(ValueError):
        ring.freed(2000)
    ring.freed(1000)
    assert ring.alloc(MIN_RING_BYTES - 1000) is not None
    ring.close()
    with pytest.raises(ConnectionError):
        ring.alloc(10)


SENDER = textwrap.dedent("""
    import asyncio, sys
    import numpy as np
    from geomx.runtime.tcp import TcpTransport
    from geomx.wire import Kind, Message, Payload

    async def main():
        a = TcpTransport("a", udp=False)
        await a.start()
        a.set_address_book({"b": sys.argv[1]})
        data = np.ones(25_000_000, np.float32)
        for i in range(1000):  # until killed
            await a.send(Message(Kind.PUSH, "a", "b", key=i, request_id=i,
                                 payloads=[Payload.of(data)]))
            print("sent", flush=True)

    asyncio.run(main())
""")


@pytest.mark.slow
def test_a_sender_killed_mid_stream_leaves_nothing_behind(tmp_path):
    """kill -9 of the sending node while a 100 MB value streams through its ring: the
    receiver drops the half-received stream and unmaps the ring; nothing was ever named
    in /dev/shm, and no mapping of the ring is left anywhere."""
    shm_before = set(os.listdir("/dev/shm"))

    async def main():
        b = TcpTransport("b", udp=False)
        await b.start()
        script = tmp_path / "sender.py"
        script.write_text(SENDER)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), b.local_address(), stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            first = await b.recv()  # a whole value through the ring
            assert first.payloads[0].data[-1] == 1.0
            # the next value is streaming: kill the sender in the middle of it
            deadline = time.monotonic() + 30
            while not b.stats()["partial_frame_bytes"]:
                assert time.monotonic() < deadline, "no second stream started"
                await asyncio.sleep(0.002)
            assert b.stats()["shm"]["rings_in"] == 1 and ring_maps()
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            deadline = time.monotonic() + 10
            while b.stats()["shm"]["mapped_bytes"] or b.stats()["partial_frame_bytes"]:
                assert time.monotonic() < deadline, b.stats()["shm"]
                await asyncio.sleep(0.01)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await b.close()

    arun(main(), timeout_s=120)
    assert not ring_maps() and not ring_fds()
    assert set(os.listdir("/dev/shm")) <= shm_before


def test_a_connection_killed_mid_ring_stream_resends_the_value_through_a_new_ring():
    """The receiver's side of a connection is reset while a value is half through the
    ring: the sender dials again, offers a new ring, writes the value again, and every
    value arrives once, in order and exact; the old ring is unmapped."""
    async def main():
        a, b = await tcp_pair(shm_ring_bytes=1 << 20)
        sent = [big_msg(1_000_000 + i, rid=i, seed=i) for i in range(4)]
        for m in sent:
            await a.send(m)
        got = [await b.recv()]
        # the next value is on its way through the ring: reset the connection under it
        deadline = time.monotonic() + 10
        while not b.stats()["partial_frame_bytes"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        for c in list(b._incoming):
            c.transport.abort()
        got += [await b.recv() for _ in range(3)]
        assert [m.request_id for m in got] == [0, 1, 2, 3]
        for g, m in zip(got, sent):
            same(g, m)
        st = a.stats()
        assert st["streams"]["reconnects"] >= 1 and st["shm"]["rings_out"] == 1
        assert b.stats()["shm"]["mapped_bytes"] == 1 << 20  # the new ring only
        await a.close()
        await b.close()
    arun(main())
