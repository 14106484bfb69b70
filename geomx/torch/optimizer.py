"""``DistributedOptimizer``: Horovod's and BytePS's wrapper of a torch optimizer.

As in BytePS the servers aggregate, every worker pulls the aggregate and the wrapped
optimizer steps locally, the same step on every worker (geomx/torch/exchange.py has the
rounds of each sync algorithm). With ``server_optimizer=True`` the optimizer runs on the
global servers instead, GeoMX's way (docs/geomx-behaviour.md §2.2), where
``geomx.optim`` has the very same one; otherwise that is refused by name.

The servers, codec, sync algorithm, transfer scheduler (P3/DGT/TSEngine) and NETSTORM
come from the scenario, as for any program. ``step()`` also charges the scenario's
per-iteration compute (``ctx.compute("per_iter")``) once per backward pass, unless the
program called ``ctx.compute`` itself since the previous step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch

from geomx.torch.compression import Compression, codec_config
from geomx.torch.exchange import Rounds, rounds_for, server_optimizer_problem
from geomx.torch.resume import publish, restore_optimizer
from geomx.torch.session import TorchAPIError, session
from geomx.torch.tensors import HostBuffers, check_tensor
from geomx.torch.waits import Operation, drive


def server_optimizer_config(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The ``geomx.optim`` config that updates exactly as ``optimizer`` does; refused by
    name when there is none."""
    groups = optimizer.param_groups
    kind = type(optimizer).__name__
    allowed = ("allowed: torch.optim.SGD (plain, or momentum without dampening or "
               "nesterov), or server_optimizer=False (the torch optimizer steps on the workers)")
    if not isinstance(optimizer, torch.optim.SGD):
        raise TorchAPIError(f"server_optimizer=True: torch.optim.{kind} has no identical "
                            f"optimizer in geomx.optim; {allowed}")
    keys = ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize")
    if any(tuple(g.get(k) for k in keys) != tuple(groups[0].get(k) for k in keys)
           for g in groups):
        raise TorchAPIError("server_optimizer=True: the parameter groups have different "
                            "hyper-parameters; the servers run one optimizer for all keys")
    g = groups[0]
    if g.get("dampening") or g.get("nesterov") or g.get("maximize"):
        raise TorchAPIError("server_optimizer=True: torch.optim.SGD with dampening, nesterov "
                            f"or maximize has no identical optimizer in geomx.optim; {allowed}")
    lr = float(g["lr"])
    wd = float(g.get("weight_decay") or 0.0)
    if g.get("momentum"):
        return {"name": "momentum", "lr": lr, "momentum": float(g["momentum"]), "wd": wd}
    return {"name": "sgd", "lr": lr, "wd": wd}


class DistributedOptimizer(torch.optim.Optimizer):
    """Wrap ``optimizer`` so that ``step()`` trains with every worker of the job.

    ``named_parameters``: ``model.named_parameters()``, whose names become the keys (in
    model order: the earliest layer gets the highest push priority); default: the
    optimizer's parameters as ``group<i>.param<j>``. ``compression``:
    :class:`~geomx.torch.compression.Compression` (the job's codec).
    ``backward_passes_per_step``: the backward passes each ``step()`` accumulates (their
    gradients add up in ``p.grad``, as in Horovod; more passes than that before a
    ``step()`` is an error). ``server_optimizer``: run the optimizer on the global
    servers (``torch.optim.SGD`` only) and pull weights. ``send_during_backward``: send
    each gradient from its backward hook where that changes no emulated time
    (docs/torch.md, "Sending during the backward pass"); False sends all from ``step()``
    (needed to change gradients between ``backward()`` and ``step()``).

    ``step()`` blocks in a synchronous ``def main(kv, ctx)``; in an ``async def main``
    use ``await optimizer.step_async()``. The wrapped optimizer's ``param_groups`` and
    ``state`` are this object's, so learning-rate schedulers and ``state_dict()`` work on
    either."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                 compression: Any = Compression.none, backward_passes_per_step: int = 1,
                 *, server_optimizer: bool = False, stage_through_host: bool = False,
                 send_during_backward: bool = True):
        s = session()
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.state = optimizer.state
        self.optimizer = optimizer
        self._s = s
        if int(backward_passes_per_step) < 1:
            raise TorchAPIError(f"backward_passes_per_step={backward_passes_per_step}; "
                                "allowed: an integer >= 1")
        self.backward_passes_per_step = int(backward_passes_per_step)
        self._names, self._params = self._name_params(optimizer, named_parameters)
        for n, p in zip(self._names, self._params):
            check_tensor(n, p, s.node_name)
        self._shapes = [tuple(p.shape) for p in self._params]
        self._stage = bool(stage_through_host)
        codec = codec_config(compression)
        self.server_optimizer = bool(server_optimizer)
        problem = server_optimizer_problem(s.node.job.sync_algorithm, self.server_optimizer)
        if problem:  # now, before the master initialises keys a server would refuse
            raise TorchAPIError(problem)
        kv = s.kv
        if self.server_optimizer:
            kv.set_optimizer(server_optimizer_config(optimizer))
        if codec is not None:
            kv.set_gradient_compression(codec)
        self._rounds: Rounds | None = None
        self._iteration = 0
        self._passes = {id(p): 0 for p in self._params}
        self._index = {id(p): k for k, p in enumerate(self._params)}
        self._name_of = {id(p): n for n, p in zip(self._names, self._params)}
        self._compute_mark = s.compute_calls
        #: the thread that calls step() (the program's), once gradients may be sent from
        #: the backward pass (:meth:`_start_early`); None until then or when not wanted
        self._early_thread: int | None = None
        self._send_during_backward = bool(send_during_backward)
        #: parameter index -> the gradient sent from the backward pass, and its version
        self._sent: dict[int, tuple[torch.Tensor, int]] = {}
        for n, p in zip(self._names, self._params):
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._count_pass)

    @staticmethod
    def _name_params(optimizer: torch.optim.Optimizer,
                     named: Iterable[tuple[str, torch.Tensor]] | None
                     ) -> tuple[list[str], list[torch.Tensor]]:
        in_opt = [p for g in optimizer.param_groups for p in g["params"]]
        if named is None:
            return ([f"group{gi}.param{pj}" for gi, g in enumerate(optimizer.param_groups)
                     for pj in range(len(g["params"]))], in_opt)
        pairs = list(named)
        names = [n for n, _ in pairs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise TorchAPIError(f"named_parameters: the name {dup[0]!r} appears twice")
        by_id = {id(p): n for n, p in pairs}
        missing = [i for i, p in enumerate(in_opt) if id(p) not in by_id]
        if missing:
            raise TorchAPIError(f"named_parameters: the optimizer's parameter {missing[0]} "
                                f"(shape {list(in_opt[missing[0]].shape)}) has no name there; "
                                "pass model.named_parameters() of the model it optimizes")
        # model order (the earliest layer first), only what the optimizer updates
        opt_ids = {id(p) for p in in_opt}
        chosen = [(n, p) for n, p in pairs if id(p) in opt_ids]
        return [n for n, _ in chosen], [p for _, p in chosen]

    def _count_pass(self, p: torch.Tensor) -> None:
        passes = self._passes[id(p)] = self._passes.get(id(p), 0) + 1
        if passes == self.backward_passes_per_step and self._early_thread is not None:
            self._start_early(p)

    def _start_early(self, p: torch.Tensor) -> None:
        """Send ``p``'s finished gradient while the backward pass goes on with the layers
        before it, as Horovod and BytePS do from the same hook; ``step()`` then sends the
        rest and waits. Only where that changes no emulated time: the scenario charges
        this worker no per-iteration compute and the program charges none itself (a
        gradient must not leave before the compute that makes it is over), and only from
        the program's own thread (a device's autograd thread cannot call the kvstore)."""
        k = self._index[id(p)]
        rounds = self._rounds
        if (rounds is None or threading.get_ident() != self._early_thread
                or self._s.compute_calls != self._compute_mark
                or p.grad is None or tuple(p.grad.shape) != self._shapes[k]
                or not p.grad.is_contiguous() or not rounds.can_start_early(k)):
            return
        rounds.start_early(k, p.grad)
        self._sent[k] = (p.grad, p.grad._version)

    def _check_sent(self) -> None:
        """A gradient sent from the backward pass must be the one ``step()`` would send:
        changed since (clipped, scaled), what the servers got is stale -- an error."""
        sent, self._sent = self._sent, {}
        for k, (grad, version) in sent.items():
            now = self._params[k].grad
            if now is not grad or grad._version != version:
                raise TorchAPIError(
                    f"parameter {self._names[k]!r} on node {self._s.node_name}: its gradient "
                    "changed between backward() and step() (gradient clipping?), after the "
                    "backward pass had sent it; pass DistributedOptimizer(..., "
                    "send_during_backward=False) to send gradients from step()")

    # ------------------------------------------------------------------ step
    def step(self, closure: Any = None) -> Any:
        """One training step with every worker (blocks; in an ``async def main`` use
        ``await step_async()``). Returns the closure's loss, as torch optimizers do."""
        if not self._s.sync_program():
            raise TorchAPIError("optimizer.step() blocks, and this program is an async def "
                                "main: use `await optimizer.step_async()`")
        loss = self._closure(closure)
        drive(self._s, self._step_op())
        return loss

    async def step_async(self, closure: Any = None) -> Any:
        """``step()`` for an ``async def main``: ``await optimizer.step_async()``."""
        loss = self._closure(closure)
        await drive(self._s, self._step_op())
        return loss

    @staticmethod
    def _closure(closure: Any) -> Any:
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def _step_op(self) -> Operation[bool]:
        s = self._s
        if s.is_master:
            raise TorchAPIError(f"node {s.node_name} is the master worker, which trains "
                                "nothing: return from main after broadcast_parameters "
                                "(`if geomx.torch.is_master(): return`)")
        undeclared = [n for n in self._names if n not in s.declared]
        if undeclared:
            raise TorchAPIError(f"parameter {undeclared[0]!r} was never broadcast on node "
                                f"{s.node_name}: call geomx.torch.broadcast_parameters("
                                "model.state_dict(), root_rank=0) on every node before the "
                                "first step")
        passes = self._check_step()
        if self._rounds is None:  # (before the compute: ESync times the whole step)
            restore_optimizer(s, self.optimizer, dict(zip(self._names, self._params)))
            buffers = HostBuffers(self._params, stage=self._stage)
            self._rounds = rounds_for(s, self._names, self._params, buffers, self.optimizer,
                                      pull_weights=self.server_optimizer)
            if (self._send_during_backward and float(s.node.compute_s_per_iter) == 0.0
                    and s.compute_calls == 0):
                self._early_thread = threading.get_ident()
        self._check_sent()
        if s.compute_calls == self._compute_mark:
            waiting = s.charge(max(1, passes))
            if waiting is not None:
                yield [waiting]
        self._iteration += 1
        shared = yield from self._rounds.step(self._iteration)
        self._compute_mark = s.compute_calls
        publish(s, self.optimizer, self._name_of)
        return shared

    def _check_step(self) -> int:
        """This step's backward passes; a parameter whose shape changed is an error."""
        node = self._s.node_name
        for n, p, shape in zip(self._names, self._params, self._shapes):
            if tuple(p.shape) != shape or (p.grad is not None and tuple(p.grad.shape) != shape):
                now = tuple(p.grad.shape) if tuple(p.shape) == shape else tuple(p.shape)
                raise TorchAPIError(f"parameter {n!r} on node {node} changed shape from "
                                    f"{list(shape)} to {list(now)}; the servers hold one "
                                    "shape per key")
            check_tensor(n, p, node)
        passes = max(self._passes.values(), default=0)
        if passes > self.backward_passes_per_step:
            worst = max(zip(self._names, self._params), key=lambda np_: self._passes[id(np_[1])])
            raise TorchAPIError(f"parameter {worst[0]!r} on node {node} had {passes} backward "
                                "passes before step(); allowed: backward_passes_per_step = "
                                f"{self.backward_passes_per_step} (raise it to accumulate more)")
        for k in self._passes:
            self._passes[k] = 0
        return passes

    @property
    def started_in_backward(self) -> tuple[str, ...]:
        """The parameters whose exchange the backward pass has already started this step
        (their gradients are on their way while the earlier layers' are computed)."""
        rounds = self._rounds
        return tuple(self._names[k] for k in rounds.started_early()) if rounds else ()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
