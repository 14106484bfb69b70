"""Gradient codecs: what bytes leave a node (GeoMX's Bi-Sparse, FP16, MPQ, and more).

Public API::

    codec = create_codec("bsc", threshold=0.01)          # or codec_from_config({...})
    codec = codec.codec_for(n, "wan")                      # the codec for this size/hop
    state = codec.new_state(n)                             # per key, owned by the caller
    enc = codec.encode(key, grad, state)                   # Encoded(arrays, meta)
    enc.nbytes                                             # bytes on the wire
    decode(enc, out=acc, accumulate=True)                  # server-side aggregation
    codec.encoded_sizes(n, "<f4")                          # phantom payload shapes

Names: ``none``, ``fp16``, ``bf16``, ``bsc``, ``mpq`` (a policy), ``onebit``.
Kernels: Numba on the CPU, ``numba.cuda`` for CUDA arrays (chosen per array; see
``device.py``). Nothing is compiled at import time.
"""
from .base import (
    DEFAULT_SIZE_LOWER_BOUND,
    SIZE_BOUND_ENV,
    TIERS,
    ArraySpec,
    Codec,
    CodecError,
    CodecState,
    Encoded,
    Tier,
    decode,
)
from .bf16 import BF16Codec
from .bsc import BiSparseCodec
from .fp16 import FP16Codec
from .identity import DenseCodec
from .mpq import MPQ
from .onebit import OneBitCodec
from .registry import CODEC_NAMES, Policy, codec_from_config, create_codec

__all__ = [
    "ArraySpec",
    "BF16Codec",
    "BiSparseCodec",
    "CODEC_NAMES",
    "Codec",
    "CodecError",
    "CodecState",
    "DEFAULT_SIZE_LOWER_BOUND",
    "DenseCodec",
    "Encoded",
    "FP16Codec",
    "MPQ",
    "OneBitCodec",
    "Policy",
    "SIZE_BOUND_ENV",
    "TIERS",
    "Tier",
    "codec_from_config",
    "create_codec",
    "decode",
]
