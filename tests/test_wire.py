"""The wire format: round trips, phantoms, and rejection of malformed frames."""

import numpy as np
import pytest

from geomx import wire
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


def _one_array(**kw):
    """The common message, which encode and decode take a shorter way for: one 1-D
    array, no meta."""
    kw.setdefault("payloads", [Payload.of(np.arange(7, dtype=np.float32))])
    return _msg(meta={}, **kw)


_SHAPES = pytest.mark.parametrize("make", [_msg, _one_array], ids=["general", "one-1d-array"])


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


@_SHAPES
@pytest.mark.parametrize("mutate, reason", [
    (lambda b: b[:10], "truncated"),
    (lambda b: b"XX" + b[2:], "bad magic"),
    (lambda b: b[:2] + bytes([9]) + b[3:], "wire version"),
    (lambda b: b[:3] + bytes([250]) + b[4:], "unknown message kind"),
    (lambda b: b + b"junk", "trailing"),
    (lambda b: b[:-4], "truncated"),
])
def test_malformed_frames_raise_wire_error_with_a_reason(mutate, reason, make):
    good = encode_bytes(make())
    with pytest.raises(WireError, match=reason):
        decode(mutate(good))


def test_oversized_frame_is_refused_before_parsing():
    with pytest.raises(WireError, match="exceeds"):
        decode(encode_bytes(_msg()), max_bytes=100)


@_SHAPES
def test_random_garbage_never_escapes_as_another_exception(make):
    rng = np.random.default_rng(0)
    good = bytearray(encode_bytes(make()))
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


@pytest.mark.parametrize("array", [np.arange(7, dtype=np.float32), np.zeros(0, np.float16),
                                   np.arange(3, dtype=np.int64)])
def test_one_array_message_round_trips_byte_for_byte_like_the_general_form(array):
    m = _one_array(payloads=[Payload.of(array)])
    b = encode_bytes(m)
    # what the general form writes: header, names, no meta, descriptor, shape, data
    src, dst = m.src.encode(), m.dst.encode()
    expected = (wire._HEADER.pack(b"GX", wire.WIRE_VERSION, int(m.kind), m.channel, 1, 0,
                                  len(src), len(dst), 0, m.key, m.part, m.version,
                                  m.request_id, m.priority)
                + src + dst + wire._DESC.pack(wire._DTYPE_CODES[array.dtype.str], 1, 0)
                + wire._DIMS[1].pack(len(array)) + array.tobytes())
    assert b == expected
    d = decode(b)
    for f in ("kind", "src", "dst", "key", "part", "version", "request_id", "priority",
              "channel", "meta"):
        assert getattr(d, f) == getattr(m, f)
    (p,) = d.payloads
    assert (p.dtype, p.shape, p.nbytes) == (m.payloads[0].dtype, array.shape, array.nbytes)
    np.testing.assert_array_equal(p.data, array)
    assert decode(bytearray(b), owned=True).payloads[0].owned is True
    assert decode(b, owned=True).payloads[0].owned is False  # read-only: never its to keep
    assert decode(bytearray(b)).payloads[0].owned is False   # not handed over
    c = decode(b, copy=True).payloads[0]
    assert c.owned and c.data.flags.writeable


def test_names_are_read_by_their_lengths_not_only_their_bytes():
    # "ab" -> "c" and "a" -> "bc" have the same name bytes; the cache must not mix them
    a = decode(encode_bytes(_one_array(src="ab", dst="c")))
    b = decode(encode_bytes(_one_array(src="a", dst="bc")))
    assert (a.src, a.dst, b.src, b.dst) == ("ab", "c", "a", "bc")


def test_strangers_names_do_not_grow_the_decoder_without_bound():
    for i in range(6000):
        decode(encode_bytes(Message(Kind.PUSH, f"stranger-{i}", "gs:0")))
    assert len(wire._NAMES_OF) <= 4096
    # names past the bound still decode right
    assert decode(encode_bytes(Message(Kind.PUSH, "late-comer", "gs:0"))).src == "late-comer"
