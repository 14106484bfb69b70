"""examples/policies/dgc.py, Deep Gradient Compression written against the public API:
top-k of the accumulated velocity, error feedback, momentum factor masking, warm-up."""

from __future__ import annotations

import numpy as np
import pytest

from geomx.policy import CodecError
from geomx.policy.codec import decode
from geomx.policy.registry import policy_class

from tests.policy.conftest import DGC_SPEC


@pytest.fixture(scope="module")
def DGC():
    return policy_class("codec", DGC_SPEC)


def test_it_sends_the_k_largest_and_keeps_the_rest_as_error_feedback(DGC):
    codec = DGC(ratio=0.1, momentum=0.0)
    rng = np.random.default_rng(0)
    g = rng.standard_normal(1000).astype(np.float32)
    state = codec.new_state(1000)
    enc = codec.encode(3, g, state)
    values, idx = enc.arrays
    assert values.shape == idx.shape == (100,) and enc.nbytes == 800
    assert set(idx) == set(np.argsort(-np.abs(g))[:100])
    sent = decode(enc)
    # nothing is lost: what was sent plus what stays in v is the gradient
    np.testing.assert_array_equal(sent + state.v, g)
    assert np.all(state.v[idx] == 0) and np.all(state.u[idx] == 0)  # factor masking


def test_momentum_correction_accumulates_velocity(DGC):
    codec = DGC(ratio=0.5, momentum=0.9)
    state = codec.new_state(2)
    g = np.array([1.0, 0.1], np.float32)
    codec.encode(0, g, state)            # sends index 0; u[1] = v[1] = 0.1
    enc = codec.encode(0, g, state)      # u = [1, 0.9*0.1 + 0.1]; v = [1, 0.1 + 0.19]
    np.testing.assert_array_equal(decode(enc), [1.0, 0.0])
    assert state.u[1] == pytest.approx(0.19, rel=1e-6)
    assert state.v[1] == pytest.approx(0.29, rel=1e-6)


def test_the_sampled_threshold_still_sends_exactly_k(DGC):
    codec = DGC(ratio=0.01, exact_below=1000, sample_ratio=0.05, seed=7)
    g = np.random.default_rng(1).standard_normal(50_000).astype(np.float32)
    enc = codec.encode(1, g, codec.new_state(g.size))
    assert enc.arrays[0].shape == (500,)
    exact = set(np.argsort(-np.abs(g))[:500])
    assert set(enc.arrays[1]) == exact


def test_warm_up_starts_dense_and_shrinks_to_the_ratio(DGC):
    codec = DGC(ratio=0.01, warmup_rounds=4)
    kept = [codec.kept(10_000, r) for r in range(6)]
    assert kept[0] > kept[1] > kept[2] > kept[3] > kept[4] == kept[5] == 100
    assert kept[0] < 2500


def test_decode_accumulates_and_refuses_bad_indices(DGC):
    codec = DGC(ratio=0.5)
    enc = codec.encode(0, np.array([3.0, -4.0, 0.5, 0.0], np.float32), codec.new_state(4))
    acc = np.ones(4, np.float32)
    decode(enc, out=acc, accumulate=True)
    np.testing.assert_array_equal(acc, [4.0, -3.0, 1.0, 1.0])
    bad = (enc.arrays[0], np.array([0, 9], np.int32)), enc.meta
    with pytest.raises(CodecError, match=r"dgc: indices outside \[0, 4\)"):
        decode((list(bad[0]), bad[1]))


def test_it_applies_to_the_wan_hop_above_its_size_bound_only(DGC):
    codec = DGC(size_lower_bound=100)
    assert codec.codec_for(1000, "wan") is codec
    assert codec.codec_for(1000, "lan").name == "none"
    assert codec.codec_for(10, "wan").name == "none"
