"""Sync algorithms: when servers aggregate and reply, and what a worker does per step.

A synchronisation algorithm touches three places of a HiPS job (docs/geomx-behaviour.md
§1, §3), and a :class:`SyncAlgorithm` builds one *side* for each:

* the **global server** (:class:`GlobalSide`): when a pushed value is applied and when
  the push is answered (FSA §3.2, MixedSync §3.3, a bounded-staleness rule of your own);
* the **local server** (:class:`LocalSide`): what it does once every worker of its DC
  has pushed a key -- forward the DC sum across the WAN, or average locally and only
  sometimes talk to the global tier (HFA §3.4);
* the **worker** (:class:`WorkerSide`): what one training step sends and receives.

Each side talks to its node only through a context (:class:`GlobalContext`,
:class:`LocalContext`, :class:`WorkerContext`), never through the node object, so the
same algorithm runs in the emulator, over sockets and in a by-hand launch. Name it in a
scenario as ``[sync] algorithm = "lab/ssp.py:BoundedStaleness"`` with its options in
``[sync.options]`` (docs/extending.md).

What must be deterministic: a side's decisions may depend only on what its hooks are
given, its own state and its context (``ctx.now()`` is virtual time in the emulator).
Hooks that are plain ``def`` run to completion inside the node's message handler and
must not block; ``async`` hooks may await their context's requests.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

from geomx.policy.base import Policy
from geomx.policy.context import NodeContext
from geomx.policy.options import PolicyOptions, options_from_table
from geomx.wire import Message

__all__ = ["SyncAlgorithm", "GlobalSide", "LocalSide", "WorkerSide", "StateService",
           "GlobalContext", "LocalContext", "WorkerContext", "ServerSlot", "LocalSlotView",
           "JobView", "KVSTORE_ALGORITHMS"]

#: A tensor value as servers hold it: a numpy array, or a phantom payload (a shape and
#: a byte count without data, for jobs that emulate a model's traffic only).
Value = Any


class JobView(Protocol):
    """What a policy may read about the whole job (identical on every node)."""

    mode: str                       # "hips" | "flat_ps" | "netstorm"
    party_dcs: list[str]
    global_servers: list[str]
    workers_of: dict[str, list[str]]

    @property
    def num_all_workers(self) -> int: ...

    @property
    def all_workers(self) -> list[str]:
        """Every training worker of the job, DC by DC, rank order."""
        ...


class ServerSlot(Protocol):
    """A global server's state of one (key, part) in the current round."""

    key: int
    version: int                    # rounds applied to ``store``
    count: int                      # pushes summed into ``merged`` this round
    merged: Value | None            # their sum
    contributors: set[str]          # who pushed this round
    waiting_pushes: list[Message]   # pushes parked until the round completes


class LocalSlotView(Protocol):
    """A local server's state of one key."""

    key: int
    round: int                      # the DC's rounds of this key so far
    store: Value | None             # the value workers pull


class GlobalContext(NodeContext, Protocol):
    """A global server as its sync side sees it."""

    @property
    def pushers(self) -> Sequence[str]:
        """Who pushes to this server: a local server per DC, or every worker (flat PS)."""
        ...

    @property
    def departed(self) -> set[str]:
        """Pushers that have finished (said goodbye) or were lost."""
        ...

    @property
    def stop_requested(self) -> bool:
        """A worker asked the job to stop (its target was reached)."""
        ...

    @property
    def has_optimizer(self) -> bool:
        """The master worker installed an optimizer on this server."""
        ...

    def slot(self, key: int, part: int) -> ServerSlot: ...

    def contributors_of(self, push: Message) -> list[str]:
        """Whose pushes ``push`` carries (its sender, or every member of a merged push)."""
        ...

    def accumulate(self, slot: ServerSlot, value: Value, count: int) -> None:
        """Add ``value`` (``count`` pushes' worth) into ``slot.merged``."""
        ...

    def apply_update(self, key: int, slot: ServerSlot, value: Value, *, sender: str,
                     completes: int | None = None) -> None:
        """Run the global optimizer (or plain sum) on ``value``; ``slot.version`` += 1.

        ``completes``: the global round this update completes, for an algorithm that does
        not count one round per update (0: it completes none); by default the update is
        round ``slot.version``. Checkpoints are taken at completed rounds."""
        ...

    def is_checkpoint_round(self, round_: int) -> bool:
        """Is global round ``round_`` a checkpoint round (``[checkpoint] every``; decided
        once, the first time it is asked; always False without checkpoints)? A side whose
        pushers are not in step holds the answers of such a round until every pusher has
        reached it, so that the servers' and workers' files form a cut of the job."""
        ...

    def reply_push(self, push: Message, slot: ServerSlot) -> None:
        """Answer ``push`` (with the new value when the scheduler fuses the pull)."""
        ...

    def reply_error(self, push: Message, reason: str) -> None: ...


class LocalContext(NodeContext, Protocol):
    """A local server as its sync side sees it."""

    @property
    def num_dcs(self) -> int: ...

    @property
    def workers(self) -> Sequence[str]:
        """This DC's workers, rank order."""
        ...

    async def exchange_global(self, key: int, slot: LocalSlotView, value: Value, *,
                              stop: bool) -> Value:
        """Push ``value`` for ``key`` to the global tier (through the job's transfer
        scheduler and codec), wait for the round, and return the new global value."""
        ...

    def answer_workers(self, slot: LocalSlotView, waiting: list[Message]) -> None:
        """Acknowledge the parked pushes of ``slot``'s finished round."""
        ...


class WorkerContext(NodeContext, Protocol):
    """A worker's training loop as its sync side sees it."""

    @property
    def kv(self) -> Any:
        """The worker's kvstore (``push``, ``pull``, ``num_workers``, ``request_stop``)."""
        ...

    @property
    def params(self) -> list[Any]:
        """The model's parameter arrays, updated in place."""
        ...

    @property
    def pull_weights(self) -> bool:
        """The global servers run an optimizer: a pull returns weights, not a sum."""
        ...

    @property
    def max_iterations(self) -> int:
        """This worker's last iteration (0 = no limit)."""
        ...

    @property
    def state_server(self) -> str:
        """The job's state server (``""`` unless the algorithm asks for one)."""
        ...

    def local_optimizer(self) -> Any:
        """A fresh optimizer for local steps (the scenario's optimizer and rate)."""
        ...


class GlobalSide(abc.ABC):
    """A global server's part of a sync algorithm."""

    #: False: the server's store holds a plain sum, ``set_optimizer`` is ignored.
    uses_optimizer: bool = True

    def start_problem(self, ctx: GlobalContext) -> str | None:
        """Why the job cannot start on this server (checked at the first INIT), or None."""
        return None

    @abc.abstractmethod
    def on_push(self, ctx: GlobalContext, push: Message, slot: ServerSlot,
                value: Value) -> None:
        """A decoded push from ``push.src`` for ``slot``: accumulate, apply, answer."""

    def on_pusher_left(self, ctx: GlobalContext, pusher: str) -> None:
        """``pusher`` has finished or was lost: release whoever waits for it."""
        return None

    def stop_version(self, ctx: GlobalContext, slot: ServerSlot) -> int:
        """A stop was first requested while ``slot`` was at ``slot.version``: the first
        version of it whose replies tell the pushers to stop.

        Default: the round in progress (``slot.version + 1``). A round every pusher must
        push to is finished by all of them, and only its replies carry the stop: a
        pusher still a round behind (a longer WAN latency) then stops after the same
        round as the others instead of leaving them waiting for a push that never
        comes. A side whose pushers never wait for one another may stop them at once
        (``slot.version``)."""
        return slot.version + 1

    def resent_push(self, ctx: GlobalContext, push: Message, slot: ServerSlot) -> str | None:
        """``[membership] on_server_loss = "wait"``: ``push`` may repeat one this side
        already has (a local server's successor pushes the round its dead predecessor may
        have pushed; ``push.version`` is the pusher's round). If so, answer it or put it
        in the old push's place and return why (``"applied"``, ``"parked"``); None: a
        new push, taken as usual.

        Default, for a side that completes a round per update once every pusher pushed
        (FSA's): rounds up to ``slot.version`` are applied (answered now); a pusher
        already among this round's contributors is parked (the new request replaces the
        old one, so the answer reaches the process that waits for it)."""
        if push.version <= slot.version:
            ctx.reply_push(push, slot)
            return "applied"
        if push.src in slot.contributors:
            slot.waiting_pushes = [push if m.src == push.src else m for m in slot.waiting_pushes]
            return "parked"
        return None

    def handover(self, key: int, part: int) -> Any:
        """A global server a successor may take over (``on_server_loss = "wait"`` with
        checkpoints): what the successor needs, besides the value of (``key``, ``part``)
        and its version, to go on from that value -- this side's own counts of what the
        value holds (whose pushes, how many). It travels with every reply that carries
        the value; the pushers keep the newest one and hand it back with the value
        (:meth:`take_over`). JSON only (numbers, strings, lists, dicts with string
        keys). Default None: the version says it all (a side that completes a round per
        update once every pusher pushed, as FSA's)."""
        return None

    def take_over(self, key: int, part: int, handover: Any) -> None:
        """A successor of a lost global server: the newest value of (``key``, ``part``)
        the pushers handed in is its model, and ``handover`` came with it (what
        :meth:`handover` returned when it was served). Called before any request is
        served; a value no pusher had newer than the predecessor's snapshot keeps the
        snapshot's state (:meth:`load_state_dict`) instead."""
        return None

    def initial_value(self, key: int, part: int, slot: ServerSlot) -> Value:
        """What an initial pull of (``key``, ``part``) returns (a local server's first
        pull: at the job's start, or its successor's after a takeover). Default: the
        store. A side whose store is not the model (a plain sum of deltas) returns the
        model it keeps, so a local server's successor starts from it."""
        assert slot.store is not None
        return slot.store

    def reply_round(self, msg: Message, slot: ServerSlot) -> int:
        """The global round that a reply to ``msg`` (a push's acknowledgement or a pull's
        reply, from ``msg.src``) belongs to: a checkpoint round's notice travels with the
        replies of that round only (geomx/node/checkpoint.py). Default: ``slot.version``,
        one round per update."""
        return slot.version

    def state_dict(self) -> Any:
        """What a checkpoint keeps of this side (taken when every key has completed a
        checkpoint round; a takeover's successor does not read it), or None."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Resuming from a checkpoint: ``state`` from :meth:`state_dict`."""
        return None


class LocalSide(abc.ABC):
    """A local server's part of a sync algorithm."""

    def on_initialized(self, ctx: LocalContext, key: int, slot: LocalSlotView) -> None:
        """``slot.store`` now holds the global initial value of ``key``."""
        return None

    @abc.abstractmethod
    async def on_round(self, ctx: LocalContext, key: int, slot: LocalSlotView,
                       merged: Value, waiting: list[Message], stop: bool) -> None:
        """Every live worker of the DC pushed ``key`` (their sum is ``merged``): decide
        the round, set ``slot.store`` and ``slot.round``, answer ``waiting``."""

    def dc_round(self, key: int, global_round: int) -> int:
        """The DC round of ``key`` that the global tier's round ``global_round`` ended
        (``[membership] on_server_loss = "wait"``): a local server's successor starts
        there (pushes of rounds up to it are answered, not applied), and an exchange
        whose pull comes back at a global round that ended an earlier DC round was lost
        with a global server and is pushed again. Default: one DC round per global
        round."""
        return global_round

    def key_state(self, key: int) -> Any:
        """What a checkpoint keeps of ``key`` (None: nothing)."""
        return None

    def load_key_state(self, key: int, state: Any) -> None:
        return None


class WorkerSide(abc.ABC):
    """One worker's part of a sync algorithm, driven by the training loop each step."""

    #: The local optimizer's per-parameter states (a worker checkpoint keeps them);
    #: empty when the side takes no local steps.
    states: list[Any] = []

    @abc.abstractmethod
    async def step(self, iteration: int, grads: list[Any]) -> bool:
        """Apply this step's gradients (locally and/or through ``ctx.kv``).

        Returns True when the worker's parameters are now a model every worker shares
        (where evaluating is meaningful)."""

    async def finish(self) -> None:
        """The training loop is over."""
        return None

    def state_dict(self) -> Any:
        """What a worker's checkpoint keeps of this side besides the model and
        :attr:`states` (geomx/node/checkpoint.py), or None. Called right after the
        :meth:`step` that finished a checkpoint round; arrays, numbers, strings, lists,
        dicts and dataclasses only (nothing is pickled)."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Resuming: ``state`` from :meth:`state_dict`. The model is already back in the
        worker's parameters and :attr:`states` restored; the next :meth:`step` is the
        first of the round after the checkpoint."""
        return None

    def rejoined(self, round_: int) -> None:
        """This worker is a restarted one the job had lost (``[membership]
        on_worker_loss = "continue"``, geomx/node/restart.py): its parameters hold the
        model of global round ``round_``, pulled at a round boundary, and the next
        :meth:`step` is the first of round ``round_ + 1``. Default: nothing (a side that
        keeps no state between rounds)."""
        return None


class StateService(abc.ABC):
    """A coordinator the worker sides of an algorithm query (ESync's step budgets).

    It runs on the job's state server, a node of its own that the planner adds when the
    algorithm sets :attr:`SyncAlgorithm.needs_state_server`. Workers send it
    ``STATE_QUERY`` messages (``version`` = the round asked about, ``meta`` = what the
    worker reports) through their context's ``request``; it answers each with a
    ``STATE_REPLY`` whose ``meta`` is what :meth:`on_query` returned for that worker.
    """

    @abc.abstractmethod
    def on_query(self, ctx: NodeContext, worker: str, round_: int,
                 meta: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
        """``worker``'s query for ``round_``. None: keep it waiting; otherwise the reply
        ``meta`` of every worker waiting on ``round_`` (raise ValueError to refuse)."""

    def on_worker_lost(self, ctx: NodeContext, worker: str) -> dict[int, dict[str, dict[str, Any]]]:
        """``worker`` was lost and the job goes on without it (``[membership]
        on_worker_loss = "continue"``; the global scheduler tells the state server): it
        will query no more, and its pending queries are dropped.
        Returns, for each round that no longer waits for anybody, the reply ``meta`` of
        every worker waiting on it (as :meth:`on_query` would). Default: refuse, as a
        service that needs every worker cannot go on."""
        raise ValueError(f"{type(self).__name__} needs every worker; it cannot go on "
                         f"without {worker}")

    def on_worker_rejoined(self, ctx: NodeContext, worker: str) -> None:
        """A lost ``worker`` restarted and is back (its worker side's
        :meth:`WorkerSide.rejoined` ran): its queries count again from the first one it
        sends. Called only when :attr:`SyncAlgorithm.state_service_rejoins` is set."""
        raise ValueError(f"{type(self).__name__} does not take a lost worker back "
                         f"({worker})")


class SyncAlgorithm(Policy):
    """A sync algorithm: its three sides and what it needs from the job."""

    kind: ClassVar[str] = "sync"
    #: The global servers run the job's optimizer and a pull returns weights; False:
    #: they only sum what workers push (model deltas), workers step locally.
    uses_global_optimizer: ClassVar[bool] = True
    #: HiPS only (needs a local server per DC).
    needs_local_tier: ClassVar[bool] = False
    #: Asks the planner for a state server (ESync's).
    needs_state_server: ClassVar[bool] = False
    #: Its state service takes a lost worker back (``StateService.on_worker_rejoined``):
    #: a worker's restart is allowed with a state server only then.
    state_service_rejoins: ClassVar[bool] = False
    #: A global server's successor may rebuild the model from the newest value a local
    #: server pulled (``on_server_loss = "wait"``): every update is in some pull, or its
    #: pusher pushes it again (``GlobalSide.handover`` says which are in).
    global_takeover: ClassVar[bool] = True
    #: The GeoMX kvstore type a user would create for it (``dist_sync`` / ``dist_async``).
    kvstore_type: ClassVar[str] = "dist_sync"
    #: Its checkpoint rounds are cuts of the job, so ``[checkpoint]`` may save and resume
    #: it (geomx/node/checkpoint.py): every global round is synchronous (one update per
    #: round, after every pusher), or the global side says which round an update
    #: completes (``GlobalContext.apply_update(completes=)``), which round a reply belongs
    #: to (``GlobalSide.reply_round``) and holds a checkpoint round's answers until every
    #: pusher reached it (``GlobalContext.is_checkpoint_round``), as MixedSync does.
    #: False: a scenario with checkpoints is refused.
    checkpoint_cuts: ClassVar[bool] = False

    @classmethod
    def options_from_sync(cls, sync: Mapping[str, Any]) -> PolicyOptions:
        """This algorithm's options from the job's ``[sync]`` table (its ``options``
        sub-table; built-ins read their historical ``[sync]`` fields instead)."""
        return options_from_table(cls.Options, sync.get("options"),
                                  policy=f"sync policy {str(sync.get('algorithm'))!r}",
                                  where="sync.options")

    def exchange_iterations(self) -> int:
        """The most worker iterations between two of a worker's exchanges with the global
        tier (what a reply may legitimately wait for; 1: every iteration)."""
        return 1

    def state_service(self, job: JobView) -> StateService:
        """The state server's coordinator (called when :attr:`needs_state_server`)."""
        raise NotImplementedError(f"sync algorithm {self.name!r} sets needs_state_server "
                                  "but does not build a state_service")

    def check(self, job: JobView) -> str | None:
        """Why this job cannot run the algorithm (refused when the job is described), or
        None. The default refuses a job without local servers when
        :attr:`needs_local_tier` is set."""
        if self.needs_local_tier and job.mode != "hips":
            return (f"sync algorithm {self.name!r} needs a local server per DC; allowed "
                    f"topologies: hips (this job runs {job.mode!r})")
        return None

    @abc.abstractmethod
    def global_side(self, job: JobView) -> GlobalSide:
        """The global servers' side (one per server)."""

    @abc.abstractmethod
    def local_side(self, job: JobView) -> LocalSide:
        """The local servers' side (one per local server)."""

    async def worker_left(self, ctx: WorkerContext) -> None:
        """A worker's training ended without a :meth:`worker_side` (a training program
        that pushes and pulls by hand): release whatever waits for it. Default: nothing."""
        return None

    @abc.abstractmethod
    def worker_side(self, ctx: WorkerContext) -> WorkerSide:
        """The worker's side (one per worker, built when its training loop starts)."""


#: The built-in algorithm a GeoMX kvstore type stands for under ``[sync] algorithm =
#: "auto"``: ``dist_sync`` runs FSA, ``dist_async`` switches the job to MixedSync
#: (docs/geomx-behaviour.md §3.3).
KVSTORE_ALGORITHMS: dict[str, str] = {"dist_sync": "fsa", "dist_async": "mixed"}
