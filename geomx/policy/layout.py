"""What a topology is given and what it lays out (:meth:`geomx.policy.Topology.layout`).

A *topology* decides which nodes a job has, in which data centre each runs, which role
each plays and which scheduler each registers with. GeoMX has one (HiPS: a local tier per
party DC under a global tier in the central DC, docs/geomx-behaviour.md §1); the vanilla
parameter-server baseline another (every worker talks to the global servers); the mesh
kinds (NETSTORM's multi-root trees, MLNET, docs/papers.md §1) put one server in every DC
(:func:`assemble_mesh_layout`) and no central tier.

A topology takes plain values (DC names, worker counts), never a scenario,
so both :mod:`geomx.cluster` (building the job) and the scenario's checks (is
``[[fault]] node`` a real node?) can call it without importing each other. Node names
follow docs/architecture.md, "Naming of nodes".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "GLOBAL_SCHEDULER", "MASTER_WORKER", "STATE_SERVER", "DCShape", "NodeLayout",
    "global_server_name", "worker_name", "assemble_layout",
    "MESH_MODE", "mesh_server_name", "assemble_mesh_layout",
]

#: The global scheduler (central DC; GeoMX's DMLC_PS_GLOBAL_ROOT_URI).
GLOBAL_SCHEDULER = "gh"
#: The master worker (central DC): initialises the global model and evaluates.
MASTER_WORKER = "mw"
#: ESync's state server (central DC; only in ESync jobs).
STATE_SERVER = "ss"
#: The JobSpec mode of a tree-aggregating mesh job (one mesh server per DC, a controller).
MESH_MODE = "netstorm"


def global_server_name(rank: int) -> str:
    return f"gs:{rank}"


def worker_name(dc: str, index: int) -> str:
    return f"w:{dc}:{index}"


def mesh_server_name(dc: str) -> str:
    return f"ns:{dc}"


@dataclass(frozen=True)
class DCShape:
    """A party data centre as a planner sees it: its name and how many workers it trains with."""

    name: str
    workers: int


@dataclass
class NodeLayout:
    """The nodes of a job: names, DCs, roles and the tiers they form.

    ``mode`` is the :class:`geomx.node.spec.JobSpec` mode the nodes run in (``"hips"``:
    workers push to their DC's local server; ``"flat_ps"``: to the global servers).
    Dicts keep a stable order (``roles`` is the order nodes are described in, ``nodes``
    the order they are listed to a person).
    """

    mode: str
    central_dc: str
    party_dcs: list[str]
    global_servers: list[str]
    local_scheduler_of: dict[str, str]     # party dc -> local scheduler ({} without a local tier)
    local_server_of: dict[str, str]        # party dc -> local server ({} without a local tier)
    workers_of: dict[str, list[str]]       # party dc -> workers, rank order
    dc_of: dict[str, str]                  # node -> dc
    roles: dict[str, str]                  # node -> role
    state_server: str = ""                 # "" = none
    global_scheduler: str = GLOBAL_SCHEDULER
    master_worker: str = MASTER_WORKER

    @property
    def all_workers(self) -> list[str]:
        return [w for dc in self.party_dcs for w in self.workers_of[dc]]

    @property
    def nodes(self) -> list[str]:
        """Every node: the central tier first, then each party's local tier, then the workers."""
        out = [self.global_scheduler, *self.global_servers, self.master_worker]
        if self.state_server:
            out.append(self.state_server)
        for dc in self.party_dcs:
            if dc in self.local_scheduler_of:
                out += [self.local_scheduler_of[dc], self.local_server_of[dc]]
        return out + self.all_workers


def assemble_layout(mode: str, central_dc: str, parties: Sequence[DCShape], *,
                    global_servers: int, state_server: bool,
                    local_tier: Mapping[str, tuple[str, str]]) -> NodeLayout:
    """The central tier and the workers every topology has, plus ``local_tier``
    (party dc -> (local scheduler, local server)) where the topology has one."""
    workers_of = {d.name: [worker_name(d.name, i) for i in range(d.workers)] for d in parties}
    gs = [global_server_name(r) for r in range(global_servers)]
    dc_of = {GLOBAL_SCHEDULER: central_dc, MASTER_WORKER: central_dc}
    dc_of.update({g: central_dc for g in gs})
    for dc, (lh, ls) in local_tier.items():
        dc_of[lh] = dc
        dc_of[ls] = dc
    for dc, names in workers_of.items():
        dc_of.update({w: dc for w in names})
    ss = STATE_SERVER if state_server else ""
    if ss:
        dc_of[ss] = central_dc
    roles = {GLOBAL_SCHEDULER: "global_scheduler", MASTER_WORKER: "master_worker"}
    roles.update({g: "global_server" for g in gs})
    roles.update({lh: "local_scheduler" for lh, _ in local_tier.values()})
    roles.update({ls: "local_server" for _, ls in local_tier.values()})
    roles.update({w: "worker" for d in parties for w in workers_of[d.name]})
    if ss:
        roles[ss] = "state_server"
    return NodeLayout(
        mode=mode, central_dc=central_dc, party_dcs=[d.name for d in parties], global_servers=gs,
        local_scheduler_of={dc: lh for dc, (lh, _) in local_tier.items()},
        local_server_of={dc: ls for dc, (_, ls) in local_tier.items()},
        workers_of=workers_of, dc_of=dc_of, roles=roles, state_server=ss)


def assemble_mesh_layout(central_dc: str, parties: Sequence[DCShape], *,
                         state_server: bool) -> NodeLayout:
    """One tree-aggregating server per DC (``ns:<dc>``, role ``mesh_server``; its DC's
    workers push to it, so it is the DC's ``local_server_of`` entry), listed as the job's
    servers so the master's commands and the workers' SHUTDOWN reach every one;
    ``central_dc`` (the first DC of a mesh scenario) hosts the controller ``gh``, which
    keeps the global scheduler's role (every runtime starts, books and addresses it as
    one) and the master worker (docs/papers.md §1 (b) "Entities")."""
    if not parties:
        raise ValueError("a mesh topology needs at least one DC with workers")
    if state_server:
        raise ValueError("a mesh topology has no state server (ESync); allowed: sync = fsa")
    lay = assemble_layout(MESH_MODE, central_dc, parties, global_servers=0, state_server=False,
                          local_tier={})
    lay.global_servers = [mesh_server_name(d.name) for d in parties]
    lay.local_server_of = {d.name: mesh_server_name(d.name) for d in parties}
    for d in parties:
        lay.dc_of[mesh_server_name(d.name)] = d.name
        lay.roles[mesh_server_name(d.name)] = "mesh_server"
    lay.dc_of[MASTER_WORKER] = central_dc
    return lay
