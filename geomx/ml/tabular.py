"""Tabular data users keep on disk: LIBSVM / SVMlight text files and CSV.

LIBSVM format (Chang & Lin's LIBSVM, Joachims's SVMlight), one sample per line::

    <label> <index>:<value> <index>:<value> ... [# comment]

indices are 1-based and increasing; absent features are 0 (the format is sparse).
:func:`read_libsvm` parses it with plain Python/numpy into CSR arrays
(:class:`SparseRows`); a bad line raises :class:`DatasetFormatError` naming the file and
line. CSV: numeric feature columns plus a label column (by index or header name); a
header row is detected when the first row has a field that is not a number.

:func:`load_libsvm` / :func:`load_csv` turn a file into a :class:`Dataset`: dense float32
features min-max scaled to [0, 1] with the training rows' ranges (test rows clipped), as
the other loaders deliver; labels (any numbers or strings) mapped to 0..K-1 in sorted
order. The test set is ``<file>.t`` for LIBSVM (the LIBSVM collection's convention, e.g.
``a9a`` / ``a9a.t``) when it exists, else a seeded ``test_fraction`` split.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from geomx.ml.dataset_types import Dataset, DatasetFormatError, DatasetNotFoundError

__all__ = ["SparseRows", "load_csv", "load_libsvm", "read_csv", "read_libsvm", "write_libsvm"]

TEST_FRACTION = 0.2


@dataclass(frozen=True)
class SparseRows:
    """Rows in CSR form: row ``i`` has ``data[indptr[i]:indptr[i+1]]`` at columns
    ``indices[...]`` (0-based). ``to_dense()`` gives the (rows, n_features) float32 matrix."""

    indptr: np.ndarray   # int64, (rows + 1,)
    indices: np.ndarray  # int64, (nnz,)
    data: np.ndarray     # float32, (nnz,)
    n_features: int

    @property
    def num_rows(self) -> int:
        return int(self.indptr.shape[0] - 1)

    def to_dense(self) -> np.ndarray:
        out = np.zeros((self.num_rows, self.n_features), np.float32)
        rows = np.repeat(np.arange(self.num_rows), np.diff(self.indptr))
        out[rows, self.indices] = self.data
        return out


def _missing(path: Path, what: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(f"{what} file {path} does not exist; geomx never downloads data")


def _number(text: str, where: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DatasetFormatError(f"{where}: {what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise DatasetFormatError(f"{where}: {what} {text!r} is not finite")
    return value


def read_libsvm(path: str | os.PathLike[str], *, n_features: int | None = None) -> tuple[SparseRows, np.ndarray]:
    """Parse a LIBSVM file into (rows, labels as float64). ``n_features`` fixes the width
    (an index above it is an error); default: the largest index in the file."""
    p = Path(path)
    if not p.is_file():
        raise _missing(p, "LIBSVM")
    if n_features is not None and n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    labels: list[float] = []
    indptr = [0]
    indices: list[int] = []
    values: list[float] = []
    with p.open("r", encoding="utf-8", errors="strict") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError as exc:
            raise DatasetFormatError(f"{p}: not a UTF-8 text file ({exc})") from None
    for lineno, line in enumerate(lines, start=1):
        body = line.split("#", 1)[0].split()
        if not body:
            continue
        where = f"{p}:{lineno}"
        labels.append(_number(body[0], where, "label"))
        previous = 0
        for token in body[1:]:
            index_text, sep, value_text = token.partition(":")
            if not sep:
                raise DatasetFormatError(f"{where}: expected index:value, got {token!r}")
            if not index_text.isdigit() or int(index_text) < 1:
                raise DatasetFormatError(f"{where}: feature index {index_text!r} must be an integer >= 1")
            index = int(index_text)
            if index <= previous:
                raise DatasetFormatError(f"{where}: feature indices must increase, {index} follows {previous}")
            if n_features is not None and index > n_features:
                raise DatasetFormatError(f"{where}: feature index {index} exceeds n_features = {n_features}")
            previous = index
            indices.append(index - 1)
            values.append(_number(value_text, where, f"value of feature {index}"))
        indptr.append(len(indices))
    if not labels:
        raise DatasetFormatError(f"{p}: no samples (every line is empty or a comment)")
    width = n_features if n_features is not None else (max(indices) + 1 if indices else 1)
    rows = SparseRows(np.asarray(indptr, np.int64), np.asarray(indices, np.int64),
                      np.asarray(values, np.float32), int(width))
    return rows, np.asarray(labels, np.float64)


def write_libsvm(path: str | os.PathLike[str], x: np.ndarray, y: np.ndarray, *, precision: int = 4) -> Path:
    """Write dense ``x`` (zeros omitted) and labels ``y`` in LIBSVM format."""
    p = Path(path)
    lines = []
    for row, label in zip(np.asarray(x), np.asarray(y)):
        nz = np.flatnonzero(row)
        label_text = str(int(label)) if float(label).is_integer() else repr(float(label))
        lines.append(" ".join([label_text, *(f"{j + 1}:{row[j]:.{precision}g}" for j in nz)]))
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def read_csv(path: str | os.PathLike[str], *, label_column: int | str = -1,
             delimiter: str = ",") -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """Parse a CSV file into (features float32 (N, F), labels as strings, header or None).

    ``label_column``: an index (negative counts from the end) or, with a header, a name.
    """
    p = Path(path)
    if not p.is_file():
        raise _missing(p, "CSV")
    with p.open("r", encoding="utf-8", newline="") as f:
        try:
            rows = [(i, r) for i, r in enumerate(csv.reader(f, delimiter=delimiter), start=1) if r and any(r)]
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DatasetFormatError(f"{p}: not a readable CSV file ({exc})") from None
    if not rows:
        raise DatasetFormatError(f"{p}: no rows")
    header: list[str] | None = None
    first = [cell.strip() for cell in rows[0][1]]
    if any(not _is_number(cell) for cell in first):
        header, rows = first, rows[1:]
        if not rows:
            raise DatasetFormatError(f"{p}: a header and no data rows")
    width = len(header) if header is not None else len(rows[0][1])
    if width < 2:
        raise DatasetFormatError(f"{p}: need a label column and at least one feature column, got {width} column")
    if isinstance(label_column, str):
        if header is None:
            raise ValueError(f"{p}: label_column {label_column!r} is a name but the file has no header row")
        if label_column not in header:
            raise ValueError(f"{p}: no column named {label_column!r}; columns: {', '.join(header)}")
        label_index = header.index(label_column)
    else:
        if not -width <= label_column < width:
            raise ValueError(f"{p}: label_column {label_column} is out of range for {width} columns")
        label_index = label_column % width
    features = np.empty((len(rows), width - 1), np.float32)
    labels: list[str] = []
    for k, (lineno, row) in enumerate(rows):
        if len(row) != width:
            raise DatasetFormatError(f"{p}:{lineno}: {len(row)} fields, expected {width}")
        cells = [c.strip() for c in row]
        labels.append(cells[label_index])
        feature_cells = cells[:label_index] + cells[label_index + 1:]
        for j, cell in enumerate(feature_cells):
            column = j if j < label_index else j + 1
            name = header[column] if header else f"column {column + 1}"
            features[k, j] = _number(cell, f"{p}:{lineno}", f"{name}")
    return features, np.asarray(labels), header


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _encode_labels(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Any labels -> 0..K-1 in sorted order (numbers sort numerically)."""
    try:
        numeric = values.astype(np.float64)
        classes, codes = np.unique(numeric, return_inverse=True)
    except ValueError:
        classes, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64).reshape(-1), int(max(2, len(classes)))


def _split(n: int, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if n < 2:
        raise DatasetFormatError(f"need at least 2 samples to split train/test, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    n_test = min(n - 1, max(1, int(round(n * test_fraction))))
    return order[n_test:], order[:n_test]


def _tabular_dataset(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                     name: str) -> Dataset:
    codes, num_classes = _encode_labels(np.concatenate([y_train, y_test]))
    low, high = x_train.min(axis=0), x_train.max(axis=0)
    span = np.where(high > low, high - low, 1.0).astype(np.float32)
    x_train = ((x_train - low) / span).astype(np.float32)
    x_test = np.clip((x_test - low) / span, 0.0, 1.0).astype(np.float32)
    n = y_train.shape[0]
    return Dataset(x_train=np.ascontiguousarray(x_train), y_train=codes[:n], x_test=np.ascontiguousarray(x_test),
                   y_test=codes[n:], num_classes=num_classes, input_shape=(x_train.shape[1],), name=name)


def load_libsvm(path: str | os.PathLike[str], *, n_features: int | None = None, seed: int = 0,
                test_fraction: float = TEST_FRACTION) -> Dataset:
    """A LIBSVM file as a Dataset (test set: ``<path>.t`` if present, else a seeded split)."""
    p = Path(path)
    rows, labels = read_libsvm(p, n_features=n_features)
    test_file = p.with_name(p.name + ".t")
    if test_file.is_file():
        test_rows, test_labels = read_libsvm(test_file, n_features=n_features or rows.n_features)
        width = max(rows.n_features, test_rows.n_features)
        x_train = SparseRows(rows.indptr, rows.indices, rows.data, width).to_dense()
        x_test = SparseRows(test_rows.indptr, test_rows.indices, test_rows.data, width).to_dense()
        return _tabular_dataset(x_train, labels, x_test, test_labels, "libsvm")
    x = rows.to_dense()
    train, test = _split(len(labels), seed, test_fraction)
    return _tabular_dataset(x[train], labels[train], x[test], labels[test], "libsvm")


def load_csv(path: str | os.PathLike[str], *, label_column: int | str = -1, seed: int = 0,
             test_fraction: float = TEST_FRACTION, delimiter: str = ",") -> Dataset:
    """A CSV file as a Dataset, split train/test by a seeded permutation."""
    x, labels, _ = read_csv(path, label_column=label_column, delimiter=delimiter)
    train, test = _split(len(labels), seed, test_fraction)
    return _tabular_dataset(x[train], labels[train], x[test], labels[test], "csv")
