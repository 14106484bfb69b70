"""``fp16``: transmit in IEEE half precision, compute in float32.

GeoMX's FP16 (docs/geomx-behaviour.md §4.2) is a dtype choice: every hop carries fp16 and
the servers even sum in fp16. Here only the wire is 16-bit: tensors are converted on
encode and decoded back to float32 (or added into a float32 accumulator), so servers
aggregate in fp32.

The conversion is round-to-nearest-even and bit-exact against numpy's
``astype(np.float16)`` for every input, special values included (±0, ±inf, NaN payloads,
subnormals, overflow to inf, ties) - see ``bits.py`` for the algorithm and for why it
works on integer views. A float16 input travels as is (MPQ's "user inits fp16 arrays").
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from geomx.policy import codec as base, device
from . import cpu_kernels
from geomx.policy.codec import ArraySpec, Codec, CodecError, CodecState, Encoded


@functools.lru_cache(maxsize=None)
def numpy_nan_modes() -> tuple[bool, bool]:
    """(quiet on fp32->fp16, quiet on fp16->fp32) as numpy does it on this machine.

    numpy's portable C cast keeps signalling NaNs signalling; an F16C hardware cast
    quiets them. The kernels reproduce whichever this numpy build does.
    """
    with np.errstate(all="ignore"):
        snan32 = np.array([0x7F800001], dtype=np.uint32).view(np.float32)
        enc_quiet = int(snan32.astype(np.float16).view(np.uint16)[0]) & 0x0200 != 0
        snan16 = np.array([0x7C01], dtype=np.uint16).view(np.float16)
        dec_quiet = int(snan16.astype(np.float32).view(np.uint32)[0]) & 0x00400000 != 0
    return bool(enc_quiet), bool(dec_quiet)


class HalfWidthCodec(Codec):
    """Shared logic of the 16-bit elementwise codecs (fp16, bf16)."""

    elementwise = True
    #: dtype string of the travelling array.
    wire_dtype: str = "<u2"

    def encoded_sizes(self, num_elements: int, dtype: Any = "<f4") -> list[ArraySpec]:
        return [ArraySpec(self.wire_dtype, (int(num_elements),))]

    def pull_encoded_sizes(self, num_elements: int, dtype: Any = "<f4", *, sources: int = 1) -> list[ArraySpec]:
        return self.encoded_sizes(num_elements, dtype)

    def encode_pull(self, key: int, x: Any, *, sources: int = 1) -> Encoded:
        return self.encode(key, x)

    def encode(self, key: int, x: Any, state: CodecState | None = None) -> Encoded:
        flat, on_dev, dtype, shape = base.flat_input(x)
        n = int(flat.shape[0])
        if on_dev:
            data = self._encode_cuda(flat, dtype)
        else:
            data = self._encode_cpu(flat)
        return Encoded([data], base.make_meta(self.name, n, dtype, shape))

    # subclass hooks: flat input -> travelling array; u16 bits -> float32 (into out)
    def _encode_cpu(self, flat: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _encode_cuda(self, flat: Any, dtype: np.dtype) -> Any:
        raise NotImplementedError

    @classmethod
    def _bits_to_f32_cpu(cls, u16: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
        raise NotImplementedError

    @classmethod
    def _bits_to_f32_cuda(cls, u16: Any, out: Any, accumulate: bool) -> None:
        raise NotImplementedError

    @classmethod
    def _decode_cpu(cls, arrays, meta, n, dtype, out, accumulate):
        base.expect_arrays(arrays, cls.name, [(cls.wire_dtype, n)])
        u16 = np.ascontiguousarray(arrays[0]).view(np.uint16)
        if out is not None and out.dtype == np.float32:
            cls._bits_to_f32_cpu(u16, out, accumulate)
            return out
        if out is None and dtype == np.dtype(cls.wire_dtype):
            return arrays[0].copy()  # fp16 in, fp16 out: nothing to convert
        tmp = np.empty(n, dtype=np.float32)
        cls._bits_to_f32_cpu(u16, tmp, False)
        return base.finish_cpu(tmp, out, accumulate, dtype)

    @classmethod
    def _decode_cuda(cls, arrays, meta, n, dtype, out, accumulate):
        base.expect_arrays(arrays, cls.name, [(cls.wire_dtype, n)])
        ck = device.cuda_kernels()
        u16 = arrays[0].view(np.uint16)
        if out is None:
            if dtype == np.dtype(cls.wire_dtype):
                return ck.copy(arrays[0])
            out = ck.empty(n, np.float32)
            accumulate = False
        elif np.dtype(out.dtype) != np.float32:
            raise CodecError(f"{cls.name}: CUDA decode needs a float32 out, got {np.dtype(out.dtype)}")
        cls._bits_to_f32_cuda(u16, out, accumulate)
        return out


class FP16Codec(HalfWidthCodec):
    name = "fp16"
    params = ()
    wire_dtype = "<f2"

    def _encode_cpu(self, flat: np.ndarray) -> np.ndarray:
        if flat.dtype == np.float16:
            return flat.copy()
        if flat.dtype != np.float32:
            # float64: numpy rounds double -> half directly (no double rounding)
            with np.errstate(over="ignore", invalid="ignore"):
                return flat.astype(np.float16)
        quiet, _ = numpy_nan_modes()
        out = np.empty(flat.shape[0], dtype=np.uint16)
        cpu_kernels.f32_to_f16(flat, out, quiet, cpu_kernels.chunks_for(out.size))
        return out.view(np.float16)

    def _encode_cuda(self, flat: Any, dtype: np.dtype) -> Any:
        ck = device.cuda_kernels()
        if dtype == np.float16:
            return ck.copy(flat)
        if dtype != np.float32:
            raise CodecError(f"fp16: CUDA encode takes float32 or float16, got {dtype}")
        quiet, _ = numpy_nan_modes()
        return ck.f32_to_f16(flat, quiet).view(np.float16)

    @classmethod
    def _bits_to_f32_cpu(cls, u16, out, accumulate):
        _, quiet = numpy_nan_modes()
        cpu_kernels.f16_to_f32(u16, out, quiet, accumulate, cpu_kernels.chunks_for(u16.size))

    @classmethod
    def _bits_to_f32_cuda(cls, u16, out, accumulate):
        _, quiet = numpy_nan_modes()
        device.cuda_kernels().f16_to_f32(u16, out, quiet, accumulate)
