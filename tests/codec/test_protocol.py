"""The codec protocol: round trips, meta, phantom sizes, decode errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from geomx.codec import (
    ArraySpec,
    BF16Codec,
    BiSparseCodec,
    CodecError,
    CodecState,
    DenseCodec,
    Encoded,
    FP16Codec,
    OneBitCodec,
    decode,
)

CODECS = [DenseCodec(), FP16Codec(), BF16Codec(), BiSparseCodec(0.05, size_lower_bound=0), OneBitCodec()]


def expected_round_trip(codec, x: np.ndarray, enc: Encoded) -> np.ndarray:
    if codec.name == "none":
        return x
    if codec.name == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if codec.name == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        return ((((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)).view(np.float32)
    if codec.name == "bsc":
        out = np.zeros(x.size, np.float32)
        out[enc.arrays[1]] = enc.arrays[0]
        return out.reshape(x.shape)
    scale = enc.arrays[1][0]
    return np.where(x >= 0, scale, -scale).astype(np.float32)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_round_trip_shape_meta_and_bytes(codec):
    x = np.random.default_rng(0).standard_normal((37, 29)).astype(np.float32)
    st = codec.new_state(x.size)
    assert isinstance(st, CodecState)
    enc = codec.encode(4, x, st)
    assert enc.nbytes == sum(a.nbytes for a in enc.arrays)
    assert json.loads(json.dumps(enc.meta)) == enc.meta and len(json.dumps(enc.meta)) < 100
    assert enc.meta["codec"] == codec.name and enc.meta["n"] == x.size and enc.meta["shape"] == [37, 29]
    y = decode(enc)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert np.array_equal(y, expected_round_trip(codec, x, enc))
    assert np.array_equal(codec.decode((enc.arrays, enc.meta)), y)  # (arrays, meta) form
    # the phantom sizes are the real ones (for bsc: the capacity, never exceeded)
    specs = codec.encoded_sizes(x.size, "<f4")
    assert [s.dtype for s in specs] == [s.dtype for s in enc.specs()]
    if codec.name == "bsc":
        assert all(a.size <= s.shape[0] for a, s in zip(enc.arrays, specs))
    else:
        assert specs == enc.specs() and sum(s.nbytes for s in specs) == enc.nbytes
    assert enc.to_host().meta == enc.meta and not enc.on_device


def test_encode_copies_its_input():
    x = np.ones(10, np.float32)
    enc = DenseCodec().encode(0, x)
    x[:] = 5
    assert np.all(enc.arrays[0] == 1)


def test_array_spec_nbytes():
    assert ArraySpec("<f4", (10,)).nbytes == 40 and ArraySpec("|u1", (3, 2)).nbytes == 6


def test_decode_errors():
    enc = FP16Codec().encode(0, np.ones(8, np.float32))
    with pytest.raises(CodecError, match="unknown codec"):
        decode((enc.arrays, {**enc.meta, "codec": "zip"}))
    with pytest.raises(CodecError, match="n must be"):
        decode((enc.arrays, {**enc.meta, "n": -1}))
    with pytest.raises(CodecError, match="shape"):
        decode((enc.arrays, {**enc.meta, "shape": [3]}))
    with pytest.raises(CodecError, match="elements"):
        decode(enc, out=np.zeros(9, np.float32))
    with pytest.raises(CodecError, match="accumulate"):
        decode(enc, accumulate=True)
    with pytest.raises(CodecError, match="dtype"):
        decode(([enc.arrays[0].view(np.int16)], enc.meta))
    with pytest.raises(CodecError, match="expected 1 arrays"):
        decode(([], enc.meta))
    with pytest.raises(CodecError, match="contiguous"):
        decode(enc, out=np.zeros(16, np.float32)[::2])
    with pytest.raises(CodecError, match="Encoded"):
        decode(42)


def test_integer_tensors_are_refused():
    with pytest.raises(CodecError, match="float"):
        FP16Codec().encode(0, np.arange(4))


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_decode_read_only_wire_buffers(codec):
    """Arrays rebuilt from received bytes (np.frombuffer) are read-only: decode must not
    need to write them."""
    x = np.random.default_rng(1).standard_normal(3000).astype(np.float32)
    enc = codec.encode(0, x, codec.new_state(x.size))
    wire = [np.frombuffer(a.tobytes(), dtype=a.dtype) for a in enc.arrays]
    assert not wire[0].flags.writeable
    acc = np.zeros(x.size, np.float32)
    decode((wire, enc.meta), out=acc, accumulate=True)
    assert np.array_equal(acc, decode(enc))
