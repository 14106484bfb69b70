"""Datasets for the training examples: shipped, user-provided, or generated.

geomx never downloads data. GeoMX's demo lets gluon fetch MNIST on first use, and the
first run may fail and need a restart (docs/geomx-behaviour.md §2.2); CI machines have no
network at all. So:

* ``digits``: scikit-learn's 8x8 digits, shipped inside the scikit-learn wheel;
* ``mnist`` / ``fashion_mnist``: files the user already has (IDX, optionally gzipped,
  or one ``.npz``); a missing file raises :class:`DatasetNotFoundError` naming where we
  looked;
* ``synthetic``: a seeded Gaussian mixture, learnable and identical on every machine;
* ``cifar10``: the CIFAR-10 python batches the user has, read with a restricted
  unpickler (``cifar.py``);
* ``libsvm`` / ``csv``: a user's tabular file (``tabular.py``), features scaled to [0, 1].

All loaders return float32 inputs scaled to [0, 1] (images NCHW, as gluon's
``ToTensor``) and int64 labels.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from geomx.ml.cifar import load_cifar10
from geomx.ml.dataset_types import (
    DATA_DIR_ENV,
    Dataset,
    DatasetFormatError,
    DatasetNotFoundError,
    default_data_dirs,
)
from geomx.ml.tabular import load_csv, load_libsvm

__all__ = [
    "Dataset",
    "DatasetNotFoundError",
    "DatasetFormatError",
    "DATASET_NAMES",
    "FILE_DATASETS",
    "default_data_dirs",
    "load_dataset",
    "load_digits",
    "load_idx_mnist",
    "make_synthetic",
    "read_idx",
    "write_idx",
    "iter_batches",
]

DATASET_NAMES: tuple[str, ...] = ("digits", "mnist", "fashion_mnist", "synthetic", "cifar10", "libsvm", "csv")
#: Datasets read from one file the user names (``path`` is required).
FILE_DATASETS: tuple[str, ...] = ("libsvm", "csv")

# -- digits -------------------------------------------------------------------------------

DIGITS_TEST_FRACTION = 0.2


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 digits as (images 0..16, labels).

    Read straight from the CSV that scikit-learn ships, which avoids importing
    ``sklearn.datasets`` (about a second); falls back to the public loader if the file
    moves in a future release.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.submodule_search_locations:
        csv = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            table = np.loadtxt(csv, delimiter=",", dtype=np.float64)
            return table[:, :-1], table[:, -1].astype(np.int64)
    try:
        from sklearn.datasets import load_digits as _sk_load_digits
    except ImportError as exc:  # pragma: no cover - scikit-learn is a dependency
        raise DatasetNotFoundError("the 'digits' dataset needs scikit-learn installed") from exc
    bunch = _sk_load_digits()
    return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)


def load_digits(*, seed: int = 0, test_fraction: float = DIGITS_TEST_FRACTION) -> Dataset:
    """scikit-learn's 8x8 digits, split train/test by a seeded permutation (default 80/20)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    pixels, labels = _digits_arrays()
    x = (pixels / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    order = np.random.default_rng(seed).permutation(labels.shape[0])
    n_test = int(round(labels.shape[0] * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset(
        x_train=np.ascontiguousarray(x[train]),
        y_train=labels[train],
        x_test=np.ascontiguousarray(x[test]),
        y_test=labels[test],
        num_classes=10,
        input_shape=(1, 8, 8),
        name="digits",
    )


# -- IDX (MNIST, Fashion-MNIST) ----------------------------------------------------------

# IDX type byte -> numpy big-endian dtype (LeCun's format description).
_IDX_DTYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_CODES: dict[str, int] = {np.dtype(v).str.lstrip("<>|="): k for k, v in _IDX_DTYPES.items()}

_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def _open_maybe_gzip(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DatasetFormatError(f"{path}: corrupt gzip data ({exc})") from None
    return raw


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a native-endian array."""
    p = Path(path)
    data = _open_maybe_gzip(p)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DatasetFormatError(f"{p}: not an IDX file (bad magic number)")
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_DTYPES:
        raise DatasetFormatError(f"{p}: unknown IDX element type 0x{type_code:02x}")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DatasetFormatError(f"{p}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", data[4:header_len])
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) - header_len != expected:
        raise DatasetFormatError(
            f"{p}: IDX header promises {dims} ({expected} bytes of data) but the file holds "
            f"{len(data) - header_len}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | os.PathLike[str], array: np.ndarray, *, compress: bool | None = None) -> Path:
    """Write ``array`` as an IDX file; gzip if ``compress`` (default: name ends in .gz).

    Used by tests and by people converting their own data; the inverse of :func:`read_idx`.
    """
    p = Path(path)
    arr = np.asarray(array)
    code = _IDX_CODES.get(arr.dtype.str.lstrip("<>|="))
    if code is None:
        raise ValueError(f"IDX cannot hold dtype {arr.dtype}; allowed: uint8, int8, int16, int32, float32, float64")
    big = arr.astype(np.dtype(_IDX_DTYPES[code]), copy=False)
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    payload = header + np.ascontiguousarray(big).tobytes()
    if compress is None:
        compress = p.suffix == ".gz"
    p.write_bytes(gzip.compress(payload, compresslevel=1) if compress else payload)
    return p


def _find_idx_file(directory: Path, stem: str) -> Path | None:
    # Both "train-images-idx3-ubyte" and the "train-images.idx3-ubyte" spelling circulate.
    alt = stem.replace("-idx", ".idx")
    for name in (stem, stem + ".gz", alt, alt + ".gz"):
        candidate = directory / name
        if candidate.is_file():
            return candidate
    return None


def _images_to_float(images: np.ndarray, source: str) -> np.ndarray:
    if images.ndim == 3:
        images = images[:, None, :, :]
    if images.ndim != 4:
        raise DatasetFormatError(f"{source}: images must be (N, H, W) or (N, C, H, W), got {images.shape}")
    if images.dtype == np.uint8:
        return images.astype(np.float32) / np.float32(255.0)
    out = images.astype(np.float32)
    if out.size and (out.min() < 0.0 or out.max() > 1.0):
        out /= np.float32(255.0)  # a float array of raw 0..255 pixel values
    return out


def _labels(labels: np.ndarray, n: int, source: str) -> np.ndarray:
    labels = np.asarray(labels).reshape(-1)
    if labels.shape[0] != n:
        raise DatasetFormatError(f"{source}: {n} images but {labels.shape[0]} labels")
    if labels.size and labels.min() < 0:
        raise DatasetFormatError(f"{source}: negative labels")
    return labels.astype(np.int64)


def _from_arrays(arrays: dict[str, np.ndarray], name: str, source: str) -> Dataset:
    x_train = _images_to_float(arrays["x_train"], source)
    x_test = _images_to_float(arrays["x_test"], source)
    y_train = _labels(arrays["y_train"], x_train.shape[0], source)
    y_test = _labels(arrays["y_test"], x_test.shape[0], source)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DatasetFormatError(f"{source}: train images {x_train.shape[1:]} != test images {x_test.shape[1:]}")
    top = max(int(y_train.max(initial=0)), int(y_test.max(initial=0)))
    return Dataset(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=max(10, top + 1),
        input_shape=tuple(int(d) for d in x_train.shape[1:]),
        name=name,
    )


def _load_npz(path: Path, name: str) -> Dataset:
    with np.load(path, allow_pickle=False) as npz:
        missing = [k for k in _IDX_FILES if k not in npz.files]
        if missing:
            raise DatasetFormatError(f"{path}: .npz lacks keys {missing}; needs x_train, y_train, x_test, y_test")
        arrays = {k: npz[k] for k in _IDX_FILES}
    return _from_arrays(arrays, name, str(path))


def load_idx_mnist(name: str = "mnist", path: str | os.PathLike[str] | None = None) -> Dataset:
    """MNIST-format data from ``path``: a directory of IDX files, a directory holding
    ``<name>.npz``, or an ``.npz`` file with keys x_train, y_train, x_test, y_test.

    Without ``path`` we look in ``$GEOMX_DATA_DIR/<name>`` and ``~/.geomx/data/<name>``.
    """
    candidates = [Path(path).expanduser()] if path is not None else default_data_dirs(name)
    looked: list[str] = []
    for base in candidates:
        if base.is_file():
            if base.suffix == ".npz":
                return _load_npz(base, name)
            raise DatasetFormatError(f"{base}: expected a directory of IDX files or an .npz file")
        if base.is_dir():
            found = {key: _find_idx_file(base, stem) for key, stem in _IDX_FILES.items()}
            if all(found.values()):
                arrays = {key: read_idx(p) for key, p in found.items() if p is not None}
                return _from_arrays(arrays, name, str(base))
            npz = base / f"{name}.npz"
            if npz.is_file():
                return _load_npz(npz, name)
            missing = [stem for key, stem in _IDX_FILES.items() if found[key] is None]
            looked.append(f"{base} (missing {', '.join(missing)}[.gz] and {npz.name})")
        else:
            looked.append(f"{base} (does not exist)")
    raise DatasetNotFoundError(
        f"{name} data not found; looked in: {'; '.join(looked)}. geomx never downloads data: "
        f"put the four IDX files (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
        f"t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]) or an .npz with keys "
        f"x_train, y_train, x_test, y_test there, pass path=..., or set ${DATA_DIR_ENV}."
    )


# -- synthetic ----------------------------------------------------------------------------


def make_synthetic(
    *,
    n_samples: int = 2000,
    n_features: int = 20,
    n_classes: int = 4,
    separability: float = 2.0,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Dataset:
    """A seeded Gaussian mixture: one unit-variance blob per class.

    Class centres are drawn from ``N(0, I)`` and scaled by ``separability``; larger
    values make the classes easier to tell apart. Features are then min-max scaled to
    [0, 1] with the training set's range (clipped for the test set), matching the other
    loaders. Classes are balanced (sample i has class ``i % n_classes`` before the shuffle).
    """
    if n_classes < 2 or n_features < 1 or n_samples < 2 * n_classes:
        raise ValueError(
            f"need n_classes >= 2, n_features >= 1, n_samples >= 2*n_classes; got "
            f"n_samples={n_samples}, n_features={n_features}, n_classes={n_classes}"
        )
    if separability < 0 or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"need separability >= 0 and 0 < test_fraction < 1; got {separability}, {test_fraction}")
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_classes, n_features)) * separability
    labels = rng.permutation(np.arange(n_samples) % n_classes).astype(np.int64)
    x = centres[labels] + rng.normal(size=(n_samples, n_features))
    n_test = max(1, int(round(n_samples * test_fraction)))
    x_train, x_test = x[n_test:], x[:n_test]
    low, high = x_train.min(axis=0), x_train.max(axis=0)
    span = np.where(high > low, high - low, 1.0)
    x_train = ((x_train - low) / span).astype(np.float32)
    x_test = np.clip((x_test - low) / span, 0.0, 1.0).astype(np.float32)
    return Dataset(
        x_train=x_train,
        y_train=labels[n_test:],
        x_test=x_test,
        y_test=labels[:n_test],
        num_classes=n_classes,
        input_shape=(n_features,),
        name="synthetic",
    )


# -- entry point --------------------------------------------------------------------------


def load_dataset(name: str, *, path: str | os.PathLike[str] | None = None, seed: int = 0, **kw: Any) -> Dataset:
    """Load a dataset by name: ``digits``, ``mnist``, ``fashion_mnist``, ``synthetic``,
    ``cifar10``, ``libsvm`` or ``csv``.

    ``seed`` fixes the digits / tabular split and the synthetic draw; ``path`` points at
    MNIST-style or CIFAR files (optional) or at the LIBSVM / CSV file (required); ``kw``
    goes to the loader (``test_fraction`` for digits, libsvm and csv; ``n_samples``,
    ``n_features``, ``n_classes``, ``separability``, ``test_fraction`` for synthetic;
    ``n_features`` for libsvm; ``label_column``, ``delimiter`` for csv).
    """
    if name == "cifar10":
        if kw:
            raise ValueError(f"dataset 'cifar10' takes no options besides path; got {sorted(kw)}")
        return load_cifar10(path)
    if name in FILE_DATASETS:
        if path is None or str(path) == "":
            raise ValueError(f"dataset {name!r} needs a path to the {name} file (training.data_path)")
        loader = load_libsvm if name == "libsvm" else load_csv
        try:
            return loader(path, seed=seed, **kw)
        except TypeError as exc:
            raise ValueError(f"dataset {name!r}: {exc}") from None
    if name in ("mnist", "fashion_mnist"):
        if kw:
            raise ValueError(f"dataset {name!r} takes no options besides path; got {sorted(kw)}")
        return load_idx_mnist(name, path)
    loaders = {"digits": load_digits, "synthetic": make_synthetic}
    if name not in loaders:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}")
    if path is not None:
        raise ValueError(f"dataset {name!r} is built in; it takes no path (got {path!r})")
    try:
        return loaders[name](seed=seed, **kw)
    except TypeError as exc:
        raise ValueError(f"dataset {name!r}: {exc}") from None


def iter_batches(indices: np.ndarray, batch_size: int, *, drop_last: bool = False) -> Iterator[np.ndarray]:
    """Consecutive slices of ``indices`` of ``batch_size``, in order, no shuffle.

    The demo's DataLoader keeps a short last batch (``last_batch='keep'``: 15000
    samples give 469 batches, the last of 24; docs/geomx-behaviour.md §2.2); ``drop_last``
    drops it instead.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size}")
    n = len(indices)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        yield indices[start : start + batch_size]
