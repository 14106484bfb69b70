"""The large-value path of push/pull copies nothing it does not have to, and what it
sends without a copy cannot change under the transport (frozen / reused only when free)."""

import asyncio

import numpy as np
import pytest

from geomx import wire
from geomx.node import push_snapshots
from geomx.node.link_codec import _dense
from geomx.node.push_snapshots import PushSnapshots
from geomx.node.values import freeze, from_payload, thaw
from geomx.runtime.recv_pool import RecvBufferPool


def _msg(arr: np.ndarray) -> wire.Message:
    return wire.Message(wire.Kind.PUSH, "w", "s", key=3, payloads=[wire.Payload.of(arr)])


def test_owned_decode_is_taken_once_then_copied():
    arr = np.arange(1000, dtype=np.float32)
    body = bytearray(wire.encode_bytes(_msg(arr)))
    msg = wire.decode(body, owned=True)
    p = msg.payloads[0]
    assert p.owned
    first = from_payload(p, take=True)
    assert np.shares_memory(first, np.frombuffer(body, np.uint8))  # no copy
    second = from_payload(p, take=True)  # the same payload again: a copy
    assert not np.shares_memory(second, first)
    assert np.array_equal(second, arr)


def test_unowned_payloads_are_copied():
    arr = np.arange(10, dtype=np.float32)
    p = wire.Payload.of(arr)  # the emulator hands over the sender's array
    assert not p.owned
    assert not np.shares_memory(from_payload(p, take=True), arr)
    readonly = wire.decode(wire.encode_bytes(_msg(arr)), owned=True).payloads[0]
    assert not readonly.owned  # a read-only buffer cannot be handed over


def test_dense_sends_frozen_arrays_without_a_copy():
    a = np.ones(100, dtype=np.float32)
    assert not np.shares_memory(_dense(a).data, a)
    assert _dense(freeze(a)).data is a
    b = thaw(a)
    assert b is not a and b.flags.writeable and np.array_equal(a, b)
    c = np.zeros(4, np.float32)
    assert thaw(c) is c


def test_push_snapshots_reuse_only_unreferenced_buffers(monkeypatch):
    monkeypatch.setattr(push_snapshots, "MIN_REUSED_BYTES", 16)
    snaps = PushSnapshots()
    x = np.arange(100, dtype=np.float32)
    s1 = snaps.take(7, x)
    assert not s1.flags.writeable and np.array_equal(s1, x)
    held = memoryview(s1).cast("B")  # a queued frame still holds it
    s2 = snaps.take(7, x + 1)
    assert not np.shares_memory(s1, s2) and np.array_equal(s1, x)
    del held, s1
    addr = s2.ctypes.data
    del s2
    s3 = snaps.take(7, x + 2)
    assert s3.ctypes.data == addr and snaps.reused == 1  # free again: reused in place
    assert np.array_equal(s3, x + 2) and not s3.flags.writeable
    s4 = snaps.take(7, np.zeros(3, np.float32))  # another shape: a fresh one
    assert s4.shape == (3,)


def test_recv_pool_reuses_free_buffers_and_stays_bounded():
    pool = RecvBufferPool(max_bytes=3000, min_bytes=100, granule_bytes=500)
    a = pool.take(1000)
    addr = a.ctypes.data
    view = np.frombuffer(memoryview(a)[8:408], dtype=np.float32).reshape(10, 10)
    del a
    b = pool.take(1000)  # the first is still referenced through a decoded view
    assert b.ctypes.data != addr
    del view
    c = pool.take(1000)
    assert c.ctypes.data == addr and pool.reused == 1
    d = pool.take(1000)  # b and c in use: a third, at the bound
    assert pool.held_bytes == 3000
    e = pool.take(1000)  # over the bound: not kept
    assert pool.held_bytes == 3000 and e.nbytes == 1000
    del b, c, d
    f = pool.take(2000)  # free ones of another size make room
    assert pool.held_bytes <= 3000 and f.nbytes == 2000
    assert pool.take(50).nbytes == 50  # small: never pooled
    del e, f
    g = pool.take(1900)  # a frame a little shorter: the free 2000-byte buffer, as a view
    assert g.nbytes == 1900 and g.base is not None and g.base.nbytes == 2000
    addr = g.ctypes.data
    h = pool.take(1950)  # the view holds its buffer: not free
    assert h.ctypes.data != addr
    del g, h
    assert pool.take(1950).ctypes.data == addr
    with pytest.raises(ValueError):
        RecvBufferPool(max_bytes=-1)


def test_pull_without_out_returns_the_owned_value_and_relayed_payloads_are_copied():
    from geomx.node.link_codec import LinkCodec

    arr = np.arange(64, dtype=np.float32).reshape(8, 8)
    reply = wire.decode(bytearray(wire.encode_bytes(_msg(arr))), owned=True)
    codec = LinkCodec(None)  # dense
    taken = codec.decode(reply)
    assert np.shares_memory(taken, reply.payloads[0].data)
    relayed = wire.decode(bytearray(wire.encode_bytes(_msg(arr))), owned=True)
    relayed.payloads[0].owned = False  # what ts_overlay.on_relay does before forwarding
    assert not np.shares_memory(codec.decode(relayed), relayed.payloads[0].data)


def test_peek_and_decode_external_payload():
    a = np.arange(1000, dtype=np.float32).reshape(10, 100)
    m = wire.Message(wire.Kind.PULL_REPLY, "s", "w", key=1, request_id=9,
                     payloads=[wire.Payload.of(a)])
    b = wire.encode_bytes(m)
    kind, rid, off, dt, nbytes = wire.peek_single_payload(b[:200])
    assert (kind, rid, dt, nbytes, off + nbytes) == (wire.Kind.PULL_REPLY, 9, "<f4", 4000, len(b))
    assert wire.peek_single_payload(b[:off - 1]) is None  # shape not all here yet
    with_meta = wire.Message(wire.Kind.PULL_REPLY, "s", "w", meta={"codec": "fp16"},
                             payloads=[wire.Payload.of(a)])
    assert wire.peek_single_payload(wire.encode_bytes(with_meta)) is None
    sink = np.empty(1000, np.float32)
    sink.view(np.uint8)[:] = np.frombuffer(b[off:], np.uint8)
    got = wire.decode(bytearray(b[:off]), external=sink)
    assert np.shares_memory(got.payloads[0].data, sink) and got.payloads[0].owned
    np.testing.assert_array_equal(got.payloads[0].data, a)
    with pytest.raises(wire.WireError, match="its buffer"):
        wire.decode(bytearray(b[:off]), external=np.empty(999, np.float32))
    with pytest.raises(wire.WireError, match="no payload"):
        wire.decode(bytearray(b), external=sink)


def test_frame_decoder_routes_a_large_body_into_the_sink():
    from geomx.runtime import framing

    data = np.arange(50_000, dtype=np.float32)
    m = wire.Message(wire.Kind.PULL_REPLY, "s", "w", request_id=4, payloads=[wire.Payload.of(data)])
    frames, total = framing.message_frames(m)
    stream = b"".join(bytes(f) for f in frames)
    sink = np.zeros(50_000, np.float32)
    got = []

    def route(ftype, first, length):
        kind, rid, off, dt, nbytes = wire.peek_single_payload(first)
        return (off, sink) if rid == 4 and off + nbytes == length else None

    dec = framing.FrameDecoder(lambda t, f, body: got.append(body), route=route)
    for lo in range(0, len(stream), 7000):  # arbitrary recv sizes
        piece = stream[lo:lo + 7000]
        done = 0
        while done < len(piece):
            buf = dec.get_buffer()
            k = min(len(buf), len(piece) - done)
            buf[:k] = piece[done:done + k]
            dec.buffer_updated(k)
            done += k
    assert len(got) == 1 and isinstance(got[0], framing.SplitBody) and got[0].tail is sink
    assert len(got[0]) == total - framing.PREAMBLE_BYTES
    np.testing.assert_array_equal(sink, data)
    rej = framing.RejectLog("w")
    msg = framing.decode_message(got[0], "s", rej)
    assert np.shares_memory(msg.payloads[0].data, sink)


async def _connected_pair():
    """Two started TcpTransports, "a" and "b", that know each other's address."""
    from geomx.runtime.tcp import TcpTransport

    a, b = TcpTransport("a"), TcpTransport("b")
    for t in (a, b):
        await t.start()
    book = {t.name: t.local_address() for t in (a, b)}
    for t in (a, b):
        t.set_address_book(book)
    return a, b


def test_transport_receives_a_named_reply_into_the_callers_array():
    from geomx.runtime import eventloop

    async def main():
        a, b = await _connected_pair()
        data = np.random.default_rng(0).standard_normal(600_000).astype(np.float32)
        out = np.zeros_like(data)
        b.receive_into("a", 11, out)
        await a.send(wire.Message(wire.Kind.PULL_REPLY, "a", "b", request_id=11,
                                  payloads=[wire.Payload.of(data)]))
        got = await b.recv()
        assert np.shares_memory(got.payloads[0].data, out)
        np.testing.assert_array_equal(out, data)
        b.forget_receive(11)
        # not named (another request id / after forget): a buffer of its own
        await a.send(wire.Message(wire.Kind.PULL_REPLY, "a", "b", request_id=11,
                                  payloads=[wire.Payload.of(data * 2)]))
        got = await b.recv()
        assert not np.shares_memory(got.payloads[0].data, out)
        np.testing.assert_array_equal(out, data)
        for t in (a, b):
            await t.close()

    eventloop.run(asyncio.wait_for(main(), 30))


def test_send_loop_holds_no_message_once_sent():
    """A node's outbox task drops the message it sent before waiting for the next: the
    arrays it carried (a push snapshot, a server's stored value) go back to their pools
    only once nothing references them."""
    import weakref

    from geomx.node.base import Node
    from geomx.transport import TransportDefaults

    class Transport(TransportDefaults):
        sent = 0

        async def send(self, msg):
            Transport.sent += 1

    class Services:
        def count_bytes(self, msg):
            pass

    async def main():
        node = Node("w", "dc", Transport(), Services())
        node._running = True
        arr = np.ones(1000, dtype=np.float32)
        ref = weakref.ref(arr)
        node.post(wire.Message(wire.Kind.PUSH, "w", "s", payloads=[wire.Payload.of(arr)]))
        del arr
        for _ in range(5):
            await asyncio.sleep(0)
        assert Transport.sent == 1 and ref() is None
        for t in node._senders.values():
            t.cancel()

    asyncio.run(main())


def test_window_admits_a_large_message_behind_small_unacknowledged_ones():
    """A message over the retain limit does not wait for the delayed acknowledgement of
    a small one before it (a PUSH_ACK before a pull reply), but still waits behind a
    large unacknowledged one (the bound on what the sender holds)."""
    from geomx.runtime import framing
    from geomx.runtime.tcp_resume import OVERSIZE_ADMIT_FRACTION, SendWindow

    def frames(n):
        return framing.sequenced_frames(wire.Message(wire.Kind.PUSH, "a", "b",
                                                     payloads=[wire.Payload.of(np.zeros(n, np.uint8))]))

    async def main():
        limit = 1 << 20
        w = SendWindow(limit)
        small, big = frames(100), frames(3 * limit)
        assert w.has_room(big[1])
        w.assign(*small)
        assert w.has_room(big[1])  # only a small message unacknowledged
        w.assign(*big)
        assert not w.has_room(big[1]) and not w.has_room(small[1] + limit)
        w.ack(2)
        assert w.has_room(big[1])
        w.assign(*frames(int(limit * OVERSIZE_ADMIT_FRACTION) + 1))
        assert not w.has_room(big[1])  # more than the fraction unacknowledged

    asyncio.run(main())


def test_large_snapshot_copies_are_shared_with_helper_threads(monkeypatch):
    monkeypatch.setattr(push_snapshots, "PARALLEL_COPY_BYTES", 4096)
    monkeypatch.setattr(push_snapshots, "COPY_PIECE_BYTES", 1000)  # not a multiple of 8
    monkeypatch.setattr(push_snapshots, "COPY_HELPERS", 2)
    monkeypatch.setattr(push_snapshots, "MIN_REUSED_BYTES", 16)
    x = np.random.default_rng(1).standard_normal((37, 101))  # 29,896 bytes: 30 pieces
    snaps = PushSnapshots()
    for i in range(3):
        s = snaps.take(5, x + i)
        ok = np.array_equal(s, x + i) and not s.flags.writeable
        del s  # (before the assert: pytest's rewriting keeps what it looked at)
        assert ok
    assert snaps.reused == 2
    odd = x[:, ::2]  # not contiguous: one plain copy
    assert np.array_equal(snaps.take(6, odd), odd)


def test_receiver_reuses_its_buffers_for_frames_of_one_key():
    """A receiver that keeps the latest value it was sent (a server storing pushes)
    needs two receive buffers per key, however the frames' headers vary in length."""
    from geomx.runtime import eventloop

    async def main():
        a, b = await _connected_pair()
        data = np.arange(2 << 20, dtype=np.uint8)  # 2 MB: pooled
        stored = None
        for i in range(6):
            meta = {"round": "x" * i}  # headers a few bytes longer each time
            await a.send(wire.Message(wire.Kind.PUSH, "a", "b", key=1, meta=meta,
                                      payloads=[wire.Payload.of(data)]))
            got = await b.recv()
            stored = from_payload(got.payloads[0], take=True)  # kept, as a store
            del got
            assert np.array_equal(stored, data)
        pool = b._recv_pool
        for t in (a, b):
            await t.close()
        return pool.allocated, pool.reused

    allocated, reused = eventloop.run(asyncio.wait_for(main(), 30))
    assert allocated == 2 and reused == 4


def test_a_codec_that_is_not_elementwise_keeps_keys_whole_and_weights_dense(tmp_path):
    """A user codec says whether it is elementwise; a sparse one (the default) is never
    split across servers and never encodes a weight vector, whatever its name."""
    from geomx.node.link_codec import LinkCodec

    (tmp_path / "mycodecs.py").write_text(
        "from geomx.policy.codec import Codec\n\n\n"
        "class HalfTopK(Codec):\n"
        "    name = 'test-half-topk'\n\n"
        "    def encode(self, key, x, state=None):\n"
        "        raise AssertionError('weights must not reach a sparse codec')\n\n"
        "    def encoded_sizes(self, num_elements, dtype='<f4'):\n"
        "        return []\n\n"
        "    @classmethod\n"
        "    def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate):\n"
        "        return out\n\n\n"
        "class Scaled(HalfTopK):\n"
        "    name = 'test-scaled'\n"
        "    elementwise = True\n")
    w = np.arange(16, dtype=np.float32)
    sparse = LinkCodec({"type": f"{tmp_path / 'mycodecs.py'}:HalfTopK"})
    assert sparse.enabled  # placement keeps its keys whole
    payloads, meta = sparse.encode_pull(0, w, tier="wan", weights=True)
    assert meta == {} and np.array_equal(np.asarray(payloads[0].data).view(np.float32), w)
    assert not LinkCodec({"type": f"{tmp_path / 'mycodecs.py'}:Scaled"}).enabled
    for name in ("fp16", "bf16", "none"):
        assert not LinkCodec({"type": name}).enabled
    for name in ("bsc", "mpq", "onebit"):
        assert LinkCodec({"type": name}).enabled
