"""P3, priority-based parameter propagation (Jayarajan et al., MLSys 2019; docs/papers.md §4,
docs/geomx-behaviour.md §4.6).

Three mechanisms, and where each lives:

* **Slicing** (this module). Every kvstore key is cut into slices of at most
  ``slice_elements`` elements. Each slice travels as a key of its own -- a *slice key* --
  so everything below the kvstore (local/global servers, the placement rule, codec state,
  optimizer state, the sync policies) handles slices without knowing about P3. This is
  GeoMX's own approach (a fresh ps-key per slice), minus its bugs: GeoMX numbers slices with
  a running counter that assumes keys are encoded in order 0..n-1 and takes keys raw at the
  servers, which breaks under MultiGPS. Here a slice key is a pure function of
  ``(key, slice index)`` (:func:`slice_key`), the same on every node, and placement runs on
  slice keys like on any key.
* **Priority** (the message's ``priority``, set by :class:`geomx.kv.KVStore` from
  ``push/pull(priority=)``). The emulator's connections and the real transport's
  per-connection send queues already serve the highest priority first, FIFO among equal
  priorities; the node's per-destination outbox (``geomx/node/base.py``) does the same, so
  a newly ready high-priority slice overtakes queued lower ones at slice granularity in
  both runtimes. With P3 off the kvstore sends every message at priority 0 (GeoMX/MXNet
  without P3: FIFO per key as gradients appear).
* **Push/pull fusion** (:data:`FUSE_META`): a P3 push asks its server to answer with the
  slice's new value once the round is over; the kvstore keeps it and the next pull of the
  slice is served from it without another round trip. The very first pull of a key (after
  ``init``) is a real pull.

Slice keys, and how they spread a key's slices over the servers round robin:
geomx/policy/wire_keys.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from geomx.policy.options import PolicyOptions
from geomx.policy.wire_keys import WireKeyError, slice_key, split_slice_key
from geomx.policy.scheduling import (GlobalSchedContext, LocalSchedContext, SchedGlobalSide,
                                     SchedLocalSide, SchedWorkerSide, TransferScheduler,
                                     WorkerSchedContext)
from geomx.wire import Message

#: Meta flag of a P3 push: "answer with the new value of this slice after the round".
FUSE_META = "p3_fuse"

#: GeoMX's default slice size (``MXNET_KVSTORE_BIGARRAY_BOUND``).
DEFAULT_SLICE_ELEMENTS = 1_000_000


class P3Error(WireKeyError):
    """A key or tensor that P3 cannot slice (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class Slice:
    """Slice ``index`` of a key: elements ``[lo, hi)`` of the flattened tensor, sent as
    kvstore key ``skey``."""

    index: int
    skey: int
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


def layer_priority(skey: int) -> int:
    """P3's order for a slice key: earliest layer first, the layers numbered by key (the
    built-in layered trainer pushes key ``k`` at ``priority=-k``, GeoMX's demo
    convention), every slice of a key at its key's priority. For a scheduler that sends
    slices on its own messages (TSEngine's merges and relays), which do not carry the
    caller's priority."""
    return -split_slice_key(skey)[0]


def slices_of(key: int, num_elements: int, slice_elements: int) -> list[Slice]:
    """The slices of a tensor of ``num_elements`` elements, in element order.

    Every slice but the last has exactly ``slice_elements`` elements; an empty tensor is
    one empty slice (it still has to be initialised and pulled)."""
    if slice_elements < 1:
        raise P3Error(f"sched.p3_slice_elements must be >= 1, got {slice_elements}")
    if num_elements < 0:
        raise P3Error(f"key {key}: negative element count {num_elements}")
    n = max(1, -(-num_elements // slice_elements))
    return [Slice(i, slice_key(key, i), i * slice_elements,
                  min(num_elements, (i + 1) * slice_elements)) for i in range(n)]


@dataclass(frozen=True)
class P3Options(PolicyOptions):
    """P3's options (``[sched] p3_slice_elements``, built once by ``geomx/cluster.py``)."""

    slice_elements: int = DEFAULT_SLICE_ELEMENTS

    def __post_init__(self) -> None:
        if self.slice_elements < 1:
            raise P3Error(f"sched.p3_slice_elements must be >= 1, got {self.slice_elements}")


def wants_fused_reply(meta: dict[str, Any]) -> bool:
    """A push whose reply must carry the slice's new value (P3 push/pull fusion)."""
    return bool(meta.get(FUSE_META))


class P3(TransferScheduler):
    """P3 as a transfer scheduler: slices, priorities and push/pull fusion (this module's
    docstring says where each mechanism acts)."""

    name: ClassVar[str] = "p3"
    Options = P3Options
    options: P3Options

    def worker_side(self, ctx: WorkerSchedContext) -> SchedWorkerSide:
        return _P3Worker(ctx, self.options.slice_elements)

    def local_side(self, ctx: LocalSchedContext) -> SchedLocalSide:
        return _P3Local()

    def global_side(self, ctx: GlobalSchedContext) -> SchedGlobalSide:
        return _P3Global()


class _P3Worker(SchedWorkerSide):
    plain = False
    orders_by_priority = True

    def __init__(self, ctx: WorkerSchedContext, slice_elements: int):
        self.ctx = ctx
        self.slice_elements = slice_elements
        #: wire key -> the fused push replies that the next pull is served from
        self.fused: dict[int, list[Message]] = {}

    def slices(self, key: int, num_elements: int) -> list[tuple[int, int, int]]:
        try:
            return [(s.skey, s.lo, s.hi) for s in slices_of(key, num_elements,
                                                             self.slice_elements)]
        except WireKeyError as e:
            raise P3Error(f"for P3: {e}") from None

    def push_meta(self, meta: dict[str, Any]) -> None:
        meta[FUSE_META] = True

    def pushed(self, key: int, acks: Sequence[Message], *, user_key: int, index: int,
               priority: int, t_ready: float, nbytes: int) -> None:
        if all(a.payloads for a in acks):
            self.fused[key] = list(acks)  # the next pull of this slice is served from these
        t = self.ctx.now()
        self.ctx.record("p3_slice", t_start=t_ready, dur=t - t_ready, key=user_key,
                        slice=index, skey=key, prio=priority, msg=f"prio {priority}",
                        bytes=nbytes)

    async def pull_replies(self, key: int) -> tuple[list[Message], bool] | None:
        acks = self.fused.pop(key, None)
        return None if acks is None else (acks, False)

    def forget(self, key: int) -> None:
        self.fused.pop(key, None)


class _P3Local(SchedLocalSide):
    def global_push_meta(self, meta: dict[str, Any]) -> None:
        meta[FUSE_META] = True  # the acks carry the new value (no pull trip)

    def acks_carry_value(self, acks: Sequence[Message]) -> bool:
        return all(a.payloads for a in acks)

    def reply_carries_value(self, push: Message) -> bool:
        return wants_fused_reply(push.meta)


class _P3Global(SchedGlobalSide):
    def reply_carries_value(self, push: Message) -> bool:
        return wants_fused_reply(push.meta)
