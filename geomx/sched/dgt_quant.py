"""4-bit quantisation with error feedback for DGT's low-priority blocks (ENABLE_DGT=3).

What GeoMX intends (docs/geomx-behaviour.md §4.4, sender step 6): per (key, block) a residual
``r`` accumulates what was not sent; the block sent is ``r + x`` quantised to 16 uniform
bins over its own ``[min, max]``; each value travels as its bin's index (4 bits) and the
receiver rebuilds the bin's midpoint; the residual keeps the quantisation error for the
next round. GeoMX packs the nibbles off by one and lets the top bin overflow (value
``max`` lands in bin 16), so its mode 3 is broken; here the top value falls in bin 15 and
two codes share a byte, element ``2i`` in the low nibble and ``2i + 1`` in the high one.

Wire form: a ``|u1`` array of ``ceil(n / 2)`` packed codes and a ``<f4`` array
``[lo, hi]``; the element count comes from the block's place in the tensor.
"""

from __future__ import annotations

import numpy as np

LEVELS = 16


def quantise4(block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantise ``block`` (float32, 1-D) to 4 bits.

    Returns ``(packed, bounds, decoded)``: the packed codes, ``[lo, hi]`` as float32 and
    the values the receiver will rebuild (so the sender can keep the error).
    """
    x = np.asarray(block, dtype=np.float32).reshape(-1)
    n = x.size
    lo = np.float32(x.min()) if n else np.float32(0)
    hi = np.float32(x.max()) if n else np.float32(0)
    width = (np.float32(hi) - np.float32(lo)) / np.float32(LEVELS)
    if width > 0:
        codes = np.floor((x - lo) / width)
        codes = np.clip(codes, 0, LEVELS - 1).astype(np.uint8)
    else:
        codes = np.zeros(n, dtype=np.uint8)
    packed = _pack(codes)
    bounds = np.array([lo, hi], dtype=np.float32)
    return packed, bounds, _centroids(codes, lo, width)


def dequantise4(packed: np.ndarray, bounds: np.ndarray, n: int) -> np.ndarray:
    """The float32 values of ``n`` packed 4-bit codes (raises ValueError on a bad shape)."""
    packed = np.asarray(packed)
    bounds = np.asarray(bounds)
    if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != (n + 1) // 2:
        raise ValueError(f"4-bit block of {n} values needs {(n + 1) // 2} packed bytes, got "
                         f"{packed.size} of {packed.dtype}")
    if bounds.size != 2 or not np.all(np.isfinite(bounds)) or bounds[0] > bounds[1]:
        raise ValueError(f"4-bit block bounds must be finite [lo, hi] with lo <= hi, got {bounds!r}")
    lo = np.float32(bounds[0])
    width = (np.float32(bounds[1]) - lo) / np.float32(LEVELS)
    codes = np.empty(2 * packed.size, dtype=np.uint8)
    codes[0::2] = packed & 0x0F
    codes[1::2] = packed >> 4
    return _centroids(codes[:n], lo, width)


def _pack(codes: np.ndarray) -> np.ndarray:
    if codes.size % 2:
        codes = np.concatenate([codes, np.zeros(1, dtype=np.uint8)])
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)


def _centroids(codes: np.ndarray, lo: np.float32, width: np.float32) -> np.ndarray:
    return (lo + (codes.astype(np.float32) + np.float32(0.5)) * width).astype(np.float32)
