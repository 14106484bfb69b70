"""A flat parameter server: the vanilla MXNet baseline GeoMX is compared against.

No local tier: every worker registers with the global scheduler and pushes its gradients
across the WAN to the global servers itself (GeoMX's papers' "vanilla PS"). This is the
topology of ``[topology] kind = "flat"``.
"""

from __future__ import annotations

from collections.abc import Sequence

from geomx.policy.layout import DCShape, NodeLayout, assemble_layout
from geomx.policy.topology import Topology

__all__ = ["FlatPS", "MODE"]

#: The JobSpec mode of this topology's nodes.
MODE = "flat_ps"


class FlatPS(Topology):
    """Workers in the party DCs, servers only in the central DC."""

    name = "flat"

    def layout(self, central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
               state_server: bool) -> NodeLayout:
        return assemble_layout(MODE, central_dc, parties, global_servers=global_servers,
                               state_server=state_server, local_tier={})
