"""Key -> server placement, as GeoMX/ps-lite does it (docs/geomx-behaviour.md §1.2, §4.7).

A tensor of fewer than ``bigarray_bound`` elements goes whole to server
``(key * 9973) % S``; a larger one is cut into ``S`` contiguous parts, part ``i``
holding ``[round(N*i/S), round(N*(i+1)/S))``, each sent to server ``i``. With several
global servers this *is* MultiGPS. Unlike GeoMX we use exact integer rounding and never
depend on encoding order, so P3 slicing and MultiGPS compose.
"""

from __future__ import annotations

from dataclasses import dataclass

#: GeoMX's multiplier for small-tensor placement.
PLACEMENT_PRIME = 9973


@dataclass(frozen=True, slots=True)
class Part:
    """One contiguous slice ``[lo, hi)`` of a flattened tensor and the server index it goes to."""

    index: int
    server: int
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


def _round_half_even_div(a: int, b: int) -> int:
    """round(a / b) with banker's rounding, like C's rint on the exact quotient."""
    q, r = divmod(a, b)
    twice = 2 * r
    if twice > b or (twice == b and q % 2 == 1):
        q += 1
    return q


def place(key: int, num_elements: int, num_servers: int, bigarray_bound: int,
          *, split: bool = True) -> list[Part]:
    """Where the parts of tensor ``key`` live. ``split=False`` forces whole-tensor placement
    (GeoMX never splits Bi-Sparse tensors)."""
    if num_servers < 1:
        raise ValueError(f"num_servers must be >= 1, got {num_servers}")
    if key < 0:
        raise ValueError(f"key must be >= 0, got {key}")
    if not split or num_elements < bigarray_bound or num_servers == 1:
        return [Part(0, (key * PLACEMENT_PRIME) % num_servers, 0, num_elements)]
    bounds = [_round_half_even_div(num_elements * i, num_servers) for i in range(num_servers + 1)]
    return [Part(i, i, bounds[i], bounds[i + 1]) for i in range(num_servers)]
