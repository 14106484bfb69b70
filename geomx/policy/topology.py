"""Topologies: which nodes a job has, who aggregates whose values, over which trees.

A :class:`Topology` lays a job out (:meth:`Topology.layout` returns the
:class:`~geomx.policy.layout.NodeLayout`: names, DCs, roles and the tiers they form) for
HiPS (docs/geomx-behaviour.md §1), the flat parameter server, and the mesh kinds of
NETSTORM and its baselines (docs/papers.md §1). Name one in a scenario as
``[topology] kind = "file.py:Class"`` with its options in ``[topology.options]``
(docs/extending.md).

A :class:`MeshTopology` runs over a mesh of DCs with no central tier: one server per DC
aggregates for the others along trees, and the job's controller asks the topology object
for those trees (:meth:`MeshTopology.plan_trees`) at the start and, when the topology
measures links (:attr:`MeshTopology.measures_links`), again at an iteration boundary once
the measured rates changed or a link died. The plan (:class:`~geomx.policy.mesh_plan.MeshPlan`)
says which DCs are roots, with which share of the model, each root's tree and the routes
of every tree edge; the servers then carry it out (docs/papers.md §1 (b) Steps 3-6).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from geomx.policy.base import Policy
from geomx.policy.layout import DCShape, NodeLayout, assemble_mesh_layout
from geomx.policy.mesh_plan import AUX_QUEUE_LIMIT, Chunk, Link, MeshPlan, chunk_table

__all__ = ["Topology", "MeshTopology", "MeshView", "SendQueue"]


class Topology(Policy):
    """A job's shape: its nodes and tiers."""

    kind: ClassVar[str] = "topology"
    #: True: one DC of the scenario is central (global tier, master worker) and the others
    #: are parties. False: every DC is alike, with a server and workers, over a mesh; the
    #: first DC also hosts the scheduler and the master worker.
    has_central_dc: ClassVar[bool] = True

    @abc.abstractmethod
    def layout(self, central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
               state_server: bool) -> NodeLayout:
        """The job's nodes: ``central_dc`` hosts the global tier and the master worker,
        ``parties`` are the other DCs in file order, each with at least one worker."""


@dataclass(frozen=True)
class SendQueue:
    """A mesh server's send queue to one neighbouring DC, as a route choice sees it: the
    data messages ``waiting`` to be sent and those ``in_flight`` (sent, not yet
    acknowledged), their ``bytes`` together, and the ``window`` of unacknowledged
    messages the queue allows (docs/papers.md §1 (b) Step 5)."""

    waiting: int
    in_flight: int
    bytes: int
    window: int


@dataclass(frozen=True)
class MeshView:
    """What the controller knows when it asks for a plan.

    ``dcs`` in scenario order; ``links`` the mesh's ``[[wan]]`` links with their one-way
    delays. ``rates_bps[(u, v)]`` is the controller's rate estimate of the directed link
    u -> v in bit/s: seeded pseudo-random guesses before any measurement (NETSTORM's
    initial matrix, :func:`~geomx.policy.mesh_plan.initial_rates`), the servers' measured
    rates after (only for topologies that measure links), and 0 for a link that died
    (a ``link_down`` fault or a stalled transfer): a plan must not route over it.
    ``chunk_bytes`` is the size of a full chunk, for planners that weigh delay against
    transfer time.
    """

    plan_id: int
    dcs: tuple[str, ...]
    links: tuple[Link, ...]
    rates_bps: Mapping[tuple[str, str], float]
    chunk_bytes: float

    def delay_s(self, a: str, b: str) -> float:
        """One-way delay of the link between ``a`` and ``b`` (KeyError: no such link)."""
        for ln in self.links:
            if {ln.a, ln.b} == {a, b}:
                return ln.delay_s
        raise KeyError(f"no link {a}-{b} in the mesh")

    def live_links(self) -> tuple[Link, ...]:
        """The links that carry traffic both ways (rate > 0 in both directions)."""
        return tuple(ln for ln in self.links
                     if self.rates_bps.get((ln.a, ln.b), 0.0) > 0
                     and self.rates_bps.get((ln.b, ln.a), 0.0) > 0)


class MeshTopology(Topology):
    """A topology whose servers aggregate over trees of DCs (NETSTORM, MLNET, your own).

    Write :meth:`plan_trees`; the layout (one server per DC, a controller in the first
    DC) and the task division (:meth:`divide`) are given. Every plan is checked
    (:meth:`~geomx.policy.mesh_plan.MeshPlan.problem`) before a server sees it.
    """

    has_central_dc: ClassVar[bool] = False

    def layout(self, central_dc: str, parties: Sequence[DCShape], *, global_servers: int,
               state_server: bool) -> NodeLayout:
        """A server per DC (``ns:<dc>``) under the controller ``gh`` in ``central_dc``
        (``global_servers`` does not apply: there is one server per DC)."""
        return assemble_mesh_layout(central_dc, parties, state_server=state_server)

    @property
    def measures_links(self) -> bool:
        """True: servers time the chunks they receive and report link rates, and the
        controller plans again when they change (passive awareness, docs/papers.md §1
        Step 4). False: the first plan stays, unless a link dies."""
        return False

    @property
    def probe_after_s(self) -> float:
        """Seconds after which a link direction that no SPEED_REPORT has covered is probed
        (the controller has one end send a few measurement-sized messages over it, so a
        link the plans stopped using, or one that came back after a fault, is measured
        again); 0 = never. Only consulted when :attr:`measures_links`."""
        return 0.0

    @abc.abstractmethod
    def plan_trees(self, view: MeshView) -> MeshPlan:
        """The plan numbered ``view.plan_id`` for the mesh as ``view`` describes it: roots
        and shares (``perf``), each root's tree (``parent``) and the routes of every tree
        edge in both directions (``routes``). Raise ``ValueError`` when the live links
        cannot carry a plan (the controller keeps the previous one)."""

    def pick_route(self, plan: MeshPlan, routes: Sequence[Sequence[str]],
                   queue: Callable[[str], SendQueue], chunk_bytes: int,
                   now_s: float) -> int:
        """Which of ``routes`` (one tree edge's, main route first) a chunk of
        ``chunk_bytes`` leaves on at ``now_s`` (the node's clock), as an index;
        ``queue(dc)`` is this server's send queue to the neighbouring DC ``dc``. Each
        server has its own topology object, which may remember its earlier choices. Default: the queue rule of docs/papers.md §1 (b)
        Step 5: the main route unless its first-hop queue holds more than 2·L messages
        waiting, then the first auxiliary route whose first-hop queue holds fewer than L
        (:data:`~geomx.policy.mesh_plan.AUX_QUEUE_LIMIT`)."""
        if len(routes) < 2 or queue(routes[0][1]).waiting <= 2 * AUX_QUEUE_LIMIT:
            return 0
        for i, aux in enumerate(routes[1:], start=1):
            if queue(aux[1]).waiting < AUX_QUEUE_LIMIT:
                return i
        return 0

    def divide(self, plan: MeshPlan, key_sizes: Mapping[int, int],
               chunk_elements: int) -> list[Chunk]:
        """Cut the model into chunks and give each a root: by default chunks of at most
        ``chunk_elements`` elements, dealt to the roots in proportion to ``plan.perf``
        (NETSTORM's task division, :func:`~geomx.policy.mesh_plan.chunk_table`). Every
        server calls this with the same arguments and must get the same list."""
        return chunk_table(key_sizes, chunk_elements, plan.perf)
