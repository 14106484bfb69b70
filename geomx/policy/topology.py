"""Topologies: which nodes a job has, who aggregates whose values, over which trees.

A :class:`Topology` lays a job out (:meth:`Topology.layout` returns the
:class:`~geomx.policy.layout.NodeLayout`: names, DCs, roles and the tiers they form) for
HiPS (docs/geomx-behaviour.md §1), the flat parameter server, and the mesh kinds of
NETSTORM and its baselines (docs/papers.md §1). Name one in a scenario as
``[topology] kind = "file.py:Class"`` with its options in ``[topology.options]``
(docs/extending.md).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

from geomx.policy.base import Policy
from geomx.policy.layout import DCShape, NodeLayout

__all__ = ["Topology"]


class Topology(Policy):
    """A job's shape: its nodes and tiers."""

    kind: ClassVar[str] = "topology"

    @abc.abstractmethod
    def layout(self, central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
               state_server: bool) -> NodeLayout:
        """The job's nodes: ``central_dc`` hosts the global tier and the master worker,
        ``parties`` are the other DCs in file order, each with at least one worker."""
