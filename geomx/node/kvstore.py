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
import zlib
from typing import Any, Sequence

import numpy as np

from geomx.node.calls import request_soon
from geomx.node.push_snapshots import PushSnapshots
from geomx.node.values import flat_slice, freeze, is_phantom, write_slice
from geomx.sched.p3 import FUSE_META, P3Config, P3Error, slices_of
from geomx.sched.placement import place
from geomx.wire import Kind, Message, Payload

#: The worker node the current task belongs to (set by the runtime before user code runs).
current_node: contextvars.ContextVar[Any] = contextvars.ContextVar("geomx_current_node")

KV_TYPES = ("local", "dist_sync", "dist_async", "dist_device_sync", "dist_sync_device")

#: message kinds of the per-message paths (a module global reads faster than the enum)
_PUSH = Kind.PUSH
_PULL = Kind.PULL


class KVStoreError(RuntimeError):
    """Misuse of the kvstore API (wrong role, unknown key, bad config)."""


def create(name: str = "dist_sync") -> "KVStore":
    """Create the store of the worker running this code (GeoMX's ``mx.kv.create``).

    ``dist_sync`` selects fully synchronous training (FSA); ``dist_async`` asynchronous
    aggregation across DCs (MixedSync) when the scenario's ``[sync] algorithm`` is ``auto``
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


class KVStore:
    """Push/pull access to the parameter servers for one worker (or the master worker).

    Every call returns at once with an already-scheduled task (MXNet's engine would have
    queued the operation), so a forgotten ``await`` still takes effect, in call order:
    ``init``, ``barrier`` and the commands are *fences* (each waits for the previous
    fence), a push or pull of key k waits for the fence before it and for the previous
    push/pull of k. ``await`` a call to wait for it (and get a pull's result).
    """

    def __init__(self, node: Any, type_: str):
        self._node = node
        self.type = type_
        job = node.job
        self._job = job
        self._servers: list[str] = (list(job.global_servers) if node.is_master
                                    else job.servers_of_worker(node.name))
        #: user key -> (shape, dtype) as given to init
        self._shapes: dict[int, tuple[tuple[int, ...], str]] = {}
        #: user key -> the wire keys it travels as: [(wire key, lo, hi)] over the flattened
        #: tensor; one entry ``(key, 0, n)`` unless P3 slices it (geomx/sched/p3.py)
        self._wire: dict[int, list[tuple[int, int, int]]] = {}
        #: wire key -> (shape, dtype) of what travels under it
        self._wire_shapes: dict[int, tuple[tuple[int, ...], str]] = {}
        #: wire key -> the fused push replies (P3) that the next pull is served from
        self._fused: dict[int, list[Message]] = {}
        #: the buffers large pushes are snapshot into, reused from push to push
        self._snapshots = PushSnapshots()
        self.p3 = P3Config.from_sched(getattr(job, "sched", None) or {})
        self._placement: dict[int, list[Any]] = {}
        self._inflight: dict[int, asyncio.Task[Any]] = {}
        self._fence: asyncio.Task[Any] | None = None
        self._string_keys: dict[int, str] = {}
        self._barrier_count = 0
        #: [membership] on_server_loss = "wait": wire key -> the last round its server
        #: answered (pushes carry the next one, so a server that took over can tell a
        #: round already applied from a new one), and the wire keys of phantom values
        self._number_rounds = getattr(job, "on_server_loss", "fail") == "wait"
        self._rounds: dict[int, int] = {}
        self._phantom: set[int] = set()
        if check_kvstore_type(type_, job.sync) and node.is_master:
            # GeoMX sends the sync mode when the store is created: before any init
            self._fenced(functools.partial(self._command, {"cmd": "set_sync",
                                                           "algorithm": "mixed"}))
        stores = getattr(node, "kv_stores", None)
        if stores is None:
            stores = node.kv_stores = []
        stores.append(self)
        self._loss: float | None = None
        #: TSEngine inside the DC (the worker's overlay peer): pushes join the merge tree,
        #: and a pull after a push takes the round's value from the overlay broadcast
        self._ts = getattr(node, "ts", None)
        self._ts_round: dict[int, int] = {}
        self._ts_pushed: set[int] = set()
        dgt = job.sched.get("dgt") or {}
        # only a job whose local servers adapt DGT's K pays the bytes of carrying the loss
        self._carry_loss = dgt.get("mode", "off") != "off" and bool(dgt.get("adaptive_k"))

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
        return bool(getattr(self._node, "stop_seen", False))

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        self._node.stop_seen = bool(value)

    # ------------------------------------------------------------------ helpers
    def _parts(self, key: int):
        parts = self._placement.get(key)
        if parts is None:
            shape, _ = self._wire_shapes[key]
            n = math.prod(shape)
            # like the local server: a tensor a sparsifying codec may touch is never split
            parts = self._placement[key] = place(key, n, len(self._servers),
                                                 self._job.bigarray_bound,
                                                 split=not self._node.lan_codec.enabled)
        return parts

    def _check_key(self, key: int) -> None:
        if key not in self._shapes:
            raise KVStoreError(f"key {self._key_name(key)} was not initialised with kv.init")

    def _key_name(self, key: int) -> str:
        return repr(self._string_keys[key]) if key in self._string_keys else str(key)

    def _key(self, key: Any) -> int:
        """An int key as is; a string key (GeoMX allows them) as a stable int that every
        node derives the same way."""
        if type(key) is int and 0 <= key < STRING_KEY_BASE:
            return key
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            k = int(key)
            if not 0 <= k < STRING_KEY_BASE:
                raise KVStoreError(f"int keys must be in [0, {STRING_KEY_BASE}), got {k}")
            return k
        if isinstance(key, str):
            k = STRING_KEY_BASE + zlib.crc32(key.encode())
            other = self._string_keys.setdefault(k, key)
            if other != key:
                raise KVStoreError(f"string keys {other!r} and {key!r} collide; rename one")
            return k
        raise KVStoreError(f"a key is an int or a str, got {type(key).__name__} {key!r}")

    def _keys(self, keys: Any, values: Any) -> list[tuple[int, Any]]:
        if not isinstance(keys, (list, tuple)):
            return [(self._key(keys), values)]
        if values is None:
            return [(self._key(k), None) for k in keys]
        if len(keys) != len(values):
            raise KVStoreError(f"{len(keys)} keys but {len(values)} values")
        return [(self._key(k), v) for k, v in zip(keys, values)]

    def _merge_devices(self, key: int, value: Any) -> Any:
        """MXNet sums the values several devices push for one key; a snapshot otherwise
        (the engine orders a later write to ``value`` after the push has read it)."""
        if isinstance(value, (list, tuple)):
            arrays = [np.asarray(v) for v in value]
            if not arrays:
                raise KVStoreError(f"push of key {key}: an empty list of per-device values")
            if any(a.shape != arrays[0].shape for a in arrays):
                raise KVStoreError(f"push of key {key}: per-device values have different "
                                   f"shapes {[a.shape for a in arrays]}")
            total = arrays[0].copy()
            for a in arrays[1:]:
                total += a
            return freeze(total)
        if isinstance(value, Payload):
            return value
        # the one copy of a push: frozen, it is sent as it is (no second snapshot by the
        # link codec) and the transport's resend window holds views of it, not copies
        return self._snapshots.take(key, value)

    def _ordered(self, coro_fn: Any, *, after: list[asyncio.Task[Any] | None]) -> asyncio.Task[Any]:
        """Run ``coro_fn()`` as a node-owned task (cancelled when the node stops; a failure
        stops the node with the error) once the tasks in ``after`` have finished."""
        waits = []
        for t in after:
            if t is not None and not t.done():
                waits.append(t)
        if not waits:
            return self._node.spawn(coro_fn())

        async def run() -> Any:
            for t in waits:
                try:
                    await t  # (the node stops on its failure anyway; this call then fails too)
                except Exception as e:
                    raise KVStoreError(f"an earlier kvstore call failed: {e}") from e
            return await coro_fn()

        return self._node.spawn(run())

    def _fenced(self, coro_fn: Any) -> asyncio.Task[Any]:
        task = self._ordered(coro_fn, after=[self._fence])
        self._fence = task
        return task

    @staticmethod
    def _join(tasks: list[asyncio.Task[Any]]) -> asyncio.Future[Any]:
        return tasks[0] if len(tasks) == 1 else asyncio.ensure_future(asyncio.gather(*tasks))

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
            if self.p3.enabled:
                try:
                    wire = [(s.skey, s.lo, s.hi)
                            for s in slices_of(k, n, self.p3.slice_elements)]
                except P3Error as e:
                    raise KVStoreError(f"key {self._key_name(k)} cannot be sliced for P3: {e} "
                                       "(string keys are not supported with sched.p3)") from None
            else:
                wire = [(k, 0, n)]
            self._wire[k] = wire
            for wk, lo, hi in wire:
                self._placement.pop(wk, None)
                self._fused.pop(wk, None)
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
            if not self._node.is_master and not getattr(self._node, "rejoining", False):
                await self._barrier_now()  # (a rejoined worker's DC passed it long ago)

        keyed = [self._inflight.get(k) for k, _ in items]
        task = self._ordered(run, after=[self._fence, *keyed])
        self._fence = task
        return task

    def push(self, key: Any, value: Any, priority: int = 0) -> asyncio.Future[Any]:
        """Start pushing ``value`` for ``key`` and return at once (await the returned future
        -- a task, or for a one-part key a plain future, :mod:`geomx.node.calls` -- to wait).

        ``value`` is read now (a later write to it does not change what is sent); a list
        of arrays for one key is summed first, as MXNet sums per-device values."""
        tasks = []
        ready = self._node.now() if self.p3.enabled else 0.0  # (P3's record reads it)
        pairs = self._keys(key, value)
        if len(pairs) > 1 and self._batchable([k for k, _ in pairs]):
            values = [(k, self._merge_devices(k, v)) for k, v in pairs]
            task = self._ordered(functools.partial(self._push_batch, values),
                                 after=[self._fence, *(self._inflight.get(k) for k, _ in pairs)])
            for k, _ in pairs:
                self._inflight[k] = task
            return task
        for k, v in pairs:
            self._check_key(k)
            v = self._merge_devices(k, v)
            wire = self._wire[k]
            fence = self._fence
            if len(wire) == 1:
                wk = wire[0][0]
                prev = self._inflight.get(wk)
                if (fence is None or fence.done()) and (prev is None or prev.done()):
                    # nothing to wait for: what _ordered would do, without its list
                    if self._plain(wk):
                        # one message, one reply: a future and callbacks, not a task
                        task = request_soon(self._node, functools.partial(
                            self._push_msg, wk, v), self._learn_one)
                    else:
                        task = self._node.spawn(
                            self._push_one(wk, v, priority, user_key=k, ready=ready))
                    self._inflight[wk] = task
                    tasks.append(task)
                    continue
            for i, (wk, lo, hi) in enumerate(wire):
                wv = v if len(wire) == 1 else flat_slice(v, lo, hi)
                task = self._ordered(functools.partial(self._push_one, wk, wv, priority,
                                                       user_key=k, index=i, ready=ready),
                                     after=[fence, self._inflight.get(wk)])
                self._inflight[wk] = task
                tasks.append(task)
        return self._join(tasks)

    async def _push_one(self, key: int, value: Any, priority: int, *, user_key: int = -1,
                        index: int = 0, ready: float = 0.0) -> None:
        node = self._node
        if self._plain(key):
            # the common case: one message, without a coroutine per part (``one`` below)
            self._learn((await node.request(self._push_msg(key, value)[0]),))
            return
        parts = self._parts(key)
        meta: dict[str, Any] = {"stop": True} if getattr(node, "stop_wanted", False) else {}
        if self._loss is not None and self._carry_loss:
            meta["loss"] = self._loss  # DGT's adaptive K at the local server
        p3 = self.p3.enabled
        if p3:
            meta[FUSE_META] = True
        # GeoMX/MXNet without P3 sends FIFO: the priority only orders P3's send queues
        wire_priority = priority if p3 else 0
        sent = [0]
        if self._ts is not None:
            # TSEngine (geomx/node/ts_overlay.py): one part (the DC's local server), dense
            rnd = self._ts_round[key] = self._ts_round.get(key, 0) + 1
            self._ts_pushed.add(key)
            v = value if isinstance(value, Payload) else np.array(value, copy=True)
            self._learn([await self._ts.contribute(key, 0, rnd, v, meta)])
            return

        async def one(p) -> Message:
            v = flat_slice(value, p.lo, p.hi) if len(parts) > 1 else value
            payloads, m = node.lan_codec.encode_push(key, v, tier=node.push_tier, part=p.index)
            m.update(meta)
            if self._number_rounds:
                m["round"] = self._rounds.get(key, 0) + 1
            msg = Message(_PUSH, node.name, self._servers[p.server], key=key, part=p.index,
                          priority=wire_priority, version=node.iteration, meta=m,
                          payloads=payloads)
            if p3:
                sent[0] += msg.nbytes  # (only P3's record reads it)
            return await node.request(msg)

        acks = [await one(parts[0])] if len(parts) == 1 else await asyncio.gather(*(one(p) for p in parts))
        self._learn(acks)
        if p3:
            if all(a.payloads for a in acks):
                self._fused[key] = acks  # the next pull of this slice is served from these
            t = node.now()
            node.record("p3_slice", t_start=ready, dur=t - ready, key=user_key, slice=index,
                        skey=key, prio=priority, msg=f"prio {priority}",
                        bytes=sent[0])

    def _plain(self, key: int) -> bool:
        """Whether a push or pull of wire key ``key`` is one request and its reply (no
        P3 slices or fused replies, no TSEngine overlay, one server part)."""
        return self._ts is None and not self.p3.enabled and len(self._parts(key)) == 1

    def _push_msg(self, key: int, value: Any) -> tuple[Message, None]:
        """The PUSH of a one-part key, built when the call starts (``value`` is read then,
        so a later write to it does not change what is sent)."""
        node = self._node
        p = self._parts(key)[0]
        payloads, m = node.lan_codec.encode_push(key, value, tier=node.push_tier,
                                                 part=p.index)
        if getattr(node, "stop_wanted", False):
            m["stop"] = True
        if self._loss is not None and self._carry_loss:
            m["loss"] = self._loss  # DGT's adaptive K at the local server
        if self._number_rounds:
            m["round"] = self._rounds.get(key, 0) + 1
        return Message(_PUSH, node.name, self._servers[p.server], key=key, part=p.index,
                       version=node.iteration, meta=m, payloads=payloads), None

    def _learn_one(self, reply: Message) -> None:
        self._learn((reply,))

    def _pull_msg(self, key: int, out: Any) -> tuple[Message, Any]:
        """The PULL of a one-part key, and where its dense reply may be received."""
        node = self._node
        p = self._parts(key)[0]
        return (Message(_PULL, node.name, self._servers[p.server], key=key, part=p.index),
                _sink(out, self._wire_shapes[key][1]))

    def _pulled_one(self, key: int, out: Any, reply: Message) -> Any:
        self._learn((reply,))
        shape, dtype = self._wire_shapes[key]
        return self._pulled(self._parts(key), shape, dtype, [reply], out)

    def pull(self, key: Any, out: Any = None, priority: int = 0) -> asyncio.Future[Any]:
        """Fetch the current value of ``key`` (after this worker's last push of it) into
        ``out``; await the returned future for the value (a list for a list of keys)."""
        tasks = []
        pairs = self._keys(key, out)
        if (len(pairs) > 1 and not any(isinstance(o, (list, tuple)) for _, o in pairs)
                and self._batchable([k for k, _ in pairs])):
            task = self._ordered(functools.partial(self._pull_batch, pairs),
                                 after=[self._fence, *(self._inflight.get(k) for k, _ in pairs)])
            for k, _ in pairs:
                self._inflight[k] = task
            return task
        for k, o in pairs:
            self._check_key(k)
            wire = self._wire[k]
            fan_out = isinstance(o, (list, tuple))
            fence = self._fence
            if len(wire) == 1 and not fan_out and (fence is None or fence.done()):
                # the common case: what _ordered does below, without its lists and closures
                wk = wire[0][0]
                prev = self._inflight.get(wk)
                if self._plain(wk):
                    # one message, one reply: a future and callbacks, not a task
                    task = request_soon(self._node, functools.partial(self._pull_msg, wk, o),
                                        functools.partial(self._pulled_one, wk, o),
                                        after=None if prev is None or prev.done() else prev,
                                        after_failed=_earlier_failed)
                elif prev is None or prev.done():
                    task = self._node.spawn(self._pull_one(wk, o, priority))
                else:
                    task = self._node.spawn(self._pull_after(prev, wk, o, priority))
                self._inflight[wk] = task
                tasks.append(task)
                continue
            if len(wire) == 1:
                wk = wire[0][0]
                after = [self._fence, self._inflight.get(wk)]
                fetch = functools.partial(self._pull_one, wk, None if fan_out else o, priority)
            else:
                # P3: each slice is pulled after this worker's push of that slice (captured
                # now, before this pull becomes the slice's latest task)
                prevs = [self._inflight.get(wk) for wk, _, _ in wire]
                after = [self._fence]
                fetch = functools.partial(self._pull_sliced, k, wire, None if fan_out else o,
                                          priority, prevs)
            if fan_out:  # per-device outputs: each gets the value
                outs = list(o)

                async def fan(fetch: Any = fetch, outs: list[Any] = outs) -> Any:
                    value = await fetch()
                    for dst in outs:
                        np.copyto(dst, np.asarray(value).reshape(np.shape(dst)), casting="unsafe")
                    return outs
                coro_fn = fan
            else:
                coro_fn = fetch
            task = self._ordered(coro_fn, after=after)
            for wk, _, _ in wire:
                self._inflight[wk] = task
            tasks.append(task)
        if not isinstance(key, (list, tuple)):
            return tasks[0]
        return asyncio.ensure_future(asyncio.gather(*tasks))

    async def _pull_after(self, prev: asyncio.Task[Any], key: int, out: Any,
                          priority: int) -> Any:
        """``_pull_one`` once ``prev`` (this worker's last call on the key) is done."""
        try:
            await prev
        except Exception as e:
            raise KVStoreError(f"an earlier kvstore call failed: {e}") from e
        return await self._pull_one(key, out, priority)

    def pushpull(self, key: Any, value: Any, out: Any = None,
                 priority: int = 0) -> asyncio.Future[Any]:
        """``push`` then ``pull`` of the same keys (MXNet's ``pushpull``); ``out`` defaults
        to ``value`` itself, as in MXNet."""
        self.push(key, value, priority=priority)
        return self.pull(key, out=value if out is None else out, priority=priority)

    async def _pull_sliced(self, key: int, wire: list[tuple[int, int, int]], out: Any,
                           priority: int, prevs: list[asyncio.Task[Any] | None]) -> Any:
        """P3: pull every slice of ``key``, each once this worker's push of that slice is
        done, so early slices complete while later ones are still in their rounds."""
        async def one(wk: int, prev: asyncio.Task[Any] | None) -> Any:
            if prev is not None and not prev.done():
                await prev
            return await self._pull_one(wk, None, priority)

        values = await asyncio.gather(*(one(wk, prev) for (wk, _, _), prev in zip(wire, prevs)))
        shape, dtype = self._shapes[key]
        if out is None:
            out = (Payload.phantom(shape, dtype) if any(is_phantom(v) for v in values)
                   else np.empty(shape, dtype=dtype))
        for (_, lo, hi), v in zip(wire, values):
            write_slice(out, lo, hi, v)
        return out

    async def _pull_one(self, key: int, out: Any, priority: int) -> Any:
        node = self._node
        parts = self._parts(key)
        shape, dtype = self._wire_shapes[key]
        replies = self._fused.pop(key, None)
        if replies is None and self._ts is not None and key in self._ts_pushed:
            self._ts_pushed.discard(key)
            replies = [await self._ts.receive(key, 0)]  # the round's overlay broadcast
            self._learn(replies)
        if replies is None:
            prio = priority if self.p3.enabled else 0
            if len(parts) == 1:  # (no list of one coroutine to build and index)
                p = parts[0]
                # one dense part: the reply may be read from the socket straight into ``out``
                replies = [await node.request(Message(_PULL, node.name, self._servers[p.server],
                                                      key=key, part=p.index, priority=prio),
                                              sink=_sink(out, dtype))]
            else:
                replies = await asyncio.gather(*(
                    node.request(Message(_PULL, node.name, self._servers[p.server], key=key,
                                         part=p.index, priority=prio)) for p in parts))
            self._learn(replies)
        return self._pulled(parts, shape, dtype, replies, out)

    def _pulled(self, parts: list[Any], shape: tuple[int, ...], dtype: str,
                replies: Sequence[Message], out: Any) -> Any:
        """Decode a pull's replies (one per part) into ``out`` (a new array if None)."""
        node = self._node
        if type(out) is np.ndarray and len(parts) == 1 and out.nbytes < SINK_MIN_BYTES:
            reply = replies[0]
            if not reply.meta and len(reply.payloads) == 1:
                data = reply.payloads[0].data
                if data is not None and data.size == out.size:
                    # a dense reply into a small ``out`` (never received into it): what the
                    # general path below does, without decoding into a temporary first
                    np.copyto(out, data.reshape(out.shape), casting="unsafe")
                    return out
        if out is None and len(parts) == 1:
            # the decoded reply is this worker's own (a received buffer, or a copy)
            value = node.lan_codec.decode(replies[0])
            if is_phantom(value):
                return Payload.phantom(shape, dtype)
            value = value.reshape(shape)
            return value if value.dtype == np.dtype(dtype) else value.astype(dtype)
        if out is None:
            out = (Payload.phantom(shape, dtype) if replies[0].payloads[0].is_phantom
                   else np.empty(shape, dtype=dtype))
        for p, reply in zip(parts, replies):
            like = out if len(parts) == 1 else flat_slice(out, p.lo, p.hi)
            value = node.lan_codec.decode(reply, like=like)
            if is_phantom(out) or is_phantom(value):
                continue
            if len(parts) == 1:
                if not (value.nbytes == out.nbytes and value.ctypes.data == out.ctypes.data):
                    np.copyto(out, value.reshape(out.shape), casting="unsafe")
            else:
                out.reshape(-1)[p.lo:p.hi] = value.reshape(-1)
        return out

    def _batchable(self, keys: list[int]) -> bool:
        """A list call goes as one message per server (``request_many``) when every key
        travels whole to one server: no P3 slices, no TSEngine overlay, no split key."""
        for k in keys:
            self._check_key(k)
        if self.p3.enabled or self._ts is not None:
            return False
        return all(len(self._wire[k]) == 1 and len(self._parts(k)) == 1 for k in keys)

    async def _push_batch(self, values: list[tuple[int, Any]]) -> None:
        """Push many whole keys, one BATCH per server (what ``_push_one`` does per key)."""
        node = self._node
        meta: dict[str, Any] = {"stop": True} if getattr(node, "stop_wanted", False) else {}
        if self._loss is not None and self._carry_loss:
            meta["loss"] = self._loss
        msgs = []
        for k, v in values:
            p = self._parts(k)[0]
            payloads, m = node.lan_codec.encode_push(k, v, tier=node.push_tier, part=p.index)
            m.update(meta)
            if self._number_rounds:
                m["round"] = self._rounds.get(k, 0) + 1
            msgs.append(Message(Kind.PUSH, node.name, self._servers[p.server], key=k,
                                part=p.index, version=node.iteration, meta=m,
                                payloads=payloads))
        self._learn(await node.request_many(msgs))

    async def _pull_batch(self, pairs: list[tuple[int, Any]]) -> list[Any]:
        """Pull many whole keys, one BATCH per server; the values in key order."""
        node = self._node
        msgs = []
        for k, _ in pairs:
            p = self._parts(k)[0]
            msgs.append(Message(Kind.PULL, node.name, self._servers[p.server], key=k,
                                part=p.index))
        replies = await node.request_many(msgs)
        self._learn(replies)
        out = []
        for (k, o), reply in zip(pairs, replies):
            shape, dtype = self._wire_shapes[k]
            out.append(self._pulled(self._parts(k), shape, dtype, [reply], o))
        return out

    def _learn(self, replies: Sequence[Message]) -> None:
        """What replies carry besides values: a stop, and a codec the master configured
        with ``set_gradient_compression`` (the local server passes it on, as GeoMX's global
        server forwards the command down the tiers)."""
        node = self._node
        for r in replies:
            if self._number_rounds and r.kind in (Kind.PUSH_ACK, Kind.PULL_REPLY):
                self._rounds[r.key] = max(self._rounds.get(r.key, 0), r.version)
            if not r.meta:  # the common case: nothing but the version
                node.seen_version = max(int(getattr(node, "seen_version", 0)), r.version)
                continue
            if r.meta.get("stop"):
                node.stop_seen = True
            node.seen_version = max(int(getattr(node, "seen_version", 0)), r.version)
            if r.meta.get("ckpt"):
                # a checkpoint round (geomx/node/checkpoint.py): the trainer saves after it
                node.ckpt_due = max(int(getattr(node, "ckpt_due", 0)), int(r.meta["ckpt"]))
            cfg = r.meta.get("codec_config")
            if cfg is not None and dict(cfg) != getattr(node.lan_codec, "config", None):
                from geomx.node.link_codec import LinkCodec

                node.lan_codec = LinkCodec(dict(cfg), num_dcs=len(self._job.party_dcs))

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
        """This worker's current training loss, carried with its next pushes (DGT's
        adaptive K reads it; GeoMX's scripts write it to ``/tmp/loss<id>.csv``)."""
        self._loss = float(loss)

    def request_stop(self) -> None:
        """Ask the whole job to stop: carried on this worker's next pushes to the global tier."""
        self._node.stop_wanted = True

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
        from geomx.node.link_codec import LinkCodec, codec_config_check

        config = codec_config_check(dict(config))
        if not self._node.is_master:
            return self._fenced(_nothing)
        self._node.lan_codec = LinkCodec(dict(config), num_dcs=len(self._job.party_dcs))
        self._placement.clear()
        return self._fenced(functools.partial(
            self._command, {"cmd": "set_gradient_compression", "config": config}))

    async def _command(self, meta: dict[str, Any]) -> None:
        await asyncio.gather(*(self._node.request(Message(Kind.COMMAND, self._node.name, gs,
                                                          meta=meta))
                               for gs in self._job.global_servers))


def _earlier_failed(exc: BaseException) -> BaseException:
    """A call that waited for this worker's previous call on its key, which failed."""
    err = KVStoreError(f"an earlier kvstore call failed: {exc}")
    err.__cause__ = exc
    return err


async def _nothing() -> None:
    return None


#: String keys map to ``STRING_KEY_BASE + crc32(name)``; int keys stay below it.
STRING_KEY_BASE = 1 << 40

#: MXNet's optimizer option names -> geomx's.
_OPTION_ALIASES = {"learning_rate": "lr", "lamda": "lamda", "lambda": "lamda",
                   "clip_gradient": "clip_gradient", "weight_decay": "wd"}


def optimizer_config(optimizer: Any) -> dict[str, Any]:
    """A JSON optimizer config from a geomx optimizer, a dict, or MXNet spellings
    (``learning_rate`` for ``lr``, ``weight_decay`` for ``wd``, names in any case)."""
    if isinstance(optimizer, dict):
        raw = dict(optimizer)
    elif hasattr(optimizer, "to_config"):
        raw = dict(optimizer.to_config())
        if raw.get("rescale_grad") == 1.0:
            raw.pop("rescale_grad")  # the default: let the servers scale
    else:
        raise KVStoreError(f"set_optimizer takes a geomx optimizer or a config dict, got "
                           f"{type(optimizer).__name__}")
    name = raw.pop("name", None) or raw.pop("optimizer", None)
    if not isinstance(name, str):
        raise KVStoreError(f"an optimizer config needs a 'name', got {optimizer!r}")
    config: dict[str, Any] = {"name": name.lower()}
    for k, v in raw.items():
        config[_OPTION_ALIASES.get(k, k)] = v
    from geomx.optim import optimizer_from_config

    try:
        optimizer_from_config(config)  # a bad name or option fails here, naming what is allowed
    except ValueError as e:
        raise KVStoreError(f"set_optimizer: {e}") from None
    return config


class _OptimizerSpelling:
    """``geomx.kv.optimizer.Adam(learning_rate=0.01)``: MXNet's ``mx.optimizer`` style."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, **options: Any) -> dict[str, Any]:
        return optimizer_config({"name": self._name, **options})


class _OptimizerNamespace:
    Adam = _OptimizerSpelling("adam")
    SGD = _OptimizerSpelling("sgd")
    DCASGD = _OptimizerSpelling("dcasgd")
    NAG = _OptimizerSpelling("nesterov")
    AdaGrad = _OptimizerSpelling("adagrad")
    RMSProp = _OptimizerSpelling("rmsprop")
    AdaDelta = _OptimizerSpelling("adadelta")
    Adamax = _OptimizerSpelling("adamax")
    Nadam = _OptimizerSpelling("nadam")
    Ftrl = _OptimizerSpelling("ftrl")
    Signum = _OptimizerSpelling("signum")
    LAMB = _OptimizerSpelling("lamb")


optimizer = _OptimizerNamespace()


def check_kvstore_type(type_: str, sync: dict[str, Any]) -> bool:
    """``dist_async`` means MixedSync across DCs (GeoMX); True when the job must switch to
    it (``[sync] algorithm = "auto"``). A scenario that chose a synchronous algorithm
    explicitly conflicts with it (and ``dist_sync`` with ``mixed``): an error, not a
    warning in the event log."""
    if type_ == "local":
        return False
    algo = sync.get("algorithm", "fsa")
    wants_async = "async" in type_
    if sync.get("auto"):
        return wants_async
    if wants_async != (algo == "mixed"):
        fix = ("set [sync] algorithm = \"mixed\"" if wants_async
               else "create the store with geomx.kv.create(\"dist_async\")")
        raise KVStoreError(f"kvstore type {type_!r} conflicts with the scenario's [sync] "
                           f"algorithm = {algo!r}; {fix}")
    return False


#: Pulls of at least this many bytes into an ``out`` array ask to be received into it.
SINK_MIN_BYTES = 1 << 20


def _sink(out: Any, wire_dtype: str) -> np.ndarray | None:
    """``out`` when a pull reply can be received straight into it: a writable C-contiguous
    array of the wire dtype, large enough for the saved copy to matter."""
    if (isinstance(out, np.ndarray) and out.nbytes >= SINK_MIN_BYTES
            and out.flags.c_contiguous and out.flags.writeable
            and out.dtype.str == np.dtype(wire_dtype).str):
        return out
    return None


def _payload(v: Any) -> Payload:
    if isinstance(v, Payload):
        return v
    return Payload.of(np.ascontiguousarray(v))
