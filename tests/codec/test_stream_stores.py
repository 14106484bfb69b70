"""Streaming-store decodes (geomx/codec/stream_stores.py): bit-identical to the plain
kernels at every alignment, chunking and length, chosen only for large overwrites, and
really compiled to non-temporal stores."""
from __future__ import annotations

import platform
import re

import numba
import numpy as np
import pytest

from geomx.codec import BF16Codec, FP16Codec, cpu_kernels, decode

SIZES = (0, 1, 15, 16, 17, 31, 33, 1000, 65_537)


def _bf16_bits(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)  # every pattern, NaNs included


def _plain_bf16(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("nch", (1, 2, 3))
def test_bf16_stream_matches_plain_at_every_offset(n, nch):
    h = _bf16_bits(n, seed=n)
    want = _plain_bf16(h).view(np.uint32)
    for off in range(8):  # every 4-byte position within a 32-byte vector
        buf = np.full(n + 8, np.nan, np.float32)
        out = buf[off:off + n]
        if nch == 1:
            cpu_kernels._bf16_to_f32_stream_range(h, out, 0, n)
        else:
            cpu_kernels._bf16_to_f32_stream(h, out, nch)
        assert np.array_equal(out.view(np.uint32), want), (n, nch, off)
        assert np.isnan(buf[:off]).all() and np.isnan(buf[off + n:]).all(), "wrote outside out"


@pytest.mark.skipif(not cpu_kernels.USE_F16C, reason="the fp16 streaming kernel needs F16C")
@pytest.mark.parametrize("n", SIZES)
def test_f16_stream_matches_plain_at_every_offset_and_nan_mode(n):
    h = _bf16_bits(n, seed=n + 1)
    for quiet in (False, True):
        want = np.empty(n, np.float32)
        cpu_kernels.f16_to_f32_hw(h, want, quiet, False, 1)
        for off in range(8):
            for nch in (1, 2):
                buf = np.full(n + 8, np.nan, np.float32)
                out = buf[off:off + n]
                if nch == 1:
                    cpu_kernels._f16_to_f32_stream_range(h, out, quiet, 0, n)
                else:
                    cpu_kernels._f16_to_f32_stream(h, out, quiet, nch)
                assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (n, quiet, off, nch)
                assert np.isnan(buf[:off]).all() and np.isnan(buf[off + n:]).all()


@pytest.fixture
def spies(monkeypatch):
    """Counts calls of the streaming entry points (the single-chunk route goes through
    these module globals) with the size threshold lowered, so small arrays stream."""
    calls = {"bf16": 0, "fp16": 0}
    monkeypatch.setattr(cpu_kernels, "STREAM_MIN_ELEMENTS", 64)
    real_b, real_f = cpu_kernels._bf16_to_f32_stream_range, cpu_kernels._f16_to_f32_stream_range

    def b(*a):
        calls["bf16"] += 1
        return real_b(*a)

    def f(*a):
        calls["fp16"] += 1
        return real_f(*a)

    monkeypatch.setattr(cpu_kernels, "_bf16_to_f32_stream_range", b)
    monkeypatch.setattr(cpu_kernels, "_f16_to_f32_stream_range", f)
    return calls


def test_codec_decode_streams_large_overwrites_only(spies):
    x = np.random.default_rng(3).standard_normal(1001).astype(np.float32)
    for codec, name in ((BF16Codec(), "bf16"), (FP16Codec(), "fp16")):
        if name == "fp16" and not cpu_kernels.USE_F16C:
            continue
        enc = codec.encode(0, x)
        plain = decode(enc)  # a new array: streamed too (over the threshold)
        before = spies[name]
        out = np.empty_like(x)
        decode(enc, out=out)
        assert spies[name] == before + 1, f"{name}: an overwrite of 1001 elements did not stream"
        assert np.array_equal(out, plain)
        acc = np.ones_like(x)
        decode(enc, out=acc, accumulate=True)
        assert spies[name] == before + 1, f"{name}: an accumulate must not stream (it reads out anyway)"
        assert np.array_equal(acc, np.float32(1) + plain)
        small = codec.encode(0, x[:63])
        decode(small, out=np.empty(63, np.float32))
        assert spies[name] == before + 1, f"{name}: below the threshold stays in cache"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="checks x86 instructions")
def test_streaming_kernel_compiles_to_non_temporal_stores():
    fresh = numba.njit(cache=False)(cpu_kernels._bf16_to_f32_stream_range.py_func)
    h = _bf16_bits(100)
    fresh(h, np.empty(100, np.float32), 0, 100)
    asm = "\n".join(fresh.inspect_asm().values())
    assert re.search(r"\bv?movnt(dq|ps)\b", asm), "no non-temporal store in the streaming kernel"
    plain = numba.njit(cache=False)(cpu_kernels._bf16_to_f32.py_func)
    plain(h, np.empty(100, np.float32), False, 1)
    assert not re.search(r"\bv?movnt(dq|ps)\b", "\n".join(plain.inspect_asm().values()))
