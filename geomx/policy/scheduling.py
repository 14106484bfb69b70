"""Transfer scheduling: how a value moves on each hop, in which order and by which path.

A :class:`TransferScheduler` decides what P3, DGT and TSEngine decide in GeoMX
(docs/geomx-behaviour.md §4.2, §4.4, §4.5): how a key is sliced and which slice leaves
first, which channel a block takes, whether a push is merged along an overlay tree
and whether the reply to a push already carries the new value. The node roles hand
each transfer to the job's schedulers through the hooks of three *sides*, in the style
of ps-lite's ``KVWorker::set_slicer`` and ``KVServer::set_request_handle``: the
transport stays fixed, the application plugs behaviour into it.

* :class:`SchedWorkerSide` -- a worker's kvstore: slicing a key into wire keys, the wire
  priority, where a push goes (its server, or an overlay), whether a pull is already
  answered (a fused push reply, an overlay broadcast);
* :class:`SchedLocalSide` -- a local server: how the DC's sum travels to the global servers
  and back (plain push and pull, a fused acknowledgement, blocks on several channels, an
  overlay merge and broadcast), and how its parked workers are answered;
* :class:`SchedGlobalSide` -- a global server: decoding a push that arrives in blocks or as an
  overlay merge, and replying (fused, or by a broadcast);
* a coordinator on the scheduler nodes (:meth:`TransferScheduler.coordinator_side`),
  for schedulers that decide transfers centrally (TSEngine).

Every hook has a default that leaves the transfer as it is, so a scheduler writes only
the hooks it needs. A side reaches its node only through its context
(:class:`SchedContext` and the role's extension), never the node object, so it runs
unchanged in the emulator and over sockets.

Several schedulers may run in one job (P3 and DGT do); :func:`worker_side_of`,
:func:`local_side_of` and :func:`global_side_of` compose their sides into one: a hook
that *decides* (``slices``, ``push``, ``exchange``, ``push_part``, ``decode_push``, ...)
goes to each side in the job's order until one answers (the rest fall through); a hook
that *observes* or *adds* (``push_meta``, ``on_key_ready``, ``drain``, ...) runs on every
side. Combinations whose mechanisms conflict are refused when the scenario loads
(:meth:`TransferScheduler.check`).

Name one in a scenario as ``[sched] policy = "file.py:Class"`` with its options in
``[sched.options]`` (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from geomx.policy.base import Policy
from geomx.policy.codec import Codec
from geomx.policy.context import NodeContext
from geomx.wire import Kind, Message, Payload

__all__ = ["TransferScheduler", "SchedWorkerSide", "SchedLocalSide", "SchedGlobalSide",
           "SchedCoordinatorSide",
           "SchedContext", "WorkerSchedContext", "LocalSchedContext", "GlobalSchedContext",
           "SchedJobView", "Uniform", "HELD", "MERGED_FROM_META", "worker_side_of",
           "local_side_of", "global_side_of", "sync_problem_of"]

#: A tensor value as servers hold it: a numpy array, or a phantom payload.
Value = Any
#: A server part of a key: ``.index``, ``.server`` (rank among the global servers) and
#: ``.lo`` / ``.hi`` (its elements of the flattened tensor).
Part = Any

#: Message meta of a push that carries several pushers' contributions (an overlay
#: merge): the names of those pushers. Sync algorithms count such a push as theirs.
MERGED_FROM_META = "ts_from"


class _Held:
    """:data:`HELD`: a push a scheduler took in part (a block); nothing to apply yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HELD"


#: What :meth:`SchedGlobalSide.decode_push` returns for a piece of a push (not the last block).
HELD: Any = _Held()


class SchedJobView(Protocol):
    """What a scheduler may read about the job (identical on every node)."""

    mode: str                           # "hips" | "flat_ps" | "netstorm"
    party_dcs: list[str]
    global_scheduler: str
    global_servers: list[str]
    master_worker: str
    local_scheduler_of: dict[str, str]  # dc -> local scheduler (hips only)
    local_server_of: dict[str, str]     # dc -> local server (hips only)
    workers_of: dict[str, list[str]]
    transfer_schedulers: Sequence["TransferScheduler"]  # the job's, in composition order


class Uniform(Protocol):
    """A seeded random generator (the part of ``numpy.random.Generator`` schedulers use)."""

    def random(self) -> float: ...

    def integers(self, low: int, high: int) -> Any: ...


class SchedContext(NodeContext, Protocol):
    """What a scheduler side may do on its node, whichever role the node plays."""

    @property
    def job(self) -> SchedJobView: ...

    async def request(self, msg: Message, *, timeout_s: float | None = None) -> Message:
        """Send ``msg`` and wait for its reply (``timeout_s=math.inf``: no deadline)."""
        ...

    def on(self, kind: Kind, handler: Callable[[Message], None]) -> None:
        """Handle every message of ``kind`` this node receives (a kind the role does not
        handle itself: overlay relays, coordinator asks)."""
        ...

    def reply_error(self, msg: Message, reason: str) -> None:
        """Answer ``msg`` with an error (its sender's call raises ``reason``)."""
        ...

    def encode_push(self, key: int, value: Value, *, tier: str) -> tuple[list[Payload],
                                                                        dict[str, Any]]:
        """``value`` as the node's codec sends a push on ``tier`` ("lan" / "wan")."""
        ...

    def encode_pull(self, key: int, value: Value, *, tier: str,
                    weights: bool = False) -> tuple[list[Payload], dict[str, Any]]:
        """``value`` as the node's codec sends a pull reply on ``tier``."""
        ...

    def codec_for(self, num_elements: int, *, tier: str) -> Codec | None:
        """The node's current codec for a tensor of ``num_elements`` on ``tier`` (None:
        such a tensor travels dense), for a scheduler that encodes pieces of a tensor
        itself (DGT's blocks, each with its own error-feedback state)."""
        ...

    def decode(self, msg: Message, like: Value | None = None) -> Value:
        """The value ``msg`` carries, decoded by the node's codec."""
        ...

    def rng(self, name: str) -> Uniform:
        """A generator seeded from the scenario seed and ``name`` (the same every run)."""
        ...


class WorkerSchedContext(SchedContext, Protocol):
    """A worker as its scheduler side sees it."""

    @property
    def is_master(self) -> bool: ...


class LocalSchedContext(SchedContext, Protocol):
    """A local server as its scheduler side sees it."""

    @property
    def workers(self) -> Sequence[str]:
        """This DC's workers, rank order."""
        ...

    def accept_merged(self, msg: Message, value: Value, count: int,
                      senders: list[str]) -> None:
        """A push that carries ``count`` workers' gradients (``senders``) summed: count it
        as their pushes of this round."""
        ...


class GlobalSchedContext(SchedContext, Protocol):
    """A global server as its scheduler side sees it."""

    @property
    def pushers(self) -> Sequence[str]: ...

    @property
    def stop_requested(self) -> bool: ...

    @property
    def has_optimizer(self) -> bool:
        """A pull returns weights (the server runs an optimizer), not a sum."""
        ...

    def reply_meta(self, version: int, key: int, part: int) -> dict[str, Any]:
        """What every reply of round ``version`` of (``key``, ``part``) carries besides
        the value (the stop request, the checkpoint round): a scheduler that answers
        another way adds it."""
        ...

    def accept_merged(self, msg: Message, value: Value, count: int,
                      senders: list[str]) -> None:
        """A push that carries ``count`` pushers' values (``senders``) summed: hand it to
        the sync algorithm as their pushes."""
        ...


class SchedWorkerSide:
    """A worker kvstore's part of a transfer scheduler (one per worker node)."""

    #: Every push and pull of a one-part key may go as one request and its reply (the
    #: kvstore's fast path): False when this side slices, fuses or reroutes transfers.
    plain: ClassVar[bool] = True
    #: The wire priority of a message is the caller's ``priority`` (GeoMX/MXNet without
    #: a scheduler sends FIFO: priority 0).
    orders_by_priority: ClassVar[bool] = False
    #: Pushes carry the worker's last reported training loss (``meta["loss"]``).
    carries_loss: ClassVar[bool] = False

    def slices(self, key: int, num_elements: int) -> list[tuple[int, int, int]] | None:
        """The wire keys ``key`` travels as: ``[(wire key, lo, hi)]`` over the flattened
        tensor (None: the key travels whole). Raise ValueError when it cannot be sliced."""
        return None

    def push_meta(self, meta: dict[str, Any]) -> None:
        """Add what this scheduler's pushes carry to ``meta`` (sent with every part)."""
        return None

    async def push(self, key: int, value: Value, meta: dict[str, Any]) -> list[Message] | None:
        """Send the push of wire key ``key`` another way than to its server (an overlay);
        returns the acknowledgements, or None to send it to its server."""
        return None

    def pushed(self, key: int, acks: Sequence[Message], *, user_key: int, index: int,
               priority: int, t_ready: float, nbytes: int) -> None:
        """The server acknowledged the push of wire key ``key`` (slice ``index`` of
        ``user_key``, made ready at ``t_ready``, ``nbytes`` sent)."""
        return None

    async def pull_replies(self, key: int) -> tuple[list[Message], bool] | None:
        """Replies that already answer the next pull of ``key`` (a fused push reply, an
        overlay broadcast), and whether the kvstore has yet to read what they carry
        besides the value; None: pull from the server."""
        return None

    def forget(self, key: int) -> None:
        """Wire key ``key`` is initialised again: drop what this side kept of it."""
        return None

    async def drain(self) -> None:
        """The worker is about to leave: finish the transfers it still owes others."""
        return None


class _SchedServerSide:
    """The hooks a local and a global server's sides share: stopping and checkpoints."""

    async def drain(self) -> None:
        """The server is about to stop: finish the transfers it still owes others."""
        return None

    def on_done(self) -> None:
        """The server has stopped (record totals)."""
        return None

    def state_dict(self) -> Any:
        """What this side keeps across rounds, saved with the server's checkpoint once
        it has finished the checkpoint round (geomx/node/checkpoint.py; a tree of dicts,
        lists, numbers, strings and numpy arrays). None: nothing outlives a round."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Take back what :meth:`state_dict` returned (a resumed server, before the
        first round after the checkpoint's)."""
        return None


class SchedLocalSide(_SchedServerSide):
    """A local server's part of a transfer scheduler."""

    def command_problem(self, cmd: str) -> str | None:
        """Why this scheduler cannot take the master's command ``cmd`` (None: it can)."""
        return None

    def receive_push(self, msg: Message) -> bool:
        """A push this scheduler handles whole (an overlay merge): True when taken."""
        return False

    def note_worker_push(self, msg: Message) -> None:
        """A worker's push was accepted into this round."""
        return None

    def on_key_ready(self, key: int) -> None:
        """``key`` is initialised here (the DC's workers may push it)."""
        return None

    async def exchange(self, key: int, parts: Sequence[Part], round_: int, value: Value,
                       meta: dict[str, Any]) -> list[tuple[Part, Message]] | None:
        """Carry the DC's sum of round ``round_`` to the global tier and bring the new
        value back another way than push and pull: the messages that carry it, one per
        part (None: push each part, then pull)."""
        return None

    def global_push_meta(self, meta: dict[str, Any]) -> None:
        """Add what this scheduler's pushes to the global servers carry to ``meta``."""
        return None

    async def push_part(self, dst: str, key: int, part: int, round_: int, value: Value,
                        meta: dict[str, Any]) -> Message | None:
        """Send one part of the DC's sum to global server ``dst`` another way than one
        message (blocks, channels); its acknowledgement, or None to send it plainly."""
        return None

    def acks_carry_value(self, acks: Sequence[Message]) -> bool:
        """The global servers' acknowledgements carry the new value (no pull)."""
        return False

    def on_round_answered(self, key: int, round_: int, value: Value,
                          reply_meta: dict[str, Any]) -> None:
        """Round ``round_`` of ``key`` is over and ``value`` is its new value; the parked
        worker pushes are answered next (with ``reply_meta``)."""
        return None

    def reply_carries_value(self, push: Message) -> bool:
        """The acknowledgement of worker push ``push`` must carry the new value."""
        return False



class SchedGlobalSide(_SchedServerSide):
    """A global server's part of a transfer scheduler."""

    def on_key_ready(self, key: int, part: int) -> None:
        """(``key``, ``part``) is initialised here."""
        return None

    def receive_push(self, msg: Message) -> bool:
        """A push this scheduler handles whole (an overlay merge): True when taken."""
        return False

    def decode_push(self, msg: Message, like: Value) -> Any:
        """The value of push ``msg`` when it is this scheduler's to decode, :data:`HELD`
        for a piece of one still incomplete, None to decode it with the codec. Raise
        ValueError for a malformed one (the push is answered with the error)."""
        return None

    def reply_push(self, msg: Message, version: int, value: Value) -> bool:
        """Answer push ``msg`` another way than an acknowledgement (an overlay broadcast
        of the new ``value``, ``version``): True when done."""
        return False

    def reply_carries_value(self, push: Message) -> bool:
        """The acknowledgement of ``push`` must carry the new value (a fused pull)."""
        return False



class TransferScheduler(Policy):
    """The job's transfer scheduling on every hop (worker, local and global servers).

    One object per job, built from its options when the job is planned; it builds a side
    per node (``None``: nothing to do on that node)."""

    kind: ClassVar[str] = "sched"

    def check(self, job: SchedJobView) -> str | None:
        """Why this job cannot run the scheduler, or None."""
        return None

    def sync_problem(self, algorithm: str) -> str | None:
        """Why the job cannot switch to sync ``algorithm`` at run time (None: it can)."""
        return None

    def worker_side(self, ctx: WorkerSchedContext) -> SchedWorkerSide | None:
        return None

    def local_side(self, ctx: LocalSchedContext) -> SchedLocalSide | None:
        return None

    def global_side(self, ctx: GlobalSchedContext) -> SchedGlobalSide | None:
        return None

    def coordinator_side(self, ctx: SchedContext) -> object | None:
        """On a scheduler node: install whatever coordinates transfers centrally (its
        handlers, through ``ctx.on``); the object is kept alive with the node. One that
        is a :class:`SchedCoordinatorSide` also hears of its members' replacements."""
        return None


class SchedCoordinatorSide:
    """A coordinator that decides transfers between nodes the job may replace: the
    scheduler tells it when a new process takes over a member's name
    (``[membership] on_server_loss = "wait"``, docs/reliability.md), so that transfers
    planned through the old process can be planned again."""

    def on_member_replaced(self, member: str) -> None:
        """A new process took over ``member``: whatever the old one held or was sent is
        gone, and the new one starts from the global tier's state."""
        return None


# ---------------------------------------------------------------- composition

def _chain_state(sides: Sequence[SchedLocalSide | SchedGlobalSide]) -> Any:
    """The sides' states in chain order (None: no side keeps any)."""
    states = [s.state_dict() for s in sides]
    return None if all(v is None for v in states) else states


def _load_chain_state(sides: Sequence[SchedLocalSide | SchedGlobalSide], state: Any) -> None:
    if state is None:
        return
    if not isinstance(state, list) or len(state) != len(sides):
        raise ValueError("the checkpoint's transfer-scheduler state does not fit this job's "
                         f"{len(sides)} schedulers ([sched] differs from the checkpoint's)")
    for side, part in zip(sides, state):
        side.load_state_dict(part)


class _WorkerChain(SchedWorkerSide):
    def __init__(self, sides: list[SchedWorkerSide]):
        self.sides = sides
        self.plain = all(s.plain for s in sides)  # type: ignore[misc]
        self.orders_by_priority = any(s.orders_by_priority for s in sides)  # type: ignore[misc]
        self.carries_loss = any(s.carries_loss for s in sides)  # type: ignore[misc]

    def slices(self, key: int, num_elements: int) -> list[tuple[int, int, int]] | None:
        for s in self.sides:
            out = s.slices(key, num_elements)
            if out is not None:
                return out
        return None

    def push_meta(self, meta: dict[str, Any]) -> None:
        for s in self.sides:
            s.push_meta(meta)

    async def push(self, key: int, value: Value, meta: dict[str, Any]) -> list[Message] | None:
        for s in self.sides:
            out = await s.push(key, value, meta)
            if out is not None:
                return out
        return None

    def pushed(self, key: int, acks: Sequence[Message], **kw: Any) -> None:
        for s in self.sides:
            s.pushed(key, acks, **kw)

    async def pull_replies(self, key: int) -> tuple[list[Message], bool] | None:
        for s in self.sides:
            out = await s.pull_replies(key)
            if out is not None:
                return out
        return None

    def forget(self, key: int) -> None:
        for s in self.sides:
            s.forget(key)

    async def drain(self) -> None:
        for s in self.sides:
            await s.drain()


class _LocalChain(SchedLocalSide):
    def __init__(self, sides: list[SchedLocalSide]):
        self.sides = sides

    def command_problem(self, cmd: str) -> str | None:
        for s in self.sides:
            p = s.command_problem(cmd)
            if p:
                return p
        return None

    def receive_push(self, msg: Message) -> bool:
        return any(s.receive_push(msg) for s in self.sides)

    def note_worker_push(self, msg: Message) -> None:
        for s in self.sides:
            s.note_worker_push(msg)

    def on_key_ready(self, key: int) -> None:
        for s in self.sides:
            s.on_key_ready(key)

    async def exchange(self, key: int, parts: Sequence[Part], round_: int, value: Value,
                       meta: dict[str, Any]) -> list[tuple[Part, Message]] | None:
        for s in self.sides:
            out = await s.exchange(key, parts, round_, value, meta)
            if out is not None:
                return out
        return None

    def global_push_meta(self, meta: dict[str, Any]) -> None:
        for s in self.sides:
            s.global_push_meta(meta)

    async def push_part(self, dst: str, key: int, part: int, round_: int, value: Value,
                        meta: dict[str, Any]) -> Message | None:
        for s in self.sides:
            out = await s.push_part(dst, key, part, round_, value, meta)
            if out is not None:
                return out
        return None

    def acks_carry_value(self, acks: Sequence[Message]) -> bool:
        return any(s.acks_carry_value(acks) for s in self.sides)

    def on_round_answered(self, key: int, round_: int, value: Value,
                          reply_meta: dict[str, Any]) -> None:
        for s in self.sides:
            s.on_round_answered(key, round_, value, reply_meta)

    def reply_carries_value(self, push: Message) -> bool:
        return any(s.reply_carries_value(push) for s in self.sides)

    async def drain(self) -> None:
        for s in self.sides:
            await s.drain()

    def on_done(self) -> None:
        for s in self.sides:
            s.on_done()

    def state_dict(self) -> Any:
        return _chain_state(self.sides)

    def load_state_dict(self, state: Any) -> None:
        _load_chain_state(self.sides, state)


class _GlobalChain(SchedGlobalSide):
    def __init__(self, sides: list[SchedGlobalSide]):
        self.sides = sides

    def on_key_ready(self, key: int, part: int) -> None:
        for s in self.sides:
            s.on_key_ready(key, part)

    def receive_push(self, msg: Message) -> bool:
        return any(s.receive_push(msg) for s in self.sides)

    def decode_push(self, msg: Message, like: Value) -> Any:
        for s in self.sides:
            out = s.decode_push(msg, like)
            if out is not None:
                return out
        return None

    def reply_push(self, msg: Message, version: int, value: Value) -> bool:
        return any(s.reply_push(msg, version, value) for s in self.sides)

    def reply_carries_value(self, push: Message) -> bool:
        return any(s.reply_carries_value(push) for s in self.sides)

    async def drain(self) -> None:
        for s in self.sides:
            await s.drain()

    def on_done(self) -> None:
        for s in self.sides:
            s.on_done()

    def state_dict(self) -> Any:
        return _chain_state(self.sides)

    def load_state_dict(self, state: Any) -> None:
        _load_chain_state(self.sides, state)


def worker_side_of(schedulers: Sequence[TransferScheduler],
                   ctx: WorkerSchedContext) -> SchedWorkerSide | None:
    """The job's schedulers' worker sides as one (None: no scheduler acts on workers)."""
    sides = [s for s in (p.worker_side(ctx) for p in schedulers) if s is not None]
    return None if not sides else sides[0] if len(sides) == 1 else _WorkerChain(sides)


def local_side_of(schedulers: Sequence[TransferScheduler],
                  ctx: LocalSchedContext) -> SchedLocalSide | None:
    """The job's schedulers' local-server sides as one (None: none acts there)."""
    sides = [s for s in (p.local_side(ctx) for p in schedulers) if s is not None]
    return None if not sides else sides[0] if len(sides) == 1 else _LocalChain(sides)


def global_side_of(schedulers: Sequence[TransferScheduler],
                   ctx: GlobalSchedContext) -> SchedGlobalSide | None:
    """The job's schedulers' global-server sides as one (None: none acts there)."""
    sides = [s for s in (p.global_side(ctx) for p in schedulers) if s is not None]
    return None if not sides else sides[0] if len(sides) == 1 else _GlobalChain(sides)


def sync_problem_of(schedulers: Sequence[TransferScheduler], algorithm: str) -> str | None:
    """Why one of the job's schedulers refuses a switch to sync ``algorithm``, or None."""
    for p in schedulers:
        problem = p.sync_problem(algorithm)
        if problem:
            return problem
    return None
