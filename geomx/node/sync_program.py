"""The kvstore and context a synchronous training program (``def main(kv, ctx)``) gets.

The same calls as an ``async def main``'s, without ``await``, as in MXNet (GeoMX's own
scripts, docs/geomx-behaviour.md §2.1) and PyTorch: ``kv.init``, ``kv.push``,
``kv.pull(..., out=)`` and the commands enqueue and return at once (their results land
by ``kv.waitall()``); ``kv.waitall()``, ``kv.barrier()`` and ``ctx.compute(...)`` block
until done. Each call is handed to the node's event loop by
:mod:`geomx.node.program_thread` and made there on the asynchronous
:class:`~geomx.node.kvstore.KVStore` and :class:`~geomx.node.program.ProgramContext`,
in the order the program makes them: the same messages, and in the emulator the same
event log, as the ``async def`` program.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Iterator

from geomx.node import kvstore
from geomx.node.program_thread import (SyncCallError, in_sync_program, run_blocking,
                                       run_on_loop)

__all__ = ["SyncKVStore", "SyncProgramContext", "create"]


def create(name: str = "dist_sync") -> Any:
    """``geomx.kv.create``: the worker's store; in a synchronous program a
    :class:`SyncKVStore` (made on the node's loop), elsewhere the async
    :class:`~geomx.node.kvstore.KVStore`."""
    if in_sync_program():
        return SyncKVStore(run_on_loop(kvstore.create, name, call="geomx.kv.create"))
    return kvstore.create(name)


class SyncKVStore:
    """A synchronous program's kvstore: :class:`~geomx.node.kvstore.KVStore`'s calls,
    blocking where MXNet's block.

    ``init``, ``push``, ``pull(key, out=...)``, ``pushpull``, ``set_optimizer`` and
    ``set_gradient_compression`` enqueue and return None (the order and the fences are
    the async store's: a pull of k follows this worker's push of k). ``pull(key)``
    without ``out`` waits and returns the value. ``waitall()`` and ``barrier()`` wait
    and return None. Identity (``rank``, ``num_workers``, ``num_all_workers``,
    ``is_master_worker``, ``type``, ``stop_requested``) reads as on the async store.
    Every call must come from the program's own thread (another thread, or an
    ``async def main``, gets :class:`~geomx.node.program_thread.SyncCallError`).
    """

    def __init__(self, store: "kvstore.KVStore | SyncKVStore"):
        self._store = store.async_store if isinstance(store, SyncKVStore) else store

    @property
    def async_store(self) -> kvstore.KVStore:
        """The asynchronous store behind this one (for code running on the node's loop)."""
        return self._store

    # ------------------------------------------------------------------ identity
    @property
    def type(self) -> str:
        return self._store.type

    @property
    def rank(self) -> int:
        """Rank of this worker inside its DC (0..num_workers-1)."""
        return self._store.rank

    @property
    def num_workers(self) -> int:
        """Workers in this worker's DC (1 for the master worker)."""
        return self._store.num_workers

    @property
    def num_all_workers(self) -> int:
        """Training workers in the whole job (the master worker not counted)."""
        return self._store.num_all_workers

    @property
    def is_master_worker(self) -> bool:
        return self._store.is_master_worker

    @property
    def stop_requested(self) -> bool:
        """The global tier told this worker that the job should stop."""
        return self._store.stop_requested

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        run_on_loop(setattr, self._store, "stop_requested", value, call="kv.stop_requested = ...")

    # ------------------------------------------------------------------ calls
    def _enqueue(self, call: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        run_on_loop(_dropped, fn, args, kwargs, call=f"kv.{call}()",
                    async_form=f"kv.{call}(...)")

    def init(self, key: Any, value: Any) -> None:
        """Declare keys and their initial values (read now); later calls wait for it."""
        self._enqueue("init", self._store.init, key, value)

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        """Start pushing ``value`` (read now; a list for one key is summed)."""
        self._enqueue("push", self._store.push, key, value, priority)

    def pull(self, key: Any, out: Any = None, priority: int = 0) -> Any:
        """Pull ``key`` into ``out`` (there by ``waitall()``; returns None), or without
        ``out`` wait for the value and return it (a list for a list of keys)."""
        if out is not None:
            self._enqueue("pull", self._store.pull, key, out, priority)
            return None
        return run_blocking(self._store.pull, key, None, priority, call="kv.pull(key)",
                            async_form="await kv.pull(key)")

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> None:
        """``push`` then ``pull`` into ``out`` (default: ``value`` itself, as in MXNet)."""
        self._enqueue("pushpull", self._store.pushpull, key, value, out, priority)

    def waitall(self) -> None:
        """Wait for every call started so far (MXNet's ``nd.waitall``)."""
        run_blocking(self._store.waitall, call="kv.waitall()", async_form="await kv.waitall()")

    def barrier(self) -> None:
        """Wait at a barrier of this DC's workers (GeoMX's ``kv._barrier``)."""
        run_blocking(self._store.barrier, call="kv.barrier()", async_form="await kv.barrier()")

    _barrier = barrier

    def set_optimizer(self, optimizer: Any) -> None:
        """Install the global optimizer (master worker only; ``KVStore.set_optimizer``)."""
        self._enqueue("set_optimizer", self._store.set_optimizer, optimizer)

    def set_gradient_compression(self, config: dict[str, Any]) -> None:
        """Configure the codec from the master worker (``KVStore.set_gradient_compression``)."""
        self._enqueue("set_gradient_compression", self._store.set_gradient_compression,
                      config)

    def report_loss(self, loss: float) -> None:
        """This worker's training loss, carried with its next pushes."""
        self._enqueue("report_loss", self._store.report_loss, loss)

    def request_stop(self) -> None:
        """Ask the whole job to stop (carried on this worker's next pushes)."""
        self._enqueue("request_stop", self._store.request_stop)


def _dropped(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``fn(*args, **kwargs)`` for its effect: the task it returns runs on its own (its
    failure stops the node, as an un-awaited call of an async program does)."""
    fn(*args, **kwargs)


class SyncProgramContext:
    """A synchronous program's ``ctx``: :class:`~geomx.node.program.ProgramContext`
    with ``compute`` blocking, and ``worker_sync(...).step(...)`` blocking.

    Every property and method of the async context is here; calls that touch the node
    (``iterations``, ``report``, ``batches``, ``now`` ...) are made on the node's loop,
    pure ones (``dataset``, ``partition``, ``build_model``) on the program's thread.
    """

    def __init__(self, ctx: Any):
        self._ctx = ctx

    def compute(self, seconds: float | str = "per_iter", *,
                measured_s: float | None = None) -> None:
        """Charge compute time like the built-in trainer, and wait it out (the async
        context's ``compute``: virtual time in the emulator, the rest of it slept over
        sockets)."""
        run_blocking(functools.partial(self._ctx.compute, seconds, measured_s=measured_s),
                     call="ctx.compute()",
                     async_form="await ctx.compute(...)")

    def iterations(self) -> Iterator[int]:
        """1, 2, ... as the async context's (a checkpoint round is saved between two)."""
        steps = run_on_loop(self._ctx.iterations, call="ctx.iterations()")
        while True:
            it = run_on_loop(next, steps, None, call="ctx.iterations()")
            if it is None:
                return
            yield it

    def dataset(self) -> Any:
        return self._ctx.dataset()

    def partition(self) -> Any:
        return self._ctx.partition()

    def build_model(self) -> Any:
        return self._ctx.build_model()

    def worker_sync(self, kv: Any, params: list[Any]) -> "SyncWorkerStep":
        """The scenario's per-step sync policy (the async context's ``worker_sync``),
        whose ``step(iteration, grads)`` blocks."""
        store = kv.async_store if isinstance(kv, SyncKVStore) else kv
        side = run_on_loop(self._ctx.worker_sync, store, params, call="ctx.worker_sync()")
        return SyncWorkerStep(side)

    def finish_sync(self) -> None:
        raise SyncCallError("ctx.finish_sync() is for `async def main`; a synchronous "
                            "program's sync policies finish when main returns: return "
                            "from main instead")

    def __getattr__(self, name: str) -> Any:
        # every other property and method of the async context (names not defined above)
        value = getattr(self._ctx, name)
        if inspect.iscoroutinefunction(value):
            raise SyncCallError(f"ctx.{name}() is async and has no blocking form for a "
                                "synchronous program")
        if callable(value):
            return _on_loop(value, f"ctx.{name}()")
        return value


class SyncWorkerStep:
    """``ctx.worker_sync(kv, params)`` in a synchronous program: ``step`` blocks."""

    def __init__(self, side: Any):
        self._side = side

    @property
    def states(self) -> list[Any]:
        """The local optimizer's per-parameter states (see ``WorkerSide.states``)."""
        return self._side.states

    def step(self, iteration: int, grads: list[Any]) -> bool:
        """Apply this step's gradients; True when every worker now holds the same model."""
        return bool(run_blocking(self._side.step, iteration, grads, call="sync.step()",
                                 async_form="await sync.step(it, grads)"))

    def finish(self) -> None:
        raise SyncCallError("sync.finish() is called by geomx when a synchronous program "
                            "returns: return from main instead")


def _on_loop(fn: Any, call: str) -> Any:
    @functools.wraps(fn)
    def on_loop(*args: Any, **kwargs: Any) -> Any:
        return run_on_loop(_with_kwargs, fn, args, kwargs, call=call)
    return on_loop


def _with_kwargs(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)
