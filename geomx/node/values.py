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
           "zeros_like_spec", "freeze", "thaw"]


def from_payload(p: Payload, *, copy: bool = True, take: bool = False) -> Value:
    """A server-owned value from a received payload (phantoms stay phantoms).

    ``take``: a payload the transport handed over (:attr:`Payload.owned`: a view of a
    fresh receive buffer nobody else holds) is returned as it is -- no copy of a large
    value on its way into a store -- and stops being owned, so a second taker of the
    same message gets a copy. Anything else (an emulated message shares the sender's
    array) is copied."""
    if p.data is None:
        return Payload.phantom(p.shape, p.dtype)
    if take and p.owned and p.data.flags.writeable:
        p.owned = False
        return p.data
    return np.array(p.data, copy=True) if copy else p.data


def freeze(v: Value) -> Value:
    """Mark an array read-only: it is being sent (a queued frame or the resend window of
    :mod:`geomx.runtime.tcp_resume` holds views of it), so it may be sent without a
    snapshot copy (``link_codec`` sends read-only arrays as they are), and an in-place
    update must :func:`thaw` it first (copy-on-write). Phantoms pass through."""
    if isinstance(v, np.ndarray):
        v.flags.writeable = False
    return v


def thaw(v: Value) -> Value:
    """A writable value with the contents of ``v``: ``v`` itself unless it is frozen,
    then a copy (the frozen one may still be on its way out)."""
    if isinstance(v, np.ndarray) and not v.flags.writeable:
        return v.copy()
    return v


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

