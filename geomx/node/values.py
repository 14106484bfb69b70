"""Tensor values held by servers: a numpy array, or a phantom (shape and dtype only).

Phantom values let the emulator run ResNet-50-sized jobs without allocating them: every
operation here accepts both and keeps phantoms phantom, so server code has one path.
The value type and the arithmetic the sync policies need live one layer down, in
``geomx.sync.tensors``; this module adds what servers do with wire payloads and slices.
"""

from __future__ import annotations

import numpy as np

from geomx.sync.tensors import Value
from geomx.sync.tensors import phantom as is_phantom
from geomx.wire import Payload

__all__ = ["Value", "is_phantom", "from_payload", "add_into", "flat_slice", "write_slice",
           "zeros_like_spec"]


def from_payload(p: Payload, *, copy: bool = True) -> Value:
    """A server-owned value from a received payload (phantoms stay phantoms)."""
    if p.data is None:
        return Payload.phantom(p.shape, p.dtype)
    return np.array(p.data, copy=True) if copy else p.data


def add_into(acc: Value, v: Value) -> Value:
    """``acc += v`` for arrays; phantoms absorb anything. Returns the accumulator."""
    if isinstance(acc, Payload) or isinstance(v, Payload):
        return acc
    np.add(acc, v.reshape(acc.shape), out=acc, casting="unsafe")
    return acc


def flat_slice(v: Value, lo: int, hi: int) -> Value:
    """Elements ``[lo, hi)`` of the flattened value."""
    if isinstance(v, Payload):
        return Payload.phantom((hi - lo,), v.dtype)
    flat = v.reshape(-1)
    return flat[lo:hi]


def write_slice(dst: Value, lo: int, hi: int, src: Value) -> None:
    if isinstance(dst, Payload) or isinstance(src, Payload):
        return
    dst.reshape(-1)[lo:hi] = src.reshape(-1)


def zeros_like_spec(shape: tuple[int, ...], dtype: str, phantom: bool) -> Value:
    if phantom:
        return Payload.phantom(shape, dtype)
    return np.zeros(shape, dtype=dtype)

