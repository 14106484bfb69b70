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
    """Global server: apply on arrival, acknowledge within the staleness bound."""

    uses_optimizer = True

    def __init__(self, staleness: int) -> None:
        self.staleness = staleness
        self.clock: dict[tuple[int, int], dict[str, int]] = {}    # (key, part) -> DC -> pushes
        self.held: dict[tuple[int, int], list[Any]] = {}          # acknowledgements waiting

    def start_problem(self, ctx: GlobalContext) -> str | None:
        return None if ctx.has_optimizer else NEEDS_OPTIMIZER

    def on_push(self, ctx: GlobalContext, push: Any, slot: ServerSlot, value: Any) -> None:
        if not ctx.has_optimizer:
            ctx.reply_error(push, NEEDS_OPTIMIZER)
            return
        ctx.apply_update(push.key, slot, value, sender=push.src)
        where = (push.key, push.part)
        clocks = self.clock.setdefault(where, {})
        clocks[push.src] = clocks.get(push.src, 0) + 1
        self.held.setdefault(where, []).append(push)
        for w in (list(self.held) if ctx.stop_requested else [where]):
            self._release(ctx, w)
        if any(m is push for m in self.held[where]):
            ctx.record("ssp_wait", key=push.key, part=push.part, dc=push.src,
                       ahead=self._ahead(ctx, where, push.src))

    def on_pusher_left(self, ctx: GlobalContext, pusher: str) -> None:
        for where in list(self.held):
            self._release(ctx, where)

    def _ahead(self, ctx: GlobalContext, where: tuple[int, int], pusher: str) -> int:
        clocks = self.clock.get(where, {})
        active = [p for p in ctx.pushers if p not in ctx.departed]
        slowest = min((clocks.get(p, 0) for p in active), default=0)
        return clocks.get(pusher, 0) - slowest

    def _release(self, ctx: GlobalContext, where: tuple[int, int]) -> None:
        waiting = self.held.get(where, [])
        still = []
        for push in waiting:
            if ctx.stop_requested or self._ahead(ctx, where, push.src) <= self.staleness:
                ctx.reply_push(push, ctx.slot(*where))
            else:
                still.append(push)
        self.held[where] = still

    def state_dict(self) -> Any:
        return {f"{k}:{p}": dict(c) for (k, p), c in sorted(self.clock.items())}

    def load_state_dict(self, state: Any) -> None:
        self.clock = {tuple(int(x) for x in where.split(":")): dict(c)  # type: ignore[misc]
                      for where, c in (state or {}).items()}


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
    options: SspOptions

    def exchange_iterations(self) -> int:
        return self.options.staleness + 1

    def global_side(self, job: JobView) -> GlobalSide:
        return StaleSynchronousServer(self.options.staleness)

    def local_side(self, job: JobView) -> LocalSide:
        return ForwardEachRound()

    def worker_side(self, ctx: WorkerContext) -> WorkerSide:
        return PushGradientsPullWeights(ctx)
