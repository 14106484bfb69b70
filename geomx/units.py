"""Quantities as a person writes them: ``"100Mbps"``, ``"30ms"``, ``"1%"``, ``"4MiB"``, ``"25.6M"``.

Scenario files describe networks and models in the units people think in, and the code
works in SI base units named in identifiers (``bandwidth_bps``, ``latency_s``,
``tcp_window_bytes``). This module is the only place that converts between the two.

Two promises:

* Every parser raises :class:`ValueError` with the offending text, the reason and an
  example of what is accepted (with a "did you mean" for near-miss units), because the
  person reading the message is usually editing a TOML file, not debugging Python.
* Every ``format_*`` helper writes text that its parser maps back to *exactly* the same
  number, so a resolved scenario can be written out readably and read back equal.
  Both directions go through :class:`decimal.Decimal`: the number the person wrote is
  scaled by the unit exactly and rounded to a float once, so ``"0.1ms"`` is the same
  float as ``0.0001`` and ``format_seconds(x)`` can always find a text for ``x``.

Conventions (the ones networking people use):

* bandwidth: lower-case ``b`` is bits, upper-case ``B`` is bytes (``"12.5MB/s"`` is
  100 Mbit/s); decimal prefixes are powers of 1000, ``Ki``/``Mi``/``Gi`` powers of 1024;
  a bare number is bit/s.
* time: ``ns``, ``us`` (or ``µs``), ``ms``, ``s``, ``min``, ``h``; a bare number is seconds.
* fraction: ``"1%"`` or a plain number in [0, 1].
* size: ``B``, ``kB``/``KB``, ``MB``, ``GB``, ``TB`` (decimal) and ``KiB``, ``MiB``,
  ``GiB``, ``TiB`` (binary); a bare integer is bytes.
* count: ``k``/``K`` (1e3), ``M`` (1e6), ``G``/``B`` (1e9, "billion"), ``T`` (1e12).
"""

from __future__ import annotations

import decimal
import difflib
import math
import re
from decimal import Decimal

__all__ = [
    "parse_bandwidth",
    "parse_seconds",
    "parse_fraction",
    "parse_size",
    "parse_count",
    "format_bps",
    "format_seconds",
    "format_fraction",
    "format_size",
    "format_count",
]

# Enough digits that scaling a 17-significant-digit float text by 1024**4 or 1e-9 is exact.
_CTX = decimal.Context(prec=60, rounding=decimal.ROUND_HALF_EVEN)

_NUMBER_AND_UNIT = re.compile(
    r"""^\s*
    (?P<num>[+-]?(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?)
    \s*
    (?P<unit>.*?)
    \s*$""",
    re.VERBOSE,
)


def _build_bandwidth_units() -> dict[str, Decimal]:
    prefixes = {
        "": Decimal(1),
        "k": Decimal(10) ** 3, "K": Decimal(10) ** 3,
        # "mbps" written in lower case means megabits: a milli-bit rate is never meant.
        "M": Decimal(10) ** 6, "m": Decimal(10) ** 6,
        "G": Decimal(10) ** 9, "g": Decimal(10) ** 9,
        "T": Decimal(10) ** 12, "t": Decimal(10) ** 12,
        "Ki": Decimal(2) ** 10, "ki": Decimal(2) ** 10,
        "Mi": Decimal(2) ** 20, "mi": Decimal(2) ** 20,
        "Gi": Decimal(2) ** 30, "gi": Decimal(2) ** 30,
        "Ti": Decimal(2) ** 40, "ti": Decimal(2) ** 40,
    }
    bit_bases = ["bps", "bit/s", "bits/s", "b/s", "bit", "bits"]
    byte_bases = ["Bps", "B/s", "byte/s", "bytes/s"]
    units: dict[str, Decimal] = {}
    for prefix, scale in prefixes.items():
        for base in bit_bases:
            units[prefix + base] = scale
        for base in byte_bases:
            units[prefix + base] = scale * 8
    return units


_BANDWIDTH_UNITS = _build_bandwidth_units()
_BANDWIDTH_EXAMPLES = "'100Mbps', '1Gbps', '10 Gbit/s', '12.5MB/s' (bytes) or a bare number of bit/s"

_TIME_UNITS: dict[str, Decimal] = {}
for _names, _scale in (
    (("ns", "nsec"), Decimal("1e-9")),
    (("us", "µs", "μs", "usec"), Decimal("1e-6")),
    (("ms", "msec"), Decimal("1e-3")),
    (("s", "sec", "secs", "second", "seconds"), Decimal(1)),
    (("min", "mins", "minute", "minutes"), Decimal(60)),
    (("h", "hr", "hrs", "hour", "hours"), Decimal(3600)),
):
    for _name in _names:
        _TIME_UNITS[_name] = _scale
_TIME_EXAMPLES = "'30ms', '0.1 ms', '250us', '2s', '5min' or a bare number of seconds"

_SIZE_UNITS: dict[str, Decimal] = {
    "B": Decimal(1), "byte": Decimal(1), "bytes": Decimal(1),
    "kB": Decimal(10) ** 3, "KB": Decimal(10) ** 3,
    "MB": Decimal(10) ** 6, "GB": Decimal(10) ** 9, "TB": Decimal(10) ** 12,
    "KiB": Decimal(2) ** 10, "MiB": Decimal(2) ** 20, "GiB": Decimal(2) ** 30, "TiB": Decimal(2) ** 40,
    "kiB": Decimal(2) ** 10, "kib": Decimal(2) ** 10, "mib": Decimal(2) ** 20,
    "gib": Decimal(2) ** 30, "tib": Decimal(2) ** 40,
}
_SIZE_EXAMPLES = "'4MiB', '1MB', '64KiB' or a bare integer number of bytes"

_COUNT_UNITS: dict[str, Decimal] = {
    "k": Decimal(10) ** 3, "K": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9, "B": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
}
_COUNT_EXAMPLES = "'25.6M', '178k', 25600000 or 25_600_000"


def _describe(value: object) -> str:
    if isinstance(value, str):
        return repr(value)
    return f"{value!r} ({type(value).__name__})"


def _suggest(unit: str, known: dict[str, Decimal]) -> str:
    close = difflib.get_close_matches(unit, list(known), n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(unit.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
        close = [k for k in known if close and k.lower() == close[0]][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _split(text: str, what: str, examples: str) -> tuple[Decimal, str]:
    match = _NUMBER_AND_UNIT.match(text)
    if not match:
        raise ValueError(f"invalid {what} {text!r}: expected a number and a unit, like {examples}")
    number = match.group("num").replace("_", "")
    try:
        return Decimal(number), match.group("unit")
    except decimal.InvalidOperation:  # pragma: no cover - the regex only lets numbers through
        raise ValueError(f"invalid {what} {text!r}: {number!r} is not a number") from None


def _magnitude(value: object, what: str, examples: str, units: dict[str, Decimal]) -> Decimal:
    """The exact quantity in base units (Decimal) for a number or a ``"<number><unit>"`` text."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"invalid {what} {_describe(value)}: expected a text like {examples}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"invalid {what} {value!r}: must be a finite number; use e.g. {examples}")
        magnitude = Decimal(repr(value))
    elif isinstance(value, int):
        magnitude = Decimal(value)
    else:
        number, unit = _split(value, what, examples)
        if unit == "":
            magnitude = number
        elif unit in units:
            magnitude = _CTX.multiply(number, units[unit])
        else:
            raise ValueError(
                f"invalid {what} {value!r}: unknown unit {unit!r}{_suggest(unit, units)}; "
                f"use e.g. {examples}"
            )
    if magnitude < 0:
        raise ValueError(f"invalid {what} {value!r}: must not be negative")
    return magnitude


def _to_float(magnitude: Decimal) -> float:
    return float(magnitude)


def _to_int(magnitude: Decimal, value: object, what: str, unit_name: str) -> int:
    rounded = magnitude.to_integral_value(rounding=decimal.ROUND_HALF_EVEN)
    if rounded != magnitude and isinstance(value, float):
        raise ValueError(f"invalid {what} {value!r}: expected a whole number of {unit_name}")
    return int(rounded)


# --------------------------------------------------------------------------- parsing

def parse_bandwidth(value: str | int | float) -> float:
    """Bandwidth in bit/s: ``"100Mbps"``, ``"1Gbps"``, ``"10 Gbit/s"``, ``"155Mbit"``,
    ``"12.5MB/s"`` (bytes per second), ``"1e9"``, ``1e9`` (bare numbers are bit/s)."""
    if isinstance(value, str):
        match = _NUMBER_AND_UNIT.match(value)
        unit = match.group("unit") if match else value.strip()
        if unit not in _BANDWIDTH_UNITS and unit in _SIZE_UNITS:
            raise ValueError(
                f"invalid bandwidth {value!r}: {unit!r} is a size, not a rate; "
                f"write bytes per second as e.g. '12.5MB/s' or bits per second as '100Mbps'"
            )
    return _to_float(_magnitude(value, "bandwidth", _BANDWIDTH_EXAMPLES, _BANDWIDTH_UNITS))


def parse_seconds(value: str | int | float) -> float:
    """Duration in seconds: ``"30ms"``, ``"0.1 ms"``, ``"250us"``, ``"2s"``, ``"5min"``,
    ``"1h"``; a bare number is seconds."""
    return _to_float(_magnitude(value, "duration", _TIME_EXAMPLES, _TIME_UNITS))


def parse_fraction(value: str | int | float) -> float:
    """A fraction in [0, 1]: ``"1%"``, ``"0.5%"``, ``0.01``, ``"0.01"``."""
    examples = "'1%', '0.5%' or a number in [0, 1] such as 0.01"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"invalid fraction {_describe(value)}: expected {examples}")
    if isinstance(value, str):
        number, unit = _split(value, "fraction", examples)
        if unit == "%":
            magnitude = _CTX.divide(number, Decimal(100))
        elif unit == "":
            magnitude = number
        else:
            raise ValueError(f"invalid fraction {value!r}: unknown unit {unit!r}; use e.g. {examples}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"invalid fraction {value!r}: expected {examples}")
    else:
        magnitude = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if magnitude < 0 or magnitude > 1:
        hint = f"; for percent write '{value}%'" if not isinstance(value, str) and magnitude > 1 else ""
        raise ValueError(f"invalid fraction {value!r}: must be between 0 and 1 (0% and 100%){hint}")
    return _to_float(magnitude)


def parse_size(value: str | int | float) -> int:
    """Size in bytes: ``"4MiB"``, ``"1MB"``, ``"64KiB"``, ``"1460B"``; a bare integer is
    bytes. Fractional results (``"1.3KiB"``) are rounded to the nearest byte."""
    if isinstance(value, str):
        match = _NUMBER_AND_UNIT.match(value)
        unit = match.group("unit") if match else ""
        if unit in ("b", "kb", "Kb", "Mb", "mb", "Gb", "gb", "Tb", "bit", "bits"):
            raise ValueError(
                f"invalid size {value!r}: sizes are in bytes; write 'B', 'kB', 'MB' "
                f"or 'KiB', 'MiB', e.g. {_SIZE_EXAMPLES}"
            )
    magnitude = _magnitude(value, "size", _SIZE_EXAMPLES, _SIZE_UNITS)
    return _to_int(magnitude, value, "size", "bytes")


def parse_count(value: str | int | float) -> int:
    """A count: ``"25.6M"``, ``"178k"``, ``"1.2B"``, ``25_600_000``, ``"25_600_000"``."""
    magnitude = _magnitude(value, "count", _COUNT_EXAMPLES, _COUNT_UNITS)
    rounded = magnitude.to_integral_value(rounding=decimal.ROUND_HALF_EVEN)
    if rounded != magnitude:
        raise ValueError(f"invalid count {value!r}: must be a whole number (it is {magnitude})")
    return int(rounded)


# --------------------------------------------------------------------------- formatting

def _plain(number: Decimal) -> str:
    """Decimal text without exponent or trailing zeros: Decimal('1E+2') -> '100'."""
    text = format(number.normalize(_CTX), "f")
    return text


def _exact_in(value: Decimal, scale: Decimal) -> Decimal | None:
    quotient = _CTX.divide(value, scale)
    if _CTX.multiply(quotient, scale) != value:
        return None
    return quotient


def _format_scaled(value: float | int, ladder: list[tuple[str, Decimal]], bare: str,
                   max_fraction_digits: int | None = None) -> str:
    """Pick the largest unit in ``ladder`` (largest first) that keeps the number >= 1
    and represents ``value`` exactly; fall back to the bare number."""
    exact = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if exact == 0:
        return "0" + ladder[-1][0]
    for suffix, scale in ladder:
        mantissa = _exact_in(abs(exact), scale)
        if mantissa is None or mantissa < 1:
            continue
        text = _plain(mantissa)
        if max_fraction_digits is not None and "." in text and len(text.split(".")[1]) > max_fraction_digits:
            continue
        return ("-" if exact < 0 else "") + text + suffix
    return bare


def format_bps(bps: float) -> str:
    """``1e8 -> "100Mbps"``, ``2.5e9 -> "2.5Gbps"``; ``parse_bandwidth`` reads it back exactly."""
    ladder = [("Tbps", Decimal(10) ** 12), ("Gbps", Decimal(10) ** 9), ("Mbps", Decimal(10) ** 6),
              ("kbps", Decimal(10) ** 3), ("bps", Decimal(1))]
    return _format_scaled(float(bps), ladder, repr(float(bps)))


def format_seconds(seconds: float) -> str:
    """``0.03 -> "30ms"``, ``180 -> "180s"``, ``2.5e-4 -> "250us"``; exact round trip."""
    ladder = [("s", Decimal(1)), ("ms", Decimal("1e-3")), ("us", Decimal("1e-6")), ("ns", Decimal("1e-9"))]
    text = _format_scaled(float(seconds), ladder, repr(float(seconds)))
    return "0s" if text == "0ns" else text


def format_fraction(fraction: float) -> str:
    """``0.01 -> "1%"``, ``0.005 -> "0.5%"``; exact round trip through ``parse_fraction``."""
    exact = Decimal(repr(float(fraction)))
    return _plain(_CTX.multiply(exact, Decimal(100))) + "%"


def format_size(nbytes: int) -> str:
    """``4194304 -> "4MiB"``, ``1000000 -> "1MB"``, ``1460 -> "1460B"`` (whole units only)."""
    nbytes = int(nbytes)
    for ladder in (
        [("TiB", Decimal(2) ** 40), ("GiB", Decimal(2) ** 30), ("MiB", Decimal(2) ** 20), ("KiB", Decimal(2) ** 10)],
        [("TB", Decimal(10) ** 12), ("GB", Decimal(10) ** 9), ("MB", Decimal(10) ** 6), ("kB", Decimal(10) ** 3)],
    ):
        text = _format_scaled(nbytes, ladder, "", max_fraction_digits=0)
        if text and nbytes != 0:
            return text
    return f"{nbytes}B"


def format_count(count: int) -> str:
    """``25600000 -> "25.6M"``, ``178000 -> "178k"``, ``23834568 -> "23834568"``: a suffix
    only where it stays short (at most two decimals)."""
    count = int(count)
    ladder = [("T", Decimal(10) ** 12), ("G", Decimal(10) ** 9), ("M", Decimal(10) ** 6), ("k", Decimal(10) ** 3)]
    text = _format_scaled(count, ladder, "", max_fraction_digits=2)
    return text if text and count != 0 else str(count)
