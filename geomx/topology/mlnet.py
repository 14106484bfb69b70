"""MLNET: a static bounded fan-in overlay per root, the NETSTORM paper's baseline.

docs/papers.md §6.6: every DC's server owns an equal share of the parameters and
aggregates it over its own balanced ``fan_in``-ary tree, laid out by hop count only (not
network-aware), so the first plan stays for the whole run
(:func:`geomx.topology.netstorm_plan.plan_mlnet`). This is the topology of
``[topology] kind = "mlnet"``; ``fan_in`` comes from ``[netstorm] mlnet_fan_in``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from geomx.policy.mesh_plan import MeshPlan
from geomx.policy.options import PolicyOptions
from geomx.policy.topology import MeshTopology, MeshView
from geomx.topology.netstorm_plan import plan_mlnet

__all__ = ["MLNet", "MLNetOptions"]


@dataclass(frozen=True)
class MLNetOptions(PolicyOptions):
    """The overlay's fan-in (``[netstorm] mlnet_fan_in``)."""

    fan_in: int = 5

    def __post_init__(self) -> None:
        if self.fan_in < 1:
            raise ValueError(f"fan_in = {self.fan_in}; allowed: an integer >= 1")


class MLNet(MeshTopology):
    """MLNET's static overlay behind the mesh topology API."""

    name = "mlnet"
    Options = MLNetOptions
    options: MLNetOptions
    #: the scenario section its options are read from (:meth:`from_section`)
    scenario_section: ClassVar[str] = "netstorm"

    @classmethod
    def from_section(cls, netstorm: Any) -> "MLNet":
        """Built from the scenario's ``[netstorm]`` section (its parsed object)."""
        return cls(MLNetOptions(fan_in=int(netstorm.mlnet_fan_in)))

    def plan_trees(self, view: MeshView) -> MeshPlan:
        return plan_mlnet(view.dcs, view.links, fan_in=self.options.fan_in,
                          plan_id=view.plan_id)
