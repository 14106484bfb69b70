"""The large-value path of push/pull copies nothing it does not have to, and what it
sends without a copy cannot change under the transport (frozen / reused only when free)."""

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
    pool = RecvBufferPool(max_bytes=3000, min_bytes=100)
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
