"""What one worker's kvstore keeps between calls, and the rules every call follows.

A :class:`~geomx.node.kvstore.KVStore` is this state plus its call paths: pushes
(:mod:`geomx.node.kv_push`), pulls (:mod:`geomx.node.kv_pull`) and the set-up and command
calls (:mod:`geomx.node.kvstore`). They are mixins of one class rather than objects that
call each other because the push and pull paths run for every tensor of every step: a
method found on the instance's class costs nothing more than before the split, and each
path reads the state as its own.

Kept here: how user keys map to wire keys and server parts, the order calls run in (the
fence and each key's latest call), and what replies carry besides values.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from typing import Any, Sequence

import numpy as np

from geomx.node.push_snapshots import PushSnapshots
from geomx.node.worker_state import WorkerState
from geomx.policy.wire_keys import STRING_KEY_BASE  # string keys: it + crc32(name)
from geomx.sched.placement import place
from geomx.wire import Kind, Message


class KVStoreError(RuntimeError):
    """Misuse of the kvstore API (wrong role, unknown key, bad config)."""


class KVStoreState:
    """One worker's (or the master worker's) view of the keys it trains, and of its calls
    still running: the latest fence (``init``, ``barrier``, a command) and each wire key's
    latest push or pull, which the next call waits for (:meth:`_ordered`)."""

    def __init__(self, node: Any, type_: str):
        self._node = node
        #: what this store learns from replies, shared with the training loop
        self._worker_state: WorkerState = node.state
        self.type = type_
        job = node.job
        self._job = job
        self._servers: list[str] = (list(job.global_servers) if node.is_master
                                    else job.servers_of_worker(node.name))
        #: user key -> (shape, dtype) as given to init
        self._shapes: dict[int, tuple[tuple[int, ...], str]] = {}
        #: user key -> the wire keys it travels as: [(wire key, lo, hi)] over the flattened
        #: tensor; one entry ``(key, 0, n)`` unless the transfer scheduler slices it
        self._wire: dict[int, list[tuple[int, int, int]]] = {}
        #: wire key -> (shape, dtype) of what travels under it
        self._wire_shapes: dict[int, tuple[tuple[int, ...], str]] = {}
        #: wire key -> the user key it belongs to (one only: :meth:`_wire_problem`)
        self._wire_owner: dict[int, int] = {}
        #: the buffers large pushes are snapshot into, reused from push to push
        self._snapshots = PushSnapshots()
        #: the transfer schedulers' worker side (geomx/policy/scheduling.py; None: none),
        #: whether one-part keys still go as one request and its reply, and whether the
        #: wire priority is the caller's (else FIFO, as GeoMX/MXNet without a scheduler)
        self._sched = node.sched
        self._sched_plain = self._sched is None or self._sched.plain
        self._by_priority = self._sched is not None and self._sched.orders_by_priority
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
        self._loss: float | None = None
        # only a job whose scheduler reads the loss pays the bytes of carrying it
        self._carry_loss = self._sched is not None and self._sched.carries_loss

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

    def _wire_problem(self, key: int, n: int, wire: list[tuple[int, int, int]]) -> str | None:
        """Why the slices a transfer scheduler gave ``key`` (``n`` elements) cannot travel:
        they must cover the tensor in order, and each wire key must be this key's alone
        (another key's value under it would reach the servers as one tensor)."""
        at = 0
        seen: set[int] = set()
        for i, (wk, lo, hi) in enumerate(wire):
            if lo != at or hi < lo or hi > n:
                return (f"slice {i} ({wk}, {lo}, {hi}) should cover elements from {at}, "
                        f"within [0, {n}): the slices must cover the tensor in order")
            at = hi
            owner = self._wire_owner.get(wk, key)
            if owner != key or wk in seen:
                whose = f"key {self._key_name(owner)}'s" if owner != key else "another slice's"
                return (f"wire key {wk} is also {whose}; number slices with "
                        "geomx.policy.slice_key(key, index), whose keys never meet "
                        "another key's")
            seen.add(wk)
        if at != n:
            return f"the {len(wire)} slices end at element {at}, not {n}"
        return None

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

    def _plain(self, key: int) -> bool:
        """Whether a push or pull of wire key ``key`` is one request and its reply (the
        transfer scheduler leaves it plain, one server part)."""
        return self._sched_plain and len(self._parts(key)) == 1

    def _batchable(self, keys: list[int]) -> bool:
        """A list call goes as one message per server (``request_many``) when every key
        travels whole to one server: plain for the transfer scheduler, no split key."""
        for k in keys:
            self._check_key(k)
        if not self._sched_plain:
            return False
        return all(len(self._wire[k]) == 1 and len(self._parts(k)) == 1 for k in keys)

    def _learn(self, replies: Sequence[Message]) -> None:
        """What replies carry besides values: a stop, and a codec the master configured
        with ``set_gradient_compression`` (the local server passes it on, as GeoMX's global
        server forwards the command down the tiers)."""
        node, state = self._node, self._worker_state
        for r in replies:
            if self._number_rounds and r.kind in (Kind.PUSH_ACK, Kind.PULL_REPLY):
                self._rounds[r.key] = max(self._rounds.get(r.key, 0), r.version)
            state.saw_version(r.version)
            if not r.meta:  # the common case: nothing but the version
                continue
            if r.meta.get("stop"):
                state.saw_stop()
            if r.meta.get("ckpt"):
                # a checkpoint round (geomx/node/checkpoint.py): the trainer saves after it
                state.saw_checkpoint(int(r.meta["ckpt"]))
            cfg = r.meta.get("codec_config")
            if cfg is not None and dict(cfg) != getattr(node.lan_codec, "config", None):
                node.lan_codec = node.lan_codec.replaced(dict(cfg))

    def _learn_one(self, reply: Message) -> None:
        self._learn((reply,))

