"""``[codec]``: gradient compression (the codecs of :mod:`geomx.codec`)."""

from __future__ import annotations

from dataclasses import dataclass

from geomx.scenario.kinds import Choice, Fraction, Integer, Section, setting


@dataclass(frozen=True)
class CodecConfig(Section):
    """What bytes leave: gradient compression."""

    type: str = setting(Choice("none", "bsc", "fp16", "bf16", "mpq", "onebit"), "none",
                        "`bsc`: bi-sparse compression; `mpq`: mixed-precision quantisation; "
                        "`fp16` / `bf16`: half precision; `onebit`: 1-bit quantisation.")
    threshold: float = setting(Fraction(min_open=True, max_open=True, percent=False), 0.01,
                               "bsc / mpq: fraction of elements kept.")
    size_lower_bound: int = setting(Integer(min=0, counts=True), 200000,
                                    "Tensors with fewer elements are sent dense.")

