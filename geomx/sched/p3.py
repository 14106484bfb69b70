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

Slice placement: a slice key ``k + i * SLICE_KEY_STRIDE`` with ``SLICE_KEY_STRIDE = 1 (mod
S)`` for every server count ``S`` dividing 720720 (all ``S <= 16``, and many more), so GeoMX's
placement rule ``(key * 9973) mod S`` sends consecutive slices of a key to consecutive
servers: slices are spread round-robin over the servers, as in P3, with no change to the
placement code. Slice 0 of a key is the key itself, so a key that fits in one slice is
placed exactly as without P3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from geomx.policy.options import PolicyOptions
from geomx.policy.scheduling import (GlobalSchedContext, LocalSchedContext, SchedGlobalSide,
                                     SchedLocalSide, SchedWorkerSide, TransferScheduler,
                                     WorkerSchedContext)
from geomx.wire import Message

#: lcm(1..16): the stride is 1 modulo every server count that divides it.
_LCM_1_TO_16 = 720_720
#: Int keys must stay below this; ``slice_key(k, i) = k + i * SLICE_KEY_STRIDE``.
SLICE_KEY_STRIDE = _LCM_1_TO_16 * 1000 + 1
#: String keys: ``STRING_KEY_BASE + crc32(name)`` (geomx/node/kv_state.py), a 2**32 range.
STRING_KEY_BASE = 1 << 40
_STRING_KEY_SPAN = 1 << 32
#: The slices of int keys stay below 2**62; those of string keys lie above, from this
#: base, which is ``STRING_KEY_BASE + 1`` modulo 720720 so that slice 1 of a string key
#: goes to the server after slice 0's, like every later slice.
_STRING_SLICES_BASE = (1 << 62) + (STRING_KEY_BASE + 1 - (1 << 62)) % _LCM_1_TO_16
#: Largest slice index that keeps an int key's slice key below the string keys' slices.
MAX_SLICES_PER_KEY = ((1 << 62) - 1) // SLICE_KEY_STRIDE
#: Stride between the slices of a string key: more than the span of string keys (so no
#: two string keys' slices meet) and 1 modulo 720720, like :data:`SLICE_KEY_STRIDE`.
STRING_SLICE_STRIDE = -(-_STRING_KEY_SPAN // _LCM_1_TO_16) * _LCM_1_TO_16 + 1
#: Largest slice index of a string key inside the wire's signed 64-bit key field.
MAX_SLICES_PER_STRING_KEY = ((2**63 - 1) - _STRING_SLICES_BASE - _STRING_KEY_SPAN) \
    // STRING_SLICE_STRIDE

#: Meta flag of a P3 push: "answer with the new value of this slice after the round".
FUSE_META = "p3_fuse"

#: GeoMX's default slice size (``MXNET_KVSTORE_BIGARRAY_BOUND``).
DEFAULT_SLICE_ELEMENTS = 1_000_000


class P3Error(ValueError):
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


def slice_key(key: int, index: int) -> int:
    """The kvstore key that slice ``index`` of ``key`` travels as.

    Slice 0 is the key itself. The further slices of an int key are ``key + index *
    SLICE_KEY_STRIDE``; those of a string key (a parameter's name) lie above
    ``2**62``, ``STRING_SLICE_STRIDE`` apart, so the two kinds never share a number."""
    if STRING_KEY_BASE <= key < STRING_KEY_BASE + _STRING_KEY_SPAN:
        if not 0 <= index <= MAX_SLICES_PER_STRING_KEY:
            raise P3Error(f"slice index {index} of key {key} out of range; allowed: "
                          f"0..{MAX_SLICES_PER_STRING_KEY} (use a larger "
                          "sched.p3_slice_elements)")
        if index == 0:
            return key
        return (_STRING_SLICES_BASE + key - STRING_KEY_BASE
                + (index - 1) * STRING_SLICE_STRIDE)
    if not 0 <= key < SLICE_KEY_STRIDE:
        raise P3Error(f"key {key} out of range for P3 slicing; allowed: "
                      f"0..{SLICE_KEY_STRIDE - 1}, or a string key")
    if not 0 <= index <= MAX_SLICES_PER_KEY:
        raise P3Error(f"slice index {index} of key {key} out of range; allowed: "
                      f"0..{MAX_SLICES_PER_KEY} (use a larger sched.p3_slice_elements)")
    return key + index * SLICE_KEY_STRIDE


def split_slice_key(skey: int) -> tuple[int, int]:
    """``(key, slice index)`` of a slice key (inverse of :func:`slice_key`)."""
    if skey >= _STRING_SLICES_BASE:
        index, offset = divmod(skey - _STRING_SLICES_BASE, STRING_SLICE_STRIDE)
        return STRING_KEY_BASE + offset, index + 1
    if STRING_KEY_BASE <= skey < STRING_KEY_BASE + _STRING_KEY_SPAN:
        return skey, 0
    index, key = divmod(skey, SLICE_KEY_STRIDE)
    return key, index


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
        except P3Error as e:
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
