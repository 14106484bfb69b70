"""``[codec]``: gradient compression (the codecs of :mod:`geomx.codec`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from geomx.scenario.kinds import Fraction, Integer, OptionsTable, PolicyName, Section, setting

#: The built-in codec names (geomx/codec/registry.py); anything else names a user codec.
BUILTIN_CODECS = ("none", "bsc", "fp16", "bf16", "mpq", "onebit")


@dataclass(frozen=True)
class CodecConfig(Section):
    """What bytes leave: gradient compression."""

    type: str = setting(PolicyName("codec", *BUILTIN_CODECS), "none",
                        "`bsc`: bi-sparse compression; `mpq`: mixed-precision quantisation; "
                        "`fp16` / `bf16`: half precision; `onebit`: 1-bit quantisation; "
                        "`\"file.py:Class\"`: a codec of your own (docs/extending.md).")
    threshold: float = setting(Fraction(min_open=True, max_open=True, percent=False), 0.01,
                               "bsc / mpq: fraction of elements kept.")
    size_lower_bound: int = setting(Integer(min=0, counts=True), 200000,
                                    "Tensors with fewer elements are sent dense.")
    options: tuple = setting(OptionsTable(), {},
                             "`[codec.options]`: constructor parameters (`params`) of the codec "
                             "`type` names, checked once at load; for a built-in they replace "
                             "the keys above.", default_doc="`{}`")

    @property
    def options_table(self) -> dict[str, Any]:
        """``[codec.options]`` as a plain table (arrays as lists)."""
        return OptionsTable().emit(self.options)

