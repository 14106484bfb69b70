"""The wire format: round trips, phantoms, and rejection of malformed frames."""

import numpy as np
import pytest

from geomx.wire import (Kind, Message, Payload, WireError, decode, encode, encode_bytes,
                        frame_length)


def _msg(**kw):
    base = dict(kind=Kind.PUSH, src="w:party-a:0", dst="ls:party-a", key=3, part=1, version=7,
                request_id=99, priority=-2, channel=1, meta={"stop": True},
                payloads=[Payload.of(np.arange(12, dtype=np.float32).reshape(3, 4)),
                          Payload.of(np.arange(5, dtype=np.int32)),
                          Payload.phantom((25_000_000,), "<f4")])
    base.update(kw)
    return Message(**base)


def test_round_trip_keeps_every_field_and_array():
    m = _msg()
    d = decode(encode_bytes(m))
    for f in ("kind", "src", "dst", "key", "part", "version", "request_id", "priority",
              "channel", "meta"):
        assert getattr(d, f) == getattr(m, f)
    np.testing.assert_array_equal(d.payloads[0].data, m.payloads[0].data)
    assert d.payloads[0].data.shape == (3, 4)
    assert d.payloads[1].data.dtype == np.int32
    assert d.payloads[2].is_phantom and d.payloads[2].nbytes == 100_000_000


def test_arrays_are_zero_copy_views_in_encode():
    a = np.ones(1000, dtype=np.float32)
    frames = encode(Message(Kind.PUSH, "a", "b", payloads=[Payload.of(a)]))
    assert isinstance(frames[1], memoryview)
    a[0] = 5.0
    assert np.frombuffer(frames[1], dtype=np.float32)[0] == 5.0
    assert frame_length(frames) == len(encode_bytes(Message(Kind.PUSH, "a", "b",
                                                           payloads=[Payload.of(a)])))


def test_phantom_costs_its_size_but_no_memory():
    m = Message(Kind.PUSH, "a", "b", payloads=[Payload.phantom((1000, 1000))])
    assert m.nbytes == 64 + 16 + 4_000_000
    assert len(encode_bytes(m)) < 200


def test_float16_and_big_endian_inputs():
    a = np.array([1.5, -2.0], dtype=">f4")
    d = decode(encode_bytes(Message(Kind.PUSH, "a", "b", payloads=[Payload.of(a)])))
    assert d.payloads[0].data.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(d.payloads[0].data, [1.5, -2.0])
    h = np.array([1, 2], dtype=np.float16)
    assert decode(encode_bytes(Message(Kind.PUSH, "a", "b",
                                       payloads=[Payload.of(h)]))).payloads[0].dtype == "<f2"


def test_unsupported_dtype_is_refused():
    with pytest.raises(WireError, match="unsupported dtype"):
        Payload.of(np.array([1 + 2j]))


@pytest.mark.parametrize("mutate, reason", [
    (lambda b: b[:10], "truncated"),
    (lambda b: b"XX" + b[2:], "bad magic"),
    (lambda b: b[:2] + bytes([9]) + b[3:], "wire version"),
    (lambda b: b[:3] + bytes([250]) + b[4:], "unknown message kind"),
    (lambda b: b + b"junk", "trailing"),
    (lambda b: b[:-4], "truncated"),
])
def test_malformed_frames_raise_wire_error_with_a_reason(mutate, reason):
    good = encode_bytes(_msg())
    with pytest.raises(WireError, match=reason):
        decode(mutate(good))


def test_oversized_frame_is_refused_before_parsing():
    with pytest.raises(WireError, match="exceeds"):
        decode(encode_bytes(_msg()), max_bytes=100)


def test_random_garbage_never_escapes_as_another_exception():
    rng = np.random.default_rng(0)
    good = bytearray(encode_bytes(_msg()))
    for i in range(3000):
        b = bytearray(good)
        for _ in range(rng.integers(1, 6)):
            b[rng.integers(0, len(b))] = rng.integers(0, 256)
        if i % 3 == 0:
            b = bytearray(rng.integers(0, 256, rng.integers(0, 200), dtype=np.uint8).tobytes())
        try:
            decode(bytes(b))
        except WireError:
            pass


def test_reply_swaps_endpoints_and_keeps_request_id():
    m = _msg()
    r = m.reply(Kind.PUSH_ACK)
    assert (r.src, r.dst, r.request_id, r.key) == (m.dst, m.src, m.request_id, m.key)
