"""``[sched]``: transfer scheduling and placement (the policies of :mod:`geomx.sched`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from geomx.scenario.errors import ScenarioError
from geomx.scenario.kinds import (Choice, Flag, Fraction, Integer, OptionsTable, PolicyName,
                                  Section, Size, setting)


DGT_MODES = ("off", "udp", "tcp", "quant")
DGT_MIN_BLOCK_BYTES = 64
#: a block is one datagram message; 1 MiB keeps a lost UDP block a small loss
DGT_MAX_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class SchedConfig(Section):
    """In which order and over which path transfers leave.

    P3, DGT and TSEngine (geomx/sched/p3.py, dgt.py, tsengine.py)."""

    bigarray_bound: int = setting(Integer(min=1, counts=True), 1000000,
                                  "Tensors with more elements are split across the global servers.")
    p3: bool = setting(Flag(), False,
                       "P3, priority-based parameter propagation (geomx/sched/p3.py; GeoMX's "
                       "ENABLE_P3): every key is sliced, slices are sent highest priority first "
                       "(earlier layers first) as soon as their gradient exists, and the push reply "
                       "carries the new value (no separate pull). Pair with training.layer_compute.")
    p3_slice_elements: int = setting(Integer(min=1, counts=True), 1000000,
                                     "P3 slice size in elements. The default is GeoMX's "
                                     "MXNET_KVSTORE_BIGARRAY_BOUND (1M), which leaves most layers "
                                     "unsliced; the P3 paper argues for finer slices (tens of thousands "
                                     "of parameters) so a high-priority slice waits less behind a "
                                     "low-priority one.")
    # DGT (geomx/sched/dgt.py; GeoMX's ENABLE_DGT, DMLC_K, ...:
    # docs/geomx-behaviour.md §4.4)
    dgt: str = setting(Choice(*DGT_MODES), "off",
                       "Differential gradient transmission of local -> global server pushes: "
                       "`udp`: low-contribution blocks on unreliable datagram channels "
                       "(GeoMX ENABLE_DGT=1); `tcp`: on deprioritised reliable channels (2); "
                       "`quant`: deprioritised and 4-bit quantised with error feedback (3).")
    dgt_block_bytes: int = setting(Size(), 4096,
                                   "DGT block size in bytes of the sent values (GeoMX DGT_BLOCK_SIZE); with "
                                   "a sparse or 1-bit codec (bsc, mpq, onebit), of the dense "
                                   "float32 values each block is ranked and encoded from.",
                                   key="dgt_block_size")
    dgt_k: float = setting(Fraction(percent=False), 0.5,
                           "DGT: fraction of blocks (by contribution) sent on the reliable, highest-"
                           "priority channel 0 (GeoMX DMLC_K; its scripts use 0.8).")
    dgt_k_min: float = setting(Fraction(percent=False), 0.2,
                               "DGT adaptive K: lower bound of K (DMLC_K_MIN).")
    dgt_adaptive_k: bool = setting(Flag(), True,
                                   "DGT: K_t = max(k_min, k * loss_t / loss_0) from the workers' "
                                   "training loss (ADAPTIVE_K_FLAG; GeoMX parses it but never uses it).")
    dgt_channels: int = setting(Integer(min=1, max=7), 3,
                                "DGT: low-priority channels C the rest of the blocks are banded over "
                                "(DMLC_UDP_CHANNEL_NUM).")
    dgt_alpha: float = setting(Fraction(percent=False), 0.3,
                               "DGT: weight of the old value in the per-block contribution EWMA "
                               "(DGT_CONTRIBUTION_ALPHA).")

    # TSEngine (geomx/sched/tsengine.py; GeoMX's ENABLE_INTER_TS / ENABLE_INTRA_TS /
    # MAX_GREED_RATE_TS -- docs/geomx-behaviour.md §4.5, docs/papers.md §2)
    tsengine_inter: bool = setting(Flag(), False,
                                   "TSEngine across DCs (GeoMX ENABLE_INTER_TS): the global "
                                   "scheduler pairs local servers into a merge tree for their "
                                   "pushes (by measured throughput) and relays the new model "
                                   "epidemically, each receiver forwarding it. FSA or HFA; "
                                   "with a codec each relay decodes, adds and encodes again.")
    tsengine_intra: bool = setting(Flag(), False,
                                   "TSEngine inside each DC (GeoMX ENABLE_INTRA_TS): the DC's "
                                   "local scheduler builds the same overlay among its workers and "
                                   "local server. FSA or HFA, any codec.")
    tsengine_max_greed_rate: float = setting(
        Fraction(percent=False), 0.9,
        "TSEngine: cap on the probability of sending the model over the fastest measured edge "
        "(p_greedy = min(known/candidates, this)); the rest explores (MAX_GREED_RATE_TS).")
    tsengine_expiry_iterations: int = setting(
        Integer(min=1, max=1000), 5,
        "TSEngine: rounds after which a throughput measurement is forgotten, so links are "
        "re-explored (docs/papers.md §2; GeoMX records the age but never uses it).")
    policy: str = setting(PolicyName("sched", "none"), "none",
                          "A transfer scheduler of your own, `\"file.py:Class\"` "
                          "(docs/extending.md); `none`: the keys above (P3, DGT, TSEngine) "
                          "decide.")
    options: tuple = setting(OptionsTable(), {},
                             "`[sched.options]`: the options of the scheduler `policy` names, "
                             "checked once at load against its options dataclass.",
                             default_doc="`{}`")

    @property
    def options_table(self) -> dict[str, Any]:
        """``[sched.options]`` as a plain table (arrays as lists)."""
        return OptionsTable().emit(self.options)

    def _check(self, path: str) -> None:
        if not DGT_MIN_BLOCK_BYTES <= self.dgt_block_bytes <= DGT_MAX_BLOCK_BYTES:
            raise ScenarioError(
                f"block size {self.dgt_block_bytes} B is out of range; allowed: "
                f"{DGT_MIN_BLOCK_BYTES} .. {DGT_MAX_BLOCK_BYTES} bytes",
                path=f"{path}.dgt_block_size", value=self.dgt_block_bytes)
        if self.dgt_k_min > self.dgt_k:
            raise ScenarioError(
                f"dgt_k_min = {self.dgt_k_min:g} is above dgt_k = {self.dgt_k:g}; allowed: "
                "dgt_k_min <= dgt_k", path=f"{path}.dgt_k_min", value=self.dgt_k_min)
