"""Worker and master worker roles: a node that runs a training program through a kvstore.

The program is ordinary async code written against ``geomx.kv`` (see ``geomx/node/
trainer.py`` for the built-in one, shaped like GeoMX's ``examples/cnn.py``). The node
registers with its schedulers, makes itself the ``current_node`` so ``geomx.kv.create``
finds it, runs the program, and then ends the job the GeoMX way
(docs/geomx-behaviour.md §1.4): a barrier of the DC's workers, the DC's rank-0 worker
tells its local server to stop, everyone leaves.
"""

from __future__ import annotations

import math
from typing import Any, Awaitable, Callable

from geomx.node.kvstore import current_node
from geomx.node.base import Node
from geomx.node.link_codec import LinkCodec
from geomx.node.scheduler import barrier, leave, register
from geomx.node.sched_context import SchedNodeContext
from geomx.node.spec import JobSpec
from geomx.node.worker_state import WorkerState
from geomx.policy.scheduling import SchedWorkerSide, worker_side_of
from geomx.wire import Kind, Message

Program = Callable[["Worker"], Awaitable[Any]]


class Worker(Node):
    role = "worker"

    def __init__(self, name: str, dc: str, transport: Any, services: Any, job: JobSpec,
                 program: Program, *, rank: int = 0, is_master: bool = False,
                 compute_s_per_iter: float = 0.0):
        super().__init__(name, dc, transport, services)
        self.job = job
        self.rank = rank
        self.is_master = is_master
        self.program = program
        self.compute_s_per_iter = compute_s_per_iter
        self.iteration = 0
        self.result: Any = None
        #: what its kvstores learn from replies and its training loop reads back
        self.state = WorkerState()
        # Workers talk to their local server over the LAN; in the flat-PS baseline they
        # talk to the global servers across the WAN, so the WAN codec applies.
        self.push_tier = "wan" if (job.mode == "flat_ps" or is_master) else "lan"
        # The codec policy decides per tier (Bi-Sparse only on "wan", FP16 on both, ...).
        self.lan_codec = LinkCodec(job.codec, num_dcs=len(job.party_dcs))
        #: the transfer schedulers' worker side (geomx/policy/scheduling.py); the kvstore
        #: hands it each transfer (None: plain pushes and pulls)
        self.sched: SchedWorkerSide | None = worker_side_of(
            job.transfer_schedulers, SchedNodeContext(self, job, codec_attr="lan_codec"))

    @property
    def rejoining(self) -> bool:
        """This process is a worker the job lost, come back (geomx/node/restart.py): it
        skips the start-up barrier its DC passed long ago and trains from the round after
        the model it pulls (geomx/node/trainer.py)."""
        return self.restarted_as == "rejoin"

    def before_resend(self, server: str) -> None:
        """Its local server was taken over: declare the keys to the new process first (the
        master worker's global servers take theirs from the local servers)."""
        if self.is_master:
            return
        for kv in self.state.kv_stores:
            kv.declare_keys(server)

    def _barrier_scheduler(self) -> str:
        if self.job.mode == "hips" and not self.is_master:
            return self.job.local_scheduler_of[self.dc]
        return self.job.global_scheduler

    async def worker_barrier(self, tag: str, *, timeout_s: float | None = None) -> None:
        """Barrier over this DC's training workers."""
        if self.is_master:
            return
        group = f"workers:{self.dc}:{tag}"
        await barrier(self, self._barrier_scheduler(), group, len(self.job.workers_of[self.dc]),
                      timeout_s=timeout_s)

    async def main(self) -> None:
        schedulers = self.job.schedulers_of(self.name)
        for s in schedulers:
            await register(self, s)
        current_node.set(self)
        self.result = await self.program(self)
        if self.sched is not None:
            await self.sched.drain()  # forward what this worker still owes others
        if self.is_master and self.job.master_says_goodbye:
            # no INIT or command of the master's is to come (JobSpec.master_says_goodbye)
            for gs in self.job.global_servers:
                self.post(Message(Kind.SHUTDOWN, self.name, gs))
        if not self.is_master:
            # unbounded: a worker that finished early may wait for a slower one's whole
            # remaining training (flat PS, asynchronous); liveness is the heartbeats' job
            await self.worker_barrier("done", timeout_s=math.inf)
            if self.job.mode == "hips":
                # with on_worker_loss = "continue" rank 0 may be gone: each worker tells
                if self.rank == 0 or self.job.on_worker_loss == "continue":
                    self.post(Message(Kind.SHUTDOWN, self.name,
                                      self.job.local_server_of[self.dc]))
            else:
                for gs in self.job.global_servers:
                    self.post(Message(Kind.SHUTDOWN, self.name, gs))
        for s in schedulers:
            leave(self, s)
