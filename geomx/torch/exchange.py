"""What one ``DistributedOptimizer.step()`` sends and receives, per sync algorithm.

The same rounds as the built-in trainer's worker sides (geomx/sync/fsa.py, hfa.py,
esync.py, mixed.py; geomx/policy/sync.py), with the wrapped torch optimizer taking the
local steps where those take a ``geomx.optim`` one, and written as operations that
start kvstore calls and yield what they wait for (geomx/torch/waits.py), so that a
synchronous and an asynchronous program run the same code:

* FSA and MixedSync (:class:`GradientRounds`): push every gradient (the earliest layer
  with the highest priority), pull the servers' sum and step the torch optimizer with
  its mean -- BytePS's semantics, the same step on every worker; or, with a server-side
  optimizer, pull the new weights (GeoMX's ``cnn.py``, docs/geomx-behaviour.md §2.2);
* HFA (:class:`ModelAveragingRounds`): a local step every iteration; every ``k1`` push
  ``weights / n_local`` and pull the average (docs/geomx-behaviour.md §3.4);
* ESync (:class:`BudgetedDeltaRounds`): local steps until the state server's budget is
  used, then push the model delta and pull the sum of the deltas (docs/papers.md §5).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from geomx.node.sync_contexts import WorkerSyncContext
from geomx.torch.session import Session, TorchAPIError
from geomx.torch.tensors import HostBuffers
from geomx.torch.waits import Operation, on_loop
from geomx.wire import Kind, Message

ALGORITHMS = ("fsa", "mixed", "hfa", "esync")


class Rounds:
    """One worker's exchange with the servers, step by step."""

    def __init__(self, s: Session, names: list[str], params: list[torch.Tensor],
                 buffers: HostBuffers, optimizer: torch.optim.Optimizer):
        self.s = s
        self.kv = s.kv
        self.names = names
        self.params = params
        self.buffers = buffers
        self.optimizer = optimizer

    def step(self, iteration: int) -> Operation[bool]:
        """Apply this step's gradients (in ``p.grad``); True when every worker now holds
        the same model."""
        raise NotImplementedError

    def _push(self, values: list[np.ndarray], skip: Any = ()) -> list[Any]:
        # the last layer's gradient is ready first; the earliest layer goes first on the
        # wire (priority -k, as the built-in trainer's sides push)
        return [self.kv.push(self.names[k], values[k], priority=-k)
                for k in reversed(range(len(values))) if k not in skip]

    def _pull(self, outs: list[np.ndarray], skip: Any = ()) -> list[Any]:
        return [self.kv.pull(self.names[k], out=outs[k], priority=-k)
                for k in range(len(outs)) if k not in skip]

    def can_start_early(self, index: int) -> bool:
        """Whether parameter ``index``'s exchange may start from its backward hook, before
        ``step()`` (only rounds of gradients can)."""
        return False

    def start_early(self, index: int, grad: torch.Tensor) -> None:
        """Start parameter ``index``'s exchange with its finished gradient ``grad``."""
        raise NotImplementedError

    def started_early(self) -> list[int]:
        """The parameters whose exchange started before this step."""
        return []

    def _local_step(self) -> None:
        self.optimizer.step()


def _host_like(t: torch.Tensor, staged: bool) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype,
                       pin_memory=staged and torch.cuda.is_available())


class GradientRounds(Rounds):
    """FSA / MixedSync: every step is a round of gradients."""

    def __init__(self, *args: Any, pull_weights: bool):
        super().__init__(*args)
        self.pull_weights = pull_weights
        self._agg = [_host_like(p, st) for p, st in zip(self.params, self.buffers.staged)]
        self._agg_np = [a.numpy() for a in self._agg]
        #: parameter index -> the push and pull its backward hook started this step
        self._early: dict[int, list[Any]] = {}

    def can_start_early(self, index: int) -> bool:
        # a host tensor's gradient is read where it lies; weights pulled from a server
        # optimizer land in the model, which the rest of the backward pass still reads
        return not self.pull_weights and not self.buffers.staged[index]

    def start_early(self, index: int, grad: torch.Tensor) -> None:
        name = self.names[index]
        self._early[index] = [self.kv.push(name, grad.detach().numpy(), priority=-index),
                              self.kv.pull(name, out=self._agg_np[index], priority=-index)]

    def started_early(self) -> list[int]:
        return sorted(self._early)

    def step(self, iteration: int) -> Operation[bool]:
        early, self._early = self._early, {}
        grads = self.buffers.grads_from_device([None if k in early else p.grad
                                                for k, p in enumerate(self.params)])
        if self.pull_weights:
            waits = self._push(grads) + self._pull(self.buffers.writable_weights())
            yield waits
            self.buffers.weights_to_device()
            return True
        waits = [w for ws in early.values() for w in ws]
        waits += self._push(grads, skip=early) + self._pull(self._agg_np, skip=early)
        yield waits
        mean = 1.0 / self.kv.num_all_workers
        with torch.no_grad():
            for p, a in zip(self.params, self._agg):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                if p.grad.device == a.device:
                    torch.mul(a, mean, out=p.grad)  # one pass over the values
                else:
                    p.grad.copy_(a, non_blocking=True)
                    p.grad.mul_(mean)
        self._local_step()
        return True


class ModelAveragingRounds(Rounds):
    """HFA: local steps, a DC average every ``k1`` iterations (a global one every
    ``k2``-th, done by the servers)."""

    def __init__(self, *args: Any, k1: int, k2: int):
        super().__init__(*args)
        self.k1, self.k2 = k1, k2
        self.share = 1.0 / self.kv.num_workers

    def step(self, iteration: int) -> Operation[bool]:
        self._local_step()
        if iteration % self.k1 != 0:
            return False
        weights = self.buffers.weights_from_device()
        yield self._push([w * w.dtype.type(self.share) for w in weights]) \
            + self._pull(weights)
        self.buffers.weights_to_device()
        return (iteration // self.k1) % self.k2 == 0


class BudgetedDeltaRounds(Rounds):
    """ESync: local steps until the budget is used, then the mean of the model deltas."""

    def __init__(self, *args: Any, max_iterations: int):
        super().__init__(*args)
        self.ctx = WorkerSyncContext(self.s.node, kv=self.kv, params=[], pull_weights=False,
                                     local_optimizer=lambda: None,
                                     max_iterations=max_iterations)
        self.server = self.ctx.state_server
        if not self.server:
            raise TorchAPIError("sync.algorithm = 'esync' needs the job's state server; "
                                "run the scenario through geomx run / geomx node")
        self.max_iterations = max_iterations
        self.prev = [w.copy() for w in self.buffers.weights_from_device()]
        self._agg = [np.zeros_like(w) for w in self.prev]
        self.round = 1
        self.budget = 1
        self.steps = 0
        self._mark = self.ctx.now()

    def step(self, iteration: int) -> Operation[bool]:
        step_s = self.ctx.now() - self._mark
        self._local_step()
        self.steps += 1
        end_round = self.steps >= self.budget
        if self.max_iterations and iteration >= self.max_iterations:
            self.kv.request_stop()  # leave together: this round carries the stop
            end_round = True
        if end_round:
            ctx = self.ctx
            msg = Message(Kind.STATE_QUERY, ctx.node_name, self.server, version=self.round + 1,
                          meta={"step_s": step_s, "end_s": ctx.now(), "steps": self.steps})
            query = on_loop(self.s, _ask, ctx, msg)
            weights = self.buffers.weights_from_device()
            yield self._push([w - p for w, p in zip(weights, self.prev)]) \
                + self._pull(self._agg) + [query]
            weights = self.buffers.writable_weights()
            n = self.kv.num_all_workers
            for w, a, prev in zip(weights, self._agg, self.prev):
                np.multiply(a, w.dtype.type(1.0 / n), out=w)
                w += prev
                np.copyto(prev, w)
            self.buffers.weights_to_device()
            self.budget = max(1, int(query.result().meta.get("steps", 1)))
            self.round += 1
            self.steps = 0
        self._mark = self.ctx.now()
        return end_round


def _ask(ctx: WorkerSyncContext, msg: Message) -> Any:
    return ctx.spawn(ctx.request(msg))


def _user_gradient_policy(algorithm: Any) -> bool:
    """A sync policy of the user's whose global servers run the optimizer: what a worker
    pushes is a gradient and what it pulls the model, whatever the global side decides
    about when to answer (SSP, a quorum)."""
    return algorithm.name not in ALGORITHMS and algorithm.uses_global_optimizer


def server_optimizer_problem(algorithm: Any, server_optimizer: bool) -> str | None:
    """Why ``DistributedOptimizer(server_optimizer=...)`` cannot run under ``algorithm``:
    MixedSync and a sync policy of the user's whose global servers run the optimizer
    apply each push as a global step, so the optimizer must be on the servers."""
    if server_optimizer:
        return None
    if algorithm.name == "mixed":
        return ("sync.algorithm = 'mixed' applies each DC's push as a global step, so the "
                "optimizer must run on the servers: pass DistributedOptimizer(..., "
                "server_optimizer=True)")
    if _user_gradient_policy(algorithm):
        return (f"sync.algorithm = {algorithm.name!r} runs the optimizer on the global "
                f"servers ({type(algorithm).__name__}.uses_global_optimizer), so the workers "
                "push gradients and pull weights: pass DistributedOptimizer(..., "
                "server_optimizer=True)")
    return None


def rounds_for(s: Session, names: list[str], params: list[torch.Tensor], buffers: HostBuffers,
               optimizer: torch.optim.Optimizer, *, pull_weights: bool) -> Rounds:
    """The rounds of the scenario's ``[sync] algorithm``; another one is refused by name.
    ``pull_weights`` has passed :func:`server_optimizer_problem` (DistributedOptimizer
    checks it when it is built)."""
    algorithm = s.node.job.sync_algorithm
    name = algorithm.name
    args = (s, names, params, buffers, optimizer)
    if name in ("fsa", "mixed") or _user_gradient_policy(algorithm):
        return GradientRounds(*args, pull_weights=pull_weights)
    if name == "hfa":
        return ModelAveragingRounds(*args, k1=int(algorithm.options.k1),
                                    k2=int(algorithm.options.k2))
    if name == "esync":
        return BudgetedDeltaRounds(*args, max_iterations=int(s.ctx.max_iterations))
    raise TorchAPIError(f"sync.algorithm = {name!r}: geomx.torch.DistributedOptimizer runs "
                        f"under {', '.join(ALGORITHMS)} and sync policies whose global "
                        "servers run the optimizer (uses_global_optimizer); "
                        f"{type(algorithm).__name__} does not: use ctx.worker_sync")
