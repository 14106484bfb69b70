"""The user-facing training API, shaped like MXNet/GeoMX's kvstore.

The calls follow GeoMX's (docs/geomx-behaviour.md §2.1).

A training loop written for GeoMX reads almost the same here, with numpy arrays and
``await`` where the MXNet engine would have blocked::

    kv = geomx.kv.create("dist_sync")
    for k, p in enumerate(params):
        await kv.init(k, p)
        await kv.pull(k, out=p)
    for x, y in batches:
        loss, grads = model.loss_and_grads(x, y)
        for k, g in enumerate(grads):
            kv.push(k, g, priority=-k)          # returns at once, like MXNet
        for k, p in enumerate(params):
            await kv.pull(k, out=p, priority=-k)  # ordered after this worker's push of k

The same loop runs in the emulator and over sockets: the store talks only to its node.
Differences from GeoMX, on purpose: commands (optimizer, compression) are acknowledged
end to end, so no ``sleep(1)`` is needed; the optimizer travels as a JSON config.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import math
from typing import Any

import numpy as np

from geomx.node.kv_optimizer import optimizer, optimizer_config
from geomx.node.kv_pull import SINK_MIN_BYTES, PullCalls
from geomx.node.kv_push import PushCalls
from geomx.node.kv_state import STRING_KEY_BASE, KVStoreError
from geomx.node.values import flat_slice, is_phantom
from geomx.policy.sync import KVSTORE_ALGORITHMS
from geomx.wire import Kind, Message, Payload

__all__ = ["KV_TYPES", "SINK_MIN_BYTES", "STRING_KEY_BASE", "KVStore", "KVStoreError",
           "check_kvstore_type", "create", "current_node", "optimizer", "optimizer_config"]

#: The worker node the current task belongs to (set by the runtime before user code runs).
current_node: contextvars.ContextVar[Any] = contextvars.ContextVar("geomx_current_node")

KV_TYPES = ("local", "dist_sync", "dist_async", "dist_device_sync", "dist_sync_device")


def create(name: str = "dist_sync") -> "KVStore":
    """Create the store of the worker running this code (GeoMX's ``mx.kv.create``).

    ``dist_sync`` selects fully synchronous training (FSA); ``dist_async`` asynchronous
    aggregation across DCs when the scenario's ``[sync] algorithm`` is ``auto``
    (the default); a scenario that chose another algorithm explicitly is an error.
    """
    lname = name.lower()
    if lname not in KV_TYPES:
        raise KVStoreError(f"unknown kvstore type {name!r}; allowed: {', '.join(KV_TYPES)}")
    try:
        node = current_node.get()
    except LookupError:
        raise KVStoreError("geomx.kv.create() must be called from code run by a geomx worker "
                           "(geomx run / geomx node)") from None
    return KVStore(node, lname)


class KVStore(PushCalls, PullCalls):
    """Push/pull access to the parameter servers for one worker (or the master worker).

    Every call returns at once with an already-scheduled task (MXNet's engine would have
    queued the operation), so a forgotten ``await`` still takes effect, in call order:
    ``init``, ``barrier`` and the commands are *fences* (each waits for the previous
    fence), a push or pull of key k waits for the fence before it and for the previous
    push/pull of k. ``await`` a call to wait for it (and get a pull's result).

    ``push`` comes from :class:`~geomx.node.kv_push.PushCalls`, ``pull`` from
    :class:`~geomx.node.kv_pull.PullCalls`, the state they share from
    :class:`~geomx.node.kv_state.KVStoreState`; this class adds the set-up calls, the
    barrier and the commands.
    """

    def __init__(self, node: Any, type_: str):
        super().__init__(node, type_)
        if check_kvstore_type(type_, self._job) and node.is_master:
            # GeoMX sends the sync mode when the store is created: before any init
            self._fenced(functools.partial(self._command, {
                "cmd": "set_sync", "algorithm": KVSTORE_ALGORITHMS["dist_async"]}))
        node.state.add_store(self)

    # ------------------------------------------------------------------ identity
    @property
    def rank(self) -> int:
        """Rank of this worker inside its DC (0..num_workers-1)."""
        return self._node.rank

    @property
    def num_workers(self) -> int:
        """Workers in this worker's DC (1 for the master worker)."""
        if self._node.is_master:
            return 1
        return len(self._job.workers_of[self._node.dc])

    @property
    def num_all_workers(self) -> int:
        """Training workers in the whole job (the master worker not counted)."""
        return self._job.num_all_workers

    @property
    def is_master_worker(self) -> bool:
        return self._node.is_master

    @property
    def stop_requested(self) -> bool:
        """The global tier told this worker that the job should stop."""
        return self._worker_state.stop_seen

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        self._worker_state.saw_stop(value)

    # ------------------------------------------------------------------ API
    def init(self, key: Any, value: Any) -> asyncio.Task[Any]:
        """Declare keys and their initial values.

        As in GeoMX only the DC's rank-0 worker (or the master worker) sends its value;
        everybody then waits at a barrier of the DC's workers, so a pull (or a push) right
        after ``init`` is safe. Pass lists of keys and values to initialise many keys with
        one barrier (their INITs travel concurrently). The value is read now.
        """
        items = []
        for k, v in self._keys(key, value):
            arr = v if isinstance(v, Payload) else np.array(v, copy=True)
            dtype = arr.dtype.str if not isinstance(arr, Payload) else arr.dtype
            self._shapes[k] = (tuple(arr.shape), dtype)
            n = math.prod(arr.shape)
            sched = self._sched
            try:
                sliced = sched.slices(k, n) if sched is not None else None
            except ValueError as e:
                raise KVStoreError(f"key {self._key_name(k)} cannot be sliced {e}") from None
            wire = sliced if sliced is not None else [(k, 0, n)]
            problem = self._wire_problem(k, n, wire)
            if problem:
                raise KVStoreError(f"key {self._key_name(k)}: the transfer scheduler's "
                                   f"slices: {problem}")
            for wk, _, _ in self._wire.get(k, ()):
                self._wire_owner.pop(wk, None)  # a key initialised again may be cut anew
            self._wire[k] = wire
            for wk, lo, hi in wire:
                self._wire_owner[wk] = k
                self._placement.pop(wk, None)
                if sched is not None:
                    sched.forget(wk)
                self._wire_shapes[wk] = ((tuple(arr.shape), dtype) if len(wire) == 1
                                         else ((hi - lo,), dtype))
                if is_phantom(arr):
                    self._phantom.add(wk)
                items.append((wk, arr if len(wire) == 1 else flat_slice(arr, lo, hi)))

        async def run() -> None:
            requests = []
            if self.rank == 0 or self._node.is_master:
                for k, arr in items:
                    parts = self._parts(k)
                    requests += [
                        self._node.request(Message(
                            Kind.INIT, self._node.name, self._servers[p.server], key=k,
                            part=p.index, payloads=[_payload(flat_slice(arr, p.lo, p.hi)
                                                             if len(parts) > 1 else arr)]))
                        for p in parts]
            if requests:
                self._learn(await asyncio.gather(*requests))
            if not self._node.is_master and not self._node.rejoining:
                await self._barrier_now()  # (a rejoined worker's DC passed it long ago)

        keyed = [self._inflight.get(k) for k, _ in items]
        task = self._ordered(run, after=[self._fence, *keyed])
        self._fence = task
        return task

    def pushpull(self, key: Any, value: Any, out: Any = None,
                 priority: int = 0) -> asyncio.Future[Any]:
        """``push`` then ``pull`` of the same keys (MXNet's ``pushpull``); ``out`` defaults
        to ``value`` itself, as in MXNet."""
        self.push(key, value, priority=priority)
        return self.pull(key, out=value if out is None else out, priority=priority)

    def declare_keys(self, server: str) -> None:
        """A new process took over ``server`` (``on_server_loss = "wait"``): tell it this
        store's keys (shape and dtype; it pulls their values from the global tier) before
        the unanswered requests go to it again. Not requests: nothing waits for them."""
        node = self._node
        for wk, (shape, dtype) in sorted(self._wire_shapes.items()):
            servers = {self._servers[p.server] for p in self._parts(wk)}
            if server in servers:
                node.post(Message(Kind.INIT, node.name, server, key=wk,
                                  meta={"takeover": True, "shape": list(shape), "dtype": dtype,
                                        "phantom": wk in self._phantom}))

    async def waitall(self) -> None:
        """Wait for every call started so far (MXNet's ``nd.waitall``)."""
        pending = [t for t in [*self._inflight.values(), self._fence]
                   if t is not None and not t.done()]
        if pending:
            await asyncio.gather(*pending)

    def barrier(self) -> asyncio.Task[Any]:
        """Barrier over the workers of this DC (GeoMX's ``kv._barrier``)."""
        return self._fenced(self._barrier_now)

    _barrier = barrier

    async def _barrier_now(self) -> None:
        self._barrier_count += 1
        await self._node.worker_barrier(f"kv{self._barrier_count}")

    def report_loss(self, loss: float) -> None:
        """This worker's current training loss, carried with its next pushes (a transfer
        scheduler may read it; GeoMX's scripts write it to ``/tmp/loss<id>.csv``)."""
        self._loss = float(loss)

    def request_stop(self) -> None:
        """Ask the whole job to stop: carried on this worker's next pushes to the global tier."""
        self._worker_state.want_stop()

    # ------------------------------------------------------------------ commands
    def set_optimizer(self, optimizer: Any) -> asyncio.Task[Any]:
        """Install the global optimizer on every global server (master worker only).

        ``optimizer`` is a geomx optimizer (``geomx.optim``), its config dict, or an
        MXNet-style spelling (``{"name": "adam", "learning_rate": 0.01, "wd": 0}`` or
        ``geomx.kv.optimizer.Adam(learning_rate=0.01)``); it is sent as JSON and
        acknowledged, never pickled. The global servers scale the summed gradient by
        1/num_all_workers unless the config sets ``rescale_grad`` itself (1.0 = GeoMX's
        sum of the workers' mean gradients).
        """
        config = optimizer_config(optimizer)
        if not self._node.is_master:
            return self._fenced(_nothing)  # GeoMX: only the master worker's call has an effect
        return self._fenced(functools.partial(self._command,
                                              {"cmd": "set_optimizer", "config": config}))

    def set_gradient_compression(self, config: dict[str, Any]) -> asyncio.Task[Any]:
        """Configure the codec, e.g. ``{"type": "bsc", "threshold": 0.01}``.

        Validated here (a bad config raises at once). As in GeoMX only the master worker's
        call acts: the global servers install it and forward it to every local server,
        which hands it to its workers with its next replies; acknowledged end to end, so
        it applies to every tier exactly as the scenario's ``[codec]`` would.
        """
        from geomx.node.link_codec import codec_config_check

        config = codec_config_check(dict(config))
        if not self._node.is_master:
            return self._fenced(_nothing)
        self._node.lan_codec = self._node.lan_codec.replaced(dict(config))
        self._placement.clear()
        return self._fenced(functools.partial(
            self._command, {"cmd": "set_gradient_compression", "config": config}))

    async def _command(self, meta: dict[str, Any]) -> None:
        await asyncio.gather(*(self._node.request(Message(Kind.COMMAND, self._node.name, gs,
                                                          meta=meta))
                               for gs in self._job.global_servers))


async def _nothing() -> None:
    return None


def check_kvstore_type(type_: str, job: Any) -> bool:
    """``dist_async`` means asynchronous aggregation across DCs (GeoMX); True when
    ``job`` (a ``JobSpec``) must switch to the algorithm that store type stands for
    (``[sync] algorithm = "auto"``). A scenario that chose an algorithm of the other
    kvstore type explicitly conflicts with it: an error, not a warning in the event log."""
    if type_ == "local":
        return False
    algo = job.sync.get("algorithm", "fsa")
    wants_async = "async" in type_
    if job.sync.get("auto"):
        return wants_async
    if wants_async != (job.sync_algorithm.kvstore_type == "dist_async"):
        fix = (f"set [sync] algorithm = \"{KVSTORE_ALGORITHMS['dist_async']}\"" if wants_async
               else "create the store with geomx.kv.create(\"dist_async\")")
        raise KVStoreError(f"kvstore type {type_!r} conflicts with the scenario's [sync] "
                           f"algorithm = {algo!r}; {fix}")
    return False


def _payload(v: Any) -> Payload:
    if isinstance(v, Payload):
        return v
    return Payload.of(np.ascontiguousarray(v))
