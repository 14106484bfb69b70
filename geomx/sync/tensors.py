"""Arithmetic on the values sync policies handle: numpy arrays or phantoms.

Servers hold either real arrays or *phantom* payloads (a shape and dtype, no memory) so
that the emulator can run ResNet-sized jobs (see ``geomx/node/values.py``). The policies
here (HFA's milestone arithmetic, ESync's deltas) must accept both and keep phantoms
phantom, so they use these helpers instead of numpy operators. Only ``geomx.wire`` is
imported: the sync layer sits below the node layer.
"""

from __future__ import annotations

import zlib
from typing import Union

import numpy as np

from geomx.wire import Payload

Value = Union[np.ndarray, Payload]


def phantom(v: Value) -> bool:
    return isinstance(v, Payload)


def copy_of(v: Value) -> Value:
    if isinstance(v, Payload):
        return Payload.phantom(v.shape, v.dtype)
    return np.array(v, copy=True)


def difference(a: Value, b: Value) -> Value:
    """``a - b`` as a new value (phantom if either is)."""
    if isinstance(a, Payload) or isinstance(b, Payload):
        return copy_of(a)
    return np.subtract(a, b.reshape(a.shape), dtype=a.dtype)


def total(a: Value, b: Value) -> Value:
    """``a + b`` as a new value (phantom if either is)."""
    if isinstance(a, Payload) or isinstance(b, Payload):
        return copy_of(a)
    return np.add(a, b.reshape(a.shape), dtype=a.dtype)


def scaled(v: Value, factor: float) -> Value:
    """``v * factor`` as a new value."""
    if isinstance(v, Payload):
        return copy_of(v)
    return v * v.dtype.type(factor)


def digest(v: Value) -> int | None:
    """A CRC-32 of the value's bytes, to show in events that two copies are identical
    (None for a phantom, which has no bytes)."""
    if isinstance(v, Payload):
        return None
    return zlib.crc32(np.ascontiguousarray(v).tobytes())
