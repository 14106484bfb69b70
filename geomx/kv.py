"""The user-facing training API, shaped like MXNet/GeoMX's kvstore (geomx-behaviour.md §2.1).

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
import math
from typing import Any, Sequence

import numpy as np

from geomx.node.values import flat_slice, is_phantom
from geomx.sched.placement import place
from geomx.wire import Kind, Message, Payload

#: The worker node the current task belongs to (set by the runtime before user code runs).
current_node: contextvars.ContextVar[Any] = contextvars.ContextVar("geomx_current_node")

KV_TYPES = ("local", "dist_sync", "dist_async", "dist_device_sync", "dist_sync_device")


class KVStoreError(RuntimeError):
    """Misuse of the kvstore API (wrong role, unknown key, bad config)."""


def create(name: str = "dist_sync") -> "KVStore":
    """Create the store of the worker running this code (GeoMX's ``mx.kv.create``).

    ``dist_sync`` selects fully synchronous training (FSA); ``dist_async`` asynchronous
    aggregation across DCs (MixedSync) — what the scenario's ``[sync]`` says wins if the
    two disagree, and a warning event is recorded.
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


class KVStore:
    """Push/pull access to the parameter servers for one worker (or the master worker)."""

    def __init__(self, node: Any, type_: str):
        self._node = node
        self.type = type_
        job = node.job
        self._job = job
        self._servers: list[str] = (list(job.global_servers) if node.is_master
                                    else job.servers_of_worker(node.name))
        self._shapes: dict[int, tuple[tuple[int, ...], str]] = {}
        self._placement: dict[int, list[Any]] = {}
        self._inflight: dict[int, asyncio.Task[Any]] = {}
        self._barrier_count = 0
        self.stop_requested = False
        self._want_stop = False
        self._loss: float | None = None
        dgt = job.sched.get("dgt") or {}
        # only a job whose local servers adapt DGT's K pays the bytes of carrying the loss
        self._carry_loss = dgt.get("mode", "off") != "off" and bool(dgt.get("adaptive_k"))
        algo = job.sync.get("algorithm", "fsa")
        if ("async" in type_) != (algo == "mixed") and type_ != "local":
            node.record("warning", text=f"kvstore type {type_} but sync.algorithm={algo}; "
                                        "the scenario decides")

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

    # ------------------------------------------------------------------ helpers
    def _parts(self, key: int):
        parts = self._placement.get(key)
        if parts is None:
            shape, _ = self._shapes[key]
            n = math.prod(shape)
            # like the local server: a tensor a sparsifying codec may touch is never split
            parts = self._placement[key] = place(key, n, len(self._servers),
                                                 self._job.bigarray_bound,
                                                 split=not self._node.lan_codec.enabled)
        return parts

    def _check_key(self, key: int) -> None:
        if key not in self._shapes:
            raise KVStoreError(f"key {key} was not initialised with kv.init")

    @staticmethod
    def _keys(keys: int | Sequence[int], values: Any) -> list[tuple[int, Any]]:
        if isinstance(keys, (int, np.integer)):
            return [(int(keys), values)]
        if values is None:
            return [(int(k), None) for k in keys]
        return [(int(k), v) for k, v in zip(keys, values, strict=True)]

    # ------------------------------------------------------------------ API
    async def init(self, key: int | Sequence[int], value: Any) -> None:
        """Declare keys and their initial values.

        As in GeoMX only the DC's rank-0 worker (or the master worker) sends its value;
        everybody then waits at a barrier of the DC's workers, so a pull right after
        ``init`` is safe. Pass lists of keys and values to initialise many keys with one
        barrier (their INITs travel concurrently).
        """
        requests = []
        for k, v in self._keys(key, value):
            if k < 0:
                raise KVStoreError(f"keys must be >= 0, got {k}")
            arr = v if isinstance(v, Payload) else np.asarray(v)
            self._placement.pop(k, None)
            self._shapes[k] = (tuple(arr.shape), arr.dtype.str if not isinstance(arr, Payload)
                               else arr.dtype)
            if self.rank == 0 or self._node.is_master:
                parts = self._parts(k)
                requests += [
                    self._node.request(Message(Kind.INIT, self._node.name, self._servers[p.server],
                                               key=k, part=p.index,
                                               payloads=[_payload(flat_slice(arr, p.lo, p.hi)
                                                                  if len(parts) > 1 else arr)]))
                    for p in parts]
        if requests:
            await asyncio.gather(*requests)
        if not self._node.is_master:
            await self.barrier()

    def push(self, key: int | Sequence[int], value: Any, priority: int = 0) -> asyncio.Task[Any]:
        """Start pushing ``value`` for ``key`` and return at once (await the task to wait)."""
        tasks = []
        for k, v in self._keys(key, value):
            self._check_key(k)
            prev = self._inflight.get(k)
            # owned by the node: cancelled when it stops, a failure stops it with the error
            task = self._node.spawn(self._push_one(k, v, priority, prev))
            self._inflight[k] = task
            tasks.append(task)
        return tasks[0] if len(tasks) == 1 else asyncio.ensure_future(asyncio.gather(*tasks))

    async def _push_one(self, key: int, value: Any, priority: int,
                        prev: asyncio.Task[Any] | None) -> None:
        if prev is not None and not prev.done():
            await prev
        node = self._node
        parts = self._parts(key)
        meta: dict[str, Any] = {"stop": True} if self._want_stop else {}
        if self._loss is not None and self._carry_loss:
            meta["loss"] = self._loss  # DGT's adaptive K at the local server

        async def one(p) -> Message:
            v = flat_slice(value, p.lo, p.hi) if len(parts) > 1 else value
            payloads, m = node.lan_codec.encode_push(key, v, tier=node.push_tier, part=p.index)
            m.update(meta)
            return await node.request(Message(Kind.PUSH, node.name, self._servers[p.server],
                                              key=key, part=p.index, priority=priority,
                                              version=node.iteration, meta=m, payloads=payloads))

        acks = [await one(parts[0])] if len(parts) == 1 else await asyncio.gather(*(one(p) for p in parts))
        if any(a.meta.get("stop") for a in acks):
            self.stop_requested = True

    async def pull(self, key: int | Sequence[int], out: Any = None, priority: int = 0) -> Any:
        """Fetch the current value of ``key`` (after this worker's last push of it) into ``out``."""
        results = []
        for k, o in self._keys(key, out):
            self._check_key(k)
            prev = self._inflight.get(k)
            if prev is not None:
                await prev
            results.append(await self._pull_one(k, o, priority))
        return results[0] if isinstance(key, (int, np.integer)) else results

    async def _pull_one(self, key: int, out: Any, priority: int) -> Any:
        node = self._node
        parts = self._parts(key)
        shape, dtype = self._shapes[key]
        requests = [node.request(Message(Kind.PULL, node.name, self._servers[p.server], key=key,
                                         part=p.index, priority=priority)) for p in parts]
        replies = [await requests[0]] if len(parts) == 1 else await asyncio.gather(*requests)
        if out is None:
            out = (Payload.phantom(shape, dtype) if replies[0].payloads[0].is_phantom
                   else np.empty(shape, dtype=dtype))
        for p, reply in zip(parts, replies):
            if reply.meta.get("stop"):
                self.stop_requested = True
            like = out if len(parts) == 1 else flat_slice(out, p.lo, p.hi)
            value = node.lan_codec.decode(reply, like=like)
            if is_phantom(out) or is_phantom(value):
                continue
            if len(parts) == 1:
                np.copyto(out, value.reshape(out.shape), casting="unsafe")
            else:
                out.reshape(-1)[p.lo:p.hi] = value.reshape(-1)
        return out

    async def waitall(self) -> None:
        """Wait for every push started so far (MXNet's ``nd.waitall``)."""
        pending = [t for t in self._inflight.values() if not t.done()]
        if pending:
            await asyncio.gather(*pending)

    async def barrier(self) -> None:
        """Barrier over the workers of this DC (GeoMX's ``kv._barrier``)."""
        self._barrier_count += 1
        await self._node.worker_barrier(f"kv{self._barrier_count}")

    def report_loss(self, loss: float) -> None:
        """This worker's current training loss, carried with its next pushes (DGT's
        adaptive K reads it; GeoMX's scripts write it to ``/tmp/loss<id>.csv``)."""
        self._loss = float(loss)

    def request_stop(self) -> None:
        """Ask the whole job to stop: carried on this worker's next pushes to the global tier."""
        self._want_stop = True

    # ------------------------------------------------------------------ commands
    async def set_optimizer(self, optimizer: Any) -> None:
        """Install the global optimizer on every global server (master worker only).

        ``optimizer`` is a geomx optimizer (``geomx.optim``) or its config dict; it is sent
        as JSON and acknowledged, never pickled.
        """
        if not self._node.is_master:
            return  # GeoMX: only the master worker's call has an effect
        config = optimizer if isinstance(optimizer, dict) else optimizer.to_config()
        await self._command({"cmd": "set_optimizer", "config": config})

    async def set_gradient_compression(self, config: dict[str, Any]) -> None:
        """Configure the inter-DC codec, e.g. ``{"type": "bsc", "threshold": 0.01}``.

        Validated here (a bad config raises at once); installed on every global server and,
        through the scenario, on every local server.
        """
        from geomx.node.link_codec import codec_config_check

        config = codec_config_check(dict(config))
        if not self._node.is_master:
            return
        await self._command({"cmd": "set_gradient_compression", "config": config})

    async def _command(self, meta: dict[str, Any]) -> None:
        await asyncio.gather(*(self._node.request(Message(Kind.COMMAND, self._node.name, gs,
                                                          meta=meta))
                               for gs in self._job.global_servers))


def _payload(v: Any) -> Payload:
    if isinstance(v, Payload):
        return v
    return Payload.of(np.ascontiguousarray(v))
