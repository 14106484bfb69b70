"""Tables for the algorithms: scikit-learn's shipped data sets, generated ones, or the
scenario's image data set flattened -- never a download.

``iris``, ``wine``, ``breast_cancer`` and ``diabetes`` ship inside the scikit-learn
wheel; ``blobs``, ``classification``, ``regression`` and ``moons`` are generated from the
run's seed (``synthetic_samples`` / ``synthetic_features`` / ``synthetic_classes``). They
are split train/test by a seeded permutation (25 % test) and standardised with the
*training* set's mean and standard deviation (for regression the target too), as a
``StandardScaler`` fitted on the training set would; the scikit-learn references in the
tests and ``bench/algorithms.py`` use these very arrays. Any other name (``digits``,
``mnist``, ...) is loaded by :func:`geomx.ml.datasets.load_dataset` and flattened to
one row per sample, unscaled (its values are already in [0, 1]).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["Table", "TABLE_DATASETS", "GENERATED", "load_table"]

SHIPPED = ("iris", "wine", "breast_cancer", "diabetes")
GENERATED = ("blobs", "classification", "regression", "moons")
TABLE_DATASETS: tuple[str, ...] = SHIPPED + GENERATED
REGRESSION = ("diabetes", "regression")
TEST_FRACTION = 0.25


@dataclass(frozen=True, eq=False)
class Table:
    """Train and test rows (float64), labels (int64) or targets (float64)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    task: str              # "classification" | "regression"
    num_classes: int       # 0 for regression
    name: str = ""

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])


def _raw(name: str, seed: int, n_samples: int, n_features: int, n_classes: int):
    import sklearn.datasets as skd

    if name in SHIPPED:
        bunch = getattr(skd, f"load_{name}")()
        return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target)
    if name == "blobs":
        return skd.make_blobs(n_samples=n_samples, n_features=n_features, centers=n_classes,
                              random_state=seed)
    if name == "classification":
        return skd.make_classification(n_samples=n_samples, n_features=n_features,
                                       n_informative=max(2, n_features // 2),
                                       n_redundant=min(2, n_features // 4), n_classes=n_classes,
                                       n_clusters_per_class=1 if n_classes > 2 else 2,
                                       class_sep=1.0, random_state=seed)
    if name == "regression":
        return skd.make_regression(n_samples=n_samples, n_features=n_features,
                                   n_informative=max(1, n_features // 2), noise=10.0,
                                   random_state=seed)
    if name == "moons":
        return skd.make_moons(n_samples=n_samples, noise=0.25, random_state=seed)
    raise ValueError(f"unknown table {name!r}")


@functools.lru_cache(maxsize=8)
def load_table(name: str, *, seed: int = 0, n_samples: int = 4000, n_features: int = 32,
               n_classes: int = 10, path: str | None = None) -> Table:
    """The table ``name`` split and scaled as described above (cached per process)."""
    if name not in TABLE_DATASETS:
        from geomx.ml.datasets import load_dataset

        kw = ({"n_samples": n_samples, "n_features": n_features, "n_classes": n_classes}
              if name == "synthetic" else {})
        d = load_dataset(name, path=path, seed=seed, **kw)
        flat = lambda a: np.asarray(a, dtype=np.float64).reshape(a.shape[0], -1)  # noqa: E731
        return Table(flat(d.x_train), np.asarray(d.y_train, np.int64), flat(d.x_test),
                     np.asarray(d.y_test, np.int64), "classification", int(d.num_classes), name)
    x, y = _raw(name, seed, n_samples, n_features, n_classes)
    x = np.asarray(x, dtype=np.float64)
    order = np.random.default_rng(seed).permutation(x.shape[0])
    n_test = int(round(x.shape[0] * TEST_FRACTION))
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    std[std == 0] = 1.0
    x = (x - mean) / std
    if name in REGRESSION:
        y = np.asarray(y, dtype=np.float64)
        y = (y - y[train].mean()) / y[train].std()
        return Table(x[train], y[train], x[test], y[test], "regression", 0, name)
    y = np.asarray(y, dtype=np.int64)
    return Table(x[train], y[train], x[test], y[test], "classification",
                 int(y.max()) + 1, name)
