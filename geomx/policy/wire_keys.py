"""The keys a sliced tensor travels as: one wire key per slice, a pure function of the
key and the slice's index.

A transfer scheduler that cuts a key into slices (``SchedWorkerSide.slices``) gives each
slice a key of its own, so that everything below the kvstore -- servers, placement, codec
and optimizer state, the sync policies -- handles slices as keys. Those wire keys must
never be another key's, nor another key's slice's: :func:`slice_key` keeps them apart for
every int key below :data:`SLICE_KEY_STRIDE` and every string key, the same on every node,
and :func:`split_slice_key` reads a wire key back. P3 (geomx/sched/p3.py) numbers its
slices with it; a scheduler of your own should too (docs/extending.md).

Placement: ``slice_key(k, i) = k + i * SLICE_KEY_STRIDE`` with ``SLICE_KEY_STRIDE = 1
(mod S)`` for every server count ``S`` dividing 720720 (all ``S <= 16``, and many more),
so GeoMX's placement rule ``(key * 9973) mod S`` sends consecutive slices of a key to
consecutive servers, round robin; slice 0 is the key itself, placed as without slicing.
"""

from __future__ import annotations

__all__ = ["WireKeyError", "slice_key", "split_slice_key", "SLICE_KEY_STRIDE",
           "MAX_SLICES_PER_KEY", "STRING_KEY_BASE"]


class WireKeyError(ValueError):
    """A key or slice index that has no wire key (the message says which and why)."""


#: lcm(1..16): the stride is 1 modulo every server count that divides it.
_LCM_1_TO_16 = 720_720
#: Int keys must stay below this; ``slice_key(k, i) = k + i * SLICE_KEY_STRIDE``.
SLICE_KEY_STRIDE = _LCM_1_TO_16 * 1000 + 1
#: String keys: ``STRING_KEY_BASE + crc32(name)`` (geomx/node/kv_state.py), a 2**32 range.
STRING_KEY_BASE = 1 << 40
_STRING_KEY_SPAN = 1 << 32
#: The slices of int keys stay below 2**62; those of string keys lie above, from this
#: base, which is ``STRING_KEY_BASE + 1`` modulo 720720 so that slice 1 of a string key
#: goes to the server after slice 0's, like every later slice.
_STRING_SLICES_BASE = (1 << 62) + (STRING_KEY_BASE + 1 - (1 << 62)) % _LCM_1_TO_16
#: Largest slice index that keeps an int key's slice key below the string keys' slices.
MAX_SLICES_PER_KEY = ((1 << 62) - 1) // SLICE_KEY_STRIDE
#: Stride between the slices of a string key: more than the span of string keys (so no
#: two string keys' slices meet) and 1 modulo 720720, like :data:`SLICE_KEY_STRIDE`.
STRING_SLICE_STRIDE = -(-_STRING_KEY_SPAN // _LCM_1_TO_16) * _LCM_1_TO_16 + 1
#: Largest slice index of a string key inside the wire's signed 64-bit key field.
MAX_SLICES_PER_STRING_KEY = ((2**63 - 1) - _STRING_SLICES_BASE - _STRING_KEY_SPAN) \
    // STRING_SLICE_STRIDE


def slice_key(key: int, index: int) -> int:
    """The kvstore key that slice ``index`` of ``key`` travels as.

    Slice 0 is the key itself. The further slices of an int key are ``key + index *
    SLICE_KEY_STRIDE``; those of a string key (a parameter's name) lie above
    ``2**62``, ``STRING_SLICE_STRIDE`` apart, so the two kinds never share a number."""
    if STRING_KEY_BASE <= key < STRING_KEY_BASE + _STRING_KEY_SPAN:
        if not 0 <= index <= MAX_SLICES_PER_STRING_KEY:
            raise WireKeyError(f"slice index {index} of key {key} out of range; allowed: "
                               f"0..{MAX_SLICES_PER_STRING_KEY} (cut the key into fewer, larger "
                               "slices)")
        if index == 0:
            return key
        return (_STRING_SLICES_BASE + key - STRING_KEY_BASE
                + (index - 1) * STRING_SLICE_STRIDE)
    if not 0 <= key < SLICE_KEY_STRIDE:
        raise WireKeyError(f"key {key} out of range for slicing; allowed: "
                           f"0..{SLICE_KEY_STRIDE - 1}, or a string key")
    if not 0 <= index <= MAX_SLICES_PER_KEY:
        raise WireKeyError(f"slice index {index} of key {key} out of range; allowed: "
                           f"0..{MAX_SLICES_PER_KEY} (cut the key into fewer, larger slices)")
    return key + index * SLICE_KEY_STRIDE


def split_slice_key(skey: int) -> tuple[int, int]:
    """``(key, slice index)`` of a slice key (inverse of :func:`slice_key`)."""
    if skey >= _STRING_SLICES_BASE:
        index, offset = divmod(skey - _STRING_SLICES_BASE, STRING_SLICE_STRIDE)
        return STRING_KEY_BASE + offset, index + 1
    if STRING_KEY_BASE <= skey < STRING_KEY_BASE + _STRING_KEY_SPAN:
        return skey, 0
    index, key = divmod(skey, SLICE_KEY_STRIDE)
    return key, index
