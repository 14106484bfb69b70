"""The pull path of the kvstore: ``pull`` and how replies become values.

A pull of key k runs after this worker's previous push or pull of k. The common case, a
key that travels whole from one server, is one message and its reply, handled with a
future and callbacks (:mod:`geomx.node.calls`); a large dense reply may be read from the
socket straight into the caller's ``out`` array. Keys the transfer scheduler slices or
answers itself (geomx/policy/scheduling.py), keys split over servers and per-device
outputs take the task paths below; a list of whole keys goes as one message per server.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Sequence

import numpy as np

from geomx.node.calls import request_soon
from geomx.node.kv_state import KVStoreError, KVStoreState
from geomx.node.values import flat_slice, is_phantom, write_slice
from geomx.wire import Kind, Message, Payload

#: the message kind of the per-message path (a module global reads faster than the enum)
_PULL = Kind.PULL

#: Pulls of at least this many bytes into an ``out`` array ask to be received into it.
SINK_MIN_BYTES = 1 << 20


class PullCalls(KVStoreState):
    """``pull`` and the decoding of its replies."""

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
                # sliced: each slice is pulled after this worker's push of it (captured
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

    async def _pull_sliced(self, key: int, wire: list[tuple[int, int, int]], out: Any,
                           priority: int, prevs: list[asyncio.Task[Any] | None]) -> Any:
        """Pull every slice of ``key``, each once this worker's push of that slice is
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
        replies = None
        if self._sched is not None:
            answered = await self._sched.pull_replies(key)  # (a fused reply, a broadcast)
            if answered is not None:
                replies, unread = answered
                if unread:
                    self._learn(replies)
        if replies is None:
            prio = priority if self._by_priority else 0
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


def _earlier_failed(exc: BaseException) -> BaseException:
    """A call that waited for this worker's previous call on its key, which failed."""
    err = KVStoreError(f"an earlier kvstore call failed: {exc}")
    err.__cause__ = exc
    return err


def _sink(out: Any, wire_dtype: str) -> np.ndarray | None:
    """``out`` when a pull reply can be received straight into it: a writable C-contiguous
    array of the wire dtype, large enough for the saved copy to matter."""
    if (isinstance(out, np.ndarray) and out.nbytes >= SINK_MIN_BYTES
            and out.flags.c_contiguous and out.flags.writeable
            and out.dtype.str == np.dtype(wire_dtype).str):
        return out
    return None

