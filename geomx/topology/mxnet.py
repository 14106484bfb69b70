"""MXNET: the stock parameter server of NETSTORM's baseline, spread over a mesh of DCs.

docs/papers.md §1 (b): one global server per DC (``gs:{i}`` in the i-th DC), parameters
sharded evenly over them, every worker pushing to every server across the mesh (the
flat-PS node code, ``mode = "flat_ps"``). No central DC: the scheduler and the master
worker sit in the first DC. This is the topology of ``[topology] kind = "mxnet"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from geomx.policy.layout import DCShape, NodeLayout, assemble_layout, global_server_name
from geomx.policy.topology import Topology

__all__ = ["MXNet"]


class MXNet(Topology):
    """Flat PS with global server i in the i-th DC."""

    name = "mxnet"
    has_central_dc: ClassVar[bool] = False

    def layout(self, central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
               state_server: bool) -> NodeLayout:
        """``global_servers`` is ignored: one per DC, as the stock MXNet deployment of the
        paper."""
        if not parties:
            raise ValueError("a mesh topology needs at least one DC with workers")
        lay = assemble_layout("flat_ps", central_dc, parties, global_servers=len(parties),
                              state_server=state_server, local_tier={})
        for i, d in enumerate(parties):
            lay.dc_of[global_server_name(i)] = d.name
        return lay
