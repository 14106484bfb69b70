"""Tables for the algorithms: scikit-learn's shipped data sets, generated ones, or the
scenario's image data set flattened -- never a download.

``iris``, ``wine``, ``breast_cancer`` and ``diabetes`` ship inside the scikit-learn
wheel (read from its CSV files); ``blobs``, ``classification``, ``regression`` and
``moons`` are generated from the run's seed (``synthetic_samples`` /
``synthetic_features`` / ``synthetic_classes``) in the manner of scikit-learn's
``make_*`` functions. They
are split train/test by a seeded permutation (25 % test) and standardised with the
*training* set's mean and standard deviation (for regression the target too), as a
``StandardScaler`` fitted on the training set would; the scikit-learn references in the
tests and ``bench/algorithms.py`` use these very arrays. Any other name (``digits``,
``mnist``, ...) is loaded by :func:`geomx.ml.datasets.load_dataset` and flattened to
one row per sample, unscaled (its values are already in [0, 1]).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

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


def _sklearn_data_dir() -> Path:
    """scikit-learn's shipped data folder, found without importing scikit-learn (about a
    second and a half per process; a real-runtime job starts one process per node)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the shipped tables need scikit-learn installed")
    return Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data"


def _shipped(name: str) -> tuple[np.ndarray, np.ndarray]:
    folder = _sklearn_data_dir()
    if name == "diabetes":
        x = np.loadtxt(folder / "diabetes_data_raw.csv.gz")
        return x, np.loadtxt(folder / "diabetes_target.csv.gz")
    file = {"iris": "iris.csv", "wine": "wine_data.csv", "breast_cancer": "breast_cancer.csv"}[name]
    table = np.loadtxt(folder / file, delimiter=",", skiprows=1)
    return table[:, :-1], table[:, -1].astype(np.int64)


def _generated(name: str, rng: np.random.Generator, n: int, d: int,
               k: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded generators in the manner of scikit-learn's ``make_*`` (not bit-identical)."""
    if name == "blobs":              # isotropic Gaussian clusters, centres in [-10, 10]^d
        centres = rng.uniform(-10.0, 10.0, size=(k, d))
        y = np.arange(n) % k
        return centres[y] + rng.normal(size=(n, d)), y
    if name == "classification":     # Guyon's design: clusters on hypercube vertices
        informative = max(2, d // 2)
        per_class = 1 if k > 2 else 2
        vertices = rng.choice([-1.0, 1.0], size=(k * per_class, informative))
        y = np.arange(n) % k
        cluster = y * per_class + rng.integers(per_class, size=n)
        mix = rng.uniform(-1.0, 1.0, size=(k * per_class, informative, informative))
        base = np.einsum("ni,nij->nj", rng.normal(size=(n, informative)), mix[cluster])
        xi = vertices[cluster] + base
        redundant = xi @ rng.normal(size=(informative, min(2, d - informative)))
        noise = rng.normal(size=(n, d - informative - redundant.shape[1]))
        x = np.hstack([xi, redundant, noise])
        return x[:, rng.permutation(d)], y
    if name == "regression":         # a sparse linear model plus Gaussian noise
        x = rng.normal(size=(n, d))
        w = np.zeros(d)
        w[:max(1, d // 2)] = 100.0 * rng.uniform(size=max(1, d // 2))
        return x, x @ w + rng.normal(scale=10.0, size=n)
    if name == "moons":              # two interleaving half circles
        y = np.arange(n) % 2
        t = rng.uniform(0.0, np.pi, size=n)
        x = np.where(y[:, None] == 0, np.c_[np.cos(t), np.sin(t)],
                     np.c_[1.0 - np.cos(t), 0.5 - np.sin(t)])
        return x + rng.normal(scale=0.25, size=(n, 2)), y
    raise ValueError(f"unknown table {name!r}")


#: (features, classes) of each table without loading it: ``None`` = from the options
SHAPES: dict[str, tuple[int | None, int | None]] = {
    "iris": (4, 3), "wine": (13, 3), "breast_cancer": (30, 2), "diabetes": (10, 0),
    "blobs": (None, None), "classification": (None, None), "regression": (None, 0),
    "moons": (2, 2)}


def table_shape(name: str, *, n_features: int = 32, n_classes: int = 10) -> tuple[int, int] | None:
    """(features, classes) of table ``name`` without loading it; None for other data sets."""
    if name not in SHAPES:
        return None
    f, c = SHAPES[name]
    return (n_features if f is None else f, n_classes if c is None else c)


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
    rng = np.random.default_rng([seed, 15])
    x, y = (_shipped(name) if name in SHIPPED
            else _generated(name, rng, n_samples, n_features, n_classes))
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
