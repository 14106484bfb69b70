"""MixedSync: synchronous inside each DC, asynchronous across DCs (GeoMX ``dist_async``).

docs/geomx-behaviour.md §3.3: the local servers stay synchronous over their workers
(:class:`~geomx.sync.fsa.ForwardEveryRound`); the global server applies each DC's push
the moment it arrives -- one optimizer step per push, so an optimizer is required -- and
answers it, after which that DC pulls the current weights and goes on. With DC-ASGD as
the optimizer the server passes the pushing DC as ``sender`` and records every pull
(``note_pull``), so each DC's gradient is corrected against the model *it* used
(docs/papers.md §6.3).

Fixes relative to GeoMX:

* no optimizer is a configuration error reported before training starts (the first INIT
  is refused with the reason, and ``geomx.scenario`` rejects such a scenario), not a
  check failure mid-run;
* every codec goes through the same decode path as FSA, so Bi-Sparse works here (GeoMX's
  asynchronous BSC handler is an empty stub and the job hangs);
* an optional staleness bound ``S`` (``sync.staleness``, 0 = none): a push is still
  applied on arrival, but its acknowledgement -- and so the DC's next iteration -- waits
  while that DC has been applied more than ``S`` times more than the slowest DC still
  training (stale-synchronous parallel, counted per key). GeoMX has no bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from geomx.policy.options import PolicyOptions
from geomx.policy.sync import (GlobalContext, GlobalSide, JobView, LocalSide, ServerSlot,
                               SyncAlgorithm, WorkerContext, WorkerSide)
from geomx.sync.fsa import ForwardEveryRound, GradientSync
from geomx.sync.tensors import Value
from geomx.wire import Message

NO_OPTIMIZER = ("sync.algorithm = 'mixed' (MixedSync, kvstore 'dist_async') applies every "
                "DC's push as its own global step and needs a global optimizer: set "
                "training.optimizer (allowed: sgd, momentum, nesterov, adam, dcasgd, "
                "dcasgd_shared) or call kv.set_optimizer before kv.init")


@dataclass(frozen=True)
class MixedOptions(PolicyOptions):
    """``staleness``: how many pushes a DC may be applied ahead of the slowest DC still
    training before its acknowledgement waits (0 = unbounded, as in GeoMX)."""

    staleness: int = 0

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ValueError(f"sync.staleness = {self.staleness}; allowed: an integer >= 0")


class AsyncAcrossDCs(GlobalSide):
    """Global server: apply each push on arrival; answer within the staleness bound.

    Rounds: a DC's ``n``-th push of a (key, part) is its round ``n``, and the server has
    completed round ``n`` of it once every DC still training has pushed ``n`` times. A
    checkpoint round is a barrier: the acknowledgement of a DC's push of that round waits
    until every DC has pushed it, so that when the last key completes the round no DC has
    started the next one and the files of the round are a cut of the job (what the global
    store holds then is each DC's first ``n`` pushes applied, in their arrival order).
    """

    name = "mixed"
    uses_optimizer = True

    def __init__(self, staleness: int = 0):
        if staleness < 0:
            raise ValueError(f"sync.staleness = {staleness}; allowed: an integer >= 0")
        self.staleness = staleness
        # (key, part) -> pusher -> pushes applied; (key, part) -> acks held back, with
        # the pusher's round each answers
        self._applied: dict[tuple[int, int], dict[str, int]] = {}
        self._held: dict[tuple[int, int], list[tuple[Message, int]]] = {}
        # (key, part) -> the round every active pusher has pushed, and how many active
        # pushers are at it (kept as pushes come, so a push costs O(1), not O(pushers))
        self._floor: dict[tuple[int, int], tuple[int, int]] = {}

    def start_problem(self, gs: GlobalContext) -> str | None:
        return None if gs.has_optimizer else NO_OPTIMIZER

    def on_push(self, gs: GlobalContext, msg: Message, slot: ServerSlot, value: Value) -> None:
        if not gs.has_optimizer:
            gs.reply_error(msg, NO_OPTIMIZER)
            return
        where = (msg.key, msg.part)
        applied = self._applied.setdefault(where, {})
        floor, behind = self._floor.get(where) or self._recount(gs, where)
        old = applied.get(msg.src, 0)
        round_ = applied[msg.src] = old + 1
        completes = 0
        if old == floor and msg.src not in gs.departed:
            if behind > 1:
                self._floor[where] = (floor, behind - 1)
            else:  # the last one at the floor: a round is complete
                completes = self._recount(gs, where)[0]
        gs.apply_update(msg.key, slot, value, sender=msg.src, completes=completes)
        if not self._held.get(where) and not gs.stop_requested and not self._holds(
                gs, where, msg.src, round_):
            gs.reply_push(msg, slot)  # nothing waits here and this push need not
            return
        self._held.setdefault(where, []).append((msg, round_))
        if gs.stop_requested:
            for w in list(self._held):
                self._release(gs, w)
        else:
            self._release(gs, where)
        if any(m is msg for m, _ in self._held.get(where, ())):
            lead = self.lead(gs, where, msg.src)
            if self.staleness and lead > self.staleness:
                gs.record("staleness_wait", key=msg.key, part=msg.part, pusher=msg.src,
                          lead=lead)
            else:
                gs.record("checkpoint_wait", key=msg.key, part=msg.part, pusher=msg.src,
                          round=round_)

    def stop_version(self, gs: GlobalContext, slot: ServerSlot) -> int:
        # no round to finish together: every reply from now on carries the stop
        return slot.version

    def on_pusher_left(self, gs: GlobalContext, pusher: str) -> None:
        # a finished DC no longer holds the others back
        for where in list(self._floor):
            self._recount(gs, where)
        for where in list(self._held):
            self._release(gs, where)

    def _recount(self, gs: GlobalContext, where: tuple[int, int]) -> tuple[int, int]:
        applied = self._applied.get(where, {})
        counts = [applied.get(p, 0) for p in gs.pushers if p not in gs.departed]
        floor = min(counts, default=0)
        self._floor[where] = (floor, counts.count(floor))
        return self._floor[where]

    def completed(self, gs: GlobalContext, where: tuple[int, int]) -> int:
        """The round every pusher still training has pushed of ``where``."""
        return (self._floor.get(where) or self._recount(gs, where))[0]

    def lead(self, gs: GlobalContext, where: tuple[int, int], pusher: str) -> int:
        """How many more pushes of ``pusher`` than of the slowest active pusher were applied."""
        return self._applied.get(where, {}).get(pusher, 0) - self.completed(gs, where)

    def reply_round(self, msg: Message, slot: ServerSlot) -> int:
        """A reply to a DC belongs to that DC's round: its pushes applied and answered so
        far (a successor of its local server starts after it, and pushes a held round
        again, which :meth:`resent_push` puts in the held one's place)."""
        where = (msg.key, msg.part)
        held = sum(1 for m, _ in self._held.get(where, ()) if m.src == msg.src)
        return self._applied.get(where, {}).get(msg.src, 0) - held

    def resent_push(self, gs: GlobalContext, push: Message, slot: ServerSlot) -> str | None:
        """A DC's round counts its own pushes: one up to its count was applied; if its
        acknowledgement is still held, the new request takes the old one's place."""
        where = (push.key, push.part)
        if push.version > self._applied.get(where, {}).get(push.src, 0):
            return None
        held = self._held.get(where, [])
        for i, (m, round_) in enumerate(held):
            if m.src == push.src and round_ == push.version:
                held[i] = (push, round_)
                return "parked"
        gs.reply_push(push, slot)
        return "applied"

    def handover(self, key: int, part: int) -> dict[str, int]:
        """Each DC's pushes the value holds: a successor that starts from this value
        answers a DC's resent push up to its count as applied and applies the ones after
        it (a push applied after the newest pull is pushed again by its DC, whose pull
        then reports fewer of its rounds than it pushed)."""
        return dict(self._applied.get((key, part), {}))

    def take_over(self, key: int, part: int, handover: dict[str, int]) -> None:
        where = (key, part)
        self._applied[where] = {str(p): int(n) for p, n in handover.items()}
        self._held.pop(where, None)
        self._floor.pop(where, None)

    def _holds(self, gs: GlobalContext, where: tuple[int, int], pusher: str,
               round_: int) -> bool:
        """Whether ``pusher``'s push of ``round_`` waits for the others: a checkpoint
        round not every DC has pushed yet, or a lead beyond the staleness bound."""
        if round_ > self.completed(gs, where) and gs.is_checkpoint_round(round_):
            return True
        return bool(self.staleness) and self.lead(gs, where, pusher) > self.staleness

    def _release(self, gs: GlobalContext, where: tuple[int, int]) -> None:
        held = self._held.get(where)
        if not held:
            return
        release, keep = [], []
        for msg, round_ in held:
            if gs.stop_requested or not self._holds(gs, where, msg.src, round_):
                release.append(msg)
            else:
                keep.append((msg, round_))
        self._held[where] = keep
        slot = gs.slot(*where)
        for msg in release:
            gs.reply_push(msg, slot)

    def state_dict(self) -> dict[str, Any]:
        """Each DC's pushes applied per (key, part): the rounds the next pushes are.
        Nothing is held at a checkpoint (its round's barrier has just released)."""
        return {"applied": {where: dict(counts) for where, counts in self._applied.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._applied = {tuple(where): {str(p): int(n) for p, n in counts.items()}
                         for where, counts in state["applied"].items()}
        self._held = {}
        self._floor = {}


class MixedSync(SyncAlgorithm):
    """``mixed``: synchronous inside each DC (FSA's local and worker sides), each DC's
    push applied on arrival at the global tier (GeoMX ``dist_async``)."""

    name = "mixed"
    checkpoint_cuts = True  # a checkpoint round's answers wait for every DC (AsyncAcrossDCs)
    Options = MixedOptions
    kvstore_type = "dist_async"
    options: MixedOptions

    @classmethod
    def options_from_sync(cls, sync: Mapping[str, Any]) -> MixedOptions:
        return MixedOptions(staleness=int(sync.get("staleness", 0) or 0))

    def exchange_iterations(self) -> int:
        return self.options.staleness + 1

    def global_side(self, job: JobView) -> GlobalSide:
        return AsyncAcrossDCs(staleness=self.options.staleness)

    def local_side(self, job: JobView) -> LocalSide:
        return ForwardEveryRound()

    def worker_side(self, ctx: WorkerContext) -> WorkerSide:
        return GradientSync(ctx)
