"""The sync-policy layer: when servers aggregate and reply, and what a worker does per step.

A synchronisation algorithm touches three places, and each gets one policy object:

* the **global server** (:class:`GlobalSyncPolicy`): when a pushed value is applied and
  when the push is answered (docs/geomx-behaviour.md §3.2 FSA, §3.3 MixedSync);
* the **local server** (:class:`LocalSyncPolicy`): what it does once every worker of its
  DC has pushed a key -- forward the DC sum across the WAN (FSA, MixedSync, ESync) or
  average locally and only every K2-th time talk to the global tier (HFA, §3.4);
* the **worker** (:class:`WorkerSync`): what a training step sends and receives -- a
  gradient every step (FSA, MixedSync), local steps with a push every K1 (HFA), or local
  steps sized by a state server (ESync, docs/papers.md §5).

Nodes hold one policy each and call it; nothing algorithm-specific lives in the node
code. ``[sync] algorithm`` in the scenario picks the policies; the kvstore type a GeoMX
user writes (``dist_sync`` / ``dist_async``) maps to FSA / MixedSync
(:func:`kvstore_type`), and the scenario wins when they disagree (``geomx.kv``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from geomx.wire import Message

if TYPE_CHECKING:  # pragma: no cover
    from geomx.sync.tensors import Value

SYNC_ALGORITHMS = ("fsa", "mixed", "hfa", "esync")

#: Algorithms whose workers take local optimizer steps and whose global servers only sum
#: (HFA: model deltas; ESync: model deltas). A global optimizer is not used with them.
LOCAL_STEP_ALGORITHMS = ("hfa", "esync")


class GlobalSyncPolicy(Protocol):
    """Decides, at a global server, when a push is applied and when it is answered."""

    name: str
    #: False: the store holds a plain sum and a ``set_optimizer`` command is ignored.
    uses_optimizer: bool

    def start_problem(self, gs: Any) -> str | None:
        """Why the job cannot start on this server (checked at the first INIT), or None."""
        ...

    def on_push(self, gs: Any, msg: Message, slot: Any, value: "Value") -> None:
        """A decoded push from ``msg.src`` for ``slot``."""
        ...

    def on_pusher_left(self, gs: Any, pusher: str) -> None:
        """``pusher`` (a local server, or a worker in flat-PS mode) has finished."""
        ...


class LocalSyncPolicy(Protocol):
    """Decides what a local server does with its DC's aggregated push of one key."""

    name: str

    def on_initialized(self, ls: Any, key: int, slot: Any) -> None:
        """``slot.store`` now holds the global initial value of ``key``."""
        ...

    async def on_round(self, ls: Any, key: int, slot: Any, merged: "Value",
                       waiting: list[Message], stop: bool) -> None:
        """Every local worker pushed ``key`` (their sum is ``merged``); answer ``waiting``."""
        ...


class WorkerSync(Protocol):
    """One worker's side of the algorithm, driven by the training loop once per step."""

    name: str

    async def step(self, iteration: int, grads: list[Any]) -> bool:
        """Apply this step's gradients (locally and/or through the kvstore).

        Returns True when the worker's parameters are now a model every worker shares
        (the point where evaluating is meaningful: every step for FSA, after a global
        sync for HFA, after a round for ESync)."""
        ...

    async def finish(self) -> None:
        """The training loop is over (say goodbye to helpers such as a state server)."""
        ...


def algorithm_of(sync: dict[str, Any]) -> str:
    algo = str(sync.get("algorithm", "fsa"))
    if algo not in SYNC_ALGORITHMS:
        raise ValueError(f"sync.algorithm = {algo!r}; allowed: {', '.join(SYNC_ALGORITHMS)}")
    return algo


def kvstore_type(algorithm: str) -> str:
    """The GeoMX kvstore type a user would create for ``algorithm`` (HFA and ESync ride
    on ``dist_sync`` as in GeoMX, where HFA is ``dist_sync`` plus an environment flag)."""
    return "dist_async" if algorithm == "mixed" else "dist_sync"


def uses_global_optimizer(algorithm: str) -> bool:
    return algorithm not in LOCAL_STEP_ALGORITHMS


def needs_state_server(algorithm: str) -> bool:
    """ESync's workers ask a state server how many local steps to take (a node of its own)."""
    return algorithm == "esync"


def make_global_policy(job: Any) -> GlobalSyncPolicy:
    """The global servers' policy for ``job.sync``."""
    from geomx.sync.fsa import FullySync
    from geomx.sync.mixed import AsyncAcrossDCs

    algo = algorithm_of(job.sync)
    if algo == "fsa":
        return FullySync()
    if algo == "mixed":
        return AsyncAcrossDCs(staleness=int(job.sync.get("staleness", 0) or 0))
    # HFA and ESync push model deltas that the global tier only sums (no optimizer).
    return FullySync(uses_optimizer=False)


def make_local_policy(job: Any) -> LocalSyncPolicy:
    """The local servers' policy for ``job.sync``."""
    from geomx.sync.fsa import ForwardEveryRound
    from geomx.sync.hfa import HierarchicalAveraging

    algo = algorithm_of(job.sync)
    if algo == "hfa":
        return HierarchicalAveraging(k2=int(job.sync.get("k2", 1)),
                                     num_dcs=len(job.party_dcs))
    return ForwardEveryRound()


def make_worker_sync(sync: dict[str, Any], *, node: Any, kv: Any, params: list[Any],
                     pull_weights: bool, local_optimizer: Callable[[], Any],
                     max_iterations: int = 0) -> WorkerSync:
    """The worker side for ``sync`` (the scenario's ``[sync]`` table as a dict).

    ``params`` are updated in place; ``pull_weights``: the global servers run an
    optimizer, so a pull returns weights (FSA/MixedSync); ``local_optimizer`` builds the
    optimizer for local steps; ``max_iterations`` (0 = none) lets ESync end its last
    round in step with the others when this worker reaches its limit.
    """
    from geomx.sync.esync import ESyncWorker
    from geomx.sync.fsa import GradientSync
    from geomx.sync.hfa import HFAWorker

    algo = algorithm_of(sync)
    if algo == "hfa":
        return HFAWorker(kv=kv, params=params, local_optimizer=local_optimizer(),
                         k1=int(sync.get("k1", 1)), k2=int(sync.get("k2", 1)))
    if algo == "esync":
        return ESyncWorker(node=node, kv=kv, params=params, local_optimizer=local_optimizer(),
                           max_iterations=max_iterations)
    return GradientSync(kv=kv, params=params, pull_weights=pull_weights,
                        local_optimizer=local_optimizer)


def describe(policy: Any) -> str:
    return getattr(policy, "name", type(policy).__name__)
