"""The worker a ``geomx.torch`` call runs on: its kvstore, program context and node.

Horovod's ``hvd.init()`` finds its peers in the environment; a geomx training program
gets its kvstore and context as arguments (``main(kv, ctx)``, geomx/node/program.py),
so ``geomx.torch.init(kv, ctx)`` hands them over once. The session lives in a context
variable, because in the emulator every worker's program runs in one process, each in
its own task (or thread) with its own context.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
from typing import Any

import geomx.kv
from geomx.threads import THREADS_VAR, apply_to_torch

_current: contextvars.ContextVar["Session"] = contextvars.ContextVar("geomx_torch_session")


class TorchAPIError(RuntimeError):
    """Misuse of ``geomx.torch`` or a model the job cannot train; names parameter and node."""


class Session:
    """One worker's (or the master worker's) ``geomx.torch`` state."""

    def __init__(self, kv: Any, ctx: Any):
        self.kv = kv
        self.ctx = ctx
        try:
            self.node = geomx.kv.current_node.get()
        except LookupError:
            raise TorchAPIError("geomx.torch.init(kv, ctx) must be called from a training "
                                "program that a geomx worker runs (geomx run / geomx node)") \
                from None
        #: names (parameters, optimizer state) whose keys are initialised on the servers
        self.declared: dict[str, tuple[tuple[int, ...], str]] = {}
        #: the tensors ``broadcast_parameters`` was given, by name: the worker's own model,
        #: which its checkpoints carry (geomx/torch/resume.py)
        self.tracked: dict[str, Any] = {}
        self._signatures = 0
        #: ``ctx.compute`` calls the program made itself (``step`` charges none then)
        self.compute_calls = 0
        self._count_compute_calls()

    @property
    def node_name(self) -> str:
        return str(self.ctx.node_name)

    @property
    def broadcasts(self) -> int:
        """Declaration checks made so far (one per broadcast, in call order: the same on
        every worker of a well-formed program, so keys numbered by it agree)."""
        return self._signatures

    def next_signature_key(self) -> str:
        """The key of this node's next declaration check."""
        self._signatures += 1
        return f"geomx.torch/signature/{self._signatures}"

    @property
    def is_master(self) -> bool:
        return bool(self.ctx.is_master)

    def sync_program(self) -> bool:
        """The program is a plain ``def main(kv, ctx)``: kvstore waits block."""
        return geomx.kv.in_sync_program()

    def _count_compute_calls(self) -> None:
        # ``ctx.compute`` is wrapped on this context object only, so that ``step`` can
        # tell whether the program charged its compute itself since the last step
        compute = self.ctx.compute
        session = self

        if inspect.iscoroutinefunction(compute):
            @functools.wraps(compute)
            async def counted(*args: Any, **kwargs: Any) -> Any:
                session.compute_calls += 1
                return await compute(*args, **kwargs)
        else:
            @functools.wraps(compute)
            def counted(*args: Any, **kwargs: Any) -> Any:
                session.compute_calls += 1
                return compute(*args, **kwargs)
        self._own_compute = compute
        self.ctx.compute = counted

    def charge(self, passes: int) -> Any:
        """The scenario's per-iteration compute, once per backward pass, without counting
        it as the program's own; returns what to wait for (None in a sync program)."""
        if self.sync_program():
            for _ in range(passes):
                self._own_compute("per_iter")
            return None
        return _charge_async(self._own_compute, passes)


async def _charge_async(compute: Any, passes: int) -> None:
    for _ in range(passes):
        await compute("per_iter")


def init(kv: Any, ctx: Any) -> Session:
    """Start ``geomx.torch`` on this worker (Horovod's ``hvd.init()``): every other call
    of the package uses this ``kv`` and ``ctx``. Calling it again replaces the session.

    Where ``OMP_NUM_THREADS`` is set -- by you, or by geomx for a process that shares the
    host's cores with others (a local real-runtime launch, a sweep's processes) -- torch
    gets that many intra-op threads here: torch reads the variable only when it loads,
    and a Numba thread pool started earlier in the process leaves its own count behind
    in the OpenMP runtime both use."""
    apply_to_torch(os.environ.get(THREADS_VAR))
    session = Session(kv, ctx)
    _current.set(session)
    return session


def session() -> Session:
    try:
        return _current.get()
    except LookupError:
        raise TorchAPIError("call geomx.torch.init(kv, ctx) first, in main(kv, ctx)") from None


def rank() -> int:
    """This worker's index in the job (Horovod's ``hvd.rank()``; -1 on the master worker)."""
    return int(session().ctx.worker_index)


def size() -> int:
    """Training workers in the job (``hvd.size()``; the master worker not counted)."""
    return int(session().ctx.num_all_workers)


def local_rank() -> int:
    """Rank inside this worker's DC (``hvd.local_rank()``)."""
    return int(session().ctx.rank)


def local_size() -> int:
    """Workers in this worker's DC (``hvd.local_size()``)."""
    return int(session().kv.num_workers)


def is_master() -> bool:
    """This node is the master worker: it publishes the initial model and trains nothing."""
    return session().is_master
