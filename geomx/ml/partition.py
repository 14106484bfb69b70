"""Splitting a training set across workers.

GeoMX's demo cuts the training set into ``num_all_workers`` contiguous slices, optionally
after grouping the samples by label, which makes the split non-IID
(``--split-by-class``, docs/geomx-behaviour.md §2.2). We offer that split (``by_class``), the
plain in-order one (``contiguous``), a shuffled IID one (``iid``) and the Dirichlet
label-skew split common in federated-learning studies (``dirichlet``; Hsu et al. 2019,
"Measuring the Effects of Non-Identical Data Distribution").

Every scheme returns one int64 index array per part; the parts are disjoint and cover
every sample. The order *inside* a part is the order a worker should iterate in, since
the demo iterates its slice in order, without shuffling: label-sorted for ``by_class``
(so a worker sees all its 0s, then its 1s), ascending for ``contiguous``, shuffled for
``iid`` and ``dirichlet``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PARTITION_SCHEMES", "partition", "class_histogram"]

PARTITION_SCHEMES: tuple[str, ...] = ("iid", "contiguous", "by_class", "dirichlet")

# Redraws of the Dirichlet proportions before falling back to moving samples into
# empty parts; with alpha >= 0.1 and a few hundred samples per part a redraw is rare.
_DIRICHLET_MAX_DRAWS = 100


def partition(
    labels: np.ndarray,
    num_parts: int,
    scheme: str = "iid",
    *,
    seed: int = 0,
    alpha: float | None = None,
) -> list[np.ndarray]:
    """Split the sample indices ``0..len(labels)-1`` into ``num_parts`` parts.

    * ``iid``: a seeded shuffle, then near-equal slices (sizes differ by at most one).
    * ``contiguous``: near-equal slices in the original order (GeoMX's default split).
    * ``by_class``: stable sort by label, then near-equal contiguous slices (GeoMX's
      ``--split-by-class``). ``seed`` is unused.
    * ``dirichlet``: for every class, proportions drawn from ``Dirichlet(alpha)`` decide
      how its samples are dealt to the parts; small ``alpha`` (0.1) gives each part few
      classes, large ``alpha`` (100) is close to IID. Every part gets at least one sample.
    """
    y = np.asarray(labels).reshape(-1)
    n = y.shape[0]
    if int(num_parts) != num_parts or num_parts < 1:
        raise ValueError(f"num_parts must be an int >= 1, got {num_parts!r}")
    if num_parts > n:
        raise ValueError(f"cannot split {n} samples into {num_parts} non-empty parts")
    if scheme != "dirichlet" and alpha is not None:
        raise ValueError(f"alpha is only used by scheme 'dirichlet', not {scheme!r}")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return _as_parts(np.array_split(rng.permutation(n), num_parts))
    if scheme == "contiguous":
        return _as_parts(np.array_split(np.arange(n), num_parts))
    if scheme == "by_class":
        return _as_parts(np.array_split(np.argsort(y, kind="stable"), num_parts))
    if scheme == "dirichlet":
        if alpha is None or not alpha > 0:
            raise ValueError(f"scheme 'dirichlet' needs alpha > 0 (e.g. 0.1 for strong skew), got {alpha!r}")
        return _dirichlet(y, int(num_parts), float(alpha), rng)
    raise ValueError(f"unknown partition scheme {scheme!r}; allowed: {', '.join(PARTITION_SCHEMES)}")


def _as_parts(chunks: list[np.ndarray]) -> list[np.ndarray]:
    return [np.ascontiguousarray(c, dtype=np.int64) for c in chunks]


def _dirichlet(y: np.ndarray, num_parts: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(y)
    by_class = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    for _ in range(_DIRICHLET_MAX_DRAWS):
        buckets: list[list[np.ndarray]] = [[] for _ in range(num_parts)]
        for members in by_class:
            proportions = rng.dirichlet(np.full(num_parts, alpha))
            cuts = (np.cumsum(proportions)[:-1] * members.shape[0]).astype(np.int64)
            for part, chunk in enumerate(np.split(members, cuts)):
                buckets[part].append(chunk)
        parts = [np.concatenate(b) for b in buckets]
        if min(p.shape[0] for p in parts) > 0:
            break
    else:
        # Very small alpha with few samples: move single samples from the largest parts.
        for i in range(num_parts):
            if parts[i].shape[0] == 0:
                donor = max(range(num_parts), key=lambda j: parts[j].shape[0])
                parts[i], parts[donor] = parts[donor][-1:], parts[donor][:-1]
    return _as_parts([rng.permutation(p) for p in parts])


def class_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int | None = None) -> np.ndarray:
    """``(num_parts, num_classes)`` sample counts: how skewed a split is."""
    y = np.asarray(labels).reshape(-1)
    k = int(num_classes if num_classes is not None else y.max(initial=-1) + 1)
    return np.stack([np.bincount(y[p], minlength=k) for p in parts]) if parts else np.zeros((0, k), np.int64)
