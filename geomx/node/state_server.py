"""State server (SS): the node that runs a sync algorithm's :class:`StateService`.

A node of its own, ``ss`` in the central DC, present only when the job's algorithm sets
``needs_state_server`` (ESync, docs/papers.md §5: the coordinator of local step counts).
Workers send ``STATE_QUERY`` messages (ESync: one per round, carrying the last step time
``c_r``, when that step ended ``e_r`` and how many local steps it took ``k_r``); the
service decides when and what to answer (ESync: once every worker's query for a round is
in, each worker's step budget, ``geomx/sync/esync.py``), and the SS sends the
``STATE_REPLY`` messages. Everything travels through the Transport, so the SS runs
unchanged in the emulator and over sockets. GeoMX itself has no state server: ESync is
"to be integrated" there (docs/geomx-behaviour.md §4.8).
"""

from __future__ import annotations

import asyncio
from typing import Any

from geomx.node.base import Node, NodeFailure
from geomx.node.scheduler import leave, register
from geomx.node.spec import JobSpec
from geomx.node.sync_contexts import StateServiceContext
from geomx.policy.sync import StateService
from geomx.wire import Kind, Message


class StateServer(Node):
    role = "state_server"

    def __init__(self, name: str, dc: str, transport: Any, services: Any, job: JobSpec):
        super().__init__(name, dc, transport, services)
        self.job = job
        self.workers = frozenset(job.all_workers)
        self.service: StateService = job.sync_algorithm.state_service(job)
        self.service_ctx = StateServiceContext(self)
        self._queries: dict[int, dict[str, Message]] = {}
        self._finished: set[str] = set()
        self._done = asyncio.Event()
        self.on(Kind.STATE_QUERY, self._on_query)
        self.on(Kind.SHUTDOWN, self._on_finished)

    def _on_query(self, msg: Message) -> None:
        if msg.src not in self.workers:
            self.reply_error(msg, f"{msg.src} is not a training worker of this job")
            return
        try:
            replies = self.service.on_query(self.service_ctx, msg.src, msg.version, msg.meta)
        except ValueError as e:
            self.reply_error(msg, str(e))
            return
        waiting = self._queries.setdefault(msg.version, {})
        waiting[msg.src] = msg
        if replies is None:
            return
        del self._queries[msg.version]
        for worker, query in waiting.items():
            self.post(query.reply(Kind.STATE_REPLY, meta=replies[worker]))

    def _on_finished(self, msg: Message) -> None:
        if msg.src in self.workers:
            self._finished.add(msg.src)
            if len(self._finished) == len(self.workers):
                self._done.set()

    def on_member_lost(self, worker: str) -> None:
        """The global scheduler says ``worker`` was lost and the job goes on
        (``[membership] on_worker_loss = "continue"``): it will neither query nor finish;
        rounds that waited only for it are answered now."""
        if worker not in self.workers or worker in self._finished:
            return
        self._finished.add(worker)
        self.record("state_worker_lost", worker=worker)
        for waiting in self._queries.values():
            waiting.pop(worker, None)
        try:
            answers = self.service.on_worker_lost(self.service_ctx, worker)
        except ValueError as e:
            raise NodeFailure(f"{self.name}: {e}") from None
        for round_, replies in sorted(answers.items()):
            for w, query in self._queries.pop(round_, {}).items():
                self.post(query.reply(Kind.STATE_REPLY, meta=replies[w]))
        if len(self._finished) == len(self.workers):
            self._done.set()

    def on_member_rejoined(self, worker: str) -> None:
        """The global scheduler says a lost ``worker`` restarted (geomx/node/restart.py):
        the service counts its queries again, and the job waits for its end again."""
        if worker not in self.workers or not self.job.sync_algorithm.state_service_rejoins:
            return
        self._finished.discard(worker)
        self.record("state_worker_rejoined", worker=worker)
        try:
            self.service.on_worker_rejoined(self.service_ctx, worker)
        except ValueError as e:
            raise NodeFailure(f"{self.name}: {e}") from None

    async def main(self) -> None:
        await register(self, self.job.global_scheduler)
        await self._done.wait()
        leave(self, self.job.global_scheduler)
