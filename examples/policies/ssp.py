"""Bounded staleness across data centres (stale synchronous parallel, Ho et al., NIPS
2013) as a sync algorithm of your own.

Written only against the public sync API (``geomx.policy.sync``); name it in a scenario:

    [sync]
    algorithm = "ssp.py:BoundedStaleness"       # next to the scenario file
    [sync.options]
    staleness = 2

Inside a DC the workers stay synchronous: the local server forwards every completed
round's sum to the global tier. Across DCs each DC has a *clock* per key: the number of
its pushes the global server has applied. A push is applied the moment it arrives (one
optimizer step each, as asynchronous SGD), but its acknowledgement -- and so that DC's
next iteration -- is held while the DC's clock is more than ``staleness`` ahead of the
slowest DC still training. ``staleness = 0`` keeps the DCs in lock-step; a large bound is
fully asynchronous. A DC that finishes or is lost stops holding the others back, and a
stop request releases everyone.

Determinism: decisions depend only on the order pushes arrive in (virtual time in the
emulator), and held acknowledgements are released in arrival order.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from geomx.policy import PolicyOptions
from geomx.policy.sync import (GlobalContext, GlobalSide, JobView, LocalContext, LocalSide,
                               LocalSlotView, ServerSlot, SyncAlgorithm, WorkerContext,
                               WorkerSide)

__all__ = ["BoundedStaleness", "SspOptions"]

NEEDS_OPTIMIZER = ("ssp applies each DC's push as its own optimizer step and needs a "
                   "global optimizer: set training.optimizer")


@dataclass(frozen=True)
class SspOptions(PolicyOptions):
    """``staleness``: how many pushes a DC may be ahead of the slowest active DC."""

    staleness: int = 2

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ValueError(f"staleness = {self.staleness}; allowed: an integer >= 0")


class StaleSynchronousServer(GlobalSide):
    """Global server: apply on arrival, acknowledge within the staleness bound.

    Rounds, for checkpoints: a DC's ``n``-th push of a (key, part) is its round ``n``; the
    server has completed round ``n`` once every DC still training has pushed ``n`` times
    (the update that gets there says so, ``apply_update(completes=n)``). A checkpoint
    round is also a barrier: a DC's push of it is answered only once every DC has pushed
    it, so when the round completes no DC has begun the next one and the files of the
    round are a cut of the job (``BoundedStaleness.checkpoint_cuts``).
    """

    uses_optimizer = True

    def __init__(self, staleness: int) -> None:
        self.staleness = staleness
        self.clock: dict[tuple[int, int], dict[str, int]] = {}    # (key, part) -> DC -> pushes
        # acknowledgements waiting, with the round of their DC each answers
        self.held: dict[tuple[int, int], list[tuple[Any, int]]] = {}

    def start_problem(self, ctx: GlobalContext) -> str | None:
        return None if ctx.has_optimizer else NEEDS_OPTIMIZER

    def on_push(self, ctx: GlobalContext, push: Any, slot: ServerSlot, value: Any) -> None:
        if not ctx.has_optimizer:
            ctx.reply_error(push, NEEDS_OPTIMIZER)
            return
        where = (push.key, push.part)
        clocks = self.clock.setdefault(where, {})
        before = self._slowest(ctx, where)
        round_ = clocks[push.src] = clocks.get(push.src, 0) + 1
        after = self._slowest(ctx, where)
        ctx.apply_update(push.key, slot, value, sender=push.src,
                         completes=after if after > before else 0)
        self.held.setdefault(where, []).append((push, round_))
        for w in (list(self.held) if ctx.stop_requested else [where]):
            self._release(ctx, w)
        if any(m is push for m, _ in self.held[where]):
            ctx.record("ssp_wait", key=push.key, part=push.part, dc=push.src,
                       ahead=clocks[push.src] - self._slowest(ctx, where))

    def on_pusher_left(self, ctx: GlobalContext, pusher: str) -> None:
        for where in list(self.held):
            self._release(ctx, where)

    def reply_round(self, msg: Any, slot: ServerSlot) -> int:
        # a reply belongs to its DC's round: that DC's pushes applied and answered
        where = (msg.key, msg.part)
        held = sum(1 for m, _ in self.held.get(where, ()) if m.src == msg.src)
        return self.clock.get(where, {}).get(msg.src, 0) - held

    def _slowest(self, ctx: GlobalContext, where: tuple[int, int]) -> int:
        clocks = self.clock.get(where, {})
        return min((clocks.get(p, 0) for p in ctx.pushers if p not in ctx.departed),
                   default=0)

    def _waits(self, ctx: GlobalContext, where: tuple[int, int], pusher: str,
               round_: int, slowest: int) -> bool:
        if round_ > slowest and ctx.is_checkpoint_round(round_):
            return True  # a checkpoint round: every DC pushes it before anyone goes on
        return self.clock[where].get(pusher, 0) - slowest > self.staleness

    def _release(self, ctx: GlobalContext, where: tuple[int, int]) -> None:
        still = []
        slowest = self._slowest(ctx, where)  # (answering a push changes no clock)
        for push, round_ in self.held.get(where, []):
            if ctx.stop_requested or not self._waits(ctx, where, push.src, round_, slowest):
                ctx.reply_push(push, ctx.slot(*where))
            else:
                still.append((push, round_))
        self.held[where] = still

    def state_dict(self) -> Any:
        # nothing is held when a checkpoint is taken: its round's barrier just released
        return {f"{k}:{p}": dict(c) for (k, p), c in sorted(self.clock.items())}

    def load_state_dict(self, state: Any) -> None:
        self.clock = {tuple(int(x) for x in where.split(":")): dict(c)  # type: ignore[misc]
                      for where, c in (state or {}).items()}
        self.held = {}


class ForwardEachRound(LocalSide):
    """Local server: synchronous over the DC's workers, every round sent to the global tier."""

    async def on_round(self, ctx: LocalContext, key: int, slot: LocalSlotView, merged: Any,
                       waiting: list[Any], stop: bool) -> None:
        slot.round += 1
        slot.store = await ctx.exchange_global(key, slot, merged, stop=stop)
        ctx.answer_workers(slot, waiting)


class PushGradientsPullWeights(WorkerSide):
    """Worker: push this step's gradients (last layer first), then pull the weights."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.kv = ctx.kv
        self.params = ctx.params

    async def step(self, iteration: int, grads: list[Any]) -> bool:
        for k in reversed(range(len(grads))):
            self.kv.push(k, grads[k], priority=-k)
        await asyncio.gather(*(self.kv.pull(k, out=self.params[k], priority=-k)
                               for k in range(len(self.params))))
        return True


class BoundedStaleness(SyncAlgorithm):
    """``ssp``: asynchronous across DCs within a staleness bound, synchronous inside."""

    name = "ssp"
    Options = SspOptions
    checkpoint_cuts = True  # StaleSynchronousServer holds checkpoint rounds' answers
    options: SspOptions

    def exchange_iterations(self) -> int:
        return self.options.staleness + 1

    def global_side(self, job: JobView) -> GlobalSide:
        return StaleSynchronousServer(self.options.staleness)

    def local_side(self, job: JobView) -> LocalSide:
        return ForwardEachRound()

    def worker_side(self, ctx: WorkerContext) -> WorkerSide:
        return PushGradientsPullWeights(ctx)
