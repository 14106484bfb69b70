"""Plain-numpy implementations of every codec algorithm.

They define what the kernels must compute (the tests compare kernels against them) and
are the baseline the benchmark measures the kernels against (``bench/codecs.py``).
They are written the way one would write them in numpy, not tuned to lose.
"""
from __future__ import annotations

import numpy as np


# --------------------------------------------------------------------------- fp16 / bf16


def f32_to_f16(x: np.ndarray) -> np.ndarray:
    """numpy's own cast: the ground truth for the fp16 kernels."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16)


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    return h.astype(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16), round to nearest even, NaN -> signed quiet NaN 0x7fc0."""
    u = x.astype(np.float32, copy=False).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        sign = ((u >> np.uint32(16)) & np.uint32(0x8000)).astype(np.uint16)
        rounded = np.where(nan, sign | np.uint16(0x7FC0), rounded)
    return rounded


def bf16_to_f32(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


# --------------------------------------------------------------------------- Bi-Sparse


def bsc_push(g: np.ndarray, u: np.ndarray, v: np.ndarray, momentum: float, positions: np.ndarray,
             top_k: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """GeoMX's push on (u, v) in place; returns (values, int32/int64 indices).

    ``positions``: the sampled positions (the codec's ``sample_positions``)."""
    m = np.float32(momentum)
    u *= m
    u += g
    v += u
    if capacity == 0 or positions.size == 0:
        return np.empty(0, np.float32), np.empty(0, np.int32)
    sample = np.abs(v[positions])
    b = np.partition(sample, sample.size - top_k)[sample.size - top_k]
    if not b > 0:
        b = np.float32(np.finfo(np.float32).smallest_subnormal)
    sel = np.flatnonzero(np.abs(v) >= b)[:capacity]
    vals = v[sel]
    u[sel] = 0
    v[sel] = 0
    idx_dtype = np.int32 if v.size <= np.iinfo(np.int32).max else np.int64
    return vals, sel.astype(idx_dtype)


def bsc_pull(x: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-zeros of ``x`` in index order, at most ``capacity``."""
    sel = np.flatnonzero(x)[:capacity]
    idx_dtype = np.int32 if x.size <= np.iinfo(np.int32).max else np.int64
    return x[sel].astype(np.float32), sel.astype(idx_dtype)


def scatter_add(out: np.ndarray, idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Scatter-add with unique indices (what a Bi-Sparse payload carries)."""
    out[idx] += vals
    return out


# --------------------------------------------------------------------------- onebit


def onebit_encode(x: np.ndarray, residual: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """Scaled sign with error feedback; updates ``residual`` in place."""
    c = x + residual
    scale = np.float32(np.abs(c).astype(np.float64).sum() / c.size) if c.size else np.float32(0)
    pos = c >= 0
    residual[...] = c - np.where(pos, scale, -scale)
    return np.packbits(pos, bitorder="little"), scale


def onebit_decode(packed: np.ndarray, scale: np.float32, n: int) -> np.ndarray:
    pos = np.unpackbits(packed, count=n, bitorder="little").astype(bool)
    return np.where(pos, np.float32(scale), np.float32(-scale))
