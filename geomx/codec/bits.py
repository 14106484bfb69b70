"""Scalar bit-level conversions between float32 and 16-bit float formats.

Why bit manipulation: numba (0.68) cannot type ``float16`` arrays on the CPU, so the
half-precision codecs work on ``uint32`` views of the fp32 data and ``uint16`` views of
the wire data (``bench/codecs.py`` times these kernels against numpy). The functions
here are plain Python on integers so that the *same source* is compiled by
``numba.njit`` (``cpu_kernels``) and by ``numba.cuda.jit(device=True)``
(``cuda_kernels``), and can also be run by the CUDA simulator. Every argument and result
is a non-negative ``int64`` holding the bit pattern.

Rounding is IEEE round-to-nearest-even (RNE), the rounding of numpy's
``astype(np.float16)``; overflow goes to ±inf, underflow to ±0 or a subnormal, exactly
like numpy. NaN handling follows numpy as well: numpy's portable C path keeps the top 10
payload bits and never turns a NaN into inf (``0x7c00 | payload``, with ``0x7c01`` when
the kept payload is empty), while a hardware (F16C) cast quiets the NaN
(``0x7e00 | payload``). ``quiet_nan`` selects which of the two the kernels reproduce; the
codec detects numpy's behaviour once at run time (``fp16.numpy_nan_modes``).
"""
from __future__ import annotations

# float32 bit layout: sign 1 | exponent 8 (bias 127) | mantissa 23
# float16 bit layout: sign 1 | exponent 5 (bias 15)  | mantissa 10
# bfloat16:           sign 1 | exponent 8 (bias 127) | mantissa 7  (= top half of fp32)


def f32_to_f16(f, quiet_nan):
    """fp32 bits -> fp16 bits, RNE, integer arithmetic only (CPU and CUDA).

    ``f`` is the float32 bit pattern as a non-negative int64.
    """
    sign = (f >> 16) & 0x8000
    a = f & 0x7FFFFFFF
    # Normal half range: rebias the exponent (127 -> 15, i.e. subtract 112 << 23) and
    # round the 13 dropped mantissa bits to nearest even: add 0xfff plus the lowest kept
    # bit, then shift. A carry out of the mantissa correctly bumps the exponent, which
    # also makes [65520, 65536) round up to inf.
    nrm = (a - 0x37FFF001 + ((a >> 13) & 1)) >> 13
    # Subnormal half range (|x| < 2**-14): the value in units of 2**-24 is m >> s with
    # m the mantissa with its implicit bit and s = 126 - exponent; round the same way.
    # s is clamped to [1, 31] so that no shift is out of range; for |x| < 2**-25 the
    # clamped shift already yields 0.
    s = 126 - (a >> 23)
    s = 1 if s < 1 else (31 if s > 31 else s)
    m = (a & 0x7FFFFF) | 0x800000
    sub = (m + ((1 << (s - 1)) - 1) + ((m >> s) & 1)) >> s
    payload = (a >> 13) & 0x3FF
    if quiet_nan:
        nan = 0x7E00 | payload
    else:
        nan = 0x7C00 | payload | (1 if payload == 0 else 0)
    if a > 0x7F800000:
        h = nan
    elif a >= 0x47800000:
        h = 0x7C00
    elif a >= 0x38800000:
        h = nrm
    else:
        h = sub
    return sign | h


def f16_to_f32(h, quiet_nan):
    """fp16 bits -> fp32 bits (exact: every half is representable in float32)."""
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    nrm = ((h & 0x7FFF) << 13) + 0x38000000
    special = 0x7F800000 | (m << 13)
    if quiet_nan and m != 0:
        special = special | 0x400000
    # Subnormal half m * 2**-24: normalise with p = floor(log2(m)), written as a sum of
    # comparisons so that it stays branch-free (and vectorisable on the CPU).
    p = (
        (1 if m >= 2 else 0) + (1 if m >= 4 else 0) + (1 if m >= 8 else 0)
        + (1 if m >= 16 else 0) + (1 if m >= 32 else 0) + (1 if m >= 64 else 0)
        + (1 if m >= 128 else 0) + (1 if m >= 256 else 0) + (1 if m >= 512 else 0)
    )
    sub = ((p + 103) << 23) | ((m << (23 - p)) & 0x7FFFFF)
    if m == 0:
        sub = 0
    if e == 0x1F:
        r = special
    elif e == 0:
        r = sub
    else:
        r = nrm
    return sign | r


def f32_to_bf16(f):
    """fp32 bits -> bfloat16 bits, RNE; NaN becomes the canonical quiet NaN (sign kept).

    This is what PyTorch / Eigen / ml_dtypes do: a NaN whose payload lives only in the
    low 16 bits must not become inf, so NaNs are not rounded but replaced by 0x7fc0.
    """
    a = f & 0x7FFFFFFF
    if a > 0x7F800000:
        return ((f >> 16) & 0x8000) | 0x7FC0
    return (f + 0x7FFF + ((f >> 16) & 1)) >> 16


def bf16_to_f32(h):
    """bfloat16 bits -> fp32 bits (exact)."""
    return h << 16
