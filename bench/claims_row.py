"""One row of ``bench/claims.py``: a headline claim, the paper's band, our figure, and, where
ours is outside the band, the mechanism-level reason with a check that the reason holds in
the measured run.

A reason is a fixed sentence per row (``REASONS`` in ``bench/claims.py``), never a pinned
number; ``witness`` is the measured fact the sentence rests on (for example "the
multipath run put more bytes on 100 Mbit/s links than the run without it"), so a test can
tell an explained miss from an unexplained one. Bands come from docs/papers.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ClaimRow:
    """A claim, the paper's band ``[band_lo, band_hi]`` (``math.inf`` for "at least"), our
    figure in the same unit, the scenario that produced it (``geomx run`` arguments)."""

    key: str
    claim: str
    source: str
    paper: str
    band_lo: float
    band_hi: float
    unit: str
    ours: float | None
    scenario: str
    reason: str = ""
    witness: bool | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def inside(self) -> bool:
        """Ours lies in the paper's band (ends included)."""
        return self.ours is not None and self.band_lo <= self.ours <= self.band_hi

    def fmt(self, x: float | None) -> str:
        """A figure in the row's unit: ``x`` (times), ``%`` (a fraction shown as percent),
        ``pp`` (accuracy points)."""
        if x is None:
            return "-"
        if math.isinf(x):
            return "∞"
        if self.unit == "%":
            return f"{x * 100:+.1f}%"
        if self.unit == "pp":
            return f"{x:+.2f} pp"
        return f"{x:.2f}x"

    def band_text(self) -> str:
        if math.isinf(self.band_hi):
            return f"≥ {self.fmt(self.band_lo)}"
        if self.band_lo == self.band_hi:
            return self.fmt(self.band_lo)
        return f"{self.fmt(self.band_lo)} .. {self.fmt(self.band_hi)}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["inside"] = self.inside
        for k in ("band_lo", "band_hi"):
            if math.isinf(d[k]):
                d[k] = None
        return d
