"""``bf16``: transmit bfloat16 (the top 16 bits of float32, rounded), compute in float32.

Beyond GeoMX. bfloat16 keeps float32's exponent range, so unlike fp16 it never
overflows or flushes gradients to zero; it keeps 8 significant bits instead of 11.
Rounding is to nearest even; NaN becomes the canonical quiet NaN with its sign
(PyTorch/Eigen behaviour). numpy has no bfloat16 dtype, so the wire array is the raw
bit pattern as ``uint16`` ("<u2").
"""
from __future__ import annotations

from typing import Any

import numpy as np

from geomx.policy import device
from . import cpu_kernels
from geomx.policy.codec import CodecError
from .fp16 import HalfWidthCodec


class BF16Codec(HalfWidthCodec):
    name = "bf16"
    params = ()
    wire_dtype = "<u2"

    def _encode_cpu(self, flat: np.ndarray) -> np.ndarray:
        f32 = flat if flat.dtype == np.float32 else flat.astype(np.float32)
        out = np.empty(f32.shape[0], dtype=np.uint16)
        cpu_kernels.f32_to_bf16(f32.view(np.uint32), out, cpu_kernels.chunks_for(out.size))
        return out

    def _encode_cuda(self, flat: Any, dtype: np.dtype) -> Any:
        if dtype != np.float32:
            raise CodecError(f"bf16: CUDA encode takes float32, got {dtype}")
        return device.cuda_kernels().f32_to_bf16(flat)

    @classmethod
    def _bits_to_f32_cpu(cls, u16, out, accumulate):
        cpu_kernels.bf16_to_f32(u16, out, accumulate, cpu_kernels.chunks_for(u16.size))

    @classmethod
    def _bits_to_f32_cuda(cls, u16, out, accumulate):
        device.cuda_kernels().bf16_to_f32(u16, out, accumulate)
