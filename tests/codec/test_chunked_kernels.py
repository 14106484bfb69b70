"""The chunked CPU kernels' two compilations (geomx/codec/cpu_kernels.py, ChunkedKernel):
one chunk (or one numba thread) runs the serial compilation, more chunks the parallel
one, and both write the same bytes."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from geomx.codec import cpu_kernels as k

SIZES = (1, 1000, 70_001)
NCH = 3


def kernels() -> list[k.ChunkedKernel]:
    return [v for v in vars(k).values() if isinstance(v, k.ChunkedKernel)]


def test_every_prange_kernel_is_chunked():
    """No ``parallel=True`` dispatcher is left that a caller would launch for one chunk."""
    for name, v in vars(k).items():
        if isinstance(v, numba.core.registry.CPUDispatcher):
            assert not v.targetoptions.get("parallel"), f"{name} is a bare parallel kernel"
    assert len(kernels()) >= 10


def test_one_chunk_picks_the_serial_compilation():
    x = np.zeros(10, np.float32)
    d = np.zeros(10, np.uint16)
    kern = k.f32_to_f16_bits
    assert kern.pick(x, d, False, 1) is kern.serial
    if numba.get_num_threads() > 1:
        assert kern.pick(x, d, False, 2) is kern.parallel
    # kernels whose chunk count is an array's length
    cval = np.zeros((1, 4), np.float32)
    assert k.bsc_push.pick(x, x, x, np.float32(0), np.float32(1), cval, cval, cval, np.zeros(1, np.int64)) \
        is k.bsc_push.serial
    assert k.select_nonzero.pick(x, cval, cval, np.zeros(1), np.zeros(1)) is k.select_nonzero.serial
    assert k.abs_sum_blocks.pick(x, x, np.zeros(1)) is k.abs_sum_blocks.serial
    assert k.abs_sum_blocks.pick(x, x, np.zeros(2)) is (k.abs_sum_blocks.serial if numba.get_num_threads() == 1
                                                       else k.abs_sum_blocks.parallel)


def test_one_numba_thread_picks_the_serial_compilation():
    x = np.zeros(10, np.float32)
    d = np.zeros(10, np.uint16)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert k.f32_to_f16_bits.pick(x, d, False, 4) is k.f32_to_f16_bits.serial
    finally:
        numba.set_num_threads(before)


def test_the_serial_compilation_is_not_parallel():
    """Serial and parallel are separate numba functions (separate cache entries): a
    shared cache entry would hand one the other's machine code."""
    for kern in kernels():
        assert not kern.serial.targetoptions.get("parallel"), kern
        assert kern.parallel.targetoptions.get("parallel"), kern
        assert kern.serial.py_func.__qualname__ != kern.parallel.py_func.__qualname__
        assert kern.serial.py_func.__code__ is kern.py_func.__code__


def _random_f32(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * np.float32(30)).astype(np.float32)
    # some specials and raw bit patterns (NaN payloads, subnormals)
    raw = rng.integers(0, 2**32, size=n // 10 + 1, dtype=np.uint32).view(np.float32)
    x[rng.integers(0, n, size=raw.size)] = raw
    return x




class Args:
    """Arrays (copied per run) plus a builder of the call's argument list for a chunk count."""

    def __init__(self, arrays: list[np.ndarray], build) -> None:
        self.arrays = [a.copy() for a in arrays]
        self._build = build

    def __call__(self, nch: int) -> tuple:
        return self._build(self.arrays, nch)


def cases(rng: np.random.Generator, n: int):
    x = _random_f32(rng, n)
    h = rng.integers(0, 2**16, size=n, dtype=np.uint16)
    o = rng.standard_normal(n).astype(np.float32)
    yield k.f32_to_f16_bits, [x, np.zeros(n, np.uint16)], lambda a, c: (a[0], a[1], False, c)
    yield k.f32_to_f16_hw, [x, np.zeros(n, np.uint16)], lambda a, c: (a[0], a[1], True, c)
    yield k.f16_to_f32_bits, [h, o], lambda a, c: (a[0], a[1], False, True, c)
    yield k.f16_to_f32_hw, [h, o], lambda a, c: (a[0], a[1], True, False, c)
    yield k._f16_to_f32_stream, [h, o], lambda a, c: (a[0], a[1], False, c)
    yield k.f32_to_bf16, [x.view(np.uint32), np.zeros(n, np.uint16)], lambda a, c: (a[0], a[1], c)
    yield k._bf16_to_f32, [h, o], lambda a, c: (a[0], a[1], True, c)
    yield k._bf16_to_f32_stream, [h, o], lambda a, c: (a[0], a[1], c)
    yield k.fill_zero, [o], lambda a, c: (a[0], c)
    g = rng.standard_normal(n).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    v = rng.standard_normal(n).astype(np.float32)
    m, bound = np.float32(0.9), np.float32(1.5)
    pos = np.sort(rng.integers(0, n, size=max(1, n // 50))).astype(np.int64)
    yield (k.bsc_sample_abs, [g, u, v, pos, np.zeros(pos.size, np.float32)],
           lambda a, c: (a[0], a[1], a[2], m, a[3], a[4], c))
    cap = n  # room for every candidate in any chunk
    yield (k.bsc_push, [g, u, v],
           lambda a, c: (a[0], a[1], a[2], m, bound, *_push_buffers(a, c, cap)))
    sparse = np.where(rng.random(n) < 0.05, g, np.float32(0))
    yield k.select_nonzero, [sparse], lambda a, c: (a[0], *_select_buffers(a, c, cap))
    r = rng.standard_normal(n).astype(np.float32)
    yield (k.abs_sum_blocks, [g, r],
           lambda a, c: (a[0], a[1], _partial(a, n)))
    yield (k.onebit_pack, [g, r, np.zeros(-(-n // 8), np.uint8)],
           lambda a, c: (a[0], a[1], np.float32(0.7), a[2], c))
    packed = rng.integers(0, 256, size=-(-n // 8), dtype=np.uint8)
    yield (k.onebit_unpack, [packed, o],
           lambda a, c: (a[0], np.float32(0.7), a[1], True, c))


def _push_buffers(a: list[np.ndarray], nch: int, cap: int) -> tuple:
    """Per-chunk output buffers, appended to the arrays so the comparison sees them."""
    bufs = [np.zeros((nch, cap), np.float32), np.zeros((nch, cap), np.float32),
            np.zeros((nch, cap), np.int64), np.zeros(nch, np.int64)]
    a.extend(bufs)
    return tuple(bufs)


def _select_buffers(a: list[np.ndarray], nch: int, cap: int) -> tuple:
    bufs = [np.zeros((nch, cap), np.float32), np.zeros((nch, cap), np.int64),
            np.zeros(nch, np.int64), np.zeros(nch, np.int64)]
    a.extend(bufs)
    return tuple(bufs)


def _partial(a: list[np.ndarray], n: int) -> np.ndarray:
    out = np.zeros(-(-n // k.SUM_BLOCK), np.float64)
    a.append(out)
    return out


def _chunked_view(arrays: list[np.ndarray], kern: k.ChunkedKernel) -> list[np.ndarray]:
    """The per-chunk selection buffers of one chunk vs many, in index order: the
    candidates chunk by chunk, as the codec reads them."""
    if kern is k.bsc_push:
        g, u, v, cval, cu, cidx, cnt = arrays
        keep = [slice(0, int(c)) for c in cnt]
        return [g, u, v, np.concatenate([cval[i, s] for i, s in enumerate(keep)]),
                np.concatenate([cu[i, s] for i, s in enumerate(keep)]),
                np.concatenate([cidx[i, s] for i, s in enumerate(keep)])]
    if kern is k.select_nonzero:
        x, cval, cidx, kept, nz = arrays
        keep = [slice(0, int(c)) for c in kept]
        return [x, np.concatenate([cval[i, s] for i, s in enumerate(keep)]),
                np.concatenate([cidx[i, s] for i, s in enumerate(keep)]), np.array([nz.sum()])]
    return arrays


@pytest.mark.parametrize("n", SIZES)
def test_serial_and_parallel_write_the_same_bytes(n):
    rng = np.random.default_rng(n)
    seen = set()
    for kern, arrays, build in cases(rng, n):
        if kern in (k.f32_to_f16_hw, k.f16_to_f32_hw, k._f16_to_f32_stream) and not k.USE_F16C:
            continue
        seen.add(kern.__name__)
        ser, par = Args(arrays, build), Args(arrays, build)
        kern.serial(*ser(1))
        kern.parallel(*par(NCH))
        for a, b in zip(_chunked_view(ser.arrays, kern), _chunked_view(par.arrays, kern), strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{kern.__name__} n={n}"
    assert seen >= {kern.__name__ for kern in kernels()} - {"f32_to_f16_hw", "f16_to_f32_hw", "_f16_to_f32_stream"}
