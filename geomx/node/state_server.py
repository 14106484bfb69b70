"""State server (SS): ESync's coordinator of local step counts (docs/papers.md §5).

A node of its own, ``ss`` in the central DC, present only when ``sync.algorithm =
'esync'``. Each worker sends one ``STATE_QUERY`` per round carrying its last step time
(``c_r``), when that step ended (``e_r``) and how many local steps it took (``k_r``);
once every worker's query for a round is in, the SS answers each with a
``STATE_REPLY`` holding its step budget for that round, computed with the paper's ready
rule (``geomx/sync/esync.py``). Everything travels through the Transport, so the SS runs
unchanged in the emulator and over sockets. GeoMX itself has no state server: ESync is
"to be integrated" there (docs/geomx-behaviour.md §4.8).
"""

from __future__ import annotations

import asyncio
from typing import Any

from geomx.node.base import Node
from geomx.node.scheduler import leave, register
from geomx.node.spec import JobSpec
from geomx.sync.esync import StateBoard
from geomx.wire import Kind, Message


class StateServer(Node):
    role = "state_server"

    def __init__(self, name: str, dc: str, transport: Any, services: Any, job: JobSpec):
        super().__init__(name, dc, transport, services)
        self.job = job
        self.board = StateBoard(list(job.all_workers),
                                epsilon_s=float(job.sync.get("esync_epsilon_s", 0.0)),
                                max_steps=int(job.sync.get("esync_max_local_steps", 64)))
        self._queries: dict[int, dict[str, Message]] = {}
        self._finished: set[str] = set()
        self._done = asyncio.Event()
        self.on(Kind.STATE_QUERY, self._on_query)
        self.on(Kind.SHUTDOWN, self._on_finished)

    def _on_query(self, msg: Message) -> None:
        if msg.src not in self.board.workers:
            self.reply_error(msg, f"{msg.src} is not a training worker of this job")
            return
        step_s = msg.meta.get("step_s")
        budgets = self.board.report(msg.src, round_=msg.version,
                                    step_s=None if step_s is None else float(step_s),
                                    end_s=msg.meta.get("end_s"),
                                    steps=int(msg.meta.get("steps", 0)))
        waiting = self._queries.setdefault(msg.version, {})
        waiting[msg.src] = msg
        if budgets is None:
            return
        del self._queries[msg.version]
        self.record("esync_round", round=msg.version, budgets=budgets)
        for worker, query in waiting.items():
            self.post(query.reply(Kind.STATE_REPLY, meta={"steps": budgets[worker]}))

    def _on_finished(self, msg: Message) -> None:
        if msg.src in self.board.workers:
            self._finished.add(msg.src)
            if len(self._finished) == len(self.board.workers):
                self._done.set()

    async def main(self) -> None:
        await register(self, self.job.global_scheduler)
        await self._done.wait()
        leave(self, self.job.global_scheduler)
