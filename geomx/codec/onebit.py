"""``onebit``: sign bits with one scale, and error feedback (beyond GeoMX).

1-bit SGD (Seide et al. 2014) in its scaled-sign form with error feedback
(Karimireddy et al. 2019, "EF-SignSGD"): with the caller-owned residual r,

    c = x + r;  scale = mean |c|;  send sign(c) (8 per byte) and scale;
    r <- c - scale * sign(c)

so whatever the message could not express is added to the next round's gradient:
over rounds, sum(decoded) + r_final == sum(x) up to float rounding ("conservation").
Wire: ceil(N/8) bytes of sign bits (little-endian bit order: element 8j+k is bit k of
byte j; bit set = c >= 0) plus one float32 scale, i.e. ~32x smaller than fp32.

Like Bi-Sparse it is meant for the WAN hop (``codec_for`` keeps the LAN dense), and
pull replies travel dense, as GeoMX's inherited 2bit codec does (a 1-bit pull without
server-side error feedback would bias the model).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from geomx.policy import codec as base, device
from . import cpu_kernels
from geomx.policy.codec import ArraySpec, Codec, CodecError, CodecState, Encoded
from .identity import DenseCodec, WanAboveBound


class OneBitCodec(WanAboveBound, Codec):
    name = "onebit"
    stateful = True
    params = ("size_lower_bound",)

    def __init__(self, *, size_lower_bound: int = 0) -> None:
        """``size_lower_bound``: tensors with fewer elements travel dense (default 0:
        every tensor is compressed)."""
        self.size_lower_bound = base.check_count(self.name, "size_lower_bound", size_lower_bound)

    def new_state(self, num_elements: int, *, like: Any = None) -> CodecState:
        n = int(num_elements)
        return CodecState(n, residual=base.zeros_like_device(n, like))

    def encoded_sizes(self, num_elements: int, dtype: Any = "<f4") -> list[ArraySpec]:
        n = int(num_elements)
        if not self.applies_to(n):
            return [ArraySpec(np.dtype(dtype).str, (n,))]
        return [ArraySpec("|u1", ((n + 7) // 8,)), ArraySpec("<f4", (1,))]

    def encode(self, key: int, x: Any, state: CodecState | None = None) -> Encoded:
        flat, on_dev, dtype, shape = base.flat_input(x)
        n = int(flat.shape[0])
        if not self.applies_to(n):
            return DenseCodec().encode(key, x)
        st = base.check_state(self.name, state, n, ("residual",), on_dev)
        if on_dev:
            if dtype != np.float32:
                raise CodecError(f"onebit: CUDA encode takes float32, got {dtype}")
            r = device.as_device(st.residual).reshape(n)
            packed, scale = device.cuda_kernels().onebit_encode(flat, r)
        else:
            x32 = base.as_f32_cpu(flat)
            r = st.residual.reshape(-1)
            partial = np.empty(-(-n // cpu_kernels.SUM_BLOCK), dtype=np.float64)
            cpu_kernels.abs_sum_blocks(x32, r, partial)
            scale_v = np.float32(partial.sum() / n) if n else np.float32(0.0)
            packed = np.empty((n + 7) // 8, dtype=np.uint8)
            cpu_kernels.onebit_pack(x32, r, scale_v, packed, cpu_kernels.chunks_for(n))
            scale = np.array([scale_v], dtype=np.float32)
        st.round += 1
        return Encoded([packed, scale], base.make_meta(self.name, n, dtype, shape))

    @classmethod
    def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate):
        base.expect_arrays(arrays, cls.name, [("|u1", (n + 7) // 8), ("<f4", 1)])
        packed = np.ascontiguousarray(arrays[0])
        scale = np.float32(arrays[1][0])
        nch = cpu_kernels.chunks_for(n)
        if out is not None and out.dtype == np.float32:
            cpu_kernels.onebit_unpack(packed, scale, out, accumulate, nch)
            return out
        tmp = np.empty(n, dtype=np.float32)
        cpu_kernels.onebit_unpack(packed, scale, tmp, False, nch)
        return base.finish_cpu(tmp, out, accumulate, dtype)

    @classmethod
    def _decode_cuda(cls, arrays, meta, n, dtype, out, accumulate):
        base.expect_arrays(arrays, cls.name, [("|u1", (n + 7) // 8), ("<f4", 1)])
        ck = device.cuda_kernels()
        if out is None:
            out = ck.empty(n, np.float32)
            accumulate = False
        elif np.dtype(out.dtype) != np.float32:
            raise CodecError(f"onebit: CUDA decode needs a float32 out, got {np.dtype(out.dtype)}")
        ck.onebit_decode(arrays[0], arrays[1], out, accumulate)
        return out
