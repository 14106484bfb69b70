"""onebit: sign bits + mean-|x| scale, with error feedback that conserves mass."""
from __future__ import annotations

import numpy as np
import pytest

from geomx.codec import CodecError, DenseCodec, OneBitCodec, cpu_kernels, decode
from geomx.codec import reference as ref


@pytest.mark.parametrize("n", [1, 7, 8, 13, 4096 + 5, 150_003])
def test_matches_numpy_reference(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n, dtype=np.float32)
    c = OneBitCodec()
    st = c.new_state(n)
    st.residual[:] = rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)
    r_ref = st.residual.copy()
    enc = c.encode(0, x, st)
    packed, scale = ref.onebit_encode(x, r_ref)
    assert np.array_equal(enc.arrays[0], packed)  # little-endian bit order, c >= 0 -> 1
    assert enc.arrays[1].dtype == np.float32 and enc.arrays[1][0] == pytest.approx(scale, rel=1e-6)
    assert np.allclose(st.residual, r_ref, rtol=0, atol=1e-6)
    assert enc.nbytes == (n + 7) // 8 + 4
    assert [tuple(s) for s in c.encoded_sizes(n)] == [("|u1", ((n + 7) // 8,)), ("<f4", (1,))]
    dec = decode(enc)
    assert np.array_equal(dec, ref.onebit_decode(packed, enc.arrays[1][0], n))


def test_error_feedback_conserves_mass_over_rounds():
    n = 100_001
    c = OneBitCodec()
    st = c.new_state(n)
    rng = np.random.default_rng(1)
    sent = np.zeros(n, np.float64)
    total = np.zeros(n, np.float64)
    for _ in range(6):
        x = rng.standard_normal(n, dtype=np.float32)
        before = st.residual.astype(np.float64) + x
        enc = c.encode(3, x, st)
        d = decode(enc)
        assert np.allclose(d + st.residual, before, rtol=0, atol=1e-5)  # per round
        assert np.all(np.abs(d) == enc.arrays[1][0])
        sent += d
        total += x
    assert np.allclose(sent + st.residual, total, rtol=0, atol=1e-4)


def test_chunking_does_not_change_bits():
    n = 70_001
    rng = np.random.default_rng(2)
    x = rng.standard_normal(n, dtype=np.float32)
    outs = []
    for nch in (1, 3):
        r = np.zeros(n, np.float32)
        packed = np.empty((n + 7) // 8, np.uint8)
        cpu_kernels.onebit_pack(x, r, np.float32(0.8), packed, nch)
        out = np.empty(n, np.float32)
        cpu_kernels.onebit_unpack(packed, np.float32(0.8), out, False, nch)
        outs.append((packed, r, out))
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


def test_decode_accumulates_and_policy():
    n = 1000
    c = OneBitCodec(size_lower_bound=100)
    enc = c.encode(0, np.linspace(-1, 1, n, dtype=np.float32), c.new_state(n))
    acc = np.ones(n, np.float32)
    decode(enc, out=acc, accumulate=True)
    assert np.array_equal(acc, 1 + decode(enc))
    assert c.codec_for(n, "wan") is c and isinstance(c.codec_for(n, "lan"), DenseCodec)
    assert isinstance(c.codec_for(99, "wan"), DenseCodec)
    assert c.encode(0, np.ones(99, np.float32)).meta["codec"] == "none"
    assert c.encode_pull(0, np.ones(n, np.float32)).meta["codec"] == "none"  # pulls dense
    with pytest.raises(CodecError, match="state"):
        c.encode(0, np.ones(n, np.float32))
