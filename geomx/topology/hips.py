"""HiPS: GeoMX's hierarchical parameter server (docs/geomx-behaviour.md §1, docs/architecture.md).

Every party DC gets a local scheduler (``lh:<dc>``) and a local server (``ls:<dc>``); its
workers register with and push to them, and only the local server crosses the WAN to the
global servers in the central DC. This is the topology of ``[topology] kind = "hips"``.
"""

from __future__ import annotations

from collections.abc import Sequence

from geomx.policy.layout import DCShape, NodeLayout, assemble_layout
from geomx.policy.topology import Topology

__all__ = ["HiPS", "MODE", "local_scheduler_name", "local_server_name"]

#: The JobSpec mode of this topology's nodes.
MODE = "hips"


def local_scheduler_name(dc: str) -> str:
    return f"lh:{dc}"


def local_server_name(dc: str) -> str:
    return f"ls:{dc}"


class HiPS(Topology):
    """The HiPS star: a local tier in each party DC under the central global tier."""

    name = "hips"

    def layout(self, central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
               state_server: bool) -> NodeLayout:
        local_tier = {d.name: (local_scheduler_name(d.name), local_server_name(d.name))
                      for d in parties}
        return assemble_layout(MODE, central_dc, parties, global_servers=global_servers,
                               state_server=state_server, local_tier=local_tier)
