"""TSEngine as a transfer scheduler: the coordinator's message handling, a member's merge
buffer and relay loop, and the sides the node roles run (docs/geomx-behaviour.md §4.5;
the decisions are ``geomx/sched/tsengine.py``; the hooks geomx/policy/scheduling.py).

Messages (all carry ``meta["ts"]`` = the overlay, ``key``/``part``, ``version`` = round):

* ``ASK_PUSH`` (request, member or root -> coordinator): "my merge buffer is ready" (the
  root: "I can receive"). Answered when the node is paired: ``SCHED_REPLY`` with
  ``to`` = the receiver (this node sends its buffer) or ``to = None`` (it will receive).
  GeoMX's "send now" order is a separate message; here it is the ask's reply.
* ``PUSH`` with ``ts_n``/``ts_from`` (request, sender -> receiver): the merge buffer and
  the contributions it holds; the receiver acknowledges at once (``PUSH_ACK``), adds it
  into its own buffer (or, at the root, into the round's aggregate) and asks again.
* ``ASK_PULL`` (request, holder -> coordinator): with the receiver and throughput of the
  holder's last transfer; answered ``SCHED_REPLY`` ``to`` = next receiver or None.
* ``RELAY`` (request, holder -> receiver): the new model; answered ``RELAY_ACK`` (GeoMX's
  AUTOPULLREPLY) on arrival; the receiver then runs the same relay loop.
* ``ASK_PULL`` with ``meta["replaced"]`` (coordinator -> the overlay's other nodes, no
  reply): a new process took over that member (``[membership] on_server_loss =
  "wait"``, docs/reliability.md); relays to the old process are given up and their loops
  started again, a root relays again the rounds ``again`` names, a member asks again for
  the buffers ``ask`` names (``Coordinator.replace`` in geomx/sched/tsengine.py). In such
  a job the root numbers each member's rounds it takes: a round sent again by a
  successor is acknowledged and not added twice, and every broadcast says which round of
  each member it answers (``ts_rounds``).

When the job runs DGT, a merge across DCs is a DGT push instead: its blocks on DGT's
channels, the end block as the request (geomx/sched/ts_dgt.py).

Bulk data (merges and relays) travels on ``TS_DATA_CHANNEL``, control (asks, answers,
acknowledgements) on channel 0, so an acknowledgement never waits behind the rest of a
megabyte going the same way: otherwise the time measured for a relay would include
whatever bulk transfer the receiver had queued towards the sender.

Throughput = bytes / (time from sending RELAY to its RELAY_ACK) on ``ctx.now()``: the
emulator's virtual clock or wall time over sockets (GeoMX measures ``clock()``, CPU time).
Nothing here knows which runtime it runs in.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, Callable, ClassVar, Iterable

import numpy as np

from geomx.policy.scheduling import (GlobalSchedContext, LocalSchedContext,
                                     SchedContext, SchedCoordinatorSide, SchedGlobalSide,
                                     SchedLocalSide, SchedWorkerSide, TransferScheduler,
                                     Value, WorkerSchedContext)
from geomx.sched.p3 import P3, layer_priority
from geomx.sched.ts_dgt import BlockMerges, dgt_of
from geomx.sched.ts_merge_codec import MergeCodec
from geomx.sched.tsengine import (TS_COUNT, TS_FROM, TS_META, Coordinator, Pairing,
                                  TsSettings)
from geomx.wire import Kind, Message, Payload

#: reliable channel of TSEngine's merges and relays (control stays on channel 0, the
#: higher strict-priority class, so acknowledgements are not queued behind data)
TS_DATA_CHANNEL = 1


class TsCoordinatorRole:
    """The coordinator of one overlay, living in a scheduler node (GeoMX: the global
    scheduler for ``inter``, each DC's local scheduler for ``intra``)."""

    def __init__(self, ctx: SchedContext, overlay: str, settings: TsSettings,
                 members: list[str], roots: list[str]):
        self.ctx = ctx
        self.overlay = overlay
        self._members = set(members)
        self._roots = set(roots)
        self.policy = Coordinator(settings, members,
                                  ctx.rng(f"tsengine:{overlay}:{ctx.node_name}"))
        #: the pending ASK_PUSH of each queued node, answered when it is paired
        self._asks: dict[tuple[int, int, str], Message] = {}

    def _check(self, msg: Message) -> None:
        root = bool(msg.meta.get("root"))
        if msg.src not in (self._roots if root else self._members):
            raise ValueError(f"{msg.src} is not a{' root' if root else ' member'} of the "
                             f"{self.overlay} overlay coordinated by {self.ctx.node_name}")

    def on_ask_push(self, msg: Message) -> None:
        self._check(msg)
        key, part = msg.key, msg.part
        self._asks[(key, part, msg.src)] = msg
        for p in self.policy.ask_push(key, part, msg.src, root=bool(msg.meta.get("root")),
                                      round_=msg.version):
            self._answer(key, part, msg.version, p)

    def _answer(self, key: int, part: int, round_: int, p: Pairing) -> None:
        """Tell a pairing's sender where to send (and its receiver, when it asked, that
        the data is coming: a root put back in the queue by a replacement did not ask)."""
        self.ctx.record("ts_pair", overlay=self.overlay, key=key, part=part,
                        round=round_, src=p.sender, dst=p.receiver, rule=p.rule,
                        a_sr=p.a_sr, a_rs=p.a_rs)
        snd = self._asks.pop((key, part, p.sender))
        rcv = self._asks.pop((key, part, p.receiver), None)
        if rcv is not None:
            self.ctx.post(rcv.reply(Kind.SCHED_REPLY, meta={"to": None}))
        self.ctx.post(snd.reply(Kind.SCHED_REPLY, meta={"to": p.receiver}))

    def on_member_replaced(self, member: str) -> None:
        """A new process took over ``member``: plan again what went through the old one
        (:meth:`geomx.sched.tsengine.Coordinator.replace`) and tell the overlay's other
        nodes (an ``ASK_PULL`` from the coordinator, ``meta["replaced"]``): each stops
        waiting for a relay to the old process and starts that relay loop again, a root
        relays again the rounds ``meta["again"]`` names, a member asks again for the
        merge buffers ``meta["ask"]`` names."""
        if member not in self._members:
            return
        for where in [w for w in self._asks if w[2] == member]:
            del self._asks[where]  # the old process's asks: nobody waits for their answer
        again: dict[str, list[list[int]]] = {}
        ask: dict[str, list[list[int]]] = {}
        for r in self.policy.replace(member):
            self.ctx.record("ts_replaced", overlay=self.overlay, member=member, key=r.key,
                            part=r.part, round=r.round, requeued=list(r.requeued),
                            reask=list(r.reask), rebroadcast=list(r.rebroadcast))
            for p in r.pairings:
                self._answer(r.key, r.part, r.round, p)
            for m in r.reask:
                ask.setdefault(m, []).append([r.key, r.part])
            root = self.policy.root_of(r.key, r.part)
            if r.rebroadcast and root is not None:
                again.setdefault(root, []).append([r.key, r.part, r.round])
        for node in sorted((self._members | self._roots) - {member}):
            self.ctx.post(Message(Kind.ASK_PULL, self.ctx.node_name, node,
                                  meta={TS_META: self.overlay, "replaced": member,
                                        "again": again.get(node, []),
                                        "ask": ask.get(node, [])}))

    def on_ask_pull(self, msg: Message) -> None:
        if msg.src not in self._members | self._roots:
            raise ValueError(f"{msg.src} is not in the {self.overlay} overlay of {self.ctx.node_name}")
        last = msg.meta.get("last")
        thr = float(msg.meta.get("thr", -1.0))
        if last is not None and thr > 0:
            self.ctx.record("ts_measure", overlay=self.overlay, src=msg.src, dst=last,
                             thr=thr, round=msg.version, key=msg.key, part=msg.part,
                             bytes=int(msg.meta.get("bytes", 0)))
        c = self.policy.ask_pull(msg.key, msg.part, msg.src, msg.version,
                                 last=None if last is None else str(last), throughput=thr)
        if c.receiver is not None:
            self.ctx.record("ts_choose", overlay=self.overlay, key=msg.key, part=msg.part,
                             round=msg.version, src=msg.src, dst=c.receiver, mode=c.mode,
                             p_greedy=c.p_greedy, known=c.known, unknown=c.unknown,
                             a=c.throughput)
        self.ctx.post(msg.reply(Kind.SCHED_REPLY, meta={"to": c.receiver}))


class TsCoordinators(SchedCoordinatorSide):
    """Routes a scheduler's ASK_PUSH / ASK_PULL to the coordinator of their overlay."""

    def __init__(self, roles: list[TsCoordinatorRole]):
        self.roles = {r.overlay: r for r in roles}

    def install(self, ctx: SchedContext) -> None:
        ctx.on(Kind.ASK_PUSH, lambda m: self._role(ctx, m).on_ask_push(m))
        ctx.on(Kind.ASK_PULL, lambda m: self._role(ctx, m).on_ask_pull(m))

    def on_member_replaced(self, member: str) -> None:
        for overlay in sorted(self.roles):
            self.roles[overlay].on_member_replaced(member)

    def _role(self, ctx: SchedContext, msg: Message) -> TsCoordinatorRole:
        role = self.roles.get(str(msg.meta.get(TS_META)))
        if role is None:
            raise ValueError(f"{ctx.node_name} coordinates no TSEngine overlay "
                             f"{msg.meta.get(TS_META)!r} (runs: {sorted(self.roles)})")
        return role


def install_coordinators(ctx: SchedContext, ts: TsSettings) -> TsCoordinators | None:
    """Give a scheduler node the TSEngine coordinators the job runs (none when off):
    ``inter`` at the global scheduler (members: the local servers), ``intra`` at each DC's
    local scheduler (members: that DC's workers)."""
    job = ctx.job
    roles = []
    if ts.inter and ctx.node_name == job.global_scheduler and job.mode == "hips":
        roles.append(TsCoordinatorRole(ctx, "inter", ts,
                                       [job.local_server_of[d] for d in job.party_dcs],
                                       list(job.global_servers)))
    if ts.intra:
        for dc, lh in job.local_scheduler_of.items():
            if lh == ctx.node_name:
                roles.append(TsCoordinatorRole(ctx, "intra", ts, list(job.workers_of[dc]),
                                               [job.local_server_of[dc]]))
    if not roles:
        return None
    coordinators = TsCoordinators(roles)
    coordinators.install(ctx)
    return coordinators


@dataclass
class _Merge:
    round: int
    value: Value
    count: int
    senders: list[str]
    meta: dict[str, Any]
    sent: asyncio.Future[Message] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    #: the sum of the encoded merges taken, decoded (None: none yet); kept apart from
    #: ``value``, this node's own, because a codec's error feedback takes them apart
    received: Value = None


#: ``root_receive(msg, value, count, senders)``: what the root does with a merged push
RootReceive = Callable[[Message, Value, int, list[str]], None]

#: broadcast meta (jobs that may replace a member): per member, its round the broadcast
#: answers, so a replaced member's successor tells the round it waits for from an older
#: one relayed to it
TS_ROUNDS = "ts_rounds"

#: the hop each overlay's merges travel on, as the codec policy names it
OVERLAY_TIER = {"inter": "wan", "intra": "lan"}


def transfer_priority(job: Any) -> Callable[[int], int] | None:
    """The wire priority of a (sliced) key's overlay transfers when the job also runs P3:
    P3's transfer unit is the slice and its order earliest layer first
    (:func:`geomx.sched.p3.layer_priority`), so merges, relays and their asks carry that
    priority and every node's queues (its outbox, the links) serve the earlier layers'
    slices first. None without P3: every transfer at priority 0, FIFO, as in GeoMX."""
    if any(isinstance(s, P3) for s in getattr(job, "transfer_schedulers", ())):
        return layer_priority
    return None


class OverlayPeer:
    """One node's side of one overlay: member (merge buffer, relay) and/or root.

    ``receive`` hands the node each broadcast round it did not consume yet; the root
    calls ``root_ready`` once per (key, part) it serves and ``broadcast`` per new round.
    """

    def __init__(self, ctx: SchedContext, overlay: str, coordinator: str,
                 peers: Iterable[str], *, root_receive: RootReceive | None = None):
        self.ctx = ctx
        self.overlay = overlay
        self.coordinator = coordinator
        #: the nodes that may send this node merges and relays in this overlay
        self.peers = frozenset(peers) - {ctx.node_name}
        self.root_receive = root_receive
        #: merges are encoded by the sender and decoded by the receiver (relays keep
        #: their own error-feedback state: geomx/sched/ts_merge_codec.py)
        self.codec = MergeCodec(ctx, OVERLAY_TIER[overlay])
        #: wire priority of a key's transfers (None: 0, FIFO)
        self.priority_of = transfer_priority(ctx.job)
        #: with DGT, merges across DCs travel as DGT's ranked blocks, every hop ranking
        #: afresh what it sends (geomx/sched/ts_dgt.py)
        dgt = dgt_of(ctx.job) if overlay == "inter" else None
        self.blocks: BlockMerges | None = (
            None if dgt is None else BlockMerges(ctx, dgt, {TS_META: overlay}))
        self._bufs: dict[tuple[int, int], _Merge] = {}
        #: latest broadcast message per (key, part) and the round last handed to the node
        self._latest: dict[tuple[int, int], Message] = {}
        self._consumed: dict[tuple[int, int], int] = {}
        self._arrived: dict[tuple[int, int], asyncio.Event] = {}
        self._broadcast_rounds: dict[tuple[int, int], int] = {}
        self._relays: set[asyncio.Task[Any]] = set()
        #: a relay loop's transfer in progress: its task -> (receiver, what it relays),
        #: so that a relay to a process that was replaced is started again
        self._relaying: dict[asyncio.Task[Any], tuple[str, int, int, int, list[Payload],
                                                      dict[str, Any]]] = {}
        #: the root: the last round it broadcast per (key, part), to relay it again
        self._last_broadcast: dict[tuple[int, int], tuple[int, list[Payload],
                                                          dict[str, Any]]] = {}
        #: the root: the last round taken from each sender per (key, part) (a replaced
        #: member's successor sends again a round its predecessor had sent)
        self._taken: dict[tuple[int, int], dict[str, int]] = {}
        #: whether a member may be replaced (``[membership] on_server_loss = "wait"``):
        #: broadcasts then say which round of each member they answer
        self._replaceable = getattr(ctx.job, "on_server_loss", "fail") == "wait"

    # ------------------------------------------------------------------ aggregation
    async def contribute(self, key: int, part: int, round_: int, value: Value,
                         meta: dict[str, Any]) -> Message:
        """Enter ``value`` (owned: it is added into) into the merge tree; returns the
        receiver's acknowledgement once this node's buffer has been sent."""
        if (key, part) in self._bufs:
            raise RuntimeError(f"{self.ctx.node_name}: key {key} part {part} is already in the "
                               f"{self.overlay} merge tree")
        buf = _Merge(round_, value, 1, [self.ctx.node_name], dict(meta))
        self._bufs[(key, part)] = buf
        self.ctx.spawn(self._ask(key, part, round_))
        return await buf.sent

    def root_ready(self, key: int, part: int, round_: int = 0) -> None:
        """The root of (key, part) enters the queue (and again after every receipt)."""
        self.ctx.spawn(self._ask(key, part, round_, root=True))

    async def _ask(self, key: int, part: int, round_: int, *, root: bool = False) -> None:
        meta: dict[str, Any] = {TS_META: self.overlay}
        if root:
            meta["root"] = True
        prio = self._priority(key)
        reply = await self.ctx.request(Message(Kind.ASK_PUSH, self.ctx.node_name,
                                                self.coordinator, key=key, part=part,
                                                version=round_, meta=meta, priority=prio),
                                        timeout_s=math.inf)
        to = reply.meta.get("to")
        if to is None:
            return  # paired as the receiver: the data comes from the sender
        buf = self._bufs.pop((key, part))
        if self.blocks is not None:
            await self._send_blocks(self.blocks, str(to), key, part, buf)
            return
        # the whole buffer (this node's value and the merges it took) under the codec
        payloads, coded = self.codec.encode(key, part, buf.value, received=buf.received)
        meta = {**buf.meta, **coded, TS_META: self.overlay, TS_COUNT: buf.count,
                TS_FROM: buf.senders}
        data = Message(Kind.PUSH, self.ctx.node_name, str(to), key=key, part=part,
                       version=buf.round, meta=meta, channel=TS_DATA_CHANNEL,
                       payloads=payloads, priority=prio)
        t0 = self.ctx.now()
        ack = await self.ctx.request(data)
        self._span("merge", data, t0)
        buf.sent.set_result(ack)

    async def _send_blocks(self, blocks: BlockMerges, to: str, key: int, part: int,
                           buf: _Merge) -> None:
        """The whole buffer (this node's value, the merges and late blocks it took) as
        DGT's blocks, ranked by what this node sends."""
        value = buf.value
        if buf.received is not None:
            _add_into(value, buf.received)
        value = blocks.late_into(key, part, value)
        meta = {**buf.meta, TS_COUNT: buf.count, TS_FROM: buf.senders}
        t0 = self.ctx.now()
        ack, nbytes = await blocks.send(to, key, part, buf.round, value, meta)
        self.ctx.record("ts_xfer", t_start=t0, dur=self.ctx.now() - t0, edge=f"->{to}",
                         msg="merge", overlay=self.overlay, key=key, part=part,
                         round=buf.round, bytes=nbytes, dgt=True)
        buf.sent.set_result(ack)

    def _priority(self, key: int) -> int:
        return 0 if self.priority_of is None else self.priority_of(key)

    def _span(self, what: str, data: Message, t0: float) -> None:
        """A ``ts_xfer`` span on the sender, one trace track per overlay edge (with the
        codec and the priority when they act)."""
        extra: dict[str, Any] = {}
        codec = self.codec.codec_name(data)
        if codec is not None:
            extra["codec"] = codec
        if self.priority_of is not None:
            extra["prio"] = data.priority
        self.ctx.record("ts_xfer", t_start=t0, dur=self.ctx.now() - t0, edge=f"->{data.dst}",
                         msg=what, overlay=self.overlay, key=data.key, part=data.part,
                         round=data.version, bytes=data.nbytes, **extra)

    def _check_peer(self, msg: Message) -> None:
        if msg.src not in self.peers:
            raise ValueError(f"{msg.src} is not a peer of {self.ctx.node_name} in the "
                             f"{self.overlay} overlay")

    def on_merge(self, msg: Message) -> None:
        """A merged push arrived: acknowledge it, add it, ask again."""
        self._check_peer(msg)
        blocks = None
        if self.blocks is not None and self.blocks.is_block(msg):
            blocks = self.blocks.take(msg)
            if blocks is None:
                return  # a block of a merge still incomplete, or a late one
        count = int(msg.meta.get(TS_COUNT, 1))
        senders = [str(s) for s in msg.meta.get(TS_FROM, [msg.src])]
        coded = blocks is None and self.codec.codec_name(msg) is not None
        if (blocks is None and not coded and len(msg.payloads) != 1) or \
                count != len(senders) or count < 1:
            raise ValueError("a TSEngine merge carries one dense payload (or a codec's, or "
                             "DGT's blocks) and ts_n = len(ts_from)")
        if self.root_receive is not None:
            if self._replaceable and self._again(msg, senders):
                self.ctx.record("ts_dedupe", overlay=self.overlay, key=msg.key,
                                part=msg.part, round=msg.version, src=msg.src)
                self.ctx.post(msg.reply(Kind.PUSH_ACK, payloads=[], channel=0))
                self.root_ready(msg.key, msg.part, msg.version)
                return
            value = blocks if blocks is not None else \
                self.codec.decode(msg, None) if coded else _from_payload(msg.payloads[0])
            if self.blocks is not None:  # late blocks join this round at the root
                value = self.blocks.late_into(msg.key, msg.part, value)
            if not self._replaceable:
                self.root_receive(msg, value, count, senders)
            else:
                # noted before the root takes it: taking it may complete the round, whose
                # broadcast says which rounds it answers (taken back if the root refuses it)
                taken = self._taken.setdefault((msg.key, msg.part), {})
                before = dict(taken)
                taken.update((s, msg.version) for s in senders)
                try:
                    self.root_receive(msg, value, count, senders)
                except Exception:
                    self._taken[(msg.key, msg.part)] = before
                    raise
            self.ctx.post(msg.reply(Kind.PUSH_ACK, payloads=[], channel=0))
            self.root_ready(msg.key, msg.part, msg.version)
            return
        buf = self._bufs.get((msg.key, msg.part))
        if buf is None or buf.round != msg.version:
            raise ValueError(f"no {self.overlay} merge buffer for key {msg.key} part "
                             f"{msg.part} round {msg.version} at {self.ctx.node_name}")
        if blocks is not None:  # DGT's merge, reassembled: added, ranked again when sent
            if isinstance(buf.value, Payload) or blocks.size != buf.value.size:
                raise ValueError(f"a DGT merge of key {msg.key} part {msg.part} has "
                                 f"{blocks.size} values, not {getattr(buf.value, 'size', '?')}")
            if buf.received is None:
                buf.received = blocks.reshape(buf.value.shape)
            else:
                _add_into(buf.received, blocks)
        elif coded:  # decode, add (the buffer is encoded again when it is sent)
            buf.received = self.codec.add_decoded(msg, buf.value, buf.received)
        else:
            p = msg.payloads[0]
            _add_into(buf.value, p if p.data is None else p.data)
        buf.count += count
        buf.senders += senders
        if msg.meta.get("stop"):
            buf.meta["stop"] = True
        self.ctx.post(msg.reply(Kind.PUSH_ACK, payloads=[], channel=0))
        self.ctx.spawn(self._ask(msg.key, msg.part, buf.round))

    def _again(self, msg: Message, senders: list[str]) -> bool:
        """Whether the root took round ``msg.version`` from every one of ``senders``
        already (it is sent again by a replaced member's successor, which restarted
        from the round before)."""
        taken = self._taken.get((msg.key, msg.part), {})
        seen = [s for s in senders if taken.get(s, -1) >= msg.version]
        if seen and len(seen) != len(senders):
            raise ValueError(f"a merge of round {msg.version} names {senders}, of which "
                             f"{seen} were taken in that round already")
        return bool(seen)

    def on_notice(self, msg: Message) -> None:
        """The coordinator says a member was replaced (``TsCoordinatorRole.on_member_replaced``):
        stop waiting for relays to its old process and start those loops again, relay
        again the rounds named in ``again`` (a root), ask again for the merge buffers
        named in ``ask`` (a member)."""
        if msg.src != self.coordinator:
            raise ValueError(f"{msg.src} is not the {self.overlay} overlay's coordinator")
        member = str(msg.meta.get("replaced"))
        for task, (to, key, part, round_, payloads, meta) in sorted(
                self._relaying.items(), key=lambda kv: kv[1][1:4]):
            if to == member:
                task.cancel()  # its request to the old process is never answered
                self.ctx.record("ts_abandon", overlay=self.overlay, dst=member, key=key,
                                part=part, round=round_)
                self._start_relay(key, part, round_, payloads, meta)
        for key, part, round_ in msg.meta.get("again", []):
            last = self._last_broadcast.get((int(key), int(part)))
            if last is not None and last[0] == int(round_):
                self._start_relay(int(key), int(part), *last)
        for key, part in msg.meta.get("ask", []):
            buf = self._bufs.get((int(key), int(part)))
            if buf is not None:
                self.ctx.spawn(self._ask(int(key), int(part), buf.round))

    # ------------------------------------------------------------------ broadcast
    def broadcast(self, key: int, part: int, round_: int, payloads: list[Payload],
                  meta: dict[str, Any]) -> None:
        """The root holds round ``round_`` of (key, part): start its relay loop (once)."""
        if self._broadcast_rounds.get((key, part), -1) >= round_:
            return
        self._broadcast_rounds[(key, part)] = round_
        if self._replaceable:
            meta = {**meta, TS_ROUNDS: dict(self._taken.get((key, part), {}))}
        self._last_broadcast[(key, part)] = (round_, payloads, meta)
        self._start_relay(key, part, round_, payloads, meta)

    def _start_relay(self, key: int, part: int, round_: int, payloads: list[Payload],
                     meta: dict[str, Any]) -> None:
        task = self.ctx.spawn(self._relay(key, part, round_, payloads, meta))
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)

    async def drain(self) -> None:
        """Wait until this node has forwarded every round it holds: a node that leaves
        while the coordinator still counts on it as a sender would strand its receivers."""
        while self._relays:
            await asyncio.gather(*list(self._relays), return_exceptions=True)

    async def _relay(self, key: int, part: int, round_: int, payloads: list[Payload],
                     meta: dict[str, Any]) -> None:
        last: str | None = None
        thr = -1.0
        nbytes = 0
        while True:
            reply = await self.ctx.request(
                Message(Kind.ASK_PULL, self.ctx.node_name, self.coordinator, key=key, part=part,
                        version=round_, meta={TS_META: self.overlay, "last": last, "thr": thr,
                                              "bytes": nbytes}, priority=self._priority(key)),
                timeout_s=math.inf)
            to = reply.meta.get("to")
            if to is None:
                return
            data = Message(Kind.RELAY, self.ctx.node_name, str(to), key=key, part=part,
                           version=round_, meta={**meta, TS_META: self.overlay},
                           channel=TS_DATA_CHANNEL, payloads=payloads,
                           priority=self._priority(key))
            t0 = self.ctx.now()
            task = asyncio.current_task()
            assert task is not None
            self._relaying[task] = (str(to), key, part, round_, payloads, meta)
            try:
                await self.ctx.request(data)
            finally:
                del self._relaying[task]
            dt = self.ctx.now() - t0
            self._span("relay", data, t0)
            last, thr, nbytes = str(to), (data.nbytes / dt if dt > 0 else -1.0), data.nbytes

    def on_relay(self, msg: Message) -> None:
        """The new model arrived: acknowledge (AUTOPULLREPLY), forward it, hand it over."""
        self._check_peer(msg)
        self.ctx.post(msg.reply(Kind.RELAY_ACK, channel=0))
        k = (msg.key, msg.part)
        if self._consumed.get(k, 0) >= msg.version or \
                (k in self._latest and self._latest[k].version >= msg.version):
            return  # a duplicate
        meta = {m: v for m, v in msg.meta.items() if m != TS_META}
        for p in msg.payloads:
            p.owned = False  # forwarded as they are: whoever decodes them must copy
        self._start_relay(msg.key, msg.part, msg.version, list(msg.payloads), meta)
        self._latest[k] = msg
        self._event(k).set()

    def _event(self, k: tuple[int, int]) -> asyncio.Event:
        ev = self._arrived.get(k)
        if ev is None:
            ev = self._arrived[k] = asyncio.Event()
        return ev

    async def receive(self, key: int, part: int, round_: int = 0) -> Message:
        """The next broadcast round of (key, part) this node has not consumed; one that
        answers this member's round ``round_`` when the broadcast says (``TS_ROUNDS``: a
        replaced member's successor may be relayed a round it has from the global tier)."""
        k = (key, part)
        me = self.ctx.node_name
        while True:
            msg = self._latest.get(k)
            if msg is not None and msg.version > self._consumed.get(k, 0) and \
                    int(msg.meta.get(TS_ROUNDS, {}).get(me, round_)) >= round_:
                self._consumed[k] = msg.version
                return msg
            ev = self._event(k)
            ev.clear()
            await ev.wait()


def _from_payload(p: Payload) -> Value:
    """A value of this node's own from a received payload (phantoms stay phantoms)."""
    if p.data is None:
        return Payload.phantom(p.shape, p.dtype)
    return np.array(p.data, copy=True)


def _add_into(acc: Value, v: Value) -> None:
    """``acc += v`` for arrays; phantoms absorb anything."""
    if isinstance(acc, Payload) or isinstance(v, Payload):
        return
    np.add(acc, v.reshape(acc.shape), out=acc, casting="unsafe")


def _flat_slice(v: Value, lo: int, hi: int) -> Value:
    if isinstance(v, Payload):
        return Payload.phantom((hi - lo,), v.dtype)
    return v.reshape(-1)[lo:hi]


def _frozen(v: Value) -> Value:
    """``v`` marked read-only: it is sent as it is (a later update copies it first)."""
    if isinstance(v, np.ndarray):
        v.flags.writeable = False
    return v


# ---------------------------------------------------------------- the scheduler

class TsEngine(TransferScheduler):
    """TSEngine as a transfer scheduler: pushes merge along overlay trees the coordinators
    build, and the new model comes back by an overlay broadcast instead of pulls."""

    name: ClassVar[str] = "tsengine"
    Options = TsSettings
    options: TsSettings

    def sync_problem(self, algorithm: str) -> str | None:
        if self.options.mode == "off":
            return None
        return ("set_sync: a dist_async store runs MixedSync, but TSEngine "
                "(sched.tsengine_inter / tsengine_intra) needs FSA; use dist_sync")

    def worker_side(self, ctx: WorkerSchedContext) -> SchedWorkerSide | None:
        if self.options.intra and ctx.job.mode == "hips" and not ctx.is_master:
            return _TsWorker(ctx)
        return None

    def local_side(self, ctx: LocalSchedContext) -> SchedLocalSide | None:
        if not (self.options.inter or self.options.intra):
            return None
        return _TsLocal(ctx, self.options)

    def global_side(self, ctx: GlobalSchedContext) -> SchedGlobalSide | None:
        if self.options.inter and ctx.job.mode == "hips":
            return _TsGlobal(ctx)
        return None

    def coordinator_side(self, ctx: SchedContext) -> object | None:
        return install_coordinators(ctx, self.options)


class _TsWorker(SchedWorkerSide):
    """A worker inside its DC's overlay: its pushes join the merge tree, and a pull after
    a push takes the round's value from the overlay broadcast."""

    plain = False

    def __init__(self, ctx: WorkerSchedContext):
        job, dc = ctx.job, ctx.dc
        self.peer = OverlayPeer(ctx, "intra", job.local_scheduler_of[dc],
                                [job.local_server_of[dc], *job.workers_of[dc]])
        ctx.on(Kind.PUSH, self.peer.on_merge)
        ctx.on(Kind.RELAY, self.peer.on_relay)
        self.rounds: dict[int, int] = {}
        self.pushed_keys: set[int] = set()

    async def push(self, key: int, value: Value, meta: dict[str, Any]) -> list[Message]:
        # one part (the DC's local server), dense
        rnd = self.rounds[key] = self.rounds.get(key, 0) + 1
        self.pushed_keys.add(key)
        v = value if isinstance(value, Payload) else np.array(value, copy=True)
        return [await self.peer.contribute(key, 0, rnd, v, meta)]

    async def pull_replies(self, key: int) -> tuple[list[Message], bool] | None:
        if key not in self.pushed_keys:
            return None
        self.pushed_keys.discard(key)
        return [await self.peer.receive(key, 0)], True  # the round's overlay broadcast

    async def drain(self) -> None:
        await self.peer.drain()  # forward the last rounds before leaving


class _TsLocal(SchedLocalSide):
    """A local server: a member of the overlay across DCs, the root of the one among
    this DC's workers."""

    def __init__(self, ctx: LocalSchedContext, ts: TsSettings):
        job = ctx.job
        self.ctx = ctx
        self.inter: OverlayPeer | None = (
            OverlayPeer(ctx, "inter", job.global_scheduler,
                        [*job.global_servers, *job.local_server_of.values()])
            if ts.inter else None)
        self.intra: OverlayPeer | None = (
            OverlayPeer(ctx, "intra", job.local_scheduler_of[ctx.dc], ctx.workers,
                        root_receive=ctx.accept_merged) if ts.intra else None)
        if self.inter is not None:
            ctx.on(Kind.RELAY, self.inter.on_relay)
        ctx.on(Kind.ASK_PULL, self._on_notice)

    def _on_notice(self, msg: Message) -> None:
        overlay = msg.meta.get(TS_META)
        peer = self.inter if overlay == "inter" else self.intra if overlay == "intra" else None
        if peer is None:
            raise ValueError(f"a TSEngine {overlay!r} notice, but that overlay is off")
        peer.on_notice(msg)

    def receive_push(self, msg: Message) -> bool:
        overlay = msg.meta.get(TS_META)
        if overlay is None:
            return False
        peer = self.inter if overlay == "inter" else \
            self.intra if overlay == "intra" else None
        if peer is None:
            self.ctx.reply_error(msg, f"a TSEngine {overlay!r} merge, but that overlay is off")
            return True
        peer.on_merge(msg)  # a merge from a peer LS (inter) or from workers (intra)
        return True

    def on_key_ready(self, key: int) -> None:
        if self.intra is not None:
            self.intra.root_ready(key, 0)  # the root of this DC's merge tree

    def note_worker_push(self, msg: Message) -> None:
        if self.inter is not None and self.inter.blocks is not None:
            self.inter.blocks.note_loss(msg.src, msg.meta.get("loss"))  # DGT's adaptive K

    async def exchange(self, key: int, parts: Sequence[Any], round_: int, value: Value,
                       meta: dict[str, Any]) -> list[tuple[Any, Message]] | None:
        """Each part joins its global server's merge tree, and the new value comes by the
        overlay broadcast (no pull: docs/geomx-behaviour.md §4.5, broadcast step 5)."""
        peer = self.inter
        if peer is None:
            return None

        async def one(part: Any) -> tuple[Any, Message]:
            v = _flat_slice(value, part.lo, part.hi) if len(parts) > 1 else value
            v = v if isinstance(v, Payload) else v.copy()
            await peer.contribute(key, part.index, round_, v, meta)
            return part, await peer.receive(key, part.index, round_)

        if len(parts) == 1:
            return [await one(parts[0])]
        return list(await asyncio.gather(*(one(p) for p in parts)))

    def on_round_answered(self, key: int, round_: int, value: Value,
                          reply_meta: dict[str, Any]) -> None:
        if self.inter is not None and self.inter.blocks is not None:
            self.inter.blocks.round_answered(key)
        if self.intra is None:
            return
        # the workers get the round's value by the broadcast (a copy: the store may be
        # replaced or updated while it is relayed)
        assert value is not None
        snapshot = value if isinstance(value, Payload) else value.copy()
        payloads, meta = self.ctx.encode_pull(key, snapshot, tier="lan")
        meta.update(reply_meta)
        self.intra.broadcast(key, 0, round_, payloads, meta)

    async def drain(self) -> None:
        for peer in (self.inter, self.intra):
            if peer is not None:
                await peer.drain()  # forward what this node still owes

    def on_done(self) -> None:
        if self.inter is not None and self.inter.blocks is not None:
            self.inter.blocks.record_sender_totals()
            self.inter.blocks.record_totals()  # as a relay of other DCs' merges

    def state_dict(self) -> Any:
        """The error-feedback state this local server keeps as a sender of the merges
        across DCs (None without a stateful codec); as the root of its DC's overlay it
        encodes nothing."""
        return None if self.inter is None else self.inter.codec.state_dict()

    def load_state_dict(self, state: Any) -> None:
        if self.inter is not None:
            self.inter.codec.load_state_dict(state)


class _TsGlobal(SchedGlobalSide):
    """A global server: the root of its (key, part)s' merge trees and broadcasts."""

    def __init__(self, ctx: GlobalSchedContext):
        self.ctx = ctx
        self.peer = OverlayPeer(ctx, "inter", ctx.job.global_scheduler, ctx.pushers,
                                root_receive=ctx.accept_merged)
        ctx.on(Kind.ASK_PULL, self.peer.on_notice)

    def on_key_ready(self, key: int, part: int) -> None:
        self.peer.root_ready(key, part)  # this shard roots its own tree

    def receive_push(self, msg: Message) -> bool:
        if TS_META not in msg.meta:
            return False
        self.peer.on_merge(msg)  # acknowledges, then the context's accept_merged
        return True

    def reply_push(self, msg: Message, version: int, value: Value) -> bool:
        if TS_META not in msg.meta:
            return False
        # the merge was acknowledged on arrival; the new value goes out by the overlay
        # broadcast (once per round, whichever merge completed it)
        payloads, meta = self.ctx.encode_pull(msg.key, _frozen(value), tier="wan",
                                              weights=self.ctx.has_optimizer)
        # the stop flag, the checkpoint round
        meta.update(self.ctx.reply_meta(version, msg.key, msg.part))
        self.peer.broadcast(msg.key, msg.part, version, payloads, meta)
        return True

    async def drain(self) -> None:
        await self.peer.drain()

    def on_done(self) -> None:
        if self.peer.blocks is not None:
            self.peer.blocks.record_totals()
