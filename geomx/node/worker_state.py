"""What a worker's kvstores learn from the servers and its training loop reads back.

The kvstore (geomx/node/kv_state.py, kvstore.py, kv_push.py) sees every reply the
servers send a worker; the training loop (geomx/node/trainer.py, or a user's program
through geomx/node/program.py) decides what to do between steps. This is what passes
between them, one object per worker (``Worker.state``): the newest round a reply
carried, a checkpoint round to save after, a stop the global tier announced, a stop
this worker asked for, and the worker's stores (a server that was taken over is told
their keys). How a job stops: docs/geomx-behaviour.md §1.4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Store", "WorkerState"]


class Store(Protocol):
    """What the worker and its program need of a kvstore
    (:class:`geomx.node.kvstore.KVStore`)."""

    def declare_keys(self, server: str) -> None: ...

    async def waitall(self) -> None: ...


@dataclass(slots=True)
class WorkerState:
    """One worker's shared state; the kvstore writes it through the methods below."""

    #: the newest round (``version``) any reply to this worker carried; a rejoined
    #: worker trains from the round after it (geomx/node/trainer.py)
    seen_version: int = 0
    #: a checkpoint round the servers announced that this worker has not saved yet
    #: (geomx/node/checkpoint.py); 0 = none
    ckpt_due: int = 0
    #: the global tier told this worker that the job stops
    stop_seen: bool = False
    #: this worker asked the job to stop: its next pushes carry the request
    stop_wanted: bool = False
    #: the kvstores this worker created, in order
    kv_stores: list[Store] = field(default_factory=list)

    def saw_version(self, version: int) -> None:
        """A reply carried round ``version``."""
        if version > self.seen_version:
            self.seen_version = version

    def saw_stop(self, seen: bool = True) -> None:
        """The global tier announced a stop (or, with ``seen=False``, the program chose
        to train on: ``kv.stop_requested = False``)."""
        self.stop_seen = bool(seen)

    def saw_checkpoint(self, round_: int) -> None:
        """The servers announced checkpoint round ``round_``."""
        if round_ > self.ckpt_due:
            self.ckpt_due = round_

    def take_checkpoint(self) -> int:
        """The checkpoint round to save now (0: none); it is then no longer due."""
        round_, self.ckpt_due = self.ckpt_due, 0
        return round_

    def want_stop(self) -> None:
        """Ask the whole job to stop, on this worker's next pushes."""
        self.stop_wanted = True

    def add_store(self, store: Store) -> None:
        """A kvstore this worker created."""
        self.kv_stores.append(store)
