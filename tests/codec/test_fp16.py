"""FP16 codec: bit-exact against numpy's cast on special values and random data."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from geomx.codec import FP16Codec, bits, cpu_kernels, decode
from geomx.codec.fp16 import numpy_nan_modes

QUIET_ENC, QUIET_DEC = numpy_nan_modes()

# float32 bit patterns around every fp16 corner case
SPECIAL_BITS = [
    0x00000000, 0x80000000,              # +-0
    0x7F800000, 0xFF800000,              # +-inf
    0x7FC00000, 0xFFC00000, 0x7FFFFFFF,  # quiet NaNs
    0x7F800001, 0xFF800001, 0x7FA00000, 0x7F802000, 0x7F801FFF,  # signalling NaNs
    0x7F7FFFFF, 0xFF7FFFFF,              # float32 max -> inf
    0x477FE000, 0xC77FE000,              # 65504, the largest half
    0x477FEFFF, 0x477FF000, 0x477FF001,  # just below / at / above the overflow tie 65520
    0x47800000, 0x501502F9,              # 65536, 1e10 -> inf
    0x38800000, 0x387FFFFF, 0x387FF000, 0x387FEFFF,  # smallest normal half and just below
    0x38000000,                          # 2**-15 (subnormal half)
    0x33800000, 0xB3800000,              # 2**-24, the smallest subnormal half
    0x33000000, 0x33000001, 0x32FFFFFF,  # 2**-25 (tie -> 0), just above, just below
    0x33C00000, 0x34200000,              # 1.5 * 2**-24 (tie -> 2), 2.5 * 2**-24 (tie -> 2)
    0x00000001, 0x807FFFFF, 0x00400000,  # float32 subnormals -> +-0
    0x3F800000, 0x3F801000, 0x3F803000,  # 1, 1 + 2**-11 (tie -> even 1), 1 + 3 * 2**-11 (tie -> up)
    0x3F801001, 0x3F800FFF, 0xBF801000,
    0x3DCCCCCD, 0x40490FDB, 0xC2F6E979,  # 0.1, pi, -123.456
]


def as_f32(b) -> np.ndarray:
    return np.asarray(b, dtype=np.uint64).astype(np.uint32).view(np.float32)


def numpy_half_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(np.float16).view(np.uint16)


def structured_inputs() -> np.ndarray:
    """Every fp16 value as float32, 1 ulp either side, and the midpoints to the next half
    (normal range: +0x1000 ulps) 1 ulp either side; plus the subnormal-half midpoints."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(all="ignore"):
        u = h.view(np.float16).astype(np.float32).view(np.uint32).astype(np.int64)
    parts = [u + d for d in (-1, 0, 1, 0x0FFF, 0x1000, 0x1001)]
    k = np.arange(0, 2050, dtype=np.float64)
    mids = (k * 2.0**-25).astype(np.float32).view(np.uint32).astype(np.int64)
    parts += [mids - 1, mids, mids + 1, mids | (1 << 31)]
    allb = np.concatenate(parts) & 0xFFFFFFFF
    return allb.astype(np.uint32).view(np.float32)


_f32_to_f16_int = numba.njit(bits.f32_to_f16)
_f16_to_f32_int = numba.njit(bits.f16_to_f32)


@numba.njit
def int_encode(src_u32, dst, quiet):
    for i in range(src_u32.size):
        dst[i] = _f32_to_f16_int(np.int64(src_u32[i]), quiet)


@numba.njit
def int_decode(src, dst_u32, quiet):
    for i in range(src.size):
        dst_u32[i] = _f16_to_f32_int(np.int64(src[i]), quiet)


def encoders():
    """(name, fn(x_f32, quiet) -> uint16 bits) for every fp32->fp16 implementation."""
    def kernel(k):
        def run(x, quiet):
            out = np.empty(x.size, np.uint16)
            k(x, out, quiet, 2)
            return out
        return run

    def integer(x, quiet):
        out = np.empty(x.size, np.uint16)
        int_encode(x.view(np.uint32), out, quiet)
        return out

    yield "bits", kernel(cpu_kernels.f32_to_f16_bits)
    if cpu_kernels.USE_F16C:
        yield "f16c", kernel(cpu_kernels.f32_to_f16_hw)
    yield "integer(cuda source)", integer


def decoders():
    def kernel(k):
        def run(h, quiet):
            out = np.empty(h.size, np.float32)
            k(h, out, quiet, False, 2)
            return out.view(np.uint32)
        return run

    def integer(h, quiet):
        out = np.empty(h.size, np.uint32)
        int_decode(h, out, quiet)
        return out

    def streaming(nch):
        def run(h, quiet):
            buf = np.empty(h.size + 1, np.float32)
            out = buf[1:]  # 4 bytes off a vector boundary: a scalar head, then streamed
            if nch == 1:
                cpu_kernels._f16_to_f32_stream_range(h, out, quiet, 0, h.size)
            else:
                cpu_kernels._f16_to_f32_stream(h, out, quiet, nch)
            return out.view(np.uint32)
        return run

    yield "bits", kernel(cpu_kernels.f16_to_f32_bits)
    if cpu_kernels.USE_F16C:
        yield "f16c", kernel(cpu_kernels.f16_to_f32_hw)
        yield "f16c streaming", streaming(1)
        yield "f16c streaming 3 chunks", streaming(3)
    yield "integer(cuda source)", integer


@pytest.mark.parametrize("name,enc", list(encoders()), ids=lambda v: v if isinstance(v, str) else "")
def test_encode_bit_exact_special_structured_and_random(name, enc):
    rng = np.random.default_rng(1)
    special = as_f32(SPECIAL_BITS)
    structured = structured_inputs()
    random_bits = rng.integers(0, 1 << 32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(200_000) * 10.0 ** rng.uniform(-9, 6, 200_000)).astype(np.float32)
    for x in (special, structured, random_bits, scaled):
        got = enc(x, QUIET_ENC)
        want = numpy_half_bits(x)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{name}: {bad.size} mismatches, e.g. {hex(x.view(np.uint32)[bad[0]])} -> " \
                              f"{hex(got[bad[0]])} vs numpy {hex(want[bad[0]])}"


def test_encoders_agree_in_both_nan_conventions():
    x = np.concatenate([as_f32(SPECIAL_BITS), structured_inputs()[::7]])
    for quiet in (False, True):
        results = [enc(x, quiet) for _, enc in encoders()]
        for r in results[1:]:
            assert np.array_equal(r, results[0])
    nan = as_f32([0x7F800001, 0xFFA00000])
    assert all(v & 0x7E00 == 0x7E00 for v in next(encoders())[1](nan, True))


@pytest.mark.parametrize("name,dec", list(decoders()), ids=lambda v: v if isinstance(v, str) else "")
def test_decode_all_65536_halves_bit_exact(name, dec):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(all="ignore"):
        want = h.view(np.float16).astype(np.float32).view(np.uint32)
    got = dec(h, QUIET_DEC)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{name}: half {hex(h[bad[0]])} -> {hex(got[bad[0]])} vs {hex(want[bad[0]])}"
    other = [d(h, not QUIET_DEC) for _, d in decoders()]
    for r in other[1:]:
        assert np.array_equal(r, other[0])


def test_codec_round_trip_and_wire_size(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "PARALLEL_MIN", 1 << 16)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((300, 701)) * 50).astype(np.float32)  # > PARALLEL_MIN, odd size
    c = FP16Codec()
    enc = c.encode(5, x)
    assert enc.arrays[0].dtype == np.float16 and enc.nbytes == 2 * x.size
    assert enc.meta == {"codec": "fp16", "n": x.size, "dtype": "<f4", "shape": [300, 701]}
    assert np.array_equal(enc.arrays[0], x.reshape(-1).astype(np.float16))
    y = decode(enc)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.array_equal(y, x.astype(np.float16).astype(np.float32))
    assert [tuple(s) for s in c.encoded_sizes(x.size)] == [("<f2", (x.size,))]


def test_decode_accumulates_in_fp32():
    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    enc = FP16Codec().encode(0, x)
    acc = np.full(x.size, 0.5, np.float32)
    decode(enc, out=acc, accumulate=True)
    assert np.array_equal(acc, np.float32(0.5) + x.astype(np.float16).astype(np.float32))
    decode(enc, out=acc)  # overwrite
    assert np.array_equal(acc, x.astype(np.float16).astype(np.float32))
    acc64 = np.ones(x.size)
    decode(enc, out=acc64, accumulate=True)
    assert np.allclose(acc64, 1 + x.astype(np.float16).astype(np.float64))


def test_fp16_and_fp64_inputs():
    h = np.array([1.5, -2.25, 65504], dtype=np.float16)
    enc = FP16Codec().encode(0, h)
    assert enc.meta["dtype"] == "<f2" and np.array_equal(enc.arrays[0], h)
    back = decode(enc)
    assert back.dtype == np.float16 and np.array_equal(back, h)
    d = np.array([1 + 2.0**-11 + 2.0**-40, 1e300, -3.0])
    enc = FP16Codec().encode(0, d)
    with np.errstate(all="ignore"):
        assert np.array_equal(enc.arrays[0], d.astype(np.float16))  # direct double -> half rounding
    assert decode(enc).dtype == np.float64


def test_numpy_nan_modes_are_booleans():
    assert all(isinstance(v, bool) for v in numpy_nan_modes())
