"""The contexts a sync algorithm's sides get instead of the node (geomx/policy/sync.py).

Each class is a thin adapter over one role: it offers exactly the operations of
:class:`~geomx.policy.sync.GlobalContext`, :class:`~geomx.policy.sync.LocalContext` or
:class:`~geomx.policy.sync.WorkerContext` and nothing else of the node, so a side cannot
come to depend on a node's private state. They sit on the per-message path (a global
server's side is called once per push), so the role-specific operations are the node's
own bound methods, taken once when the context is built, and ``__slots__`` keeps the
attribute reads cheap. The operations every context shares (``record``, ``post``, ...)
go through the node on each call, so they follow the node when its methods are
replaced (tests stub ``record`` and ``post``).
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, Callable

from geomx.wire import Message

__all__ = ["GlobalSyncContext", "LocalSyncContext", "WorkerSyncContext",
           "StateServiceContext"]


class _NodeOps:
    """What every policy context offers (geomx/policy/context.py), on ``self._node``."""

    __slots__ = ("_node",)

    def __init__(self, node: Any):
        self._node = node

    @property
    def node_name(self) -> str:
        return self._node.name

    @property
    def dc(self) -> str:
        return self._node.dc

    def now(self) -> float:
        return self._node.now()

    def record(self, event: str, **fields: Any) -> None:
        self._node.record(event, **fields)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self._node.spawn(coro)

    async def request(self, msg: Message) -> Message:
        return await self._node.request(msg)

    def post(self, msg: Message) -> None:
        self._node.post(msg)


class GlobalSyncContext(_NodeOps):
    """A global server (geomx/node/global_server.py) as its sync side sees it."""

    __slots__ = ("contributors_of", "accumulate", "apply_update", "reply_push",
                 "reply_error", "is_checkpoint_round")

    def __init__(self, gs: Any):
        super().__init__(gs)
        self.contributors_of = gs.contributors_of
        self.accumulate = gs.accumulate
        self.apply_update = gs.apply_update
        self.reply_push = gs.reply_push
        self.reply_error = gs.reply_error
        self.is_checkpoint_round = gs.is_checkpoint_round

    @property
    def pushers(self) -> Sequence[str]:
        return self._node.pushers

    @property
    def departed(self) -> set[str]:
        return self._node.departed

    @property
    def stop_requested(self) -> bool:
        return self._node.stop_requested

    @property
    def has_optimizer(self) -> bool:
        return self._node.optimizer is not None

    def slot(self, key: int, part: int) -> Any:
        return self._node.slots[(key, part)]


class LocalSyncContext(_NodeOps):
    """A local server (geomx/node/local_server.py) as its sync side sees it."""

    __slots__ = ("exchange_global", "answer_workers")

    def __init__(self, ls: Any):
        super().__init__(ls)
        self.exchange_global = ls.exchange_global
        self.answer_workers = ls.answer_workers

    @property
    def num_dcs(self) -> int:
        return len(self._node.job.party_dcs)

    @property
    def workers(self) -> Sequence[str]:
        return self._node.workers


class WorkerSyncContext(_NodeOps):
    """A worker's training loop (geomx/node/trainer.py) as its sync side sees it."""

    __slots__ = ("kv", "params", "pull_weights", "max_iterations", "_local_optimizer")

    def __init__(self, node: Any, *, kv: Any, params: list[Any], pull_weights: bool,
                 local_optimizer: Callable[[], Any], max_iterations: int = 0):
        super().__init__(node)
        self.kv = kv
        self.params = params
        self.pull_weights = pull_weights
        self.max_iterations = max_iterations
        self._local_optimizer = local_optimizer

    @property
    def state_server(self) -> str:
        return self._node.job.state_server

    def local_optimizer(self) -> Any:
        return self._local_optimizer()


class StateServiceContext(_NodeOps):
    """The state server (geomx/node/state_server.py) as its state service sees it."""

    __slots__ = ()
