"""MPQ follows GeoMX's table (§4.3) for every case, with one size rule (N >= bound)."""
from __future__ import annotations

import numpy as np
import pytest

from geomx.codec import MPQ, BiSparseCodec, DenseCodec, FP16Codec, codec_from_config, decode
from geomx.policy.codec import SIZE_BOUND_ENV

BOUND = 1000


@pytest.mark.parametrize("n,tier,kind", [
    (10, "lan", FP16Codec), (10, "wan", FP16Codec),              # tiny: fp16 dense everywhere
    (999, "lan", FP16Codec), (999, "wan", FP16Codec),
    (1000, "lan", DenseCodec), (1000, "wan", BiSparseCodec),     # exactly the bound is large
    (10**6, "lan", DenseCodec), (10**6, "wan", BiSparseCodec),   # large: fp32 dense / sparse
])
def test_table(n, tier, kind):
    p = MPQ(0.01, size_lower_bound=BOUND)
    c = p.codec_for(n, tier)
    assert type(c) is kind
    assert p.is_large(n) == (n >= BOUND)
    if kind is BiSparseCodec:
        assert c.applies_to(n) and c.threshold == 0.01 and c.size_lower_bound == BOUND


def test_the_boundary_tensor_is_consistent_end_to_end():
    """GeoMX's mismatch: N == bound was made fp16 by the worker but sparsified as fp32 by
    the LS. Here the same tensor is fp32 on the LAN and Bi-Sparse on the WAN."""
    p = MPQ(0.01, size_lower_bound=BOUND)
    x = np.random.default_rng(0).standard_normal(BOUND, dtype=np.float32)
    lan = p.codec_for(BOUND, "lan").encode(0, x)
    assert lan.arrays[0].dtype == np.float32 and np.array_equal(decode(lan), x)
    wan_codec = p.codec_for(BOUND, "wan")
    wan = wan_codec.encode(0, x, wan_codec.new_state(BOUND))
    assert wan.meta["codec"] == "bsc" and wan.arrays[0].size <= 10


def test_tiny_tensors_travel_fp16_and_decode_to_fp32():
    p = MPQ(size_lower_bound=BOUND)
    x = np.linspace(-1, 1, 300, dtype=np.float32)
    for tier in ("lan", "wan"):
        enc = p.codec_for(x.size, tier).encode(0, x)
        assert enc.nbytes == 600 and np.array_equal(decode(enc), x.astype(np.float16).astype(np.float32))


def test_config_env_and_validation(monkeypatch):
    monkeypatch.setenv(SIZE_BOUND_ENV, "1234")
    p = codec_from_config({"type": "mpq", "threshold": 0.05})
    assert isinstance(p, MPQ) and p.size_lower_bound == 1234 and p.threshold == 0.05
    assert codec_from_config(p.config()) == p
    with pytest.raises(ValueError, match="threshold"):
        MPQ(1.5)
    with pytest.raises(ValueError, match="tier"):
        p.codec_for(10, "intra")
