"""CUDA kernels give the CPU kernels' results (run on a GPU, or in numba's simulator).

Without a GPU these tests are skipped in-process; ``test_cuda_sim.py`` runs this
file in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``, so they always execute in CI. The
simulator runs one Python thread per CUDA thread: keep the arrays tiny.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from geomx.codec import BF16Codec, BiSparseCodec, CodecError, FP16Codec, OneBitCodec, decode
from geomx.policy import device

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _have_cuda() -> bool:
    if SIM:
        return True
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _have_cuda(), reason="needs a CUDA GPU or NUMBA_ENABLE_CUDASIM=1 "
                                                       "(test_cuda_sim.py runs this file so)")

SPECIAL = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                    0x7F7FFFFF, 0x477FF000, 0x477FEFFF, 0x38800000, 0x387FFFFF, 0x33000000,
                    0x33000001, 0x33C00000, 0x00000001, 0x3F801000, 0x3F803000, 0xC2F6E979],
                   dtype=np.uint32).view(np.float32)


def to_dev(a):
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))


def host(a):
    return device.to_host(a)


def sample(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NaN + 1 in the simulator
@pytest.mark.parametrize("codec", [FP16Codec(), BF16Codec()], ids=lambda c: c.name)
def test_half_width_codecs(codec):
    x = np.concatenate([SPECIAL, sample(14) * 100])
    dx = to_dev(x)
    assert device.is_cuda_array(dx)
    enc = codec.encode(0, dx)
    assert enc.on_device and enc.meta == codec.encode(0, x).meta
    cpu = codec.encode(0, x)
    assert np.array_equal(host(enc.arrays[0]).view(np.uint16), cpu.arrays[0].view(np.uint16))
    want = decode(cpu)
    got = host(decode(enc))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    acc = to_dev(np.ones(x.size, np.float32))
    decode(enc, out=acc, accumulate=True)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(host(acc), np.float32(1) + want, equal_nan=True)
    back = enc.to_host()
    assert not back.on_device and np.array_equal(decode(back).view(np.uint32), want.view(np.uint32))


def test_bsc_push_equals_cpu_over_rounds():
    n = 200
    c = BiSparseCodec(0.1, size_lower_bound=0)  # K = 20 of 200, sample 100, top_k 10
    cpu_state = c.new_state(n)
    dev_probe = to_dev(np.zeros(1, np.float32))
    dev_state = c.new_state(n, like=dev_probe)
    assert device.is_cuda_array(dev_state.u) and device.is_cuda_array(dev_state.v)
    for rnd in range(2):
        g = sample(n, rnd)
        want = c.encode(3, g, cpu_state)
        got = c.encode(3, to_dev(g), dev_state)
        assert got.on_device and got.arrays[1].dtype == np.int32
        assert np.array_equal(host(got.arrays[0]), want.arrays[0])
        assert np.array_equal(host(got.arrays[1]), want.arrays[1])
        assert np.array_equal(host(dev_state.u), cpu_state.u)
        assert np.array_equal(host(dev_state.v), cpu_state.v)
    assert want.arrays[0].size > 0


def test_bsc_pull_and_scatter_add_equal_cpu():
    n = 150
    c = BiSparseCodec(0.1, size_lower_bound=0)
    x = np.zeros(n, np.float32)
    x[::3] = sample(len(x[::3]), 5)
    want = c.encode_pull(0, x, sources=2)
    got = c.encode_pull(0, to_dev(x), sources=2)
    assert want.meta == got.meta
    assert all(np.array_equal(host(a), b) for a, b in zip(got.arrays, want.arrays))
    acc_cpu = np.full(n, 0.5, np.float32)
    decode(want, out=acc_cpu, accumulate=True)
    acc_dev = to_dev(np.full(n, 0.5, np.float32))
    decode(got, out=acc_dev, accumulate=True)
    assert np.array_equal(host(acc_dev), acc_cpu)
    assert np.array_equal(host(decode(got)), decode(want))
    bad = [to_dev(np.ones(1, np.float32)), to_dev(np.array([n], np.int32))]
    with pytest.raises(CodecError, match="outside"):
        decode((bad, want.meta))


def test_onebit_equals_cpu():
    n = 101
    c = OneBitCodec()
    x = sample(n, 7)
    cpu_state = c.new_state(n)
    dev_state = c.new_state(n, like=to_dev(x))
    for _ in range(2):
        want = c.encode(0, x, cpu_state)
        got = c.encode(0, to_dev(x), dev_state)
        assert np.array_equal(host(got.arrays[0]), want.arrays[0])
        assert host(got.arrays[1])[0] == pytest.approx(want.arrays[1][0], rel=1e-6)
        assert np.allclose(host(dev_state.residual), cpu_state.residual, rtol=0, atol=1e-6)
    out = to_dev(np.zeros(n, np.float32))
    decode(got, out=out)
    assert np.allclose(host(out), decode(want), rtol=1e-6)


def test_dense_codec_on_device():
    from geomx.codec import DenseCodec

    x = sample(50, 9)
    enc = DenseCodec().encode(0, to_dev(x))
    assert enc.on_device and np.array_equal(host(decode(enc)), x)
    acc = to_dev(np.ones(50, np.float32))
    decode(enc, out=acc, accumulate=True)
    assert np.array_equal(host(acc), 1 + x)
