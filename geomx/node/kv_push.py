"""The push path of the kvstore: ``push`` and what it sends.

A push returns at once; its value is read (snapshot) when the call is made. The common
case, a key that travels whole to one server with nothing to wait for, is one message
and its acknowledgement, handled with a future and callbacks (:mod:`geomx.node.calls`)
rather than a task; keys the transfer scheduler handles (geomx/policy/scheduling.py)
and keys split over servers take ``_push_one``; a list of whole keys goes as one
message per server.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np

from geomx.node.calls import request_soon
from geomx.node.kv_state import KVStoreError, KVStoreState
from geomx.node.values import flat_slice, freeze
from geomx.wire import Kind, Message, Payload

#: the message kind of the per-message path (a module global reads faster than the enum)
_PUSH = Kind.PUSH


class PushCalls(KVStoreState):
    """``push`` and the messages it becomes."""

    def push(self, key: Any, value: Any, priority: int = 0) -> asyncio.Future[Any]:
        """Start pushing ``value`` for ``key`` and return at once (await the returned future
        -- a task, or for a one-part key a plain future, :mod:`geomx.node.calls` -- to wait).

        ``value`` is read now (a later write to it does not change what is sent); a list
        of arrays for one key is summed first, as MXNet sums per-device values."""
        tasks = []
        ready = self._node.now() if self._sched is not None else 0.0  # (for the scheduler)
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
        meta: dict[str, Any] = {"stop": True} if self._worker_state.stop_wanted else {}
        if self._loss is not None and self._carry_loss:
            meta["loss"] = self._loss  # read by the transfer scheduler at the local server
        sched = self._sched
        if sched is not None:
            sched.push_meta(meta)
            routed = await sched.push(key, value, meta)  # (an overlay, not the server)
            if routed is not None:
                self._learn(routed)
                return
        # without a scheduler ordering by priority the sends are FIFO (GeoMX/MXNet)
        wire_priority = priority if self._by_priority else 0
        sent = [0]

        async def one(p) -> Message:
            v = flat_slice(value, p.lo, p.hi) if len(parts) > 1 else value
            payloads, m = node.lan_codec.encode_push(key, v, tier=node.push_tier, part=p.index)
            m.update(meta)
            if self._number_rounds:
                m["round"] = self._rounds.get(key, 0) + 1
            msg = Message(_PUSH, node.name, self._servers[p.server], key=key, part=p.index,
                          priority=wire_priority, version=node.iteration, meta=m,
                          payloads=payloads)
            sent[0] += msg.nbytes
            return await node.request(msg)

        acks = [await one(parts[0])] if len(parts) == 1 else await asyncio.gather(*(one(p) for p in parts))
        self._learn(acks)
        if sched is not None:
            sched.pushed(key, acks, user_key=user_key, index=index, priority=priority,
                         t_ready=ready, nbytes=sent[0])

    def _push_msg(self, key: int, value: Any) -> tuple[Message, None]:
        """The PUSH of a one-part key, built when the call starts (``value`` is read then,
        so a later write to it does not change what is sent)."""
        node = self._node
        p = self._parts(key)[0]
        payloads, m = node.lan_codec.encode_push(key, value, tier=node.push_tier,
                                                 part=p.index)
        if self._worker_state.stop_wanted:
            m["stop"] = True
        if self._loss is not None and self._carry_loss:
            m["loss"] = self._loss  # read by the transfer scheduler at the local server
        if self._number_rounds:
            m["round"] = self._rounds.get(key, 0) + 1
        return Message(_PUSH, node.name, self._servers[p.server], key=key, part=p.index,
                       version=node.iteration, meta=m, payloads=payloads), None

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

    async def _push_batch(self, values: list[tuple[int, Any]]) -> None:
        """Push many whole keys, one BATCH per server (what ``_push_one`` does per key)."""
        node = self._node
        meta: dict[str, Any] = {"stop": True} if self._worker_state.stop_wanted else {}
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

