"""``bsc``: GeoMX's Bi-Sparse compression (HiPS/BSC; docs/geomx-behaviour.md §4.1,
docs/papers.md §6.5), with its bugs fixed.

Push (local server -> global server), per key with N >= ``size_lower_bound`` elements,
with the caller-owned state ``u`` (momentum) and ``v`` (accumulator):

1. DGC momentum correction (Lin et al. 2018, §3.2): ``u <- m*u + g``; ``v <- v + u``
   with m = 0.9 as GeoMX hard-codes it.
2. Boundary from a seeded sample, sized as GeoMX sizes it: S = int(N * 0.005) if
   N * 0.005 * r >= 10 else int(10 / r), top_k = int(S * r); the boundary is the
   top_k-th largest |v| in the sample. Fixes: S is clamped to N (GeoMX reads out of
   bounds), and the sample is drawn from a generator seeded by (seed, key, round), so
   it is deterministic but differs between rounds (GeoMX reuses seed 42 every round,
   always sampling the same positions; ``resample=False`` restores that). The sample is
   stratified (one uniform position in each of S equal strata) - same size and the same
   inclusion probability S/N per element as GeoMX's permutation prefix, cheaper, and a
   lower-variance quantile estimate.
3. Selection in index order of every i with |v_i| >= boundary, at most
   K = floor(N * r); each selected (v_i, i) is sent and u_i, v_i are reset to 0
   (momentum-factor masking, DGC §3.3). What is not sent stays in v: the error-feedback
   residual. Fixes: exactly the selected count travels (no -65530 placeholders),
   indices are int32 (exact beyond 2**24, unlike GeoMX's float indices; int64 when
   N >= 2**31), and exact zeros are never selected (a zero boundary would otherwise
   fill the message with zeros).

Pull ("bidirectional"): the global server sparsifies the aggregated sum it sends back:
the non-zeros in index order, at most floor(N * r * D) for D summed pushes; no residual
(the sum of D K-sparse vectors has at most D*K non-zeros, so nothing is lost unless
other contributions were added). ``meta["dropped"]`` reports anything cut off.

Tensors with N < ``size_lower_bound`` travel dense in their own dtype (codec ``none``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from geomx.policy import codec as base, device
from . import cpu_kernels
from geomx.policy.codec import ArraySpec, Codec, CodecError, CodecState, Encoded
from .identity import DenseCodec, WanAboveBound

_MASK64 = (1 << 64) - 1
#: GeoMX: top_k of the sample is at least 10 (sample = 10 / r when 0.5% of N is too few).
MIN_SAMPLE_TOP_K = 10
_TINY = np.float32(np.finfo(np.float32).smallest_subnormal)


def index_dtype(num_elements: int) -> np.dtype:
    """int32 indices (exact up to 2**31 - 1), int64 beyond."""
    return np.dtype("<i4") if num_elements <= np.iinfo(np.int32).max else np.dtype("<i8")


class BiSparseCodec(WanAboveBound, Codec):
    name = "bsc"
    stateful = True
    params = ("threshold", "size_lower_bound", "momentum", "seed", "resample", "sample_ratio")

    def __init__(self, threshold: float = 0.01, *, size_lower_bound: int | None = None,
                 momentum: float = 0.9, seed: int = 42, resample: bool = True,
                 sample_ratio: float = 0.005) -> None:
        """``threshold`` is GeoMX's name for the *kept fraction* r (not a magnitude).

        ``size_lower_bound``: default ``MXNET_KVSTORE_SIZE_LOWER_BOUND`` if set, else
        200000. ``sample_ratio``: GeoMX's 0.5% (raise it for a steadier density).
        """
        self.threshold = base.check_fraction(self.name, "threshold", threshold)
        self.size_lower_bound = base.resolve_size_lower_bound(self.name, size_lower_bound)
        self.momentum = base.check_fraction(self.name, "momentum", momentum, lo_open=False)
        self.seed = base.check_count(self.name, "seed", seed)
        if not isinstance(resample, (bool, np.bool_)):
            raise ValueError(f"codec 'bsc': resample must be true or false, got {resample!r}")
        self.resample = bool(resample)
        self.sample_ratio = base.check_fraction(self.name, "sample_ratio", sample_ratio, hi_open=False)

    # -- policy: WanAboveBound (only the LS <-> GS hop, only tensors >= the bound) --
    # -- sizes --------------------------------------------------------------------
    def capacity(self, num_elements: int) -> int:
        """K = floor(N * r): the most (value, index) pairs a push carries."""
        return int(num_elements * self.threshold)

    def pull_capacity(self, num_elements: int, sources: int = 1) -> int:
        """floor(N * r * D): the most pairs a pull reply carries."""
        return int(num_elements * self.threshold * _check_sources(sources))

    def sample_plan(self, num_elements: int) -> tuple[int, int]:
        """(sample size S, top_k) exactly as GeoMX computes them, S clamped to N."""
        n = int(num_elements)
        r = self.threshold
        s = n * self.sample_ratio
        size = int(s) if s * r >= MIN_SAMPLE_TOP_K else int(MIN_SAMPLE_TOP_K / r)
        size = min(size, n)
        top_k = int(size * r)
        if top_k == 0 and self.capacity(n) > 0:
            top_k = 1
        return size, top_k

    def sample_positions(self, num_elements: int, key: int, round: int) -> np.ndarray:
        """The sampled positions (int64, ascending) for this key and round."""
        n = int(num_elements)
        size, _ = self.sample_plan(n)
        if size >= n:
            return np.arange(n, dtype=np.int64)
        rnd = round if self.resample else 0
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            [self.seed, int(key) & _MASK64, int(rnd) & _MASK64])))
        rand = rng.integers(0, 1 << 32, size, dtype=np.uint64)
        pos = np.empty(size, dtype=np.int64)
        cpu_kernels.stratified_positions(rand, n, pos)
        return pos

    def encoded_sizes(self, num_elements: int, dtype: Any = "<f4") -> list[ArraySpec]:
        n = int(num_elements)
        if not self.applies_to(n):
            return [ArraySpec(np.dtype(dtype).str, (n,))]
        k = self.capacity(n)
        return [ArraySpec("<f4", (k,)), ArraySpec(index_dtype(n).str, (k,))]

    def pull_encoded_sizes(self, num_elements: int, dtype: Any = "<f4", *, sources: int = 1) -> list[ArraySpec]:
        n = int(num_elements)
        if not self.applies_to(n):
            return [ArraySpec(np.dtype(dtype).str, (n,))]
        k = min(self.pull_capacity(n, sources), n)
        return [ArraySpec("<f4", (k,)), ArraySpec(index_dtype(n).str, (k,))]

    # -- state --------------------------------------------------------------------
    def new_state(self, num_elements: int, *, like: Any = None) -> CodecState:
        n = int(num_elements)
        return CodecState(n, u=base.zeros_like_device(n, like), v=base.zeros_like_device(n, like))

    # -- encode -------------------------------------------------------------------
    def boundary(self, key: int, g: Any, state: CodecState, round: int) -> np.float32:
        """The sampled magnitude boundary for this push (before the state is updated)."""
        n = state.num_elements
        size, top_k = self.sample_plan(n)
        if self.capacity(n) == 0 or size == 0:
            return np.float32(np.inf)
        pos = self.sample_positions(n, key, round)
        m = np.float32(self.momentum)
        if device.is_cuda_array(g):
            sv = device.cuda_kernels().bsc_sample_abs(g, state.u, state.v, m, pos)
        else:
            sv = np.empty(pos.size, dtype=np.float32)
            nch = 1 if pos.size < 8192 else cpu_kernels.chunks_for(n)
            cpu_kernels.bsc_sample_abs(g, state.u, state.v, m, pos, sv, nch)
        b = np.float32(np.partition(sv, size - top_k)[size - top_k])
        if not b > 0:  # zero (or NaN) boundary: select only non-zeros
            b = _TINY
        return b

    def encode(self, key: int, x: Any, state: CodecState | None = None) -> Encoded:
        flat, on_dev, dtype, shape = base.flat_input(x)
        n = int(flat.shape[0])
        if not self.applies_to(n):
            return DenseCodec().encode(key, x)
        st = base.check_state(self.name, state, n, ("u", "v"), on_dev)
        rnd = st.round
        m = np.float32(self.momentum)
        k = self.capacity(n)
        if on_dev:
            if dtype != np.float32:
                raise CodecError(f"bsc: CUDA encode takes float32, got {dtype}")
            u = device.as_device(st.u).reshape(n)
            v = device.as_device(st.v).reshape(n)
            st_view = CodecState(n, u=u, v=v)
            b = self.boundary(key, flat, st_view, rnd)
            vals, idx = device.cuda_kernels().bsc_push(flat, u, v, m, b, k, index_dtype(n))
        else:
            g = base.as_f32_cpu(flat)
            u = st.u.reshape(-1)
            v = st.v.reshape(-1)
            b = self.boundary(key, g, CodecState(n, u=u, v=v), rnd)
            nch = cpu_kernels.chunks_for(n)
            cap = min(k, -(-n // nch))
            cval, cu, cidx, ccount = _scratch(st, nch, cap, index_dtype(n))
            cpu_kernels.bsc_push(g, u, v, m, b, cval, cu, cidx, ccount)
            vals, idx, _ = _take_in_order(cval, cidx, ccount, k, restore=(cu, u, v))
        st.round += 1
        return Encoded([vals, idx], base.make_meta(self.name, n, dtype, shape))

    def encode_pull(self, key: int, x: Any, *, sources: int = 1) -> Encoded:
        """Sparsify a server's aggregated tensor: its non-zeros in index order, at most
        floor(N * r * sources); no residual (GeoMX's pull side)."""
        flat, on_dev, dtype, shape = base.flat_input(x)
        n = int(flat.shape[0])
        if not self.applies_to(n):
            return DenseCodec().encode(key, x)
        k = self.pull_capacity(n, sources)
        if on_dev:
            if dtype != np.float32:
                raise CodecError(f"bsc: CUDA encode takes float32, got {dtype}")
            vals, idx, nonzero = device.cuda_kernels().select_nonzero(flat, k, index_dtype(n))
        else:
            x32 = base.as_f32_cpu(flat)
            nch = cpu_kernels.chunks_for(n)
            cap = min(k, -(-n // nch))
            cval = np.empty((nch, cap), dtype=np.float32)
            cidx = np.empty((nch, cap), dtype=index_dtype(n))
            ckept = np.zeros(nch, dtype=np.int64)
            cnz = np.zeros(nch, dtype=np.int64)
            cpu_kernels.select_nonzero(x32, cval, cidx, ckept, cnz)
            vals, idx, _ = _take_in_order(cval, cidx, ckept, k)
            nonzero = int(cnz.sum())
        dropped = int(nonzero) - int(vals.shape[0])
        extra = {"dropped": dropped} if dropped > 0 else {}
        return Encoded([vals, idx], base.make_meta(self.name, n, dtype, shape, **extra))

    # -- decode -------------------------------------------------------------------
    @classmethod
    def _check_pairs(cls, arrays: list[Any], n: int) -> int:
        if len(arrays) != 2:
            raise CodecError(f"bsc: expected 2 arrays (values, indices), got {len(arrays)}")
        vals, idx = arrays
        if np.dtype(vals.dtype) != np.float32:
            raise CodecError(f"bsc: values must be <f4, got {np.dtype(vals.dtype).str}")
        if np.dtype(idx.dtype) not in (np.dtype("<i4"), np.dtype("<i8")):
            raise CodecError(f"bsc: indices must be <i4 or <i8, got {np.dtype(idx.dtype).str}")
        if len(vals.shape) != 1 or len(idx.shape) != 1 or vals.shape[0] != idx.shape[0]:
            raise CodecError(f"bsc: values {tuple(vals.shape)} and indices {tuple(idx.shape)} "
                             "must be 1-D of equal length")
        k = int(vals.shape[0])
        if k > n:
            raise CodecError(f"bsc: {k} pairs for a tensor of {n} elements")
        return k

    @classmethod
    def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate):
        cls._check_pairs(arrays, n)
        vals = np.ascontiguousarray(arrays[0])
        idx = np.ascontiguousarray(arrays[1])
        bad = cpu_kernels.count_out_of_range(idx, n)
        if bad:
            raise CodecError(f"bsc: {bad} indices outside [0, {n})")
        if out is None:
            res = np.zeros(n, dtype=np.float32)
            cpu_kernels.scatter(vals, idx, res, False)
            return res if dtype == np.float32 else res.astype(dtype)
        if out.dtype in (np.float32, np.float64):
            if not accumulate:
                cpu_kernels.fill_zero(out, cpu_kernels.chunks_for(n))
            cpu_kernels.scatter(vals, idx, out, accumulate)
        else:  # e.g. float16 accumulators: numba has no CPU float16
            if not accumulate:
                out[...] = 0
            np.add.at(out, idx, vals.astype(out.dtype))
        return out

    @classmethod
    def _decode_cuda(cls, arrays, meta, n, dtype, out, accumulate):
        cls._check_pairs(arrays, n)
        ck = device.cuda_kernels()
        vals, idx = arrays
        bad = ck.count_out_of_range(idx, n)
        if bad:
            raise CodecError(f"bsc: {bad} indices outside [0, {n})")
        if out is None:
            out = ck.zeros(n)
        elif np.dtype(out.dtype) != np.float32:
            raise CodecError(f"bsc: CUDA decode needs a float32 out, got {np.dtype(out.dtype)}")
        elif not accumulate:
            ck.fill_zero(out)
        ck.scatter_add(vals, idx, out)
        return out


def _scratch(state: CodecState, nch: int, cap: int, idx_dtype: np.dtype
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-chunk candidate buffers, kept in the key's state between rounds (about 3% of
    the state's size at r = 0.01): allocating and faulting in fresh ones every push
    costs more than the selection itself. Results are copied out of them."""
    bufs = state.extra.get("bsc_candidates")
    if bufs is None or bufs[0].shape != (nch, cap) or bufs[2].dtype != idx_dtype:
        bufs = (np.empty((nch, cap), dtype=np.float32), np.empty((nch, cap), dtype=np.float32),
                np.empty((nch, cap), dtype=idx_dtype), np.zeros(nch, dtype=np.int64))
        state.extra["bsc_candidates"] = bufs
    return bufs


def _check_sources(sources: Any) -> int:
    if isinstance(sources, bool) or not isinstance(sources, (int, np.integer)) or sources < 1:
        raise ValueError(f"sources must be a positive integer, got {sources!r}")
    return int(sources)


def _take_in_order(cval: np.ndarray, cidx: np.ndarray, ccount: np.ndarray, k: int,
                   restore: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """Keep the first ``k`` candidates over all chunks (chunk order = index order).

    With ``restore=(cu, u, v)``, candidates past ``k`` get their u and v back (the
    kernel reset them optimistically). Returns (values, indices, candidates seen)."""
    remaining = k
    vparts: list[np.ndarray] = []
    iparts: list[np.ndarray] = []
    for c in range(cval.shape[0]):
        cnt = int(ccount[c])
        q = min(cnt, remaining)
        remaining -= q
        vparts.append(cval[c, :q])
        iparts.append(cidx[c, :q])
        if restore is not None and cnt > q:
            cu, u, v = restore
            lost = cidx[c, q:cnt]
            u[lost] = cu[c, q:cnt]
            v[lost] = cval[c, q:cnt]
    vals = np.concatenate(vparts) if len(vparts) != 1 else vparts[0].copy()
    idx = np.concatenate(iparts) if len(iparts) != 1 else iparts[0].copy()
    return vals, idx, int(ccount.sum())

