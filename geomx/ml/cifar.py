"""CIFAR-10 in its "python version" (Krizhevsky, https://www.cs.toronto.edu/~kriz/cifar.html),
read safely.

The distribution is ``cifar-10-python.tar.gz``, holding ``cifar-10-batches-py/`` with
``data_batch_1`` .. ``data_batch_5`` and ``test_batch``: each a *pickle* of a dict with
``data`` (10000 x 3072 uint8, the red, green and blue 32x32 planes of each image, row-major)
and ``labels`` (10000 ints in 0..9), written by Python 2.

Why a restricted unpickler: ``pickle.load`` calls whatever importable function a file
names (``os.system`` included) while it reads, so loading a pickle someone else made runs
their code. :class:`RestrictedUnpickler` resolves only the handful of names a numpy array
inside a dict needs (numpy's array reconstructor, ``ndarray``, ``dtype``, and ``codecs.encode``,
which Python 3 uses to write bytes in protocol 2) and refuses every
other global with :class:`~geomx.ml.datasets.DatasetFormatError`; the result is then
checked for exactly the arrays and labels CIFAR-10 has (uint8 data, 3072 columns, labels
in 0..9, an object-dtype array is rejected). We read the directory or the ``.tar.gz``
directly (members are read, never extracted to disk). geomx never downloads it.
"""

from __future__ import annotations

import codecs
import io
import os
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from geomx.ml.dataset_types import Dataset, DatasetFormatError, DatasetNotFoundError, default_data_dirs

__all__ = ["CIFAR10_CLASSES", "RestrictedUnpickler", "load_cifar10", "read_cifar_batch", "write_cifar_batch"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
ARCHIVE = "cifar-10-python.tar.gz"
ARCHIVE_DIR = "cifar-10-batches-py"
_PIXELS = 3 * 32 * 32


def _numpy_globals() -> dict[tuple[str, str], Any]:
    reconstruct = np.zeros(1).__reduce__()[0]  # numpy's own reconstructor, wherever it lives
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
                                           # how Python 3 writes bytes in protocol 2: a pure function
                                           ("_codecs", "encode"): codecs.encode}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that can build dicts, lists, strings, numbers and numpy arrays, and
    nothing that needs any other global (so no function a file names is ever called)."""

    _ALLOWED = _numpy_globals()

    def __init__(self, file: io.BufferedIOBase, source: str) -> None:
        # Python 2 pickles: keys and the raw array bytes are byte strings.
        super().__init__(file, encoding="bytes")
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        found = self._ALLOWED.get((module, name))
        if found is None:
            raise DatasetFormatError(
                f"{self._source}: the pickle asks for {module}.{name}, which a CIFAR batch never "
                "needs; refusing to load it (only numpy arrays, dicts, lists and numbers are allowed)"
            )
        return found


def _field(batch: dict[Any, Any], name: str) -> Any:
    for key in (name.encode(), name):
        if key in batch:
            return batch[key]
    return None


def read_cifar_batch(raw: bytes, source: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch pickle -> (images uint8 (N, 3, 32, 32), labels int64 (N,))."""
    try:
        batch = RestrictedUnpickler(io.BytesIO(raw), source).load()
    except DatasetFormatError:
        raise
    except Exception as exc:  # truncated or not a pickle at all
        raise DatasetFormatError(f"{source}: not a CIFAR-10 batch pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(batch, dict):
        raise DatasetFormatError(f"{source}: expected a dict with 'data' and 'labels', got {type(batch).__name__}")
    data, labels = _field(batch, "data"), _field(batch, "labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        shape = getattr(data, "shape", None)
        raise DatasetFormatError(f"{source}: 'data' must be a uint8 array of shape (N, {_PIXELS}), got "
                                 f"{type(data).__name__} {getattr(data, 'dtype', '')} {shape}")
    if not isinstance(labels, (list, np.ndarray)) or len(labels) != data.shape[0]:
        raise DatasetFormatError(f"{source}: 'labels' must list one label per image ({data.shape[0]})")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        raise DatasetFormatError(f"{source}: labels must be integers") from None
    if y.ndim != 1 or (y.size and (y.min() < 0 or y.max() > 9)):
        raise DatasetFormatError(f"{source}: labels must be integers in 0..9")
    return data.reshape(-1, 3, 32, 32), y


def write_cifar_batch(path: str | os.PathLike[str], images: np.ndarray, labels: np.ndarray) -> Path:
    """Write a batch in the distribution's format (tests and people making subsets)."""
    p = Path(path)
    images = np.ascontiguousarray(images, dtype=np.uint8).reshape(-1, _PIXELS)
    batch = {b"batch_label": b"geomx", b"labels": [int(v) for v in labels], b"data": images,
             b"filenames": [f"{i}.png".encode() for i in range(images.shape[0])]}
    p.write_bytes(pickle.dumps(batch, protocol=2))
    return p


def _read_members(base: Path) -> dict[str, bytes] | None:
    names = (*TRAIN_BATCHES, TEST_BATCH)
    if base.is_dir():
        for directory in (base, base / ARCHIVE_DIR):
            if all((directory / n).is_file() for n in names):
                return {n: (directory / n).read_bytes() for n in names}
        archive = base / ARCHIVE
        if not archive.is_file():
            return None
        base = archive
    if base.is_file():
        try:
            with tarfile.open(base, "r:*") as tar:
                members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
                missing = [n for n in names if n not in members]
                if missing:
                    raise DatasetFormatError(f"{base}: archive lacks {', '.join(missing)}")
                out = {}
                for n in names:
                    handle = tar.extractfile(members[n])
                    assert handle is not None
                    out[n] = handle.read()
                return out
        except tarfile.TarError as exc:
            raise DatasetFormatError(f"{base}: not a CIFAR-10 directory or .tar.gz ({exc})") from None
    return None


def load_cifar10(path: str | os.PathLike[str] | None = None) -> Dataset:
    """CIFAR-10 from ``path``: the ``cifar-10-batches-py`` directory, a directory holding
    it or ``cifar-10-python.tar.gz``, or that archive itself. Without ``path``:
    ``$GEOMX_DATA_DIR/cifar10`` and ``~/.geomx/data/cifar10``. Images are float32 in
    [0, 1], NCHW (3, 32, 32); 50000 train and 10000 test images in the full set."""
    candidates = [Path(path).expanduser()] if path is not None else default_data_dirs("cifar10")
    for base in candidates:
        members = _read_members(base)
        if members is None:
            continue
        train = [read_cifar_batch(members[n], f"{base}:{n}") for n in TRAIN_BATCHES]
        x_test, y_test = read_cifar_batch(members[TEST_BATCH], f"{base}:{TEST_BATCH}")
        x_train = np.concatenate([x for x, _ in train])
        return Dataset(
            x_train=x_train.astype(np.float32) / np.float32(255.0),
            y_train=np.concatenate([y for _, y in train]),
            x_test=x_test.astype(np.float32) / np.float32(255.0),
            y_test=y_test,
            num_classes=10,
            input_shape=(3, 32, 32),
            name="cifar10",
        )
    looked = "; ".join(str(c) for c in candidates)
    raise DatasetNotFoundError(
        f"cifar10 data not found in {looked}: need data_batch_1..5 and test_batch (the python "
        f"version, in {ARCHIVE_DIR}/ or {ARCHIVE}); geomx never downloads data"
    )
