"""Bi-Sparse (bsc): GeoMX's algorithm, its sizes, conservation, density, determinism."""
from __future__ import annotations

import json

import numpy as np
import pytest

from geomx.codec import BiSparseCodec, CodecError, DenseCodec, cpu_kernels, decode
from geomx.codec import reference as ref
from geomx.policy.codec import SIZE_BOUND_ENV

M = np.float32(0.9)


def codec(r=0.01, **kw) -> BiSparseCodec:
    kw.setdefault("size_lower_bound", 1000)
    return BiSparseCodec(r, **kw)


def push_reference(c: BiSparseCodec, key: int, g, u, v, rnd: int):
    size, top_k = c.sample_plan(g.size)
    pos = c.sample_positions(g.size, key, rnd)
    return ref.bsc_push(g, u, v, c.momentum, pos, top_k, c.capacity(g.size))


# ------------------------------------------------------------------ sizes, as GeoMX


@pytest.mark.parametrize("n,push_k,pull_k", [(12_800, 128, 256), (131_072, 1310, 2621),
                                               (32_768, 327, 655), (1_280, 12, 25)])
def test_demo_table_sizes(n, push_k, pull_k):
    """docs/geomx-behaviour.md §4.1 demo (r = 0.01, D = 2): sample 1000, top_k 10; GeoMX's
    buffers hold floor(2Nr) floats for K = floor(Nr) pairs."""
    c = codec()
    assert c.sample_plan(n) == (1000, 10)
    assert c.capacity(n) == push_k and c.pull_capacity(n, 2) == pull_k
    assert [tuple(s) for s in c.encoded_sizes(n)] == [("<f4", (push_k,)), ("<i4", (push_k,))]
    assert [tuple(s) for s in c.pull_encoded_sizes(n, sources=2)] == [("<f4", (pull_k,)), ("<i4", (pull_k,))]
    assert c.encoded_nbytes(n) == 8 * push_k


def test_sample_size_rules_and_clamp():
    c = codec()
    assert c.sample_plan(25_000_000) == (125_000, 1250)  # 0.5% of N when that gives top_k >= 10
    assert c.sample_plan(400) == (400, 4)  # 10/r = 1000 > N: clamped (GeoMX reads out of bounds)
    c2 = codec(0.0078, size_lower_bound=0)
    size, top_k = c2.sample_plan(1280)
    assert size == 1280 and top_k == 9
    pos = c2.sample_positions(1280, 0, 0)
    assert np.array_equal(pos, np.arange(1280))


def test_sample_positions_are_stratified_and_in_range():
    c = codec()
    n = 1_000_003
    pos = c.sample_positions(n, 3, 7)
    size, _ = c.sample_plan(n)
    assert pos.size == size and pos.dtype == np.int64
    edges = (np.arange(size + 1, dtype=np.int64) * n) // size
    assert np.all(pos >= edges[:-1]) and np.all(pos < edges[1:])


# ------------------------------------------------------------------ the push


def test_kernel_matches_numpy_reference_over_rounds(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "PARALLEL_MIN", 1 << 16)
    n = 300_001  # > PARALLEL_MIN: several chunks
    c = codec()
    st = c.new_state(n)
    ru, rv = np.zeros(n, np.float32), np.zeros(n, np.float32)
    rng = np.random.default_rng(0)
    for rnd in range(4):
        g = rng.standard_normal(n, dtype=np.float32)
        enc = c.encode(11, g, st)
        vals, idx = push_reference(c, 11, g, ru, rv, rnd)
        assert enc.arrays[1].dtype == np.int32
        assert np.array_equal(enc.arrays[0], vals) and np.array_equal(enc.arrays[1], idx)
        assert np.array_equal(st.u, ru) and np.array_equal(st.v, rv)
    assert st.round == 4


@pytest.mark.parametrize("nch", [1, 3, 7])
def test_result_does_not_depend_on_chunking(monkeypatch, nch):
    n = 200_000
    rng = np.random.default_rng(1)
    gs = [rng.standard_normal(n, dtype=np.float32) for _ in range(2)]
    base = codec()
    st0 = base.new_state(n)
    want = [base.encode(2, g, st0) for g in gs]
    monkeypatch.setattr(cpu_kernels, "chunks_for", lambda n: nch)
    st1 = base.new_state(n)
    got = [base.encode(2, g, st1) for g in gs]
    for a, b in zip(want, got):
        assert all(np.array_equal(x, y) for x, y in zip(a.arrays, b.arrays))
    assert np.array_equal(st0.v, st1.v) and np.array_equal(st0.u, st1.u)


def test_mass_is_conserved_every_round():
    """What was sent plus what stays in v equals what was accumulated (exactly)."""
    n = 120_000
    c = codec(0.02)
    st = c.new_state(n)
    rng = np.random.default_rng(2)
    for _ in range(5):
        g = rng.standard_normal(n, dtype=np.float32)
        u_new = M * st.u + g
        accumulated = st.v + u_new
        enc = c.encode(0, g, st)
        sent = decode(enc)
        assert np.array_equal(sent + st.v, accumulated)
        idx = enc.arrays[1]
        assert np.all(st.u[idx] == 0) and np.all(st.v[idx] == 0)  # momentum-factor masking
        rest = np.ones(n, bool)
        rest[idx] = False
        assert np.array_equal(st.u[rest], u_new[rest])


def test_density_within_ten_percent_and_never_above_capacity():
    n = 2_000_000
    c = codec(0.01)
    k = c.capacity(n)
    st = c.new_state(n)
    rng = np.random.default_rng(3)
    counts = []
    for _ in range(8):
        enc = c.encode(5, rng.standard_normal(n, dtype=np.float32), st)
        counts.append(enc.arrays[0].size)
        assert np.all(np.diff(enc.arrays[1]) > 0)  # index order, no duplicates
    assert max(counts) <= k
    assert abs(np.mean(counts) / k - 1) <= 0.10, counts


def test_deterministic_for_a_seed_and_resampled_per_round():
    n = 50_000
    rng = np.random.default_rng(4)
    gs = [rng.standard_normal(n, dtype=np.float32) for _ in range(3)]

    def run(c):
        st = c.new_state(n)
        return [c.encode(9, g, st).arrays for g in gs]

    a, b = run(codec(seed=1)), run(codec(seed=1))
    assert all(np.array_equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    c = codec(seed=1)
    assert not np.array_equal(c.sample_positions(n, 9, 0), c.sample_positions(n, 9, 1))
    assert not np.array_equal(c.sample_positions(n, 9, 0), c.sample_positions(n, 8, 0))
    assert not np.array_equal(c.sample_positions(n, 9, 0), codec(seed=2).sample_positions(n, 9, 0))
    fixed = codec(seed=1, resample=False)  # GeoMX: the same sample every round
    assert np.array_equal(fixed.sample_positions(n, 9, 0), fixed.sample_positions(n, 9, 5))


def test_selection_in_index_order_capped_at_k():
    n = 10_000
    c = codec(0.01)
    st = c.new_state(n)
    enc = c.encode(0, np.ones(n, np.float32), st)  # every |v| equals the boundary
    assert np.array_equal(enc.arrays[1], np.arange(c.capacity(n)))
    assert np.all(enc.arrays[0] == 1)


def test_zero_gradient_sends_nothing():
    n = 5000
    c = codec(0.05)
    st = c.new_state(n)
    enc = c.encode(0, np.zeros(n, np.float32), st)
    assert enc.arrays[0].size == 0 and enc.nbytes == 0
    assert np.array_equal(decode(enc), np.zeros(n, np.float32))


def test_indices_exact_above_2_pow_24():
    n = (1 << 24) + 1000
    c = BiSparseCodec(0.001, size_lower_bound=0)
    g = np.zeros(n, np.float32)
    hot = np.array([(1 << 24) + 1, (1 << 24) + 3, n - 1])
    g[hot] = 1000.0
    enc = c.encode(0, g, c.new_state(n))
    assert np.array_equal(enc.arrays[1], hot) and enc.arrays[1].dtype == np.int32


def test_small_tensors_go_dense_without_state():
    c = codec(size_lower_bound=1000)
    x = np.arange(999, dtype=np.float32)
    enc = c.encode(0, x)
    assert enc.meta["codec"] == "none" and enc.nbytes == 999 * 4
    assert np.array_equal(decode(enc), x)
    assert not c.applies_to(999) and c.applies_to(1000)
    assert [tuple(s) for s in c.encoded_sizes(999)] == [("<f4", (999,))]
    h = np.ones(10, np.float16)
    assert codec().encode(0, h).arrays[0].dtype == np.float16  # own dtype


def test_state_is_required_and_checked():
    c = codec()
    x = np.ones(2000, np.float32)
    with pytest.raises(CodecError, match="state"):
        c.encode(0, x)
    with pytest.raises(CodecError, match="2000"):
        c.encode(0, x, c.new_state(3000))


def test_size_lower_bound_env(monkeypatch):
    monkeypatch.delenv(SIZE_BOUND_ENV, raising=False)
    assert BiSparseCodec().size_lower_bound == 200_000
    monkeypatch.setenv(SIZE_BOUND_ENV, "1000")
    assert BiSparseCodec().size_lower_bound == 1000
    assert BiSparseCodec(size_lower_bound=5).size_lower_bound == 5
    monkeypatch.setenv(SIZE_BOUND_ENV, "lots")
    with pytest.raises(ValueError, match=SIZE_BOUND_ENV):
        BiSparseCodec()


def test_codec_for_compresses_only_large_tensors_on_the_wan():
    c = codec(size_lower_bound=1000)
    assert c.codec_for(5000, "wan") is c
    assert isinstance(c.codec_for(5000, "lan"), DenseCodec)
    assert isinstance(c.codec_for(999, "wan"), DenseCodec)
    with pytest.raises(ValueError, match="tier"):
        c.codec_for(5000, "dc")


# ------------------------------------------------------------------ pull side and decode


@pytest.mark.slow
def test_pull_side_sends_the_aggregate_nonzeros():
    n = 100_000
    c = codec(0.01)
    rng = np.random.default_rng(5)
    agg = np.zeros(n, np.float32)
    for d in range(2):  # two DCs push, the GS sums
        decode(c.encode(1, rng.standard_normal(n, dtype=np.float32), c.new_state(n)), out=agg, accumulate=True)
    enc = c.encode_pull(1, agg, sources=2)
    assert "dropped" not in enc.meta and enc.arrays[0].size == np.count_nonzero(agg)
    assert enc.arrays[0].size <= c.pull_capacity(n, 2)
    assert np.array_equal(decode(enc), agg)
    vals, idx = ref.bsc_pull(agg, c.pull_capacity(n, 2))
    assert np.array_equal(enc.arrays[0], vals) and np.array_equal(enc.arrays[1], idx)


def test_pull_side_truncates_at_capacity_and_says_so():
    n = 300_000
    c = codec(0.01)
    x = np.random.default_rng(6).standard_normal(n, dtype=np.float32)
    enc = c.encode_pull(0, x, sources=2)
    k = c.pull_capacity(n, 2)
    assert enc.arrays[0].size == k and enc.meta["dropped"] == n - k
    assert np.array_equal(enc.arrays[1], np.arange(k))  # index order, no residual
    with pytest.raises(ValueError, match="sources"):
        c.encode_pull(0, x, sources=0)


def test_decode_scatter_add_and_overwrite():
    n = 4000
    c = codec(0.05)
    rng = np.random.default_rng(7)
    enc = c.encode(0, rng.standard_normal(n, dtype=np.float32), c.new_state(n))
    vals, idx = enc.arrays
    acc = np.full(n, 2.0, np.float32)
    decode(enc, out=acc, accumulate=True)
    want = np.full(n, 2.0, np.float32)
    want[idx] += vals
    assert np.array_equal(acc, want)
    decode(enc, out=acc)
    want = np.zeros(n, np.float32)
    want[idx] = vals
    assert np.array_equal(acc, want)
    acc64 = np.ones(n)
    decode(enc, out=acc64, accumulate=True)
    assert np.allclose(acc64, 1 + want)
    acc16 = np.zeros(n, np.float16)
    decode(enc, out=acc16, accumulate=True)
    assert np.array_equal(acc16, want.astype(np.float16))
    assert len(json.dumps(enc.meta)) < 100


def test_decode_rejects_malformed_payloads():
    meta = {"codec": "bsc", "n": 10, "dtype": "<f4", "shape": [10]}
    v = np.ones(2, np.float32)
    with pytest.raises(CodecError, match="outside"):
        decode(([v, np.array([1, 10], np.int32)], meta))
    with pytest.raises(CodecError, match="outside"):
        decode(([v, np.array([-1, 3], np.int32)], meta))
    with pytest.raises(CodecError, match="equal length"):
        decode(([v, np.array([1], np.int32)], meta))
    with pytest.raises(CodecError, match="indices"):
        decode(([v, np.array([1, 2], np.float32)], meta))
    with pytest.raises(CodecError, match="pairs"):
        decode(([np.ones(11, np.float32), np.arange(11, dtype=np.int32)], meta))
    with pytest.raises(CodecError, match="2 arrays"):
        decode(([v], meta))
