"""Tensor values held by servers: a numpy array, or a phantom (shape and dtype only).

Phantom values let the emulator run ResNet-50-sized jobs without allocating them: every
operation here accepts both and keeps phantoms phantom, so server code has one path.
"""

from __future__ import annotations

from typing import Union

import numpy as np

from geomx.wire import Payload

Value = Union[np.ndarray, Payload]


def is_phantom(v: Value) -> bool:
    return isinstance(v, Payload)


def to_payload(v: Value) -> Payload:
    if isinstance(v, Payload):
        return v
    return Payload.of(v)


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


def copy_value(v: Value) -> Value:
    if isinstance(v, Payload):
        return Payload.phantom(v.shape, v.dtype)
    return np.array(v, copy=True)


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


def scale(v: Value, factor: float) -> Value:
    if isinstance(v, Payload):
        return v
    v *= v.dtype.type(factor)
    return v
