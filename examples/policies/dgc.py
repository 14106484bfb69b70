"""Deep Gradient Compression (Lin et al., ICLR 2018) as a geomx codec of your own.

Written only against the public policy API (``geomx.policy``): name it in a scenario as

    [codec]
    type = "dgc.py:DeepGradientCompression"      # next to the scenario file
    [codec.options]
    ratio = 0.01

Per key, on the local server -> global server hop (the WAN; the LAN hops and tensors
below ``size_lower_bound`` travel dense, as Bi-Sparse does), with the per-key state the
node owns (``u``: velocity, ``v``: accumulated velocity):

1. local gradient clipping (paper §3.4), when ``clip_norm`` > 0: ``g *= min(1, c/|g|)``;
2. momentum correction (§3.2): ``u <- m*u + g``, ``v <- v + u``;
3. top-k of ``|v|`` (k = ratio * N): exact for small tensors; above ``exact_below``
   elements the threshold is estimated from a sample of ``sample_ratio`` of ``|v|`` and
   refined by an exact top-k of the candidates (the paper's hierarchical selection),
   so the cost stays one pass over the tensor;
4. momentum factor masking (§3.3): the sent positions of ``u`` and ``v`` are zeroed; what
   is not sent stays in ``v`` (error feedback, "local gradient accumulation");
5. warm-up (§3.4): the kept fraction starts at 25% and shrinks exponentially to
   ``ratio`` over the first ``warmup_rounds`` encodes of each key.

The payload is (values float32, indices int32); the receiver scatter-adds it into its
accumulator. The sample positions come from a generator seeded by (seed, key, round), so
a run is deterministic: the emulator's golden/determinism checks hold for it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from geomx.policy import Codec, CodecError, CodecState, Encoded
from geomx.policy.codec import ArraySpec, check_count, check_fraction, flat_input, make_meta
from geomx.policy.registry import dense_codec

__all__ = ["DeepGradientCompression"]


def _momentum_accumulate(g: np.ndarray, u: np.ndarray, v: np.ndarray, m: float) -> None:
    """u <- m*u + g; v <- v + u, in place (three vectorised passes)."""
    u *= np.float32(m)
    u += g
    v += u


class DeepGradientCompression(Codec):
    """Top-k sparsification with momentum correction, factor masking and warm-up."""

    name = "dgc"
    stateful = True
    params = ("ratio", "momentum", "size_lower_bound", "clip_norm", "warmup_rounds",
              "sample_ratio", "exact_below", "seed")

    def __init__(self, ratio: float = 0.01, momentum: float = 0.9, size_lower_bound: int = 0,
                 clip_norm: float = 0.0, warmup_rounds: int = 0, sample_ratio: float = 0.01,
                 exact_below: int = 100_000, seed: int = 0) -> None:
        self.ratio = check_fraction(self.name, "ratio", ratio, hi_open=False)
        self.momentum = check_fraction(self.name, "momentum", momentum, lo_open=False)
        self.size_lower_bound = check_count(self.name, "size_lower_bound", size_lower_bound)
        if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float)) or not (
                math.isfinite(clip_norm) and clip_norm >= 0):
            raise ValueError(f"codec 'dgc': clip_norm must be a number >= 0, got {clip_norm!r}")
        self.clip_norm = float(clip_norm)
        self.warmup_rounds = check_count(self.name, "warmup_rounds", warmup_rounds)
        self.sample_ratio = check_fraction(self.name, "sample_ratio", sample_ratio, hi_open=False)
        self.exact_below = check_count(self.name, "exact_below", exact_below)
        self.seed = check_count(self.name, "seed", seed)

    # -- where it applies: the WAN hop, tensors of at least size_lower_bound ---------
    def applies_to(self, num_elements: int) -> bool:
        return int(num_elements) >= self.size_lower_bound

    def codec_for(self, num_elements: int, tier: str) -> Codec:
        if tier == "wan" and self.applies_to(num_elements):
            return self
        return dense_codec()

    # -- state and sizes ---------------------------------------------------------------
    def new_state(self, num_elements: int, *, like: Any = None) -> CodecState:
        n = int(num_elements)
        return CodecState(n, u=np.zeros(n, np.float32), v=np.zeros(n, np.float32))

    def kept(self, num_elements: int, round: int) -> int:
        """How many elements a push of this round carries (warm-up, then ``ratio``)."""
        r = self.ratio
        if round < self.warmup_rounds and r < 0.25:
            # 25% -> ratio, exponentially over the warm-up rounds (paper §3.4)
            r = 0.25 * (self.ratio / 0.25) ** ((round + 1) / (self.warmup_rounds + 1))
        return max(1, int(num_elements * r)) if num_elements else 0

    def encoded_sizes(self, num_elements: int, dtype: Any = "<f4") -> list[ArraySpec]:
        k = self.kept(int(num_elements), self.warmup_rounds)
        return [ArraySpec("<f4", (k,)), ArraySpec("<i4", (k,))]

    # -- encode ------------------------------------------------------------------------
    def encode(self, key: int, x: Any, state: CodecState | None = None) -> Encoded:
        flat, on_dev, dtype, shape = flat_input(x)
        if on_dev:
            raise CodecError("dgc: this example has CPU kernels only")
        n = int(flat.shape[0])
        if state is None or state.num_elements != n or state.u is None:
            raise CodecError(f"dgc: encode needs its per-key state (codec.new_state({n}))")
        g = flat.astype(np.float32, copy=self.clip_norm > 0)
        if self.clip_norm > 0:
            norm = float(np.linalg.norm(g))
            if norm > self.clip_norm:
                g *= np.float32(self.clip_norm / norm)
        u, v = state.u, state.v
        _momentum_accumulate(g, u, v, self.momentum)
        k = self.kept(n, state.round)
        idx = self._top_k(key, v, k, state.round)
        idx.sort()
        values = v[idx].astype(np.float32)
        u[idx] = 0.0
        v[idx] = 0.0
        state.round += 1
        return Encoded([values, idx.astype(np.int32)], make_meta(self.name, n, dtype, shape))

    def _top_k(self, key: int, v: np.ndarray, k: int, round: int) -> np.ndarray:
        n = v.shape[0]
        if k >= n:
            return np.arange(n, dtype=np.int64)
        mag = np.abs(v)
        if n < self.exact_below:
            return np.argpartition(mag, n - k)[n - k:]
        rng = np.random.default_rng([self.seed, int(key) & 0xFFFFFFFF, int(round)])
        size = max(int(n * self.sample_ratio), min(n, 1000))
        sample = mag[rng.integers(0, n, size)]
        top = max(1, int(size * k / n))
        threshold = np.partition(sample, size - top)[size - top]
        candidates = np.flatnonzero(mag >= threshold)
        if candidates.size < k:  # the sample overestimated the threshold: exact
            return np.argpartition(mag, n - k)[n - k:]
        if candidates.size == k:
            return candidates
        part = np.argpartition(mag[candidates], candidates.size - k)[candidates.size - k:]
        return candidates[part]

    # -- decode ------------------------------------------------------------------------
    @classmethod
    def _decode_cpu(cls, arrays: list[np.ndarray], meta: dict[str, Any], n: int,
                    dtype: np.dtype, out: np.ndarray | None, accumulate: bool) -> np.ndarray:
        if len(arrays) != 2:
            raise CodecError(f"dgc: expected 2 arrays (values, indices), got {len(arrays)}")
        values, idx = arrays
        if values.shape != idx.shape or values.ndim != 1:
            raise CodecError("dgc: values and indices must be 1-D of equal length")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise CodecError(f"dgc: indices outside [0, {n})")
        if out is None:
            res = np.zeros(n, dtype=np.float32)
            res[idx] = values
            return res.astype(dtype, copy=False)
        if not accumulate:
            out[...] = 0
        out[idx] += values.astype(out.dtype, copy=False)  # indices are unique: no np.add.at
        return out
