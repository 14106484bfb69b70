"""Numba CPU kernels for the codecs.

Design notes (measured on the project's 2-core machine, see ``bench/codecs.py``):

* Every kernel is ``cache=True`` and compiled lazily on its first call: decorating is
  free, importing this module compiles nothing.
* Parallel kernels split the work into ``nch`` contiguous chunks (``prange`` over
  chunks, a plain loop inside, on 1-D slice views so LLVM vectorises the inner loop).
  The chunking never changes a result: selections are made in index order and
  reductions use fixed-size blocks, so outputs do not depend on the thread count.
  Small tensors use one chunk (:func:`chunks_for`).
* Each chunked kernel is compiled twice from one Python function (:class:`ChunkedKernel`):
  with ``parallel=True``, and serially (``prange`` runs as ``range``). A ``parallel=True``
  kernel wakes and joins every pool thread on every call, even for one chunk; on a loaded
  host that waits for descheduled threads (a scheduler tick or more per call, measured in
  ``bench/codecs.py --launch``). One chunk, or one numba thread, runs the serial
  compilation on the calling thread. Both compile lazily, so a process that only ever
  sees one chunk compiles only the (cheaper) serial one.
* fp16/bf16 work on ``uint32``/``uint16`` views: numba has no CPU float16 arrays.
  fp16 has two bit-identical kernels: portable bit manipulation, and (on CPUs with F16C)
  LLVM's own ``fptrunc``/``fpext`` to ``half`` through a tiny intrinsic, which compiles
  to the vector conversion instructions.
* Indices and sizes are validated by the Python callers before a kernel runs: kernels
  do not bounds-check (numba does not), so nothing unchecked from the network reaches
  them.
"""
from __future__ import annotations

from collections.abc import Callable
from types import FunctionType
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from . import bits
from .stream_stores import LANES, STREAM_MIN_ELEMENTS, head_elements, store_fence, stream_bf16_to_f32, stream_f16_to_f32

#: Below this many elements a kernel runs as one chunk, serially on the calling thread.
#: At 4M elements one fp16 pass takes ~1 ms on one core; below that, two threads save
#: at most a few hundred microseconds per call even when the pool is awake, while a
#: parallel call on a loaded host waits milliseconds for a descheduled pool thread
#: (measured with ``bench/codecs.py --launch``).
PARALLEL_MIN = 1 << 22
#: Elements per block of the selection kernels (vectorised count, then a short scan).
SELECT_BLOCK = 128
#: Block size of the deterministic partial sums (onebit's mean |x|).
SUM_BLOCK = 1 << 16
#: Elements per block of the onebit kernels (a multiple of 8; fits L1 with its scratch).
PACK_BLOCK = 4096

_HALF = np.float32(0.5)
_TWO_M24 = np.float32(2.0**-24)
# onebit: 8 flag bytes (0/1) read as one uint64 -> one byte of bits, and back
_PACK_MAGIC = np.uint64(0x0102040810204080)
_SPREAD_BYTE = np.uint64(0x0101010101010101)
_BIT_PER_BYTE = np.uint64(0x8040201008040201)
_SHIFT56 = np.uint64(56)

_f32_to_bf16_int = njit(cache=True)(bits.f32_to_bf16)


def _host_has_f16c() -> bool:
    """Whether numba compiles for a CPU with F16C (hardware fp32<->fp16 conversion).

    Only when numba targets the host CPU (the default): a pinned ``NUMBA_CPU_NAME``
    (e.g. "generic" for portable caches) may lack it, and then LLVM would need a
    soft-float library call that numba cannot link."""
    if numba.config.CPU_NAME not in (None, "", "host"):
        return False
    try:
        import llvmlite.binding as llb

        return bool(llb.get_host_cpu_features().get("f16c", False))
    except Exception:  # pragma: no cover - exotic llvmlite builds
        return False


#: Use the F16C kernels for fp16 (set False to force the portable bit-manipulation ones).
USE_F16C = _host_has_f16c()


def chunks_for(n: int) -> int:
    """Number of chunks for an ``n``-element kernel: one per thread when it pays."""
    if n < PARALLEL_MIN:
        return 1
    return max(1, int(numba.get_num_threads()))


def _last_argument(*args: Any) -> int:
    return int(args[-1])


class ChunkedKernel:
    """A chunked kernel: one Python function compiled with ``parallel=True`` and serially,
    called through one name; the call runs the serial compilation when the work is one
    chunk or numba has one thread, the parallel one otherwise.

    The two compilations give identical results (the chunking never changes one, see the
    module notes). A Python object, so it cannot be called from other njit code: the
    kernels here are only called from Python (the codecs in this package).

    ``chunks`` maps the call's positional arguments to its number of chunks (by default
    the last argument, ``nch``). ``serial`` and ``parallel`` are the two numba
    dispatchers, ``py_func`` the Python function.
    """

    def __init__(self, py_func: FunctionType, chunks: Callable[..., int] = _last_argument) -> None:
        self.py_func = py_func
        self.parallel = njit(parallel=True, cache=True)(py_func)
        # numba's cache files are named by qualified name and keyed by bytecode, not by
        # compile options: the serial compilation needs its own name, or the two would
        # load each other's machine code from the cache.
        serial_func = FunctionType(py_func.__code__, py_func.__globals__, py_func.__name__ + "_serial",
                                   py_func.__defaults__, py_func.__closure__)
        serial_func.__qualname__ = py_func.__qualname__ + "_serial"
        serial_func.__doc__ = py_func.__doc__
        self.serial = njit(cache=True)(serial_func)
        self._chunks = chunks
        self.__name__ = py_func.__name__
        self.__qualname__ = py_func.__qualname__
        self.__doc__ = py_func.__doc__
        self.__module__ = py_func.__module__

    def pick(self, *args: Any) -> Any:
        """The dispatcher a call with these arguments runs."""
        if self._chunks(*args) <= 1 or numba.get_num_threads() == 1:
            return self.serial
        return self.parallel

    def __call__(self, *args: Any) -> Any:
        return self.pick(*args)(*args)

    def __repr__(self) -> str:
        return f"ChunkedKernel({self.__qualname__})"


def chunked(chunks: Callable[..., int] = _last_argument) -> Callable[[FunctionType], ChunkedKernel]:
    """Decorator: make a :class:`ChunkedKernel` of a ``prange``-over-chunks function."""

    def wrap(py_func: FunctionType) -> ChunkedKernel:
        return ChunkedKernel(py_func, chunks)

    return wrap


# --------------------------------------------------------------------------- fp16
#
# Two implementations, bit-identical (tested against numpy and against each other):
# ``*_bits`` is portable integer/float arithmetic; ``*_hw`` lets LLVM emit the F16C
# conversion instructions (8 lanes per instruction, ~2x faster, memory-bound even on
# one core) and patches the NaN lanes to numpy's NaN convention, the one case where
# hardware and numpy's software cast differ.


@intrinsic
def _hw_f32_to_f16(typingctx, x):
    """fp32 -> fp16 bits with the CPU's conversion (RNE); LLVM ``fptrunc``."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def _hw_f16_to_f32(typingctx, h):
    """fp16 bits -> fp32 with the CPU's conversion (exact); LLVM ``fpext``."""
    if h != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@njit(cache=True)
def _f32_to_f16_bits(xf, quiet_nan):
    """Same result as ``bits.f32_to_f16`` but with the subnormal case done by a float
    add: |x| + 0.5 puts the half-subnormal unit (2**-24) at the last mantissa bit of the
    sum and the FPU rounds to nearest even for us (no variable shifts)."""
    f = np.int64(np.float32(xf).view(np.uint32))
    sign = (f >> 16) & 0x8000
    a = f & 0x7FFFFFFF
    nrm = (a - 0x37FFF001 + ((a >> 13) & 1)) >> 13
    sub = np.int64(np.float32(abs(xf) + _HALF).view(np.uint32)) - 0x3F000000
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


@njit(cache=True)
def _f32_to_f16_hw(xf, quiet_nan):
    f = np.int64(np.float32(xf).view(np.uint32))
    a = f & 0x7FFFFFFF
    payload = (a >> 13) & 0x3FF
    if quiet_nan:
        nan = 0x7E00 | payload
    else:
        nan = 0x7C00 | payload | (1 if payload == 0 else 0)
    h = np.int64(_hw_f32_to_f16(xf))
    return (((f >> 16) & 0x8000) | nan) if a > 0x7F800000 else h


@njit(cache=True)
def _f16_to_f32_bits(hb, quiet_nan):
    h = np.int64(hb)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    sign = (h & 0x8000) << 16
    if e == 0:  # zero or subnormal: m * 2**-24 is exact in float32
        v = np.float32(m) * _TWO_M24
        return -v if sign else v
    if e == 0x1F:
        b = sign | 0x7F800000 | (m << 13)
        if quiet_nan and m != 0:
            b |= 0x400000
    else:
        b = sign | (((h & 0x7FFF) << 13) + 0x38000000)
    return np.uint32(b).view(np.float32)


# uint32 constants: with them the NaN fix-up below stays in 32-bit lanes (a plain int
# literal would widen every lane to int64 and halve the vector width)
_U32_0x7E00 = np.uint32(0x7E00)
_U32_0x7C00 = np.uint32(0x7C00)
_U32_0x1FF = np.uint32(0x1FF)
_U32_22 = np.uint32(22)


@njit(cache=True)
def _f16_to_f32_hw(hb, quiet_nan):
    """F16C conversion, made bit-identical to numpy: the hardware quiets a signalling NaN
    (sets fp32 mantissa bit 22); numpy's portable cast keeps it signalling, so for an
    sNaN input (exponent all ones, half quiet bit 0x200 clear, payload non-zero) that
    one bit is cleared again. Branch-free, so the loop vectorises."""
    v = _hw_f16_to_f32(hb)
    if quiet_nan:
        return v
    h = np.uint32(hb)
    snan = np.uint32(((h & _U32_0x7E00) == _U32_0x7C00) & ((h & _U32_0x1FF) != 0))
    return np.uint32(np.float32(v).view(np.uint32) & ~(snan << _U32_22)).view(np.float32)


@chunked()
def f32_to_f16_bits(src, dst, quiet_nan, nch):
    """``dst`` (uint16) <- fp16 bits of ``src`` (float32); portable."""
    n = src.size
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        s = src[lo:hi]
        d = dst[lo:hi]
        for i in range(hi - lo):
            d[i] = _f32_to_f16_bits(s[i], quiet_nan)


@chunked()
def f32_to_f16_hw(src, dst, quiet_nan, nch):
    """``dst`` (uint16) <- fp16 bits of ``src`` (float32); F16C."""
    n = src.size
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        s = src[lo:hi]
        d = dst[lo:hi]
        for i in range(hi - lo):
            d[i] = _f32_to_f16_hw(s[i], quiet_nan)


@chunked()
def f16_to_f32_bits(src, out, quiet_nan, accumulate, nch):
    """``out`` (float32) <- (or +=) the values of the fp16 bits in ``src``; portable."""
    n = src.size
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        s = src[lo:hi]
        o = out[lo:hi]
        if accumulate:
            for i in range(hi - lo):
                o[i] += _f16_to_f32_bits(s[i], quiet_nan)
        else:
            for i in range(hi - lo):
                o[i] = _f16_to_f32_bits(s[i], quiet_nan)


@chunked()
def f16_to_f32_hw(src, out, quiet_nan, accumulate, nch):
    """``out`` (float32) <- (or +=) the values of the fp16 bits in ``src``; F16C."""
    n = src.size
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        s = src[lo:hi]
        o = out[lo:hi]
        if accumulate:
            for i in range(hi - lo):
                o[i] += _f16_to_f32_hw(s[i], quiet_nan)
        else:
            for i in range(hi - lo):
                o[i] = _f16_to_f32_hw(s[i], quiet_nan)


def f32_to_f16(src: np.ndarray, dst: np.ndarray, quiet_nan: bool, nch: int) -> None:
    """fp32 -> fp16 bits with the fastest kernel this CPU has."""
    (f32_to_f16_hw if USE_F16C else f32_to_f16_bits)(src, dst, quiet_nan, nch)


@njit(cache=True)
def _f16_to_f32_stream_range(src, out, quiet_nan, lo, hi):
    """``out[lo:hi]`` (float32, contiguous, 4-byte aligned) <- the values of the fp16
    bits ``src[lo:hi]``, the aligned middle with streaming stores (:mod:`.stream_stores`);
    F16C."""
    j = lo + head_elements(out.ctypes.data, lo, hi)
    for i in range(lo, j):
        out[i] = _f16_to_f32_hw(src[i], quiet_nan)
    m = (hi - j) // LANES * LANES
    stream_f16_to_f32(out, src, j, m, quiet_nan)
    for i in range(j + m, hi):
        out[i] = _f16_to_f32_hw(src[i], quiet_nan)
    store_fence()


@chunked()
def _f16_to_f32_stream(src, out, quiet_nan, nch):
    n = src.size
    for c in prange(nch):
        _f16_to_f32_stream_range(src, out, quiet_nan, c * n // nch, (c + 1) * n // nch)


def _streams(out: np.ndarray, accumulate: bool) -> bool:
    """Whether a decode into ``out`` should use streaming stores: an overwrite of a
    large, contiguous, 4-byte-aligned float32 array (see :mod:`.stream_stores`)."""
    return (not accumulate and out.size >= STREAM_MIN_ELEMENTS and out.flags.c_contiguous
            and out.ctypes.data % 4 == 0)


def f16_to_f32(src: np.ndarray, out: np.ndarray, quiet_nan: bool, accumulate: bool, nch: int) -> None:
    """fp16 bits -> fp32 (or +=) with the fastest kernel this CPU has."""
    if USE_F16C and _streams(out, accumulate):
        if nch == 1:  # no parallel launch: waking a pool thread can cost a scheduler tick
            _f16_to_f32_stream_range(src, out, quiet_nan, 0, src.size)
        else:
            _f16_to_f32_stream(src, out, quiet_nan, nch)
        return
    (f16_to_f32_hw if USE_F16C else f16_to_f32_bits)(src, out, quiet_nan, accumulate, nch)


# --------------------------------------------------------------------------- bf16


@chunked()
def f32_to_bf16(src, dst, nch):
    """``dst`` (uint16) <- bfloat16 bits of ``src`` (uint32 view of float32)."""
    n = src.size
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        s = src[lo:hi]
        d = dst[lo:hi]
        for i in range(hi - lo):
            d[i] = _f32_to_bf16_int(np.int64(s[i]))


@chunked()
def _bf16_to_f32(src, out, accumulate, nch):
    """``out`` (float32) <- (or +=) the values of the bfloat16 bits in ``src``."""
    n = src.size
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        s = src[lo:hi]
        o = out[lo:hi]
        if accumulate:
            for i in range(hi - lo):
                o[i] += np.uint32(np.uint32(s[i]) << np.uint32(16)).view(np.float32)
        else:
            for i in range(hi - lo):
                o[i] = np.uint32(np.uint32(s[i]) << np.uint32(16)).view(np.float32)


@njit(cache=True)
def _bf16_to_f32_stream_range(src, out, lo, hi):
    """``out[lo:hi]`` (float32, contiguous, 4-byte aligned) <- the values of the bfloat16
    bits ``src[lo:hi]``, the aligned middle with streaming stores (:mod:`.stream_stores`)."""
    j = lo + head_elements(out.ctypes.data, lo, hi)
    for i in range(lo, j):
        out[i] = np.uint32(np.uint32(src[i]) << np.uint32(16)).view(np.float32)
    m = (hi - j) // LANES * LANES
    stream_bf16_to_f32(out, src, j, m)
    for i in range(j + m, hi):
        out[i] = np.uint32(np.uint32(src[i]) << np.uint32(16)).view(np.float32)
    store_fence()


@chunked()
def _bf16_to_f32_stream(src, out, nch):
    n = src.size
    for c in prange(nch):
        _bf16_to_f32_stream_range(src, out, c * n // nch, (c + 1) * n // nch)


def bf16_to_f32(src: np.ndarray, out: np.ndarray, accumulate: bool, nch: int) -> None:
    """bfloat16 bits -> fp32 (or +=); streaming stores for a large overwrite."""
    if not _streams(out, accumulate):
        _bf16_to_f32(src, out, accumulate, nch)
    elif nch == 1:  # no parallel launch (see f16_to_f32)
        _bf16_to_f32_stream_range(src, out, 0, src.size)
    else:
        _bf16_to_f32_stream(src, out, nch)


# --------------------------------------------------------------------------- Bi-Sparse


@njit(cache=True)
def stratified_positions(rand, n, out):
    """One position per stratum: stratum j is [floor(j*n/S), floor((j+1)*n/S)) and its
    position is lo + floor(rand_j * width / 2**32) for a uniform 32-bit ``rand_j``.
    Stratum edges are stepped Bresenham-style (no divisions). Needs n < 2**32 * S."""
    s = out.size
    q = n // s
    rem = n % s
    lo = 0
    acc = 0
    for j in range(s):
        acc2 = acc + rem
        w = q + (1 if acc2 >= s else 0)
        out[j] = lo + np.int64((rand[j] * np.uint64(w)) >> np.uint64(32))
        lo += w
        acc = acc2 - s if acc2 >= s else acc2


@chunked()
def bsc_sample_abs(g, u, v, momentum, pos, out, nch):
    """``out[j] = |v + (m*u + g)|`` at the sampled positions: the post-update magnitude,
    computed from the *old* state so that the threshold is known before the one fused
    update pass (same float32 arithmetic as that pass, hence the same values)."""
    s = pos.size
    for c in prange(nch):
        lo = c * s // nch
        hi = (c + 1) * s // nch
        for j in range(lo, hi):
            p = pos[j]
            out[j] = abs(v[p] + (momentum * u[p] + g[p]))


@chunked(lambda g, u, v, momentum, boundary, cval, *rest: cval.shape[0])
def bsc_push(g, u, v, momentum, boundary, cval, cu, cidx, ccount):
    """One pass of GeoMX's push: momentum correction, accumulation, selection.

    For every i: u <- m*u + g; v <- v + u. Each chunk c collects, in index order, up to
    ``cval.shape[1]`` candidates with |v| >= boundary into its own buffer and resets their
    u and v to 0 (momentum-factor masking, DGC §3). The caller keeps the first
    K candidates over all chunks (chunk order is index order) and restores u and v of
    the few candidates beyond K.

    Per block of SELECT_BLOCK elements: a vectorised loop updates u and v and counts the
    elements over the boundary; only when it found some does a scalar loop (on data
    still in L1) pick them, and it stops at the last one. g, u, v are read and u, v
    written once: at two threads the pass runs at memory speed.
    """
    n = g.size
    nch = cval.shape[0]
    cap = cval.shape[1]
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        cv = cval[c]
        cuu = cu[c]
        ci = cidx[c]
        cnt = 0
        for s in range(lo, hi, SELECT_BLOCK):
            e = min(s + SELECT_BLOCK, hi)
            gs = g[s:e]
            us = u[s:e]
            vs = v[s:e]
            hits = 0
            for i in range(e - s):
                ui = momentum * us[i] + gs[i]
                vi = vs[i] + ui
                us[i] = ui
                vs[i] = vi
                hits += 1 if abs(vi) >= boundary else 0
            i = 0
            while hits > 0 and cnt < cap:
                vi = vs[i]
                if abs(vi) >= boundary:
                    hits -= 1
                    cv[cnt] = vi
                    cuu[cnt] = us[i]
                    ci[cnt] = s + i
                    cnt += 1
                    us[i] = 0
                    vs[i] = 0
                i += 1
        ccount[c] = cnt


@chunked(lambda x, cval, *rest: cval.shape[0])
def select_nonzero(x, cval, cidx, ckept, cnonzero):
    """Per chunk, the first ``cval.shape[1]`` non-zeros of ``x`` in index order (the GS's
    pull-side sparsification of the aggregated sum); ``cnonzero`` counts all of them so
    the caller can report what the capacity cut off. Blocked like :func:`bsc_push`."""
    n = x.size
    nch = cval.shape[0]
    cap = cval.shape[1]
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        cv = cval[c]
        ci = cidx[c]
        kept = 0
        nz = 0
        for s in range(lo, hi, SELECT_BLOCK):
            e = min(s + SELECT_BLOCK, hi)
            xs = x[s:e]
            hits = 0
            for i in range(e - s):
                hits += 1 if xs[i] != 0 else 0
            nz += hits
            i = 0
            while hits > 0 and kept < cap:
                xi = xs[i]
                if xi != 0:
                    hits -= 1
                    cv[kept] = xi
                    ci[kept] = s + i
                    kept += 1
                i += 1
        ckept[c] = kept
        cnonzero[c] = nz


@njit(cache=True)
def count_out_of_range(idx, n):
    """Number of indices outside [0, n): run before any scatter (no bounds checks in
    numba)."""
    bad = 0
    for j in range(idx.size):
        k = idx[j]
        if k < 0 or k >= n:
            bad += 1
    return bad


@chunked()
def fill_zero(out, nch):
    n = out.size
    for c in prange(nch):
        lo = c * n // nch
        hi = (c + 1) * n // nch
        o = out[lo:hi]
        for i in range(hi - lo):
            o[i] = 0


@njit(cache=True)
def scatter(vals, idx, out, accumulate):
    """``out[idx] += vals`` (or ``=``). Indices must be validated by the caller.

    Serial on purpose: the pairs are ~1% of the tensor, so this is ~1 ms for a
    25M-element tensor, and a serial loop is also correct for repeated indices."""
    if accumulate:
        for j in range(vals.size):
            out[idx[j]] += vals[j]
    else:
        for j in range(vals.size):
            out[idx[j]] = vals[j]


# --------------------------------------------------------------------------- onebit


@chunked(lambda x, r, partial: partial.size)
def abs_sum_blocks(x, r, partial):
    """``partial[b] = sum |x + r|`` over fixed blocks of SUM_BLOCK elements, in float64
    with four interleaved accumulators (deterministic, independent of thread count)."""
    n = x.size
    nb = partial.size
    for b in prange(nb):
        lo = b * SUM_BLOCK
        hi = min(lo + SUM_BLOCK, n)
        xs = x[lo:hi]
        rs = r[lo:hi]
        m = hi - lo
        s0 = 0.0
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        i = 0
        while i + 4 <= m:
            s0 += abs(xs[i] + rs[i])
            s1 += abs(xs[i + 1] + rs[i + 1])
            s2 += abs(xs[i + 2] + rs[i + 2])
            s3 += abs(xs[i + 3] + rs[i + 3])
            i += 4
        while i < m:
            s0 += abs(xs[i] + rs[i])
            i += 1
        partial[b] = (s0 + s1) + (s2 + s3)


@njit(cache=True)
def _pack_tail(x, r, scale, packed, start):
    byte = 0
    for i in range(start, x.size):
        ci = x[i] + r[i]
        if ci >= 0:
            byte |= 1 << (i - start)
            r[i] = ci - scale
        else:
            r[i] = ci + scale
    packed[start // 8] = byte


@chunked()
def onebit_pack(x, r, scale, packed, nch):
    """Sign bits of c = x + r, 8 per byte, little-endian bit order (element 8j+k is bit k
    of byte j, i.e. ``np.packbits(c >= 0, bitorder="little")``), and the error-feedback
    residual r <- c - (+scale if c >= 0 else -scale).

    Per block: a vectorised pass writes the residual and one 0/1 byte per element into
    an L1 scratch buffer; then each 8 such bytes, read as one uint64, are gathered into
    one byte by a multiplication (byte k of the word lands on bit 56+k)."""
    n = x.size
    nfull = n // 8
    neg = -scale
    for c in prange(nch):
        blo = c * nfull // nch
        bhi = (c + 1) * nfull // nch
        tmp = np.empty(PACK_BLOCK, dtype=np.uint8)
        words = tmp.view(np.uint64)
        for s in range(8 * blo, 8 * bhi, PACK_BLOCK):
            e = min(s + PACK_BLOCK, 8 * bhi)
            xs = x[s:e]
            rs = r[s:e]
            for i in range(e - s):
                ci = xs[i] + rs[i]
                pos = ci >= 0
                rs[i] = ci - (scale if pos else neg)
                tmp[i] = pos
            base = s // 8
            for j in range((e - s) // 8):
                packed[base + j] = (words[j] * _PACK_MAGIC) >> _SHIFT56
    if n % 8:
        _pack_tail(x, r, scale, packed, 8 * nfull)


@chunked()
def onebit_unpack(packed, scale, out, accumulate, nch):
    """``out`` <- (or +=) +scale / -scale from the packed sign bits.

    Per block: each byte is spread to one 0/1-flag byte per bit (multiply by
    0x0101..01 to replicate it, mask bit k in byte k), then a vectorised select."""
    n = out.size
    nbytes = packed.size
    neg = -scale
    for c in prange(nch):
        blo = c * nbytes // nch
        bhi = (c + 1) * nbytes // nch
        tmp = np.empty(PACK_BLOCK, dtype=np.uint8)
        words = tmp.view(np.uint64)
        for s in range(8 * blo, min(8 * bhi, n), PACK_BLOCK):
            e = min(s + PACK_BLOCK, 8 * bhi, n)
            base = s // 8
            for j in range((e - s + 7) // 8):
                words[j] = (np.uint64(packed[base + j]) * _SPREAD_BYTE) & _BIT_PER_BYTE
            o = out[s:e]
            if accumulate:
                for i in range(e - s):
                    o[i] += scale if tmp[i] != 0 else neg
            else:
                for i in range(e - s):
                    o[i] = scale if tmp[i] != 0 else neg
