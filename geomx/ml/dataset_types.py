"""What every dataset loader returns, its errors, and where data is looked for.

Kept apart from ``datasets.py`` so the per-format loaders (``cifar.py``, ``tabular.py``)
and the dispatcher in ``datasets.py`` import it without importing each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["DATA_DIR_ENV", "Dataset", "DatasetFormatError", "DatasetNotFoundError", "default_data_dirs"]

# Environment variable naming a directory whose subdirectories (``mnist/``,
# ``fashion_mnist/``, ``cifar10/``) are searched when no ``path`` is given.
DATA_DIR_ENV = "GEOMX_DATA_DIR"


class DatasetNotFoundError(FileNotFoundError):
    """The data files are not where we looked. geomx never downloads data."""


class DatasetFormatError(ValueError):
    """A data file exists but is not what its name or extension promises."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """Train and test arrays plus what a model builder needs to know (compared by identity)."""

    x_train: np.ndarray  # float32, (N, *input_shape), values in [0, 1]
    y_train: np.ndarray  # int64, (N,)
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    name: str = ""

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, train={self.num_train}, test={self.num_test}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes})"
        )


def default_data_dirs(name: str) -> list[Path]:
    """Where a dataset is looked for without a path: ``$GEOMX_DATA_DIR/<name>``, then
    ``~/.geomx/data/<name>``."""
    dirs = []
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        dirs.append(Path(env) / name)
    dirs.append(Path.home() / ".geomx" / "data" / name)
    return dirs
