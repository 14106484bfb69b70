"""FSA, fully synchronous aggregation (GeoMX ``dist_sync``; docs/geomx-behaviour.md §3.2).

:class:`FSA` is the ``[sync] algorithm = "fsa"`` plug-in (geomx/policy/sync.py); its
three sides, one per tier, are reused by the other built-ins:

* :class:`FullySync` (global server): collect one push from every contributor (a local
  server per DC, or every worker in flat-PS mode), run one global step on the sum, answer
  everybody. With ``uses_optimizer=False`` it is the summing server HFA and ESync need
  (the store becomes the plain sum of the pushed deltas).
* :class:`ForwardEveryRound` (local server): once all local workers pushed, push the DC
  sum to the global tier, pull the result back, then answer the workers. MixedSync and
  ESync use it unchanged (MixedSync is synchronous inside a DC, §3.3).
* :class:`GradientSync` (worker): push this step's gradients, pull the new weights -- or,
  when the global servers run no optimizer, pull the gradient sum and take a local step
  with it (GeoMX's ``cnn_bsc.py`` shape, §2.2).
"""

from __future__ import annotations

import asyncio

from typing import Any

import numpy as np

from geomx.policy.sync import (GlobalContext, GlobalSide, JobView, LocalContext, LocalSide,
                               LocalSlotView, ServerSlot, SyncAlgorithm, WorkerContext,
                               WorkerSide)
from geomx.sync.tensors import Value, phantom
from geomx.wire import Message


class FullySync(GlobalSide):
    """Global server: one global step per key per round, after every contributor pushed."""

    def __init__(self, *, uses_optimizer: bool = True):
        self.uses_optimizer = uses_optimizer
        self.name = "fsa" if uses_optimizer else "sum"

    def on_push(self, gs: GlobalContext, msg: Message, slot: ServerSlot, value: Value) -> None:
        # a TSEngine merge carries several contributors' pushes (geomx/node/ts_overlay.py)
        senders = gs.contributors_of(msg)
        again = [s for s in senders if s in slot.contributors]
        if again:
            gs.reply_error(msg, f"{again[0]} pushed key {msg.key} twice in round {slot.version}")
            return
        slot.contributors.update(senders)
        gs.accumulate(slot, value, len(senders))
        slot.waiting_pushes.append(msg)
        if slot.count < len(gs.pushers):
            return
        merged, slot.merged = slot.merged, None
        slot.count = 0
        slot.contributors.clear()
        # Every contributor pulled the current model after the previous round, so any of
        # them is a valid ``sender`` for a per-sender rule (DC-ASGD's correction is 0 here).
        gs.apply_update(msg.key, slot, merged, sender=msg.src)
        waiting, slot.waiting_pushes = slot.waiting_pushes, []
        for req in waiting:
            gs.reply_push(req, slot)


class ForwardEveryRound(LocalSide):
    """Local server: every completed local round is a global round."""

    name = "forward"

    async def on_round(self, ls: LocalContext, key: int, slot: LocalSlotView, merged: Value,
                       waiting: list[Message], stop: bool) -> None:
        slot.round += 1
        slot.store = await ls.exchange_global(key, slot, merged, stop=stop)
        ls.answer_workers(slot, waiting)


class GradientSync(WorkerSide):
    """Worker: push gradients every step, pull weights (or the sum and step locally)."""

    name = "gradient"

    def __init__(self, ctx: WorkerContext):
        self.kv = kv = ctx.kv
        self.params = params = ctx.params
        self.local_opt = None
        self.states: list[Any] = []
        self.agg: list[np.ndarray] = []
        if not ctx.pull_weights and params and not phantom(params[0]):
            self.local_opt = ctx.local_optimizer()
            # the pulled value is the sum over all workers: step with its mean
            self.local_opt.rescale_grad = 1.0 / kv.num_all_workers
            self.states = [self.local_opt.create_state(k, p) for k, p in enumerate(params)]
            self.agg = [np.zeros_like(p) for p in params]

    async def step(self, iteration: int, grads: list[Any]) -> bool:
        kv = self.kv
        for k in reversed(range(len(grads))):
            kv.push(k, grads[k], priority=-k)
        # all pulls in flight at once, as MXNet's asynchronous pulls are (each one still
        # waits for this worker's push of its key); then use the results
        dst = self.params if self.local_opt is None else self.agg
        await asyncio.gather(*(kv.pull(k, out=dst[k], priority=-k) for k in range(len(dst))))
        if self.local_opt is not None:
            for k in range(len(self.params)):
                self.local_opt.update(k, self.params[k], self.agg[k], self.states[k])
        return True


class FSA(SyncAlgorithm):
    """``fsa``: every worker's gradient of every step reaches the global optimizer, and
    nobody goes on before the round is complete (docs/geomx-behaviour.md §3.2)."""

    name = "fsa"
    checkpoint_cuts = True  # every global round is synchronous

    def global_side(self, job: JobView) -> GlobalSide:
        return FullySync()

    def local_side(self, job: JobView) -> LocalSide:
        return ForwardEveryRound()

    def worker_side(self, ctx: WorkerContext) -> WorkerSide:
        return GradientSync(ctx)
