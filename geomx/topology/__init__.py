"""Topology planning: which nodes a job has, where they run and whom they register with.

``[topology] kind`` names a :class:`~geomx.policy.topology.Topology`: a built-in of
:data:`geomx.policy.registry.BUILTIN` (``hips``: GeoMX's two tiers, :mod:`.hips`;
``flat``: the vanilla parameter server, :mod:`.flat`; over a mesh of DCs, docs/papers.md
§1: ``netstorm`` and ``mlnet``, tree-aggregating :class:`~geomx.policy.topology.MeshTopology`
s planned by :mod:`.netstorm_plan`, and ``mxnet``, one flat-PS server per DC) or a user's
class (``"file.py:Class"``, options in ``[topology.options]``).
Two modules here serve both runtimes rather than a topology: :mod:`geomx.topology.routes`
(the WAN routing rule and path loss) and :mod:`geomx.topology.link_faults` (link failures
as a timeline of routing states).
This is a policy package: it takes plain values and imports nothing
from the scenario, the cluster, the nodes or the runtimes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from geomx.policy.layout import (GLOBAL_SCHEDULER, MASTER_WORKER, STATE_SERVER, DCShape,
                                 NodeLayout)
from geomx.policy.loading import build_policy
from geomx.policy.registry import BUILTIN, policy_class
from geomx.policy.topology import MeshTopology, Topology

__all__ = [
    "GLOBAL_SCHEDULER", "MASTER_WORKER", "STATE_SERVER", "DCShape", "NodeLayout",
    "KINDS", "MESH_KINDS", "plan_nodes", "topology_class", "make_topology", "is_mesh",
    "aggregates_over_trees",
]

#: The built-in ``[topology] kind`` names.
KINDS: tuple[str, ...] = tuple(BUILTIN["topology"])


def topology_class(kind: str) -> type[Topology]:
    """The class ``kind`` names (a built-in name, ``file.py:Class``, ...); raises
    :class:`~geomx.policy.registry.PolicyError` (a ``ValueError``) naming the allowed ones."""
    return policy_class("topology", kind)


def is_mesh(kind: str) -> bool:
    """Whether ``kind`` lays the job over a mesh of DCs with no central DC."""
    return not topology_class(kind).has_central_dc


def aggregates_over_trees(kind: str) -> bool:
    """Whether ``kind``'s servers aggregate over a controller's trees (a MeshTopology)."""
    return issubclass(topology_class(kind), MeshTopology)


#: Built-in kinds over a mesh of DCs, without a central DC (docs/papers.md §1).
MESH_KINDS: tuple[str, ...] = tuple(k for k in KINDS if is_mesh(k))


def make_topology(kind: str | Topology, *, options: Mapping[str, Any] | None = None,
                  sections: Mapping[str, Any] | None = None) -> Topology:
    """The topology object of a job: ``kind`` itself when it is one; else the class
    ``kind`` names, built from ``options`` (``[topology.options]``) or, for a built-in
    whose options live in an existing scenario section (its ``scenario_section``, read by
    its ``from_section``), from ``sections[<that section>]`` when no options are given."""
    if isinstance(kind, Topology):
        return kind
    cls = topology_class(kind)
    section = str(getattr(cls, "scenario_section", ""))
    if not options and section and sections is not None and section in sections:
        built: Topology = getattr(cls, "from_section")(sections[section])
        return built
    topology: Topology = build_policy("topology", kind, options)
    return topology


def plan_nodes(kind: str | Topology, central_dc: str, parties: Sequence[DCShape], *,
               global_servers: int, state_server: bool) -> NodeLayout:
    """The nodes of a job laid out by ``kind``: a topology object, or a name (a built-in
    of :data:`KINDS`, ``file.py:Class``, ...) built with its default options."""
    topology = make_topology(kind)
    return topology.layout(central_dc, parties, global_servers=global_servers,
                           state_server=state_server)
