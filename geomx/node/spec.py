"""Plain descriptions of a job that node code needs (no scenario parsing down here).

``geomx/cluster.py`` builds a :class:`JobSpec` from a validated scenario; nodes only read
it. Keeping this below ``scenario.py`` keeps the layering of docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from geomx.policy.registry import policy_class
from geomx.policy.scheduling import TransferScheduler
from geomx.policy.sync import SyncAlgorithm


def sync_algorithm(sync: Mapping[str, Any]) -> SyncAlgorithm:
    """The algorithm a job's ``[sync]`` table names (geomx/policy/registry.py), built
    with its options; :class:`JobSpec` does it once, nodes only use the object."""
    cls = policy_class("sync", str(sync.get("algorithm", "fsa")))
    return cls(cls.options_from_sync(sync))


@dataclass(frozen=True)
class KeySpec:
    """One parameter tensor: its kvstore key, shape and dtype."""

    key: int
    shape: tuple[int, ...]
    dtype: str = "<f4"

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class JobSpec:
    """Who is in the job and how it synchronises. Identical on every node."""

    mode: str                                  # "hips" | "flat_ps" | "netstorm"
    central_dc: str
    party_dcs: list[str]
    global_scheduler: str
    global_servers: list[str]
    master_worker: str
    local_scheduler_of: dict[str, str]         # dc -> local scheduler (hips only)
    local_server_of: dict[str, str]            # dc -> local server (hips only)
    workers_of: dict[str, list[str]]           # dc -> worker names, rank order
    dc_of: dict[str, str]                      # node -> dc
    bigarray_bound: int = 1_000_000
    seed: int = 0
    sync: dict[str, Any] = field(default_factory=lambda: {"algorithm": "fsa"})
    codec: dict[str, Any] = field(default_factory=lambda: {"type": "none"})
    #: the job's transfer schedulers (geomx/policy/scheduling.py), built once from the
    #: scenario's [sched]; each node asks them for its side
    transfer_schedulers: tuple[TransferScheduler, ...] = ()
    heartbeat_interval_s: float = 0.0
    heartbeat_timeout_s: float = 0.0
    register_timeout_s: float = 0.0
    request_timeout_s: float = 0.0             # 0 = requests wait forever
    state_server: str = ""                     # ESync's state server ("" = none)
    #: NETSTORM / MLNET (mode "netstorm"): the controller's and servers' settings, plain
    #: values from [netstorm] and the mesh (geomx/node/mesh_server.py reads them)
    mesh: dict[str, Any] = field(default_factory=dict)
    #: [checkpoint] (geomx/node/checkpoint.py): every_rounds, every_s, keep, resume_from;
    #: the runtime adds ``dir`` (this run's checkpoints folder). {} = off
    checkpoint: dict[str, Any] = field(default_factory=dict)
    #: [membership] on_worker_loss: "fail" (stop the job) | "continue" (the DC goes on)
    on_worker_loss: str = "fail"
    #: [membership] on_server_loss: "fail" | "wait" (a local server may be taken over),
    #: and how long the others wait for it (server_loss_timeout)
    on_server_loss: str = "fail"
    server_loss_timeout_s: float = 0.0
    #: the algorithm ``sync`` names, built once with its options from that table
    #: (geomx/policy/sync.py); each node asks it for its side
    sync_algorithm: SyncAlgorithm = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.sync_algorithm = sync_algorithm(self.sync)
        problem = self.sync_algorithm.check(self)
        if problem:
            raise ValueError(problem)

    @property
    def num_all_workers(self) -> int:
        return sum(len(v) for v in self.workers_of.values())

    @property
    def all_workers(self) -> list[str]:
        return [w for dc in self.party_dcs for w in self.workers_of.get(dc, [])]

    @property
    def master_says_goodbye(self) -> bool:
        """The master worker's servers (the global tier) hear from it when its program
        returns, and stop only after that: on a flat PS and a mesh, where the workers
        talk to those servers themselves and could finish before a late master's
        commands and INITs arrive (geomx/node/global_server.py, ``_on_init``). Under
        HiPS the global servers wait for the master's INITs before any round."""
        return self.mode != "hips"

    def servers_of_worker(self, worker: str) -> list[str]:
        """The servers a worker pushes to: its DC's local server (HiPS) or the global servers."""
        if self.mode == "flat_ps":
            return list(self.global_servers)
        return [self.local_server_of[self.dc_of[worker]]]

    def replaceable_servers(self) -> set[str]:
        """Servers a new process may take over ([membership] on_server_loss = "wait"):
        the local servers, and the global servers when checkpoints are on (a successor
        takes its optimizer's configuration and state from its own last snapshot)."""
        if self.on_server_loss != "wait" or self.mode != "hips":
            return set()
        out = set(self.local_server_of.values())
        if self.checkpoint.get("every_rounds") or self.checkpoint.get("every_s"):
            out |= set(self.global_servers)
        return out

    def scheduler_members(self, scheduler: str) -> list[str]:
        """Nodes that register with ``scheduler`` (excluding itself)."""
        if scheduler == self.global_scheduler:
            members = list(self.global_servers) + [self.master_worker]
            if self.mode in ("flat_ps", "netstorm"):
                # flat PS: workers talk to the global tier; netstorm: the controller is
                # every node's one scheduler (the local servers are the global_servers)
                members += self.all_workers
            else:
                members += [self.local_server_of[d] for d in self.party_dcs]
            if self.state_server:
                # workers learn the state server's address from the global scheduler
                members.append(self.state_server)
                if self.mode != "flat_ps":
                    members += self.all_workers
            return members
        for dc, s in self.local_scheduler_of.items():
            if s == scheduler:
                return [self.local_server_of[dc]] + list(self.workers_of.get(dc, []))
        raise KeyError(f"unknown scheduler {scheduler!r}")

    def schedulers_of(self, node: str) -> list[str]:
        """The schedulers ``node`` registers with, global tier first."""
        out = []
        if node in self.scheduler_members(self.global_scheduler):
            out.append(self.global_scheduler)
        dc = self.dc_of[node]
        if self.mode == "hips" and dc in self.local_scheduler_of:
            lh = self.local_scheduler_of[dc]
            if node in self.scheduler_members(lh):
                out.append(lh)
        return out

    def all_nodes(self) -> list[str]:
        nodes = [self.global_scheduler, *self.global_servers, self.master_worker]
        if self.state_server:
            nodes.append(self.state_server)
        if self.mode == "hips":
            for dc in self.party_dcs:
                nodes += [self.local_scheduler_of[dc], self.local_server_of[dc]]
        nodes += self.all_workers
        return nodes
