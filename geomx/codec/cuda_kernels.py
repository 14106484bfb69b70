"""``numba.cuda`` kernels for the codecs, with their host-side launchers.

Imported lazily by ``device.cuda_kernels()`` the first time a CUDA array is encoded or
decoded, so CPU-only runs never import ``numba.cuda``. Kernels compile on first launch
(``cache=True`` on a real GPU). Under ``NUMBA_ENABLE_CUDASIM=1`` the same kernels run in
numba's simulator, which is how the tests check them against the CPU kernels on
machines without a GPU (keep those arrays tiny: the simulator runs one Python thread per
CUDA thread).

Algorithms mirror ``cpu_kernels`` and give the same results:

* fp16/bf16: one thread per element, the shared integer bit functions of ``bits.py``.
* Bi-Sparse push: (1) a sample kernel for the boundary (positions drawn on the host by
  the same seeded generator as on the CPU), (2) one update kernel (u <- m*u + g,
  v <- v + u) that also counts, per block, the elements with |v| >= boundary, (3) a
  host prefix sum of the block counts, (4) a compaction kernel: a block-wide scan gives
  every selected element its global rank in index order; ranks < K are written out and
  their u, v reset. The multiply uses ``fmul_rn`` so that the compiler cannot fuse it
  into an FMA, which would round differently from the CPU.
* Pull sparsification: the same count + compaction with the predicate x != 0.
* Scatter-add: one thread per pair, atomic add (safe even for repeated indices).
* onebit: block-reduced float64 partial sums of |x + r| (summed on the host), then one
  thread per byte packs 8 signs and updates the residual.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from . import bits
from .cudasim import check_target_loads, simulator_enabled

_SIM = simulator_enabled()
if not _SIM:
    check_target_loads()
#: Threads per block; a compile-time constant for the shared-memory scan. Smaller in the
#: simulator, where every thread is a Python thread.
TPB = 32 if _SIM else 256
_CACHE = not _SIM

_d_f32_to_f16 = cuda.jit(device=True)(bits.f32_to_f16)
_d_f16_to_f32 = cuda.jit(device=True)(bits.f16_to_f32)
_d_f32_to_bf16 = cuda.jit(device=True)(bits.f32_to_bf16)
_d_bf16_to_f32 = cuda.jit(device=True)(bits.bf16_to_f32)

if _SIM:
    def _mul_py(a, b):
        return a * b  # numpy float32 scalars: float32 rounding, no fusion

    _mul_rn = cuda.jit(device=True)(_mul_py)
else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    _mul_rn = libdevice.fmul_rn


def _blocks(n: int) -> int:
    return max(1, (n + TPB - 1) // TPB)


# --------------------------------------------------------------------------- elementwise


@cuda.jit(cache=_CACHE)
def _k_f32_to_f16(src, dst, quiet_nan):
    i = cuda.grid(1)
    if i < src.shape[0]:
        dst[i] = _d_f32_to_f16(np.int64(src[i]), quiet_nan)


@cuda.jit(cache=_CACHE)
def _k_f16_to_f32(src, dst, quiet_nan):
    i = cuda.grid(1)
    if i < src.shape[0]:
        dst[i] = _d_f16_to_f32(np.int64(src[i]), quiet_nan)


@cuda.jit(cache=_CACHE)
def _k_f32_to_bf16(src, dst):
    i = cuda.grid(1)
    if i < src.shape[0]:
        dst[i] = _d_f32_to_bf16(np.int64(src[i]))


@cuda.jit(cache=_CACHE)
def _k_bf16_to_f32(src, dst):
    i = cuda.grid(1)
    if i < src.shape[0]:
        dst[i] = _d_bf16_to_f32(np.int64(src[i]))


@cuda.jit(cache=_CACHE)
def _k_add(src, dst, accumulate):
    i = cuda.grid(1)
    if i < src.shape[0]:
        if accumulate:
            dst[i] += src[i]
        else:
            dst[i] = src[i]


@cuda.jit(cache=_CACHE)
def _k_fill(dst, value):
    i = cuda.grid(1)
    if i < dst.shape[0]:
        dst[i] = value


# --------------------------------------------------------------------------- Bi-Sparse


@cuda.jit(cache=_CACHE)
def _k_sample_abs(g, u, v, m, pos, out):
    j = cuda.grid(1)
    if j < pos.shape[0]:
        p = pos[j]
        out[j] = abs(v[p] + (_mul_rn(m, u[p]) + g[p]))


@cuda.jit(cache=_CACHE)
def _k_push_update(g, u, v, m, boundary, counts):
    cnt = cuda.shared.array(1, np.int32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    if t == 0:
        cnt[0] = 0
    cuda.syncthreads()
    if i < g.shape[0]:
        ui = _mul_rn(m, u[i]) + g[i]
        vi = v[i] + ui
        u[i] = ui
        v[i] = vi
        if abs(vi) >= boundary:
            cuda.atomic.add(cnt, 0, 1)
    cuda.syncthreads()
    if t == 0:
        counts[cuda.blockIdx.x] = cnt[0]


@cuda.jit(cache=_CACHE)
def _k_count_nonzero(x, counts):
    cnt = cuda.shared.array(1, np.int32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    if t == 0:
        cnt[0] = 0
    cuda.syncthreads()
    if i < x.shape[0]:
        if x[i] != 0:
            cuda.atomic.add(cnt, 0, 1)
    cuda.syncthreads()
    if t == 0:
        counts[cuda.blockIdx.x] = cnt[0]


@cuda.jit(cache=_CACHE)
def _k_compact(x, u, v, boundary, mode, offsets, k, out_val, out_idx):
    """mode 0: select |x| >= boundary and reset u, v there (x is v); mode 1: x != 0."""
    flags = cuda.shared.array(TPB, np.int32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    f = 0
    xi = np.float32(0.0)
    if i < x.shape[0]:
        xi = x[i]
        if mode == 0:
            f = 1 if abs(xi) >= boundary else 0
        else:
            f = 1 if xi != 0 else 0
    flags[t] = f
    cuda.syncthreads()
    off = 1
    while off < TPB:  # Hillis-Steele inclusive scan of the flags
        add = flags[t - off] if t >= off else 0
        cuda.syncthreads()
        flags[t] += add
        cuda.syncthreads()
        off *= 2
    if f == 1:
        rank = offsets[cuda.blockIdx.x] + flags[t] - 1
        if rank < k:
            out_val[rank] = xi
            out_idx[rank] = i
            if mode == 0:
                u[i] = 0
                v[i] = 0


@cuda.jit(cache=_CACHE)
def _k_count_out_of_range(idx, n, bad):
    j = cuda.grid(1)
    if j < idx.shape[0]:
        k = idx[j]
        if k < 0 or k >= n:
            cuda.atomic.add(bad, 0, 1)


@cuda.jit(cache=_CACHE)
def _k_scatter_add(vals, idx, out):
    j = cuda.grid(1)
    if j < vals.shape[0]:
        cuda.atomic.add(out, idx[j], vals[j])


# --------------------------------------------------------------------------- onebit


@cuda.jit(cache=_CACHE)
def _k_abs_sum(x, r, partial):
    sh = cuda.shared.array(TPB, np.float64)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    s = 0.0
    while i < x.shape[0]:
        s += abs(x[i] + r[i])
        i += stride
    sh[t] = s
    cuda.syncthreads()
    step = TPB // 2
    while step > 0:
        if t < step:
            sh[t] += sh[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = sh[0]


@cuda.jit(cache=_CACHE)
def _k_pack(x, r, scale, packed):
    j = cuda.grid(1)
    if j < packed.shape[0]:
        n = x.shape[0]
        base = 8 * j
        byte = 0
        for b in range(8):
            i = base + b
            if i < n:
                c = x[i] + r[i]
                if c >= 0:
                    byte |= 1 << b
                    r[i] = c - scale
                else:
                    r[i] = c + scale
        packed[j] = byte


@cuda.jit(cache=_CACHE)
def _k_unpack(packed, scale, out, accumulate):
    i = cuda.grid(1)
    if i < out.shape[0]:
        s = scale[0]
        val = s if (packed[i >> 3] >> (i & 7)) & 1 else -s
        if accumulate:
            out[i] += val
        else:
            out[i] = val


# --------------------------------------------------------------------------- launchers


def empty(n: int, dtype: Any) -> Any:
    return cuda.device_array(int(n), dtype=np.dtype(dtype))


def zeros(n: int) -> Any:
    out = empty(n, np.float32)
    fill_zero(out)
    return out


def fill_zero(a: Any) -> None:
    n = int(a.shape[0]) if len(a.shape) == 1 else int(np.prod(a.shape))
    if n:
        flat = a.reshape(n)
        _k_fill[_blocks(n), TPB](flat, flat.dtype.type(0))


def copy(src: Any) -> Any:
    n = int(src.shape[0])
    out = empty(n, src.dtype)
    if n:
        _k_add[_blocks(n), TPB](src, out, False)
    return out


def add_into(src: Any, dst: Any, accumulate: bool) -> None:
    n = int(src.shape[0])
    if n:
        _k_add[_blocks(n), TPB](src, dst, accumulate)


def f32_to_f16(x: Any, quiet_nan: bool) -> Any:
    n = int(x.shape[0])
    out = empty(n, np.uint16)
    if n:
        _k_f32_to_f16[_blocks(n), TPB](x.view(np.uint32), out, quiet_nan)
    return out


def f16_to_f32(h: Any, out: Any, quiet_nan: bool, accumulate: bool) -> None:
    n = int(h.shape[0])
    if not n:
        return
    if accumulate:
        tmp = empty(n, np.uint32)
        _k_f16_to_f32[_blocks(n), TPB](h, tmp, quiet_nan)
        _k_add[_blocks(n), TPB](tmp.view(np.float32), out, True)
    else:
        _k_f16_to_f32[_blocks(n), TPB](h, out.view(np.uint32), quiet_nan)


def f32_to_bf16(x: Any) -> Any:
    n = int(x.shape[0])
    out = empty(n, np.uint16)
    if n:
        _k_f32_to_bf16[_blocks(n), TPB](x.view(np.uint32), out)
    return out


def bf16_to_f32(h: Any, out: Any, accumulate: bool) -> None:
    n = int(h.shape[0])
    if not n:
        return
    if accumulate:
        tmp = empty(n, np.uint32)
        _k_bf16_to_f32[_blocks(n), TPB](h, tmp)
        _k_add[_blocks(n), TPB](tmp.view(np.float32), out, True)
    else:
        _k_bf16_to_f32[_blocks(n), TPB](h, out.view(np.uint32))


def bsc_sample_abs(g: Any, u: Any, v: Any, m: np.float32, pos: np.ndarray) -> np.ndarray:
    """|v + (m*u + g)| at the sampled positions, returned to the host."""
    s = int(pos.shape[0])
    if not s:
        return np.empty(0, np.float32)
    out = empty(s, np.float32)
    _k_sample_abs[_blocks(s), TPB](g, u, v, np.float32(m), cuda.to_device(np.ascontiguousarray(pos, np.int64)), out)
    return out.copy_to_host()


def _compact(x: Any, u: Any, v: Any, boundary: np.float32, mode: int, counts_dev: Any, k: int,
             idx_dtype: np.dtype) -> tuple[Any, Any, int]:
    n = int(x.shape[0])
    counts = counts_dev.copy_to_host().astype(np.int64)
    total = int(counts.sum())
    kept = min(total, int(k))
    out_val = empty(kept, np.float32)
    out_idx = empty(kept, idx_dtype)
    if kept:
        offsets = np.zeros(counts.size, dtype=np.int64)
        np.cumsum(counts[:-1], out=offsets[1:])
        _k_compact[_blocks(n), TPB](x, u, v, np.float32(boundary), mode, cuda.to_device(offsets),
                                    kept, out_val, out_idx)
    return out_val, out_idx, total


def bsc_push(g: Any, u: Any, v: Any, m: np.float32, boundary: np.float32, k: int,
             idx_dtype: np.dtype) -> tuple[Any, Any]:
    n = int(g.shape[0])
    if not n:
        return empty(0, np.float32), empty(0, idx_dtype)
    nb = _blocks(n)
    counts = empty(nb, np.int32)
    _k_push_update[nb, TPB](g, u, v, np.float32(m), np.float32(boundary), counts)
    vals, idx, _ = _compact(v, u, v, boundary, 0, counts, k, idx_dtype)
    return vals, idx


def select_nonzero(x: Any, k: int, idx_dtype: np.dtype) -> tuple[Any, Any, int]:
    n = int(x.shape[0])
    if not n:
        return empty(0, np.float32), empty(0, idx_dtype), 0
    nb = _blocks(n)
    counts = empty(nb, np.int32)
    _k_count_nonzero[nb, TPB](x, counts)
    return _compact(x, x, x, np.float32(0), 1, counts, k, idx_dtype)


def count_out_of_range(idx: Any, n: int) -> int:
    m = int(idx.shape[0])
    if not m:
        return 0
    bad = cuda.to_device(np.zeros(1, np.int64))
    _k_count_out_of_range[_blocks(m), TPB](idx, int(n), bad)
    return int(bad.copy_to_host()[0])


def scatter_add(vals: Any, idx: Any, out: Any) -> None:
    m = int(vals.shape[0])
    if m:
        _k_scatter_add[_blocks(m), TPB](vals, idx, out)


def onebit_encode(x: Any, r: Any) -> tuple[Any, Any]:
    n = int(x.shape[0])
    nbytes = (n + 7) // 8
    packed = empty(nbytes, np.uint8)
    if not n:
        return packed, cuda.to_device(np.zeros(1, np.float32))
    nb = min(_blocks(n), 1024)
    partial = empty(nb, np.float64)
    _k_abs_sum[nb, TPB](x, r, partial)
    scale = np.float32(partial.copy_to_host().sum() / n)
    _k_pack[_blocks(nbytes), TPB](x, r, scale, packed)
    return packed, cuda.to_device(np.array([scale], dtype=np.float32))


def onebit_decode(packed: Any, scale: Any, out: Any, accumulate: bool) -> None:
    n = int(out.shape[0])
    if n:
        _k_unpack[_blocks(n), TPB](packed, scale, out, accumulate)
