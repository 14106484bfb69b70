"""HFA, hierarchical frequency aggregation (GeoMX ``MXNET_KVSTORE_USE_HFA=1``).

docs/geomx-behaviour.md §3.4, docs/papers.md §6.2. Workers take a local optimizer step every
iteration and every ``K1`` iterations push ``params / n_local``; the local server sums
them (the DC average) and answers at once -- a *local sync* that never leaves the DC.
Every ``K2``-th local sync it instead pushes ``(average - milestone) / D`` to the global
server, which sums over the ``D`` DCs without an optimizer, and serves
``milestone + sum`` (the mean of the DC models), which becomes the new milestone. A
global sync therefore happens every ``K1 * K2`` worker iterations, and right after it
every worker of every DC holds the same model.

Fixes relative to GeoMX (docs/geomx-behaviour.md §6, bug 1):

* the milestone starts at the *global* initial model pulled at initialisation (GeoMX
  discards it and keeps its own rank-0 init, so DCs can start and stay offset);
* local syncs are counted per key (GeoMX counts key 0 only and assumes it finishes first);
* a stop request seen at a local sync is carried to the next global sync, so every DC
  stops after the same global sync holding the same model.

A local server's takeover (``[membership] on_server_loss = "wait"``,
docs/reliability.md): the local server holds its DC's model between global syncs (the
local average and the milestone), which dies with it. The global tier's store is only
the last sum of deltas, so :class:`SummingKeepsModel` also keeps the model every DC
holds after each global sync (milestone + sum, the same additions the local servers
make) and returns it to an initial pull: the successor's milestone is the other DCs'
one, bit for bit. The DC's round is counted from the workers' pushes, which number
their rounds under ``on_server_loss = "wait"`` (``meta["round"]``); the successor
starts at the last global sync's round (:meth:`HierarchicalAveraging.dc_round`), so
a worker's resent push of that round is answered with the milestone, not summed again,
and the next local sync's average comes from the workers' own models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from geomx.policy.options import PolicyOptions
from geomx.policy.sync import (GlobalContext, GlobalSide, JobView, LocalContext, LocalSide,
                               LocalSlotView, ServerSlot, SyncAlgorithm, WorkerContext,
                               WorkerSide)
from geomx.sync.fsa import FullySync
from geomx.sync.tensors import Value, copy_of, difference, digest, phantom, scaled, total
from geomx.wire import Message


@dataclass(frozen=True)
class HFAOptions(PolicyOptions):
    """``k1``: local steps per local sync; ``k2``: local syncs per global sync."""

    k1: int = 20
    k2: int = 10

    def __post_init__(self) -> None:
        if self.k1 < 1 or self.k2 < 1:
            raise ValueError(f"sync.k1 = {self.k1}, sync.k2 = {self.k2}; allowed: integers >= 1")


class HierarchicalAveraging(LocalSide):
    """Local server: local average every round, global delta average every ``k2`` rounds."""

    name = "hfa"

    def __init__(self, *, k2: int, num_dcs: int):
        if k2 < 1:
            raise ValueError(f"sync.k2 = {k2}; allowed: an integer >= 1")
        if num_dcs < 1:
            raise ValueError(f"HFA needs at least one DC, got {num_dcs}")
        self.k2 = k2
        self.num_dcs = num_dcs
        self.milestone: dict[int, Value] = {}
        self.local_syncs: dict[int, int] = {}
        self._stop_pending: dict[int, bool] = {}

    def on_initialized(self, ls: LocalContext, key: int, slot: LocalSlotView) -> None:
        self.milestone[key] = copy_of(slot.store)
        self.local_syncs[key] = 0

    def key_state(self, key: int) -> dict[str, Any]:
        """What a checkpoint keeps of ``key`` (geomx/node/checkpoint.py): the milestone
        and the local-sync count (taken after a global sync: no stop is pending)."""
        return {"milestone": self.milestone[key], "local_syncs": self.local_syncs[key]}

    def load_key_state(self, key: int, state: dict[str, Any]) -> None:
        self.milestone[key] = state["milestone"]
        self.local_syncs[key] = int(state["local_syncs"])

    def dc_round(self, key: int, global_round: int) -> int:
        """Global sync ``global_round`` ended local sync ``global_round * k2`` (a
        successor starts there: the initial pull returned that sync's model, the
        milestone, which :meth:`on_initialized` took)."""
        return global_round * self.k2

    def is_global(self, local_sync: int) -> bool:
        return local_sync % self.k2 == 0

    async def on_round(self, ls: LocalContext, key: int, slot: LocalSlotView, merged: Value,
                       waiting: list[Message], stop: bool) -> None:
        # workers pushed params / n_local, so ``merged`` is the DC average; workers that
        # number their pushes say which local sync this is (a successor took over
        # after local syncs it did not see)
        pushed = max((int(m.meta.get("round", 0)) for m in waiting), default=0)
        n = max(slot.round + 1, pushed)
        self.local_syncs[key] = n
        slot.round = n
        stop = self._stop_pending.pop(key, False) or stop
        if not self.is_global(n):
            if stop:
                self._stop_pending[key] = True
            slot.store = merged
            ls.answer_workers(slot, waiting)
            return
        milestone = self.milestone[key]
        delta = scaled(difference(merged, milestone), 1.0 / self.num_dcs)
        summed = await ls.exchange_global(key, slot, delta, stop=stop)
        model = total(milestone, summed)
        self.milestone[key] = model
        slot.store = copy_of(model)
        ls.record("global_sync", key=key, sync=n // self.k2, digest=digest(model))
        ls.answer_workers(slot, waiting)


class SummingKeepsModel(FullySync):
    """Global server: HFA's summing side (the store becomes each round's sum of DC
    deltas) that also keeps the model every DC holds after each global sync, and
    returns it to an initial pull -- what a local server's successor starts from."""

    def __init__(self) -> None:
        super().__init__(uses_optimizer=False)
        #: (key, part) -> the model, the slot, and the slot's version the model is at
        self.models: dict[tuple[int, int], Value] = {}
        self._slots: dict[tuple[int, int], ServerSlot] = {}
        self._at: dict[tuple[int, int], int] = {}

    def on_push(self, gs: GlobalContext, msg: Message, slot: ServerSlot, value: Value) -> None:
        ident = (msg.key, msg.part)
        if ident not in self.models:
            assert slot.store is not None
            self.models[ident] = copy_of(slot.store)  # the initial model, before any sum
        if ident not in self._slots:
            self._slots[ident] = slot
            self._at[ident] = slot.version
        super().on_push(gs, msg, slot, value)
        self._catch_up()

    def _catch_up(self) -> None:
        """Add each round's sum that completed since (a round completes inside
        ``on_push``, where a checkpoint may ask for :meth:`state_dict` first): the local
        servers' milestone + sum (HierarchicalAveraging.on_round)."""
        for ident, slot in self._slots.items():
            if slot.version != self._at[ident]:
                self.models[ident] = total(self.models[ident], slot.store)
                self._at[ident] = slot.version

    def initial_value(self, key: int, part: int, slot: ServerSlot) -> Value:
        self._catch_up()
        model = self.models.get((key, part))
        return super().initial_value(key, part, slot) if model is None else model

    def state_dict(self) -> Any:
        self._catch_up()
        return [[k, p, m] for (k, p), m in sorted(self.models.items())]

    def load_state_dict(self, state: Any) -> None:
        self.models = {(int(k), int(p)): m for k, p, m in (state or [])}
        self._slots = {}  # the slots' versions are the restored ones: counted from there


class HFAWorker(WorkerSide):
    """Worker: local steps; every ``k1`` iterations push ``params / n_local`` and pull."""

    name = "hfa"

    def __init__(self, *, kv: Any, params: list[Any], local_optimizer: Any, k1: int, k2: int):
        if k1 < 1 or k2 < 1:
            raise ValueError(f"sync.k1 = {k1}, sync.k2 = {k2}; allowed: integers >= 1")
        self.kv = kv
        self.params = params
        self.k1 = k1
        self.k2 = k2
        self.share = 1.0 / kv.num_workers
        self.local_opt = None if not params or phantom(params[0]) else local_optimizer
        self.states = ([self.local_opt.create_state(k, p) for k, p in enumerate(params)]
                       if self.local_opt is not None else [])

    async def step(self, iteration: int, grads: list[Any]) -> bool:
        if self.local_opt is not None:
            for k, g in enumerate(grads):
                self.local_opt.update(k, self.params[k], g, self.states[k])
        if iteration % self.k1 != 0:
            return False
        kv = self.kv
        for k in reversed(range(len(self.params))):
            kv.push(k, scaled(self.params[k], self.share), priority=-k)
        for k in range(len(self.params)):
            await kv.pull(k, out=self.params[k], priority=-k)
        return (iteration // self.k1) % self.k2 == 0


class HFA(SyncAlgorithm):
    """``hfa``: local optimizer steps, a DC average every ``k1`` iterations and a global
    average of the DC models every ``k2``-th of those (docs/geomx-behaviour.md §3.4)."""

    name = "hfa"
    checkpoint_cuts = True  # its global syncs are synchronous rounds
    Options = HFAOptions
    uses_global_optimizer = False
    needs_local_tier = True
    options: HFAOptions

    @classmethod
    def options_from_sync(cls, sync: Mapping[str, Any]) -> HFAOptions:
        return HFAOptions(k1=int(sync.get("k1", 20)), k2=int(sync.get("k2", 10)))

    def exchange_iterations(self) -> int:
        return self.options.k1 * self.options.k2

    def global_side(self, job: JobView) -> GlobalSide:
        # the DCs push model deltas that the global tier only sums; where a local
        # server may be taken over, it also keeps the model for the successor
        if getattr(job, "on_server_loss", "fail") == "wait":
            return SummingKeepsModel()
        return FullySync(uses_optimizer=False)

    def local_side(self, job: JobView) -> LocalSide:
        return HierarchicalAveraging(k2=self.options.k2, num_dcs=len(job.party_dcs))

    def worker_side(self, ctx: WorkerContext) -> WorkerSide:
        return HFAWorker(kv=ctx.kv, params=ctx.params, local_optimizer=ctx.local_optimizer(),
                         k1=self.options.k1, k2=self.options.k2)
