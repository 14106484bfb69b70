"""`Table`: named columns of numpy arrays, the pandas-free result of comparisons and sweeps.

pandas is optional in geomx (a notebook often has it, a cluster node rarely does), so
the analysis API returns this small structure: numeric columns are float64 arrays (NaN
where a run has no value), text columns are object arrays of str. `to_pandas()` turns
it into a DataFrame when pandas is installed; `to_text()` prints it for a terminal.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def column_array(values: Sequence[Any]) -> np.ndarray:
    """int64 when every value is an integer, float64 when every present value is a
    number (None -> NaN), else object (str)."""
    present = [v for v in values if v is not None and v != ""]
    if present and len(present) == len(values) and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in present):
        return np.array([int(v) for v in values], dtype=np.int64)
    if present and all(_is_number(v) for v in present):
        return np.array([np.nan if v is None or v == "" else float(v) for v in values],
                        dtype=np.float64)
    return np.array(["" if v is None else str(v) for v in values], dtype=object)


def parse_cell(text: str) -> Any:
    """A CSV cell back to a number when it is one (empty -> None)."""
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


class Table:
    """Ordered named columns of equal length (numpy arrays)."""

    def __init__(self, columns: Mapping[str, Sequence[Any] | np.ndarray] | None = None) -> None:
        self.columns: dict[str, np.ndarray] = {}
        for name, values in (columns or {}).items():
            self[name] = values

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], names: Sequence[str] | None = None) -> Table:
        rows = list(rows)
        if names is None:
            names = []
            for row in rows:
                names.extend(k for k in row if k not in names)
        return cls({n: column_array([row.get(n) for row in rows]) for n in names})

    def __setitem__(self, name: str, values: Sequence[Any] | np.ndarray) -> None:
        arr = values if isinstance(values, np.ndarray) else column_array(list(values))
        if self.columns and len(arr) != len(self):
            raise ValueError(f"column {name!r} has {len(arr)} values; the table has {len(self)} rows")
        self.columns[name] = arr

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(f"no column {name!r}; columns: {', '.join(self.columns)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def keys(self) -> list[str]:
        return list(self.columns)

    def rows(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield {k: _plain(v[i]) for k, v in self.columns.items()}

    def to_pandas(self):
        """A pandas DataFrame of the same columns (needs pandas)."""
        import pandas as pd

        return pd.DataFrame({k: v for k, v in self.columns.items()})

    def to_csv(self, path: str | os.PathLike) -> None:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(self.keys())
            for row in self.rows():
                w.writerow(["" if v is None else v for v in row.values()])

    @classmethod
    def read_csv(cls, path: str | os.PathLike) -> Table:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            rows = [dict(zip(header, (parse_cell(c) for c in line))) for line in reader]
        return cls.from_rows(rows, header)

    def to_text(self, formats: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None) -> str:
        """Aligned plain-text table; `formats` maps a column to a format spec (".3f")."""
        formats = formats or {}
        headers = headers or {}
        cols = self.keys()
        cells = [[headers.get(c, c) for c in cols]]
        for row in self.rows():
            cells.append([_fmt(row[c], formats.get(c)) for c in cols])
        widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
        numeric = [self.columns[c].dtype != object for c in cols]
        lines = []
        for r in cells:
            lines.append("  ".join(s.rjust(w) if num else s.ljust(w)
                                   for s, w, num in zip(r, widths, numeric)).rstrip())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.to_text()


def _plain(v: Any) -> Any:
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        f = float(v)
        return None if math.isnan(f) else f
    return v


def _fmt(v: Any, spec: str | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if spec:
            return format(v, spec)
        return f"{v:.6g}"
    return str(v)
