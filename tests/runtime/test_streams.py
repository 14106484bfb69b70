"""Large messages as streams of bounded frames (geomx/runtime/framing.py, "Large messages"):
reassembly straight into the destination, the receiver's sink, the budget, and the
streams a lying peer sends (rejected, counted, freed; the node keeps serving)."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from geomx import wire
from geomx.runtime import framing
from geomx.runtime.framing import (PREAMBLE_BYTES, STREAM_HEAD, STREAM_PIECE, FrameType,
                                   FramingError, SplitBody, control_frame, pack_preamble,
                                   sequenced_frames, stamp_sequence, stream_frames)
from geomx.runtime.shaper import LinkShape, Shaper
from geomx.runtime.tcp import TcpTransport, parse_address
from geomx.wire import Kind, Message, Payload

from tests.helpers.aio import arun, start_pair

PIECE = 70_000  # small pieces: many of them, and bodies larger than the decoder's scratch


def big_msg(n: int, *, kind: Kind = Kind.PUSH, rid: int = 1, seed: int = 0) -> Message:
    data = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return Message(kind, "a", "b", key=3, request_id=rid, payloads=[Payload.of(data)])


def streamed(m: Message, sid: int = 7, piece: int = PIECE,
             seq: int | None = 1) -> tuple[bytes, bytes]:
    """``m`` as the bytes of its stream on the wire, and the body of the frame it carries
    (a SEQ_MESSAGE numbered ``seq``; a MESSAGE with ``seq=None``)."""
    if seq is None:
        frames, nbytes = framing.message_frames(m)
    else:
        frames, nbytes = sequenced_frames(m)
        stamp_sequence(frames, seq)
    body = b"".join(bytes(f) for f in frames)[PREAMBLE_BYTES:]
    out, wire_nbytes = stream_frames(frames, sid, piece)
    data = b"".join(bytes(f) for f in out)
    assert len(data) == wire_nbytes
    return data, body


def frames_of(data: bytes) -> list[bytes]:
    """The frames of a byte stream, one by one."""
    out, off = [], 0
    while off < len(data):
        length = framing.PREAMBLE.unpack_from(data, off)[3]
        out.append(data[off:off + PREAMBLE_BYTES + length])
        off += PREAMBLE_BYTES + length
    return out


def feed(dec: framing.FrameDecoder, data: bytes, rng: random.Random) -> None:
    pos = 0
    while pos < len(data):
        buf = dec.get_buffer(-1)
        n = min(len(buf), rng.choice([1, 5, 13, 4096, 70_001, 1 << 20]), len(data) - pos)
        buf[:n] = data[pos:pos + n]
        dec.buffer_updated(n)
        pos += n


class Budget:
    def __init__(self, limit: int = 1 << 40):
        self.limit, self.used, self.peak = limit, 0, 0

    def reserve(self, n: int) -> bool:
        if self.used and self.used + n > self.limit:
            return False
        self.used += n
        self.peak = max(self.peak, self.used)
        return True

    def release(self, n: int) -> None:
        self.used -= n


def decoder(out: list, budget: Budget | None = None, route=None,
            max_frame_bytes: int = PIECE + STREAM_HEAD.size) -> framing.FrameDecoder:
    dec = framing.FrameDecoder(lambda t, f, body: out.append((t, f, body)),
                               max_frame_bytes=max_frame_bytes,
                               reserve=budget.reserve if budget else None,
                               release=budget.release if budget else None, route=route)
    dec.max_stream_bytes = 1 << 30
    return dec


def test_a_stream_reassembles_into_one_buffer_whatever_the_reads():
    rng = random.Random(3)
    msgs = [big_msg(n, rid=i, seed=i) for i, n in enumerate([40_000, 1_000_000, 17, 250_001])]
    wire_bytes, bodies = b"", []
    for i, m in enumerate(msgs):
        frames, nbytes = sequenced_frames(m)
        stamp_sequence(frames, i + 1)
        body = b"".join(bytes(f) for f in frames)[PREAMBLE_BYTES:]
        if nbytes - PREAMBLE_BYTES > PIECE:
            frames, nbytes = stream_frames(frames, 100 + i, PIECE)
        wire_bytes += b"".join(bytes(f) for f in frames)
        bodies.append(body)
    for trial in range(6):
        out: list = []
        budget = Budget()
        dec = decoder(out, budget)
        feed(dec, wire_bytes, rng)
        assert [bytes(b) for _, _, b in out] == bodies
        assert all(t == FrameType.SEQ_MESSAGE for t, _, _ in out)
        assert dec.pending_bytes() == 0 and budget.used == 0
        # the carried body of a stream is one buffer of its own: a message decodes from it
        got = wire.decode(memoryview(out[1][2])[8:], owned=True)
        np.testing.assert_array_equal(got.payloads[0].data, msgs[1].payloads[0].data)
        assert got.payloads[0].data.flags.writeable


def test_every_frame_of_a_stream_is_within_the_piece_size():
    data, body = streamed(big_msg(300_000))
    off, sizes = 0, []
    while off < len(data):
        _, ftype, _, length = framing.PREAMBLE.unpack_from(data, off)
        sizes.append((ftype, length))
        off += PREAMBLE_BYTES + length
    assert sizes[0][0] == FrameType.STREAM_HEAD and sizes[0][1] < 200
    assert {t for t, _ in sizes[1:]} == {FrameType.STREAM_PIECE}
    assert max(n for _, n in sizes) == PIECE + STREAM_PIECE.size
    assert sum(n for _, n in sizes) - STREAM_HEAD.size - STREAM_PIECE.size * (len(sizes) - 1) \
        == len(body)


def test_a_routed_stream_is_read_straight_into_the_receivers_sink():
    m = big_msg(200_000, kind=Kind.PULL_REPLY, rid=42)
    data, body = streamed(m)
    sink = np.zeros(200_000, np.float32)
    seen = []

    def route(ftype, first, length):
        peek = wire.peek_single_payload(first[8:])
        seen.append((ftype, length, peek[1]))
        return 8 + peek[2], sink

    out: list = []
    budget = Budget()
    feed(decoder(out, budget, route=route), data, random.Random(1))
    assert seen == [(FrameType.SEQ_MESSAGE, len(body), 42)]
    (t, f, got), = out
    assert isinstance(got, SplitBody) and got.tail is sink
    np.testing.assert_array_equal(sink, m.payloads[0].data)
    assert budget.peak == 0  # the sink was the receiver's memory already


def test_a_stream_over_the_budget_waits_for_room_then_arrives():
    data, body = streamed(big_msg(100_000))
    out: list = []
    budget = Budget(limit=1000)
    budget.used = 10  # another frame holds some
    dec = decoder(out, budget)
    buf = dec.get_buffer(-1)
    buf[:len(data[:4096])] = data[:4096]
    dec.buffer_updated(4096)
    assert dec.waiting and not out
    budget.used = 0
    dec.retry()
    assert not dec.waiting
    feed(dec, data[4096:], random.Random(2))
    assert bytes(out[0][2]) == body and budget.used == 0


def _stream_error(data: bytes, category: str, match: str, **kw) -> framing.FrameDecoder:
    out: list = []
    budget = Budget()
    dec = decoder(out, budget, **kw)
    with pytest.raises(FramingError, match=match) as e:
        feed(dec, data, random.Random(0))
    assert e.value.category == category
    dec.abandon()  # what the connection does when it closes: the stream's budget is back
    assert budget.used == 0
    return dec


def test_lying_streams_are_stream_errors():
    data, body = streamed(big_msg(100_000), sid=7)
    head, *pieces = frames_of(data)
    rest = b"".join(pieces)
    assert len(pieces) >= 4
    piece = lambda sid, payload: (pack_preamble(FrameType.STREAM_PIECE,  # noqa: E731
                                                STREAM_PIECE.size + len(payload))
                                  + STREAM_PIECE.pack(sid) + payload)
    # a piece when no stream is open, and one for another stream than the open one
    _stream_error(piece(7, b"x" * 10), "stream_unknown", "unknown stream 7 .none is open")
    _stream_error(head + piece(8, b"x" * 10), "stream_unknown", "stream 7 is open")
    # pieces beyond the announced size
    _stream_error(head + rest + piece(7, b"x"), "stream_unknown", "none is open")
    last = len(pieces[-1]) - PREAMBLE_BYTES - STREAM_PIECE.size
    _stream_error(head + b"".join(pieces[:-1]) + piece(7, b"x" * (last + 1)), "stream_overrun",
                  "runs past the .* bytes stream 7 announced")
    # a stream never finished: another frame, or another stream, before its last byte
    cut = b"".join(pieces[:2])
    small = b"".join(bytes(f) for f in framing.message_frames(big_msg(3))[0])
    _stream_error(head + cut + small, "stream_unfinished", "never finished")
    _stream_error(head + cut + head, "stream_unfinished", "never finished")
    # more than the receiver accepts, announced
    dec = decoder([])
    dec.max_stream_bytes = len(body) - 1
    with pytest.raises(FramingError, match="announced, limit is") as e:
        feed(dec, head, random.Random(0))
    assert e.value.category == "oversize"
    # streams on a connection that does not allow them (before its handshake)
    dec = decoder([])
    dec.max_stream_bytes = 0
    with pytest.raises(FramingError, match="does not allow streams"):
        feed(dec, head, random.Random(0))
    # a head for a frame type that never streams, and an empty piece
    bad = bytearray(head)
    bad[PREAMBLE_BYTES + 4] = FrameType.ACK
    _stream_error(bytes(bad), "protocol", "type-8 frame")
    _stream_error(head + piece(7, b""), "protocol", "no data")


def test_a_connection_lost_mid_stream_frees_its_buffer_and_budget():
    data, _ = streamed(big_msg(300_000))
    out: list = []
    budget = Budget()
    dec = decoder(out, budget)
    feed(dec, data[:len(data) // 2], random.Random(4))
    assert budget.used > 0 and dec.pending_bytes() > 0
    assert "carried by stream 7" in dec.pending_description()
    dec.abandon()
    assert budget.used == 0 and dec.pending_bytes() == 0 and not out


# -- over sockets -----------------------------------------------------------------------------

async def pair(**kw) -> tuple[TcpTransport, TcpTransport]:
    a, b = TcpTransport("a", udp=False, **kw), TcpTransport("b", udp=False, **kw)
    await start_pair(a, b)
    return a, b


def test_messages_larger_than_a_frame_travel_as_streams_over_sockets():
    """A frame is at most 128 KiB here, messages of 1.2 MB and 6 MB arrive exact (as the
    awaited reply, read into the caller's array, too), and every frame stayed bounded."""
    async def main():
        a, b = await pair(max_frame_bytes=128 << 10)
        sizes = [300_000, 1_500_000, 10]
        for i, n in enumerate(sizes):
            await a.send(big_msg(n, rid=i, seed=i))
        for i, n in enumerate(sizes):
            got = await b.recv()
            assert got.request_id == i
            np.testing.assert_array_equal(got.payloads[0].data,
                                          big_msg(n, rid=i, seed=i).payloads[0].data)
        sink = np.zeros(1_500_000, np.float32)
        assert b.receive_into("a", 99, sink)
        reply = big_msg(1_500_000, kind=Kind.PULL_REPLY, rid=99, seed=5)
        await a.send(reply)
        got = await b.recv()
        b.forget_receive(99)
        assert got.payloads[0].data.base is not None
        np.testing.assert_array_equal(sink, reply.payloads[0].data)
        st = b.stats()
        assert st["rejected_frames"] == 0 and st["partial_frame_bytes"] == 0
        assert st["peers"]["a"]["bytes_received"] == a.stats()["peers"]["b"]["bytes_sent"]
        await a.close()
        await b.close()
    arun(main())


def test_a_shaped_stream_arrives_and_its_queue_accounting_returns_to_zero():
    async def main():
        a = TcpTransport("a", udp=False, max_frame_bytes=128 << 10,
                         shaper=Shaper({"b": LinkShape(400e6, 0.001)}, seed=1))
        b = TcpTransport("b", udp=False)
        await start_pair(a, b)
        m = big_msg(600_000)
        await a.send(m)
        got = await b.recv()
        np.testing.assert_array_equal(got.payloads[0].data, m.payloads[0].data)
        await asyncio.sleep(0.05)
        assert a.stats()["queued_bytes"] == 0
        await a.close()
        await b.close()
    arun(main())


def test_a_lying_stream_is_rejected_counted_and_freed_and_the_node_keeps_serving():
    async def main():
        victim = TcpTransport("victim", udp=False, max_frame_bytes=128 << 10,
                              max_message_bytes=8 << 20)
        await victim.start()
        host, port = parse_address(victim.local_address())
        data, body = streamed(big_msg(1_000_000), piece=100_000, seq=None)
        head, *pieces = frames_of(data)

        async def attack(name: str, payload: bytes) -> None:
            r, w = await asyncio.open_connection(host, port)
            w.write(control_frame(FrameType.HELLO, v=1, name=name, to="victim", ch=0,
                                  auth=False))
            await asyncio.wait_for(r.read(4096), 10)  # WELCOME
            w.write(payload)
            await w.drain()
            await asyncio.sleep(0.2)
            w.close()

        half = head + b"".join(pieces[:len(pieces) // 2])
        piece = (pack_preamble(FrameType.STREAM_PIECE, STREAM_PIECE.size + 5)
                 + STREAM_PIECE.pack(1234) + b"xxxxx")
        await attack("liar0", data + piece)                                    # unknown id
        await attack("liar1", half + head)                                     # unfinished
        over = bytearray(head)
        STREAM_HEAD.pack_into(over, PREAMBLE_BYTES, 7, FrameType.MESSAGE, 0, 0, 9 << 20)
        await attack("liar2", bytes(over))                                     # oversize
        await attack("liar3", half)                                            # peer gone
        await asyncio.sleep(0.3)
        st = victim.stats()
        assert st["rejected"].get("stream_unknown") == 1
        assert st["rejected"].get("stream_unfinished") == 1
        assert st["rejected"].get("oversize") == 1
        assert st["partial_frame_bytes"] == 0
        # the complete stream liar0 sent before lying was delivered; the node still serves
        got = await asyncio.wait_for(victim.recv(), 5)
        assert got.request_id == 1 and len(got.payloads[0].data) == 1_000_000
        a = TcpTransport("a", udp=False, max_frame_bytes=128 << 10)  # (the job's limits)
        await a.start()
        a.set_address_book({"victim": victim.local_address()})
        await a.send(Message(Kind.PUSH, "a", "victim", key=1, request_id=5,
                             payloads=[Payload.of(np.ones(2_000_000, np.float32))]))
        got = await asyncio.wait_for(victim.recv(), 10)
        assert got.request_id == 5 and got.payloads[0].data.sum() == 2_000_000
        await a.close()
        await victim.close()
    arun(main())


def test_a_message_over_max_message_bytes_is_refused_by_the_sender_naming_the_setting():
    async def main():
        a, b = await pair(max_message_bytes=1 << 20)
        with pytest.raises(wire.WireError, match=r"exceeds max_message_bytes .1048576.*raise "
                                                 r"`\[real\] max_message` in the scenario"):
            await a.send(big_msg(300_000))
        await a.close()
        await b.close()
    arun(main())


def test_streams_cut_by_killed_connections_are_written_again_and_arrive_once():
    """A connection reset mid-stream: the receiver frees the half-received stream, the
    sender dials again and streams the unacknowledged messages again, and each arrives
    once, in order, exact."""
    from tests.runtime.test_reconnect import (acks_on, kill_incoming, kill_outgoing, no_acks,
                                              reopened)

    n, size = 24, 600_000  # each message: a stream of five pieces

    async def main():
        a, b = await pair(max_frame_bytes=128 << 10)
        no_acks(b)
        killed = 0

        async def produce():
            nonlocal killed
            for i in range(n):
                await a.send(big_msg(size, rid=i, seed=i % 3))
                if i % 6 == 3:
                    await asyncio.sleep(0.002)  # b is inside a stream by now, or near
                    await reopened(a)
                    killed += (kill_incoming(b, "a") if i % 12 == 3 else kill_outgoing(a, "b"))

        producer = asyncio.ensure_future(produce())
        got = []
        for _ in range(n):
            m = await asyncio.wait_for(b.recv(), 20)
            np.testing.assert_array_equal(m.payloads[0].data,
                                          big_msg(size, seed=m.request_id % 3).payloads[0].data)
            got.append(m.request_id)
        await producer
        acks_on(b)
        sa, sb = a.stats(), b.stats()
        await a.close()
        await b.close()
        return got, killed, sa, sb

    got, killed, sa, sb = arun(main(), timeout_s=60.0)
    assert got == list(range(n))
    assert killed >= 3 and sa["streams"]["reconnects"] >= 3
    assert sa["streams"]["resent_messages"] >= 3
    assert sb["partial_frame_bytes"] == 0 and sb["rejected_frames"] == 0


def test_a_message_larger_than_the_budget_is_not_starved_by_newcomers():
    """The budget admits a message larger than itself only when empty: frames arriving
    on other connections meanwhile wait in line behind it instead of keeping it busy."""
    from geomx.runtime.tcp_conn import OPEN, FrameBudget

    budget = FrameBudget(100)

    class Line:
        """A connection's decoder and pause state, as FrameBudget sees them."""

        def __init__(self, want: int):
            self.want, self.state, self.waiting, self.admitted = want, OPEN, False, False
            self.decoder = self

        def try_(self) -> None:
            self.waiting = not budget.reserve(self.want)
            self.admitted = not self.waiting
            if self.waiting:
                budget.wait(self)

        def retry(self) -> None:
            self.waiting = not budget.reserve(self.want)
            self.admitted = not self.waiting

        def unpause(self, reason: str) -> None:
            assert reason == "budget"

    held, big, small = Line(60), Line(300), Line(10)
    held.try_()
    big.try_()
    small.try_()  # it would fit beside the 60, but the big one is in line first
    assert held.admitted and big.waiting and small.waiting
    budget.release(60)  # the big one has the budget to itself; the small one still waits
    assert big.admitted and small.waiting and budget.used_bytes == 300
    budget.release(300)
    assert small.admitted and budget.used_bytes == 10


def test_the_sender_follows_the_limits_its_receiver_announces():
    """The WELCOME says what the receiver takes: a sender allowed longer frames cuts its
    pieces to the receiver's, and a message larger than the receiver accepts is refused
    by the sender, naming the setting, instead of being refused (and written again on
    every reconnect) by the receiver."""
    async def main():
        a = TcpTransport("a", udp=False)  # 2 GiB frames allowed here
        b = TcpTransport("b", udp=False, max_frame_bytes=128 << 10, max_message_bytes=8 << 20)
        await start_pair(a, b)
        m = big_msg(1_000_000)  # 4 MB: one frame for a, a stream of 31 pieces for b
        await a.send(m)
        got = await asyncio.wait_for(b.recv(), 10)
        np.testing.assert_array_equal(got.payloads[0].data, m.payloads[0].data)
        with pytest.raises(wire.WireError, match=r"exceeds the 8388608 bytes its receiver "
                                                 r"accepts.*`\[real\] max_message`"):
            await a.send(big_msg(3_000_000))
        sa, sb = a.stats(), b.stats()
        assert sb["rejected_frames"] == 0 and sa["streams"]["reconnects"] == 0
        await a.close()
        await b.close()
    arun(main())
