"""Piecewise-constant bandwidth traces for emulated links.

They live below both runtimes, not inside ``geomx/sim``: the emulator's links follow
them, and ``geomx/cluster.py`` (used by the real runtime too) reads a CSV trace's floor
to bound request timeouts.

Why piecewise constant: the flow model (``geomx/sim/network.py``) only has to recompute rates at
the instants a capacity changes, so a trace that tells the network *when* it will next
change (``next_change_after``) costs one event per step, not one per message. Measured
WAN bandwidth is usually published the same way (one sample per interval), and the
GeoMX papers' "bandwidth uniformly random between 20 and 155 Mbps, redrawn every 180 s"
experiment is a step function too.

Every trace answers two questions (the :class:`BandwidthTrace` protocol):

* ``rate_at(t_s)``: the capacity in bits per second at virtual time ``t_s``;
* ``next_change_after(t_s)``: the first time strictly after ``t_s`` at which the rate
  may change, or ``math.inf`` if it never does.
"""

from __future__ import annotations

import bisect
import math
import os
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "BandwidthTrace", "ConstantTrace", "CsvTrace", "StepTrace", "TraceError",
    "UniformRandomTrace", "link_trace", "wan_traces",
]


class TraceError(ValueError):
    """A trace that cannot be built; the message names the file and line when there is one."""


@runtime_checkable
class BandwidthTrace(Protocol):
    def rate_at(self, t_s: float) -> float:
        """Capacity in bit/s at virtual time ``t_s``."""
        ...

    def next_change_after(self, t_s: float) -> float:
        """First time > ``t_s`` at which the rate may change (``math.inf``: never)."""
        ...


def _check_rate(bandwidth_bps: float, what: str) -> float:
    r = float(bandwidth_bps)
    if not math.isfinite(r) or r < 0:
        raise TraceError(f"{what}: bandwidth must be a finite number >= 0 bit/s, got {bandwidth_bps!r}")
    return r


class ConstantTrace:
    """A link whose capacity never changes."""

    __slots__ = ("bandwidth_bps",)

    def __init__(self, bandwidth_bps: float) -> None:
        self.bandwidth_bps = _check_rate(bandwidth_bps, "ConstantTrace")

    def rate_at(self, t_s: float) -> float:
        return self.bandwidth_bps

    def next_change_after(self, t_s: float) -> float:
        return math.inf

    def __repr__(self) -> str:
        return f"ConstantTrace({self.bandwidth_bps:g} bps)"


class StepTrace:
    """A step function given as ``(time_s, bandwidth_bps)`` points.

    The rate of point i holds on ``[time_i, time_{i+1})``; the last rate holds forever
    and the first rate also applies before the first point. Times must be strictly
    increasing. Consecutive equal rates are merged so the network sees no empty steps.
    """

    __slots__ = ("times_s", "rates_bps")

    def __init__(self, points: Sequence[tuple[float, float]], *, source: str = "StepTrace") -> None:
        if not points:
            raise TraceError(f"{source}: a trace needs at least one (time_s, bandwidth_bps) point")
        times: list[float] = []
        rates: list[float] = []
        prev = -math.inf
        for i, (t, r) in enumerate(points):
            t = float(t)
            if not math.isfinite(t):
                raise TraceError(f"{source}: point {i}: time must be finite, got {t!r}")
            if t <= prev:
                raise TraceError(f"{source}: point {i}: times must be strictly increasing "
                                 f"({t:g} s after {prev:g} s)")
            prev = t
            r = _check_rate(r, f"{source}: point {i}")
            if rates and rates[-1] == r:
                continue
            times.append(t)
            rates.append(r)
        self.times_s = times
        self.rates_bps = rates

    def rate_at(self, t_s: float) -> float:
        i = bisect.bisect_right(self.times_s, t_s) - 1
        return self.rates_bps[i if i >= 0 else 0]

    def next_change_after(self, t_s: float) -> float:
        i = bisect.bisect_right(self.times_s, t_s)
        if i == 0:
            i = 1  # the first rate already applies before the first point
        return self.times_s[i] if i < len(self.times_s) else math.inf

    def __repr__(self) -> str:
        return f"StepTrace({len(self.times_s)} steps)"


# -- CSV traces ------------------------------------------------------------------------

_TIME_UNITS_S = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0, "h": 3600.0}
_RATE_UNITS_BPS = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}
_NUMBER_UNIT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z/]*)\s*$")


def _unit_from_header(name: str, units: dict[str, float], default: str) -> float | None:
    """``time_ms`` -> 1e-3, ``bandwidth_mbps`` -> 1e6, ``time`` -> default; None if unknown."""
    name = name.strip().lower()
    suffix = name.rsplit("_", 1)[1] if "_" in name else default
    m = re.search(r"\(([^)]*)\)$", name)  # also accept "time (s)", "bandwidth (Mbps)"
    if m:
        suffix = m.group(1).strip()
    return units.get(suffix)


def _parse_cell(cell: str, scale: float, units: dict[str, float], where: str, what: str) -> float:
    m = _NUMBER_UNIT.match(cell)
    if not m:
        raise TraceError(f"{where}: cannot read {what} from {cell.strip()!r}")
    value = float(m.group(1))
    unit = m.group(2).lower()
    if unit:
        if unit not in units:
            raise TraceError(f"{where}: unknown {what} unit {m.group(2)!r}; "
                             f"allowed: {', '.join(units)}")
        return value * units[unit]
    return value * scale


class CsvTrace(StepTrace):
    """A step trace read from a CSV file of ``time, bandwidth`` rows.

    The header is optional. With a header, column units come from the names
    (``time_s``/``time_ms``, ``bandwidth_bps``/``bandwidth_kbps``/``bandwidth_mbps``/
    ``bandwidth_gbps``, or ``time (s)``, ``bandwidth (Mbps)``); without one, seconds and
    bit/s. A cell may carry its own unit (``500ms``, ``100Mbps``). Blank lines and lines
    starting with ``#`` are skipped. Times must be strictly increasing; any problem is
    reported as ``path:line: reason``.
    """

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise TraceError(f"{self.path}: cannot read bandwidth trace: {e.strerror}") from None
        time_scale, rate_scale = 1.0, 1.0
        points: list[tuple[float, float]] = []
        seen_data = False
        prev_t = -math.inf
        for lineno, raw in enumerate(lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{self.path}:{lineno}"
            cells = [c for c in line.split(",")]
            if len(cells) < 2:
                raise TraceError(f"{where}: expected two columns 'time_s,bandwidth_bps', got {line!r}")
            if not seen_data and not _NUMBER_UNIT.match(cells[0]):
                ts = _unit_from_header(cells[0], _TIME_UNITS_S, "s")
                rs = _unit_from_header(cells[1], _RATE_UNITS_BPS, "bps")
                if ts is None or rs is None:
                    raise TraceError(f"{where}: unknown header {line!r}; expected e.g. "
                                     "'time_s,bandwidth_bps' or 'time_ms,bandwidth_mbps'")
                time_scale, rate_scale = ts, rs
                seen_data = True  # only one header, before the data
                continue
            seen_data = True
            t = _parse_cell(cells[0], time_scale, _TIME_UNITS_S, where, "time")
            r = _parse_cell(cells[1], rate_scale, _RATE_UNITS_BPS, where, "bandwidth")
            if not math.isfinite(t):
                raise TraceError(f"{where}: time must be finite")
            if t <= prev_t:
                raise TraceError(f"{where}: times must be strictly increasing "
                                 f"({t:g} s does not come after {prev_t:g} s)")
            if not math.isfinite(r) or r < 0:
                raise TraceError(f"{where}: bandwidth must be finite and >= 0, got {cells[1].strip()!r}")
            prev_t = t
            points.append((t, r))
        if not points:
            raise TraceError(f"{self.path}: no data rows in bandwidth trace")
        super().__init__(points, source=self.path)

    def __repr__(self) -> str:
        return f"CsvTrace({self.path!r}, {len(self.times_s)} steps)"


# -- random traces ---------------------------------------------------------------------

class UniformRandomTrace:
    """Bandwidth drawn uniformly from ``[low_bps, high_bps]``, redrawn every ``period_s``.

    Step k covers ``[k * period_s, (k + 1) * period_s)``. Draws come from a seeded
    :func:`numpy.random.default_rng` in fixed-size chunks, so the value of step k depends
    only on the seed and k, never on which times were queried first.
    """

    __slots__ = ("low_bps", "high_bps", "period_s", "seed", "_rng", "_values")

    _CHUNK = 256

    def __init__(self, low_bps: float, high_bps: float, period_s: float, seed: int = 0) -> None:
        self.low_bps = _check_rate(low_bps, "UniformRandomTrace low")
        self.high_bps = _check_rate(high_bps, "UniformRandomTrace high")
        if self.high_bps < self.low_bps:
            raise TraceError(f"UniformRandomTrace: high ({high_bps!r} bps) < low ({low_bps!r} bps)")
        period_s = float(period_s)
        if not (math.isfinite(period_s) and period_s > 0):
            raise TraceError(f"UniformRandomTrace: period_s must be > 0, got {period_s!r}")
        self.period_s = period_s
        self.seed = int(seed)
        self._rng = np.random.default_rng(self.seed)
        self._values: list[float] = []

    def _step(self, t_s: float) -> int:
        if t_s <= 0:
            return 0
        p = self.period_s
        k = int(t_s // p)
        # Step boundaries are the floats k * period_s; make k agree with them exactly.
        while (k + 1) * p <= t_s:
            k += 1
        while k > 0 and k * p > t_s:
            k -= 1
        return k

    def _value(self, k: int) -> float:
        values = self._values
        while k >= len(values):
            values.extend(float(v) for v in self._rng.uniform(self.low_bps, self.high_bps, self._CHUNK))
        return values[k]

    def rate_at(self, t_s: float) -> float:
        return self._value(self._step(t_s))

    def next_change_after(self, t_s: float) -> float:
        return (self._step(t_s) + 1) * self.period_s

    def __repr__(self) -> str:
        return (f"UniformRandomTrace({self.low_bps:g}..{self.high_bps:g} bps, "
                f"every {self.period_s:g} s, seed={self.seed})")


def link_trace(w: Any, *, seed: int) -> BandwidthTrace | None:
    """The trace of one direction of a ``[[wan]]`` link ``w`` (None: constant capacity;
    a CSV file drives both directions alike, a ``"uniform"`` one draws per direction)."""
    if not w.trace:
        return None
    if w.trace == "uniform":
        return UniformRandomTrace(w.trace_low_bps, w.trace_high_bps, w.trace_period_s, seed=seed)
    return CsvTrace(w.trace)


def wan_traces(wans: Sequence[Any], run_seed: int) -> dict[tuple[str, str], BandwidthTrace]:
    """``(src DC, dst DC) -> trace`` of every traced WAN direction, with the seeds both
    runtimes use (so a ``"uniform"`` link draws the same rates in each)."""
    out: dict[tuple[str, str], BandwidthTrace] = {}
    for i, w in enumerate(wans):
        for src, dst, k in ((w.a, w.b, 0), (w.b, w.a, 1)):
            trace = link_trace(w, seed=run_seed * 7919 + 2 * i + k)
            if trace is not None:
                out[(src, dst)] = trace
    return out
