"""Partitions cover every sample exactly once; by_class and dirichlet skew the labels."""

from __future__ import annotations

import numpy as np
import pytest

from geomx.ml import PARTITION_SCHEMES, class_histogram, partition

LABELS = np.random.default_rng(0).integers(0, 10, size=1000)


def _kwargs(scheme: str) -> dict:
    return {"alpha": 0.5} if scheme == "dirichlet" else {}


@pytest.mark.parametrize("scheme", PARTITION_SCHEMES)
@pytest.mark.parametrize("num_parts", [1, 4, 7])
def test_parts_are_disjoint_and_cover_every_sample(scheme: str, num_parts: int) -> None:
    parts = partition(LABELS, num_parts, scheme, seed=1, **_kwargs(scheme))
    assert len(parts) == num_parts
    assert all(p.dtype == np.int64 and p.size > 0 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(LABELS.size))


@pytest.mark.parametrize("scheme", ["iid", "contiguous", "by_class"])
def test_equal_split_sizes_differ_by_at_most_one(scheme: str) -> None:
    sizes = [p.size for p in partition(LABELS, 7, scheme, seed=0)]
    assert max(sizes) - min(sizes) <= 1


def test_iid_is_seeded_and_mixes_classes() -> None:
    a, b = partition(LABELS, 4, "iid", seed=5), partition(LABELS, 4, "iid", seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], partition(LABELS, 4, "iid", seed=6)[0])
    assert (class_histogram(LABELS, a, 10) > 0).all()


def test_contiguous_is_geomx_default_in_order_slices() -> None:
    parts = partition(np.zeros(60000, np.int64), 4, "contiguous")
    np.testing.assert_array_equal(parts[1], np.arange(15000, 30000))


def test_by_class_sorts_by_label_then_slices_like_geomx_split_by_class() -> None:
    labels = np.repeat(np.arange(10), 100)[np.random.default_rng(1).permutation(1000)]
    parts = partition(labels, 4, "by_class")
    hist = class_histogram(labels, parts, 10)
    assert (hist > 0).sum(axis=1).tolist() == [3, 3, 3, 3]  # 250 samples = 2.5 classes each
    for p in parts:  # iteration order: all of one class before the next
        assert (np.diff(labels[p]) >= 0).all()
        # stable: within a class, original order
        for c in np.unique(labels[p]):
            members = p[labels[p] == c]
            assert (np.diff(members) > 0).all()


def test_dirichlet_small_alpha_skews_classes_large_alpha_does_not() -> None:
    def mean_top_class_share(alpha: float) -> float:
        hist = class_histogram(LABELS, partition(LABELS, 10, "dirichlet", seed=2, alpha=alpha), 10)
        return float((hist.max(axis=1) / hist.sum(axis=1)).mean())

    assert mean_top_class_share(0.1) > 0.5
    assert mean_top_class_share(1000.0) < 0.2


def test_dirichlet_never_leaves_a_part_empty() -> None:
    labels = np.arange(30) % 3
    parts = partition(labels, 25, "dirichlet", seed=0, alpha=0.01)
    assert min(p.size for p in parts) >= 1
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(30))


def test_bad_arguments_name_the_problem() -> None:
    with pytest.raises(ValueError, match="allowed: iid, contiguous, by_class, dirichlet"):
        partition(LABELS, 2, "shards")
    with pytest.raises(ValueError, match="alpha"):
        partition(LABELS, 2, "dirichlet")
    with pytest.raises(ValueError, match="alpha is only used"):
        partition(LABELS, 2, "iid", alpha=0.5)
    with pytest.raises(ValueError, match="non-empty"):
        partition(LABELS[:3], 4, "iid")
    with pytest.raises(ValueError, match="num_parts"):
        partition(LABELS, 0, "iid")
