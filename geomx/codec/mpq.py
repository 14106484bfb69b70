"""``mpq``: GeoMX's mixed-precision quantisation policy (docs/geomx-behaviour.md §4.3).

MPQ is not a codec but a rule that picks one per tensor and hop:

=================  ===================  ===================
tensor             intra-DC ("lan")     inter-DC ("wan")
=================  ===================  ===================
N <  bound (tiny)  fp16 dense           fp16 dense
N >= bound (large) fp32 dense           fp32 Bi-Sparse
=================  ===================  ===================

Fix: GeoMX's workers use ``N > bound`` to choose the dtype while its local servers use
``N >= bound`` to choose sparsification, so a tensor of exactly ``bound`` elements is
made fp16 and then sparsified as if it were fp32 (garbage). Here there is one rule:
``N >= bound`` is large.
"""
from __future__ import annotations

from typing import Any

from geomx.policy import codec as base
from geomx.policy.codec import Codec, CodecPolicy, Tier
from .bsc import BiSparseCodec
from .fp16 import FP16Codec
from .identity import DenseCodec


class MPQ(CodecPolicy):
    """Policy: ``codec_for(num_elements, tier)`` returns the codec GeoMX's MPQ uses."""

    name = "mpq"
    stateful = True  # its WAN codec for large tensors is Bi-Sparse
    params = BiSparseCodec.params

    def __init__(self, threshold: float = 0.01, *, size_lower_bound: int | None = None,
                 momentum: float = 0.9, seed: int = 42, resample: bool = True,
                 sample_ratio: float = 0.005) -> None:
        self.sparse = BiSparseCodec(threshold, size_lower_bound=size_lower_bound, momentum=momentum,
                                    seed=seed, resample=resample, sample_ratio=sample_ratio)
        self.half = FP16Codec()
        self.dense = DenseCodec()
        # the policy's parameters are its Bi-Sparse codec's
        for p in self.params:
            setattr(self, p, getattr(self.sparse, p))

    def is_large(self, num_elements: int) -> bool:
        """The one size rule: N >= bound is large (fp32), else tiny (fp16)."""
        return int(num_elements) >= self.sparse.size_lower_bound

    def applies_to(self, num_elements: int) -> bool:
        """Whether the tensor is sparsified on the WAN."""
        return self.is_large(num_elements)

    def codec_for(self, num_elements: int, tier: Tier) -> Codec:
        base.check_tier(tier)
        if not self.is_large(num_elements):
            return self.half
        return self.sparse if tier == "wan" else self.dense

    def config(self) -> dict[str, Any]:
        return {"type": self.name, **{p: getattr(self.sparse, p) for p in self.params}}

    def __repr__(self) -> str:
        args = ", ".join(f"{p}={getattr(self.sparse, p)!r}" for p in self.params)
        return f"MPQ({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MPQ) and other.config() == self.config()

    def __hash__(self) -> int:
        return hash(("MPQ", tuple(sorted(self.config().items()))))
