"""``none``: the identity codec, dense in the tensor's own dtype.

This is what GeoMX sends when no accelerator applies: every worker <-> local-server hop
under Bi-Sparse, and tensors below ``MXNET_KVSTORE_SIZE_LOWER_BOUND`` on the WAN
(docs/geomx-behaviour.md §4.1). ``encode`` copies, so the caller may reuse its gradient
buffer while the message is in flight.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from geomx.policy import codec as base, device
from geomx.policy.codec import ArraySpec, Codec, CodecError, CodecState, Encoded


class DenseCodec(Codec):
    name = base.DENSE
    params = ()
    elementwise = True

    def encode(self, key: int, x: Any, state: CodecState | None = None) -> Encoded:
        return base.encode_dense(x)

    def encode_pull(self, key: int, x: Any, *, sources: int = 1) -> Encoded:
        return self.encode(key, x)

    def encoded_sizes(self, num_elements: int, dtype: Any = "<f4") -> list[ArraySpec]:
        return [ArraySpec(np.dtype(dtype).str, (int(num_elements),))]

    @classmethod
    def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate):
        base.expect_arrays(arrays, cls.name, [(dtype.str, n)])
        a = arrays[0]
        if out is None:
            return a.astype(dtype, copy=True)
        if accumulate:
            out += a
        else:
            out[...] = a
        return out

    @classmethod
    def _decode_cuda(cls, arrays, meta, n, dtype, out, accumulate):
        base.expect_arrays(arrays, cls.name, [(dtype.str, n)])
        ck = device.cuda_kernels()
        if out is None:
            return ck.copy(arrays[0])
        if np.dtype(out.dtype) != dtype:
            raise CodecError(f"none: CUDA decode needs out of dtype {dtype}, got {np.dtype(out.dtype)}")
        ck.add_into(arrays[0], out, accumulate)
        return out


class WanAboveBound:
    """Policy of the compressing codecs that GeoMX confines to the WAN (Bi-Sparse, and
    onebit after it): compress only on the local <-> global server hop and only tensors of
    at least ``size_lower_bound`` elements; everything else travels dense
    (docs/geomx-behaviour.md §4.1)."""

    size_lower_bound: int

    def applies_to(self, num_elements: int) -> bool:
        return int(num_elements) >= self.size_lower_bound

    def codec_for(self, num_elements: int, tier: base.Tier) -> Codec:
        base.check_tier(tier)
        if tier == "wan" and self.applies_to(num_elements):
            return self  # type: ignore[return-value]
        return DenseCodec()

    def block_codec(self) -> Codec:
        """This codec with no size bound: the whole tensor passed it, so every block of
        it is encoded (the codec's other parameters unchanged)."""
        if self.size_lower_bound == 0:
            return self  # type: ignore[return-value]
        params = {p: getattr(self, p) for p in self.params}  # type: ignore[attr-defined]
        return type(self)(**{**params, "size_lower_bound": 0})  # type: ignore[call-arg]
