"""BF16 codec: round to nearest even, NaN stays NaN, exact decode."""
from __future__ import annotations

import numba
import numpy as np

from geomx.codec import BF16Codec, bits, decode
from geomx.codec import reference as ref

_f32_to_bf16_int = numba.njit(bits.f32_to_bf16)


@numba.njit
def int_encode(src_u32, dst):
    for i in range(src_u32.size):
        dst[i] = _f32_to_bf16_int(np.int64(src_u32[i]))


def f32(bits_list) -> np.ndarray:
    return np.asarray(bits_list, dtype=np.uint64).astype(np.uint32).view(np.float32)


def test_special_values():
    x = f32([0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # +-0, +-inf
             0x3F808000,  # 1 + 2**-8: tie -> even (1.0)
             0x3F818000,  # 1 + 3 * 2**-8: tie -> up
             0x3F808001, 0x3F807FFF,  # just above / below the tie
             0x7F7FFFFF,  # float32 max rounds up to inf (RNE)
             0x7F7F7FFF,  # stays finite
             0x00000001, 0x807FFFFF,  # float32 subnormals
             0x7FC00000, 0xFFC00001, 0x7F800001, 0xFF800001])  # NaNs, incl. low-payload ones
    got = BF16Codec().encode(0, x).arrays[0]
    want = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x3F80, 0x3F82, 0x3F81, 0x3F80,
            0x7F80, 0x7F7F, 0x0000, 0x8080, 0x7FC0, 0xFFC0, 0x7FC0, 0xFFC0]
    assert [int(v) for v in got] == want
    assert np.isnan(decode(BF16Codec().encode(0, x))[-4:]).all()


def test_matches_reference_on_random_bits_and_data():
    rng = np.random.default_rng(3)
    rb = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    data = (rng.standard_normal(150_001) * 1e3).astype(np.float32)
    for x in (rb, data):
        got = BF16Codec().encode(0, x).arrays[0]
        want = ref.f32_to_bf16(x)
        assert np.array_equal(got, want)
        integer = np.empty(x.size, np.uint16)
        int_encode(x.view(np.uint32), integer)  # the CUDA kernels' source
        assert np.array_equal(integer, want)


def test_round_trip_accumulate_and_size():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((70, 1000)).astype(np.float32)
    c = BF16Codec()
    enc = c.encode(1, x)
    assert enc.arrays[0].dtype == np.uint16 and enc.nbytes == 2 * x.size
    assert [tuple(s) for s in c.encoded_sizes(x.size)] == [("<u2", (x.size,))]
    y = decode(enc)
    expect = ref.bf16_to_f32(ref.f32_to_bf16(x.reshape(-1))).reshape(x.shape)
    assert y.shape == x.shape and np.array_equal(y, expect)
    assert np.max(np.abs(y - x) / np.maximum(np.abs(x), 1e-30)) <= 2.0**-8
    acc = np.ones(x.size, np.float32)
    decode(enc, out=acc, accumulate=True)
    assert np.array_equal(acc, np.float32(1) + expect.reshape(-1))
