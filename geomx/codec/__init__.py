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
from geomx.policy.codec import (
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
    set_decoder_loader,
)
from .identity import DenseCodec
from .registry import CODEC_NAMES, Policy, codec_from_config, create_codec
from . import registry as _registry

# A node decodes whatever payload reaches it, also of a codec it has not built yet (a
# reply in fp16 can overtake the command that sets fp16): decode() imports its module.
set_decoder_loader(_registry.DECODER_NAMES, _registry.load_decoder)

#: Classes whose modules import Numba: loaded on first access (PEP 562), so importing
#: the package (every node does) costs no Numba unless a compressing codec is used.
_LAZY = {"BF16Codec": "bf16", "BiSparseCodec": "bsc", "FP16Codec": "fp16", "MPQ": "mpq",
         "OneBitCodec": "onebit"}


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


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
