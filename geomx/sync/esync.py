"""ESync: a state server sizes each worker's local steps so that everybody arrives together.

docs/papers.md §5 (Lizonghang/ESync; TSC 2020). Heterogeneous workers would make a
synchronous round wait for the slowest; ESync lets fast workers take *more local steps*
per round, then averages synchronously: every worker pushes ``delta = w - w_prev``, the
servers sum, and every worker sets ``w <- w_prev + sum(delta) / W`` (global lr 1, not
weighted by step counts) and ``w_prev <- w``.

The paper's ready rule (``is_ready``): worker ``r`` with ``k_r`` local steps done this
round is ready when ``k_r > 0`` and either it is the slowest worker ``s`` (largest step
time ``c``), or ``s`` is ready, or ``c_r + eps > rest`` where ``rest = c_s - (now - e_s)``
is the time until ``s`` finishes its current step (``e`` = end of a worker's last step):
one more step by ``r`` would overshoot the slowest worker's arrival.

What differs from the paper, and why: the paper's workers ask an HTTP state server
*before every minibatch*, which is cheap inside one cluster. Across a WAN that is a round
trip per step, so here each worker asks **once per round** for a *step budget*: the state
server replays the same rule from a common round start for every worker (the slowest
does one step, worker ``j`` about ``floor(c_slowest / c_j)``). The query for round
``t + 1`` (carrying the step time just measured) is sent when round ``t``'s push starts
and is answered once every worker's query for ``t + 1`` is in, so it travels while the
synchronisation does and adds no waiting; round 1 is one step for everybody (nothing
has been measured yet). Queries and answers are ``STATE_QUERY`` / ``STATE_REPLY``
messages through the Transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geomx.policy.context import NodeContext
from geomx.policy.options import PolicyOptions
from geomx.policy.sync import (GlobalSide, JobView, LocalSide, StateService, SyncAlgorithm,
                               WorkerContext, WorkerSide)
from geomx.sync.fsa import ForwardEveryRound, FullySync
from geomx.sync.tensors import copy_of, difference, phantom
from geomx.wire import Kind, Message

#: Step times are rounded to this before use, so budgets do not hinge on float noise
#: in ``now() - mark`` (1 ns).
STEP_TIME_RESOLUTION_S = 1e-9


def is_ready(*, worker: str, steps_done: int, step_s: dict[str, float],
             end_s: dict[str, float], now_s: float, slowest: str, slowest_ready: bool,
             epsilon_s: float) -> bool:
    """The ESync ready rule for ``worker`` (docs/papers.md §5)."""
    if steps_done <= 0:
        return False
    if worker == slowest or slowest_ready:
        return True
    rest_s = step_s[slowest] - (now_s - end_s[slowest])
    return step_s[worker] + epsilon_s > rest_s


def slowest_of(step_s: dict[str, float]) -> str:
    """The worker with the longest step (ties: the first name, for determinism)."""
    return max(sorted(step_s), key=lambda w: step_s[w])


def local_step_budget(worker: str, step_s: dict[str, float], *, epsilon_s: float,
                      max_steps: int) -> int:
    """Local steps ``worker`` takes in a round, by replaying :func:`is_ready` from a
    round start shared by everybody (the slowest worker's step starts then too)."""
    if worker not in step_s or max_steps <= 1:
        return 1
    slowest = slowest_of(step_s)
    end_s = {slowest: 0.0}
    steps = 0
    while steps < max_steps:
        now_s = steps * step_s[worker]
        if is_ready(worker=worker, steps_done=steps, step_s=step_s, end_s=end_s, now_s=now_s,
                    slowest=slowest, slowest_ready=False, epsilon_s=epsilon_s):
            return steps
        steps += 1
    return max_steps


@dataclass
class WorkerRecord:
    """What the state server knows about one worker (the paper's per-worker record)."""

    step_s: float | None = None      # c_r: duration of its last local step
    end_s: float | None = None       # e_r: when its last local step ended
    steps: int = 0                   # k_r: local steps it took in its last round


@dataclass
class StateBoard:
    """The state server's bookkeeping: records, and the queries of each round.

    A lost worker leaves the board (:meth:`drop`); when it restarts it comes back
    (:meth:`take_back`) and counts from the first round it asks about: rounds before that
    one do not wait for it, and if the others' queries of that round were all in already,
    its query is answered at once with budgets sized from what the board knows then."""

    workers: list[str]
    epsilon_s: float = 0.0
    max_steps: int = 64
    records: dict[str, WorkerRecord] = field(default_factory=dict)
    _asked: dict[int, set[str]] = field(default_factory=dict)
    #: the newest round whose budgets were given
    answered: int = 0
    #: every worker of the job in rank order (the board's order when a worker comes back)
    _ranks: dict[str, int] = field(default_factory=dict)
    #: workers taken back that have not asked yet, and the first round each counts in
    _returning: set[str] = field(default_factory=set)
    _counts_from: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._ranks = {w: i for i, w in enumerate(self.workers)}

    def report(self, worker: str, *, round_: int, step_s: float | None, end_s: float | None,
               steps: int) -> dict[str, int] | None:
        """Note ``worker``'s query for round ``round_``; when it is the last one of the
        round, return every worker's step budget for that round."""
        late = False
        if worker in self._returning:
            self._returning.discard(worker)
            self.workers = sorted([*self.workers, worker], key=self._ranks.__getitem__)
            # the others may have been answered for this round already: it then counts
            # from the next one, and this query is answered alone
            late = round_ <= self.answered
            self._counts_from[worker] = round_ + 1 if late else round_
        if worker not in self.workers:
            raise ValueError(f"{worker} is not a training worker of this job")
        rec = self.records.setdefault(worker, WorkerRecord())
        if step_s is not None:
            rec.step_s = round(float(step_s) / STEP_TIME_RESOLUTION_S) * STEP_TIME_RESOLUTION_S
        rec.end_s = end_s
        rec.steps = steps
        if late:
            return self.budgets()
        asked = self._asked.setdefault(round_, set())
        asked.add(worker)
        if not self._all_in(round_, asked):
            return None
        del self._asked[round_]
        self.answered = max(self.answered, round_)
        return self.budgets()

    def _all_in(self, round_: int, asked: set[str]) -> bool:
        """Has every worker that counts in ``round_`` asked about it?"""
        if not self._counts_from:
            return len(asked) >= len(self.workers)
        return all(w in asked for w in self.workers if self._counts_from.get(w, 0) <= round_)

    def drop(self, worker: str) -> dict[int, dict[str, int]]:
        """``worker`` was lost: budgets are sized for the others from now on. Returns the
        budgets of each round whose queries are now all in."""
        self._returning.discard(worker)
        self._counts_from.pop(worker, None)
        if worker not in self.workers:
            return {}
        self.workers = [w for w in self.workers if w != worker]
        self.records.pop(worker, None)
        out = {}
        for round_, asked in sorted(self._asked.items()):
            asked.discard(worker)
            if asked and self._all_in(round_, asked):
                del self._asked[round_]
                self.answered = max(self.answered, round_)
                out[round_] = self.budgets()
        return out

    def take_back(self, worker: str) -> None:
        """A lost ``worker`` restarted: it counts again from its first query."""
        if worker not in self._ranks:
            raise ValueError(f"{worker} is not a training worker of this job")
        if worker not in self.workers:
            self._returning.add(worker)

    def budgets(self) -> dict[str, int]:
        known = {w: r.step_s for w, r in self.records.items() if r.step_s is not None}
        if len(known) < len(self.workers):
            return {w: 1 for w in self.workers}
        return {w: local_step_budget(w, known, epsilon_s=self.epsilon_s, max_steps=self.max_steps)
                for w in self.workers}


class StateBoardService(StateService):
    """The state server's side of ESync: a :class:`StateBoard` answering ``STATE_QUERY``
    meta (``step_s``, ``end_s``, ``steps``) with each worker's budget (``steps``)."""

    def __init__(self, board: StateBoard):
        self.board = board

    def on_query(self, ctx: NodeContext, worker: str, round_: int,
                 meta: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
        step_s = meta.get("step_s")
        budgets = self.board.report(worker, round_=round_,
                                    step_s=None if step_s is None else float(step_s),
                                    end_s=meta.get("end_s"), steps=int(meta.get("steps", 0)))
        if budgets is None:
            return None
        ctx.record("esync_round", round=round_, budgets=budgets)
        return {w: {"steps": n} for w, n in budgets.items()}

    def on_worker_lost(self, ctx: NodeContext, worker: str) -> dict[int, dict[str, dict[str, Any]]]:
        out = {}
        for round_, budgets in self.board.drop(worker).items():
            ctx.record("esync_round", round=round_, budgets=budgets)
            out[round_] = {w: {"steps": n} for w, n in budgets.items()}
        return out

    def on_worker_rejoined(self, ctx: NodeContext, worker: str) -> None:
        self.board.take_back(worker)


class ESyncWorker(WorkerSide):
    """Worker: local steps until the budget is used, then a synchronous delta average."""

    name = "esync"

    def __init__(self, *, ctx: WorkerContext, kv: Any, params: list[Any], local_optimizer: Any,
                 max_iterations: int = 0):
        self.ctx = ctx
        self.kv = kv
        self.params = params
        self.server = ctx.state_server
        if not self.server:
            raise ValueError("sync.algorithm = 'esync' needs a state server in the job "
                             "(JobSpec.state_server); build the job with geomx.cluster.plan_job")
        self.num_all_workers = kv.num_all_workers
        self.max_iterations = max_iterations
        self.real = bool(params) and not phantom(params[0])
        self.local_opt = local_optimizer if self.real else None
        self.states = ([local_optimizer.create_state(k, p) for k, p in enumerate(params)]
                       if self.real else [])
        self.prev = [copy_of(p) for p in params]
        self.agg = [np.zeros_like(p) for p in params] if self.real else []
        self.round = 1
        self.budget = 1
        self.steps = 0
        self.step_s: float | None = None
        self._mark = ctx.now()

    async def step(self, iteration: int, grads: list[Any]) -> bool:
        self.step_s = self.ctx.now() - self._mark
        if self.local_opt is not None:
            for k, g in enumerate(grads):
                self.local_opt.update(k, self.params[k], g, self.states[k])
        self.steps += 1
        end_round = self.steps >= self.budget
        if self.max_iterations and iteration >= self.max_iterations:
            # leave together: this round ends now and carries the stop to everybody
            self.kv.request_stop()
            end_round = True
        if end_round:
            await self._synchronise()
        self._mark = self.ctx.now()
        return end_round

    async def _synchronise(self) -> None:
        ctx, kv = self.ctx, self.kv
        query = ctx.spawn(ctx.request(Message(
            Kind.STATE_QUERY, ctx.node_name, self.server, version=self.round + 1,
            meta={"step_s": self.step_s, "end_s": ctx.now(), "steps": self.steps})))
        for k in reversed(range(len(self.params))):
            kv.push(k, difference(self.params[k], self.prev[k]), priority=-k)
        for k in range(len(self.params)):
            if self.real:
                await kv.pull(k, out=self.agg[k], priority=-k)
                p = self.params[k]
                np.multiply(self.agg[k], p.dtype.type(1.0 / self.num_all_workers), out=p)
                p += self.prev[k]
                np.copyto(self.prev[k], p)
            else:
                await kv.pull(k, out=self.params[k], priority=-k)
        reply = await query
        self.budget = max(1, int(reply.meta.get("steps", 1)))
        self.round += 1
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint is taken after the step that ended a round: the next round's
        number and step budget, and the model the next delta is taken against (the step
        time is measured again by the next step). The state server keeps nothing a
        checkpoint needs: every record it computes budgets from is replaced by the next
        round's queries before it answers them (docs/reliability.md)."""
        return {"round": self.round, "budget": self.budget,
                "prev": list(self.prev) if self.real else []}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.budget = int(state["budget"])
        for k, saved in enumerate(state["prev"]):
            np.copyto(self.prev[k], saved)
        self.steps = 0
        self._mark = self.ctx.now()  # the next step's time counts from here, as after a sync

    def rejoined(self, round_: int) -> None:
        """A restarted worker starts round ``round_ + 1`` from the model it pulled: the
        next delta is taken against it, with one local step (nothing measured yet), and
        its query is for the round after, as everybody's is."""
        self.round = round_ + 1
        self.budget = 1
        self.steps = 0
        for k, p in enumerate(self.params):
            self.prev[k] = copy_of(p)
        self._mark = self.ctx.now()

    async def finish(self) -> None:
        """Tell the state server this worker is done (it stops when all are)."""
        self.ctx.post(Message(Kind.SHUTDOWN, self.ctx.node_name, self.server))


@dataclass(frozen=True)
class ESyncOptions(PolicyOptions):
    """``epsilon_s``: the ready rule's slack; ``max_local_steps``: the most local steps a
    worker takes in one round."""

    epsilon_s: float = 0.0
    max_local_steps: int = 64

    def __post_init__(self) -> None:
        if self.epsilon_s < 0:
            raise ValueError(f"sync.esync_epsilon = {self.epsilon_s}; allowed: a duration >= 0")
        if self.max_local_steps < 1:
            raise ValueError(f"sync.esync_max_local_steps = {self.max_local_steps}; "
                             "allowed: an integer >= 1")


class ESync(SyncAlgorithm):
    """``esync``: local steps sized by a state server so that every worker of the job
    arrives at the synchronous delta average together (docs/papers.md §5)."""

    name = "esync"
    checkpoint_cuts = True  # its global rounds are synchronous
    Options = ESyncOptions
    uses_global_optimizer = False
    needs_local_tier = True
    needs_state_server = True
    state_service_rejoins = True
    options: ESyncOptions

    @classmethod
    def options_from_sync(cls, sync: Mapping[str, Any]) -> ESyncOptions:
        return ESyncOptions(epsilon_s=float(sync.get("esync_epsilon_s", 0.0)),
                            max_local_steps=int(sync.get("esync_max_local_steps", 64)))

    def exchange_iterations(self) -> int:
        return 2

    def global_side(self, job: JobView) -> GlobalSide:
        # workers push model deltas that the global tier only sums
        return FullySync(uses_optimizer=False)

    def local_side(self, job: JobView) -> LocalSide:
        return ForwardEveryRound()

    def worker_side(self, ctx: WorkerContext) -> WorkerSide:
        return ESyncWorker(ctx=ctx, kv=ctx.kv, params=ctx.params,
                           local_optimizer=ctx.local_optimizer(),
                           max_iterations=ctx.max_iterations)

    async def worker_left(self, ctx: WorkerContext) -> None:
        """A worker that trained without an :class:`ESyncWorker` (a program pushing by
        hand) still leaves the state server, which stops once every worker has."""
        ctx.post(Message(Kind.SHUTDOWN, ctx.node_name, ctx.state_server))

    def state_service(self, job: JobView) -> StateService:
        return StateBoardService(StateBoard(list(job.all_workers),
                                            epsilon_s=self.options.epsilon_s,
                                            max_steps=self.options.max_local_steps))
