"""TcpTransport over loopback: delivery guarantees, channels, priority, back-pressure, UDP."""

from __future__ import annotations

import asyncio
import random
import socket

import numpy as np
import pytest

from geomx import wire
from geomx.runtime import eventloop, framing, udp
from geomx.runtime.tcp import (WRITE_BATCH_BYTES, WRITE_HIGH_WATER_BYTES, HandshakeRefused,
                               TcpTransport, parse_address)
from geomx.transport import Transport
from geomx.wire import Kind, Message, Payload

from tests.helpers.aio import arun
from tests.helpers.ports import free_port


async def cluster(*names: str, **kw) -> list[TcpTransport]:
    nodes = [TcpTransport(n, **kw) for n in names]
    for n in nodes:
        await n.start()
    book = {n.name: n.local_address() for n in nodes}
    for n in nodes:
        n.set_address_book(book)
    return nodes


async def close_all(*nodes: TcpTransport) -> None:
    for n in nodes:
        await n.close()


def msg(src: str, dst: str, i: int = 0, *, ch: int = 0, prio: int = 0, n: int = 4,
        dtype=np.float32) -> Message:
    data = (np.arange(n) + i).astype(dtype)
    return Message(Kind.PUSH, src, dst, key=i, request_id=i, channel=ch, priority=prio,
                   meta={"i": i}, payloads=[Payload.of(data)])


# -- basics -----------------------------------------------------------------------------------

def test_implements_transport_protocol_and_loop_choice():
    async def main():
        (a,) = await cluster("a")
        assert isinstance(a, Transport)
        host, port = parse_address(a.local_address())
        assert host == "127.0.0.1" and port == a.port > 0
        kind = eventloop.loop_kind()
        await a.close()
        return kind
    want = "uvloop" if eventloop.uvloop_available() else "asyncio"
    assert arun(main(), use_uvloop=True) == want
    assert arun(main(), use_uvloop=False) == "asyncio"


def test_parse_address_errors():
    assert parse_address("[::1]:80") == ("::1", 80)
    for bad in ("nohost", ":80", "h:0", "h:x", "h:70000"):
        with pytest.raises(ValueError, match="host:port"):
            parse_address(bad)
    t = TcpTransport("a")
    with pytest.raises(ValueError, match="'b'"):
        t.set_address_book({"b": "localhost"})


def test_payloads_roundtrip_exactly():
    async def main():
        a, b = await cluster("a", "b")
        rng = np.random.default_rng(0)
        arrays = [rng.standard_normal((3, 5)).astype("<f4"), np.arange(7, dtype="<i8"),
                  rng.integers(0, 255, 1000).astype("|u1"), np.zeros((0,), "<f2"),
                  rng.standard_normal(300_000).astype("<f8")]   # 2.4 MB: the large-frame path
        m = Message(Kind.PULL_REPLY, "a", "b", key=5, part=1, version=9, request_id=77,
                    meta={"codec": "fp16", "n": [1, 2]},
                    payloads=[Payload.of(x) for x in arrays] + [Payload.phantom(10)])
        await a.send(m)
        got = await b.recv()
        assert (got.kind, got.src, got.dst, got.key, got.part, got.version, got.request_id) == \
            (Kind.PULL_REPLY, "a", "b", 5, 1, 9, 77)
        assert got.meta == {"codec": "fp16", "n": [1, 2]}
        for x, p in zip(arrays, got.payloads):
            assert p.dtype == x.dtype.str and p.shape == x.shape
            np.testing.assert_array_equal(p.data, x)
        assert got.payloads[-1].is_phantom and got.payloads[-1].nbytes == 40
        assert got.payloads[4].data.flags.writeable  # decoded in place, owned by the message
        st_a, st_b = a.stats(), b.stats()
        assert st_a["peers"]["b"]["bytes_sent"] == st_b["peers"]["a"]["bytes_received"] > 2_400_000
        assert st_a["peers"]["b"]["msgs_sent"] == st_b["peers"]["a"]["msgs_received"] == 1
        await close_all(a, b)
    arun(main())


def test_order_per_channel_and_exactly_once():
    async def main():
        a, b, c = await cluster("a", "b", "c")
        rng = random.Random(1)
        n_each = 400

        async def sender(t: TcpTransport):
            for i in range(n_each):
                size = rng.choice([1, 10, 1000, 40_000])  # mixes small and batched writes
                await t.send(msg(t.name, "c", i, ch=i % 3, n=size))
                if i % 50 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(sender(a), sender(b))
        seen: dict[tuple[str, int], list[int]] = {}
        for _ in range(2 * n_each):
            m = await c.recv()
            seen.setdefault((m.src, m.channel), []).append(m.request_id)
            assert m.payloads[0].data[0] == m.request_id
        for (src, ch), ids in seen.items():
            assert ids == sorted(ids), f"order broken on {src}/ch{ch}"
        all_ids = sorted((s, i) for (s, _), ids in seen.items() for i in ids)
        assert all_ids == sorted((s, i) for s in "ab" for i in range(n_each))  # exactly once
        await asyncio.sleep(0.05)
        assert c.pending() == 0
        st = c.stats()
        assert st["msgs_received"] == 2 * n_each and st["rejected_frames"] == 0
        assert a.stats()["msgs_sent"] == n_each
        await close_all(a, b, c)
    arun(main())


def test_send_nowait_bursts_keep_order_with_queued_sends():
    """Small messages written at once (corked within a loop turn, geomx/runtime/
    tcp_outgoing.py) and larger ones through send() arrive in order, exactly once."""
    async def main():
        a, b = await cluster("a", "b")
        assert not a.send_nowait(msg("a", "b", 0))  # no connection yet: send() dials
        await a.send(msg("a", "b", 0))
        fast = 0
        i = 1
        for burst in range(30):
            for _ in range(60):  # one loop turn: the first written, the rest corked
                size = 1000 if i % 7 else 30_000  # over the fast path's limit: send()
                m = msg("a", "b", i, n=size)
                if a.send_nowait(m):
                    fast += 1
                else:
                    await a.send(m)
                i += 1
            await asyncio.sleep(0)
        got = [(await b.recv()).request_id for _ in range(i)]
        assert got == list(range(i))
        assert fast > i // 2
        assert a.stats()["msgs_sent"] == i
        await close_all(a, b)
    arun(main())


def test_a_turns_small_messages_share_frames_and_arrive_one_by_one():
    """After the first small message of a loop turn, send_nowait holds the next ones and
    frames them together (one SEQ_MESSAGE flagged SPLIT_BATCH per ~CORK_BYTES,
    tcp_outgoing.Outgoing.hold); the receiver still gets each message on its own, in
    order, exactly once -- also when the connection breaks while messages are held."""
    async def main():
        a, b = await cluster("a", "b")
        await a.send(msg("a", "b", 0))
        assert (await b.recv()).request_id == 0
        conn = next(c for c in b._incoming if c.peer == "a")
        frames_before = conn.decoder.frames
        for i in range(1, 301):
            assert a.send_nowait(msg("a", "b", i, n=16))
        got = [await b.recv() for _ in range(300)]
        assert [m.request_id for m in got] == list(range(1, 301))
        assert all(m.kind == Kind.PUSH and m.meta == {"i": m.key} for m in got)
        assert np.array_equal(got[41].payloads[0].data, np.arange(16, dtype=np.float32) + 42)
        assert conn.decoder.frames - frames_before < 10  # not 300
        assert a.stats()["msgs_sent"] == b.stats()["msgs_received"] == 301
        # held messages when the connection breaks: numbered into the window, resent once
        out = next(o for (peer, _), o in a._out.items() if peer == "b")
        for i in range(301, 401):
            assert a.send_nowait(msg("a", "b", i, n=16))
        assert out._held
        out.proto.transport.abort()
        got = [(await b.recv()).request_id for _ in range(100)]
        assert got == list(range(301, 401))
        await asyncio.sleep(0.05)
        assert b.stats()["inbox_messages"] == 0
        await close_all(a, b)
    arun(main())


def test_all_reliable_channels_are_separate_connections():
    async def main():
        a, b = await cluster("a", "b")
        for i in range(80):
            await a.send(msg("a", "b", i, ch=i % 8))
        got = [await b.recv() for _ in range(80)]
        by_ch: dict[int, list[int]] = {}
        for m in got:
            by_ch.setdefault(m.channel, []).append(m.request_id)
        assert sorted(by_ch) == list(range(8))
        assert all(ids == sorted(ids) and len(ids) == 10 for ids in by_ch.values())
        assert a.stats()["connections_out"] == 8
        assert b.stats()["connections_in"] == 8
        await close_all(a, b)
    arun(main())


def test_small_channel_not_blocked_by_bulk_channel():
    async def main():
        a, b = await cluster("a", "b")
        await a.connect("b", 0)
        await a.connect("b", 1)
        big = Message(Kind.PUSH, "a", "b", channel=1,
                      payloads=[Payload.of(np.zeros(12_000_000, np.float32))])  # 48 MB
        await a.send(big)
        await a.send(msg("a", "b", 1, ch=0))
        first = await b.recv()
        assert first.channel == 0  # the small message overtook the bulk transfer
        second = await b.recv()
        assert second.channel == 1 and second.payloads[0].nbytes == 48_000_000
        await close_all(a, b)
    arun(main())


def test_priority_inside_a_channel():
    async def main():
        a, b = await cluster("a", "b")
        await a.connect("b", 0)
        # A large message first keeps the connection busy while the others queue behind it.
        big = Message(Kind.PUSH, "a", "b", key=-7, priority=100,
                      payloads=[Payload.of(np.zeros(6 * WRITE_BATCH_BYTES // 4, np.float32))])
        await a.send(big)
        rng = random.Random(3)
        prios = [rng.choice([0, 1, 2, 5, -1]) for _ in range(60)]
        for i, p in enumerate(prios):
            await a.send(msg("a", "b", i, prio=p))
        order = [await b.recv() for _ in range(61)]
        assert order[0].key == -7
        got = [(m.priority, m.request_id) for m in order[1:]]
        want = sorted(((p, i) for i, p in enumerate(prios)), key=lambda t: (-t[0], t[1]))
        assert got == want  # higher first, FIFO among equals
        await close_all(a, b)
    arun(main())


# -- back-pressure ----------------------------------------------------------------------------

def test_back_pressure_bounds_sender_queue():
    limit = 4 * 1024 * 1024
    one = 1024 * 1024
    total = 64

    async def main():
        a = TcpTransport("a", send_queue_limit_bytes=limit)
        b = TcpTransport("b", recv_queue_limit_bytes=2 * one)
        for t in (a, b):
            await t.start()
        book = {"a": a.local_address(), "b": b.local_address()}
        a.set_address_book(book)
        b.set_address_book(book)
        payload = np.ones(one // 4, np.float32)
        sent = 0

        async def producer():
            nonlocal sent
            for i in range(total):
                await a.send(Message(Kind.PUSH, "a", "b", request_id=i,
                                     payloads=[Payload.of(payload)]))
                sent += 1

        task = asyncio.create_task(producer())
        await asyncio.sleep(1.0)   # b never calls recv() meanwhile
        out = a._out[("b", 0)]
        st = a.stats()
        assert not task.done(), "send() should be blocked by a receiver that stops reading"
        assert sent < total
        assert st["max_queued_bytes"] <= limit
        buffered = out.proto.transport.get_write_buffer_size()
        assert buffered <= WRITE_HIGH_WATER_BYTES + WRITE_BATCH_BYTES
        assert b.stats()["inbox_bytes"] <= 2 * one + one + 1024
        # once the receiver reads again everything arrives, in order
        ids = []
        for _ in range(total):
            ids.append((await b.recv()).request_id)
        await task
        assert ids == list(range(total))
        assert a.stats()["max_queued_bytes"] <= limit
        await close_all(a, b)
    arun(main())


def test_message_larger_than_queue_limit_is_admitted_alone():
    async def main():
        a, b = await cluster("a", "b", send_queue_limit_bytes=1024)
        await a.send(msg("a", "b", 1, n=100_000))
        await a.send(msg("a", "b", 2, n=100_000))
        assert [(await b.recv()).request_id for _ in range(2)] == [1, 2]
        await close_all(a, b)
    arun(main())


# -- connecting -------------------------------------------------------------------------------

def test_lazy_connect_retries_until_peer_starts():
    async def main():
        port = free_port()
        a = TcpTransport("a", connect_timeout_s=10)
        await a.start()
        a.set_address_book({"b": f"127.0.0.1:{port}"})

        async def late_start():
            await asyncio.sleep(0.4)
            b = TcpTransport("b", port=port)
            await b.start()
            return b

        starter = asyncio.create_task(late_start())
        await a.send(msg("a", "b", 42))   # waits while b is not up yet
        b = await starter
        assert (await b.recv()).request_id == 42
        await close_all(a, b)
    arun(main())


def test_connect_timeout_names_the_peer():
    async def main():
        a = TcpTransport("a", connect_timeout_s=0.3, address_wait_s=0.3)
        await a.start()
        a.set_address_book({"gs:0": f"127.0.0.1:{free_port()}"})
        with pytest.raises(ConnectionError, match=r"'gs:0'.*127\.0\.0\.1"):
            await a.send(msg("a", "gs:0"))
        with pytest.raises(ConnectionError, match="no address for peer 'nobody'"):
            await a.send(msg("a", "nobody"))
        await a.close()
    arun(main())


def test_stale_address_book_is_reported():
    async def main():
        a, b = await cluster("a", "b")
        a.set_address_book({"c": b.local_address()})
        with pytest.raises(HandshakeRefused, match="not 'c'"):
            await a.send(msg("a", "c"))
        await close_all(a, b)
    arun(main())


def test_reconnects_after_peer_restarts():
    async def main():
        a, b = await cluster("a", "b")
        await a.send(msg("a", "b", 1))
        assert (await b.recv()).request_id == 1
        port = b.port
        await b.close()
        await asyncio.sleep(0.1)
        b2 = TcpTransport("b", port=port)
        await b2.start()
        await a.send(msg("a", "b", 2))
        assert (await b2.recv()).request_id == 2
        await close_all(a, b2)
    arun(main())


def test_close_flushes_queued_messages_and_recv_then_fails():
    async def main():
        a, b = await cluster("a", "b")
        for i in range(30):
            await a.send(msg("a", "b", i, n=50_000))
        await a.close()
        ids = [(await b.recv()).request_id for _ in range(30)]
        assert ids == list(range(30))
        await b.close()
        with pytest.raises(ConnectionError):
            await b.recv()
        with pytest.raises(ConnectionError):
            await b.send(msg("b", "a"))
    arun(main())


def test_stock_asyncio_loop_fallback():
    async def main():
        assert eventloop.loop_kind() == "asyncio"
        a, b = await cluster("a", "b")
        await a.send(msg("a", "b", 1, n=3_000_000))  # 12 MB: batched writes
        await a.send(msg("a", "b", 2, ch=wire.UNRELIABLE_BASE))
        got = sorted([await b.recv() for _ in range(2)], key=lambda m: m.request_id)
        assert got[0].payloads[0].data[-1] == 3_000_000 and got[1].channel == 8
        await close_all(a, b)
    arun(main(), use_uvloop=False)


# -- framing ----------------------------------------------------------------------------------

def test_frame_decoder_any_split():
    rng = random.Random(5)
    msgs = [msg("a", "b", i, n=rng.choice([0, 3, 70_000, 200_000])) for i in range(12)]
    stream = b"".join(b"".join(bytes(f) for f in framing.message_frames(m)[0]) for m in msgs)
    for trial in range(20):
        out = []
        dec = framing.FrameDecoder(lambda t, f, body: out.append(wire.decode(body)),
                                   scratch_bytes=4096 * (1 + trial % 3))
        pos = 0
        while pos < len(stream):
            buf = dec.get_buffer(-1)
            n = min(len(buf), rng.choice([1, 7, 100, 5000, 1 << 20]), len(stream) - pos)
            buf[:n] = stream[pos:pos + n]
            dec.buffer_updated(n)
            pos += n
        assert [m.request_id for m in out] == list(range(12))
        assert dec.pending_bytes() == 0
        for m, g in zip(msgs, out):
            np.testing.assert_array_equal(m.payloads[0].data, g.payloads[0].data)


def test_frame_decoder_rejects_oversize_before_allocating():
    dec = framing.FrameDecoder(lambda *a: None, max_frame_bytes=1000)
    buf = dec.get_buffer(-1)
    pre = framing.pack_preamble(framing.FrameType.MESSAGE, 1001)
    buf[:8] = pre
    with pytest.raises(framing.FramingError, match="1001 bytes announced") as e:
        dec.buffer_updated(8)
    assert e.value.category == "oversize"


# -- UDP --------------------------------------------------------------------------------------

def test_udp_channel_roundtrip_and_chunking():
    async def main():
        a, b = await cluster("a", "b", udp_chunk_bytes=1000)
        m = msg("a", "b", 3, ch=wire.UNRELIABLE_BASE + 2, n=20_000)  # 80 KB -> 81 datagrams
        await a.send(m)
        got = await b.recv()
        assert got.channel == 10 and got.request_id == 3
        np.testing.assert_array_equal(got.payloads[0].data, m.payloads[0].data)
        su, ru = a.stats()["udp"], b.stats()["udp"]
        assert su["datagrams_sent"] == 81 == ru["datagrams_received"]
        assert ru["messages_received"] == 1 and ru["incomplete_dropped"] == 0
        assert a.stats()["peers"]["b"]["bytes_sent"] == b.stats()["peers"]["a"]["bytes_received"]
        await close_all(a, b)
    arun(main())


def test_udp_lost_chunk_drops_message_and_counts_it():
    async def main():
        (b,) = await cluster("b", udp_reassembly_timeout_s=0.2)
        host, port = parse_address(b.local_address())
        data = wire.encode_bytes(msg("a", "b", 9, ch=8, n=2000))
        dgrams = udp.split_message(data, 77, 1400)
        assert len(dgrams) == 6
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i, d in enumerate(dgrams):
            if i != 2:
                s.sendto(d, (host, port))
        await asyncio.sleep(0.5)
        st = b.stats()["udp"]
        assert b.pending() == 0 and st["incomplete_dropped"] == 1 and st["pending_messages"] == 0
        # the same chunks, complete and out of order, and duplicated: delivered once
        for d in reversed(udp.split_message(data, 78, 1400)):
            s.sendto(d, (host, port))
            s.sendto(d, (host, port))
        got = await asyncio.wait_for(b.recv(), 2)
        assert got.request_id == 9
        assert b.stats()["udp"]["duplicate_chunks"] == 5
        s.close()
        await b.close()
    arun(main())


def test_reassembler_rejects_malformed_datagrams():
    r = udp.Reassembler(timeout_s=1.0, max_message_bytes=5000)
    good = udp.split_message(b"x" * 3000, 1, 1000)
    bad = [b"", b"GU", b"XX" + good[0][2:], good[0][:2] + b"\x09" + good[0][3:],
           udp.CHUNK_HEADER.pack(b"GU", 1, 0, 5, 3, 3), udp.CHUNK_HEADER.pack(b"GU", 1, 0, 5, 0, 0),
           udp.CHUNK_HEADER.pack(b"GU", 1, 0x80, 5, 0, 1)]
    for d in bad:
        with pytest.raises(udp.DatagramError):
            r.feed(d, "p", 0.0)
    assert r.feed(good[0], "p", 0.0) is None
    with pytest.raises(udp.DatagramError, match="differs"):
        r.feed(udp.CHUNK_HEADER.pack(b"GU", 1, 0, 1, 1, 4) + b"y", "p", 0.0)
    big = udp.split_message(b"z" * 8000, 2, 1000)
    with pytest.raises(udp.DatagramError, match="announces 8 chunks of 1000 bytes, past 5000"):
        r.feed(big[0], "p", 0.0)  # refused before anything is held
    # a last chunk (whose size says nothing of the others) that overflows is caught on arrival
    r2 = udp.Reassembler(timeout_s=1.0, max_message_bytes=5000)
    sneaky = [udp.CHUNK_HEADER.pack(b"GU", 1, 0, 9, i, 3) + b"w" * n for i, n in ((2, 4000),
                                                                                  (0, 2000))]
    assert r2.feed(sneaky[0], "p", 0.0) is None
    with pytest.raises(udp.DatagramError, match="grows past"):
        r2.feed(sneaky[1], "p", 0.0)
    assert r2.pending_bytes == 0
    assert r.expire(5.0) == 1 and r.pending_bytes == 0
    assert r.stats.rejected == len(bad) + 2


def test_reassembler_memory_is_bounded_against_announced_chunk_counts():
    """13-byte datagrams each claiming to be chunk 0 of 65,535 must not each allocate a
    65,535-slot table (2,500 of them would take 300-730 MB): a partial message costs what
    it carries plus a fixed charge, all counted against max_pending_bytes."""
    import tracemalloc

    bound = 1 << 20
    r = udp.Reassembler(timeout_s=60.0, max_pending_bytes=bound)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for mid in range(20_000):
            r.feed(udp.CHUNK_HEADER.pack(b"GU", 1, 0, mid, 0, 0xFFFF) + b"x", ("evil", 1), 0.0)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert r.pending_bytes <= bound
    assert held < 2 * bound, held          # the accounting is not far below the truth
    assert r.stats.incomplete > 15_000     # the oldest were evicted to stay inside the bound
    # an honest message still gets through afterwards
    good = udp.split_message(b"y" * 3000, 7, 1000)
    assert [r.feed(d, ("ok", 2), 0.0) for d in good][-1] == bytearray(b"y" * 3000)


def test_close_wakes_blocked_senders_and_connectors():
    async def main():
        a = TcpTransport("a", send_queue_limit_bytes=1 << 20, connect_timeout_s=30)
        b = TcpTransport("b", recv_queue_limit_bytes=1 << 20)
        for t in (a, b):
            await t.start()
        a.set_address_book({"b": b.local_address(), "ghost": f"127.0.0.1:{free_port()}"})

        async def flood():
            for i in range(200):
                await a.send(msg("a", "b", i, n=256 * 1024))

        blocked = asyncio.create_task(flood())
        connecting = asyncio.create_task(a.send(msg("a", "ghost")))
        await asyncio.sleep(0.5)
        assert not blocked.done() and not connecting.done()
        await a.close(flush_timeout_s=0.2)
        for task in (blocked, connecting):
            with pytest.raises(ConnectionError, match="closed"):
                await asyncio.wait_for(task, 2)
        await b.close()
    arun(main())
