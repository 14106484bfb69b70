"""TSEngine's node-side mechanics: the coordinator's message handling and a member's
merge buffer and relay loop (docs/geomx-behaviour.md §4.5; the decisions are
``geomx/sched/tsengine.py``).

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

Bulk data (merges and relays) travels on ``TS_DATA_CHANNEL``, control (asks, answers,
acknowledgements) on channel 0, so an acknowledgement never waits behind the rest of a
megabyte going the same way: otherwise the time measured for a relay would include
whatever bulk transfer the receiver had queued towards the sender.

Throughput = bytes / (time from sending RELAY to its RELAY_ACK) on ``node.now()``: the
emulator's virtual clock or wall time over sockets (GeoMX measures ``clock()``, CPU time).
Nothing here knows which runtime it runs in.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from geomx.node.values import Value, add_into, from_payload
from geomx.sched.tsengine import TS_COUNT, TS_FROM, TS_META, Coordinator, TsSettings
from geomx.wire import Kind, Message, Payload

#: reliable channel of TSEngine's merges and relays (control stays on channel 0, the
#: higher strict-priority class, so acknowledgements are not queued behind data)
TS_DATA_CHANNEL = 1


class TsCoordinatorRole:
    """The coordinator of one overlay, living in a scheduler node (GeoMX: the global
    scheduler for ``inter``, each DC's local scheduler for ``intra``)."""

    def __init__(self, node: Any, overlay: str, settings: TsSettings, members: list[str],
                 roots: list[str]):
        self.node = node
        self.overlay = overlay
        self._members = set(members)
        self._roots = set(roots)
        self.policy = Coordinator(settings, members,
                                  node.services.rng(f"tsengine:{overlay}:{node.name}"))
        #: the pending ASK_PUSH of each queued node, answered when it is paired
        self._asks: dict[tuple[int, int, str], Message] = {}

    def _check(self, msg: Message) -> None:
        root = bool(msg.meta.get("root"))
        if msg.src not in (self._roots if root else self._members):
            raise ValueError(f"{msg.src} is not a{' root' if root else ' member'} of the "
                             f"{self.overlay} overlay coordinated by {self.node.name}")

    def on_ask_push(self, msg: Message) -> None:
        self._check(msg)
        key, part = msg.key, msg.part
        self._asks[(key, part, msg.src)] = msg
        for p in self.policy.ask_push(key, part, msg.src, root=bool(msg.meta.get("root")),
                                      round_=msg.version):
            self.node.record("ts_pair", overlay=self.overlay, key=key, part=part,
                             round=msg.version, src=p.sender, dst=p.receiver, rule=p.rule,
                             a_sr=p.a_sr, a_rs=p.a_rs)
            snd = self._asks.pop((key, part, p.sender))
            rcv = self._asks.pop((key, part, p.receiver))
            self.node.post(rcv.reply(Kind.SCHED_REPLY, meta={"to": None}))
            self.node.post(snd.reply(Kind.SCHED_REPLY, meta={"to": p.receiver}))

    def on_ask_pull(self, msg: Message) -> None:
        if msg.src not in self._members | self._roots:
            raise ValueError(f"{msg.src} is not in the {self.overlay} overlay of {self.node.name}")
        last = msg.meta.get("last")
        thr = float(msg.meta.get("thr", -1.0))
        if last is not None and thr > 0:
            self.node.record("ts_measure", overlay=self.overlay, src=msg.src, dst=last,
                             thr=thr, round=msg.version, key=msg.key, part=msg.part,
                             bytes=int(msg.meta.get("bytes", 0)))
        c = self.policy.ask_pull(msg.key, msg.part, msg.src, msg.version,
                                 last=None if last is None else str(last), throughput=thr)
        if c.receiver is not None:
            self.node.record("ts_choose", overlay=self.overlay, key=msg.key, part=msg.part,
                             round=msg.version, src=msg.src, dst=c.receiver, mode=c.mode,
                             p_greedy=c.p_greedy, known=c.known, unknown=c.unknown,
                             a=c.throughput)
        self.node.post(msg.reply(Kind.SCHED_REPLY, meta={"to": c.receiver}))


class TsCoordinators:
    """Routes a scheduler's ASK_PUSH / ASK_PULL to the coordinator of their overlay."""

    def __init__(self, roles: list[TsCoordinatorRole]):
        self.roles = {r.overlay: r for r in roles}

    def install(self, node: Any) -> None:
        node.on(Kind.ASK_PUSH, lambda m: self._role(node, m).on_ask_push(m))
        node.on(Kind.ASK_PULL, lambda m: self._role(node, m).on_ask_pull(m))

    def _role(self, node: Any, msg: Message) -> TsCoordinatorRole:
        role = self.roles.get(str(msg.meta.get(TS_META)))
        if role is None:
            raise ValueError(f"{node.name} coordinates no TSEngine overlay "
                             f"{msg.meta.get(TS_META)!r} (runs: {sorted(self.roles)})")
        return role


def install_coordinators(node: Any, job: Any) -> None:
    """Give a scheduler node the TSEngine coordinators the job runs (none when off):
    ``inter`` at the global scheduler (members: the local servers), ``intra`` at each DC's
    local scheduler (members: that DC's workers)."""
    ts = TsSettings.from_sched(job.sched)
    roles = []
    if ts.inter and node.name == job.global_scheduler and job.mode == "hips":
        roles.append(TsCoordinatorRole(node, "inter", ts,
                                       [job.local_server_of[d] for d in job.party_dcs],
                                       list(job.global_servers)))
    if ts.intra:
        for dc, lh in job.local_scheduler_of.items():
            if lh == node.name:
                roles.append(TsCoordinatorRole(node, "intra", ts, list(job.workers_of[dc]),
                                               [job.local_server_of[dc]]))
    if roles:
        TsCoordinators(roles).install(node)


@dataclass
class _Merge:
    round: int
    value: Value
    count: int
    senders: list[str]
    meta: dict[str, Any]
    sent: asyncio.Future[Message] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


#: ``root_receive(msg, value, count, senders)``: what the root does with a merged push
RootReceive = Callable[[Message, Value, int, list[str]], None]


class OverlayPeer:
    """One node's side of one overlay: member (merge buffer, relay) and/or root.

    ``receive`` hands the node each broadcast round it did not consume yet; the root
    calls ``root_ready`` once per (key, part) it serves and ``broadcast`` per new round.
    """

    def __init__(self, node: Any, overlay: str, coordinator: str, peers: Iterable[str], *,
                 root_receive: RootReceive | None = None):
        self.node = node
        self.overlay = overlay
        self.coordinator = coordinator
        #: the nodes that may send this node merges and relays in this overlay
        self.peers = frozenset(peers) - {node.name}
        self.root_receive = root_receive
        self._bufs: dict[tuple[int, int], _Merge] = {}
        #: latest broadcast message per (key, part) and the round last handed to the node
        self._latest: dict[tuple[int, int], Message] = {}
        self._consumed: dict[tuple[int, int], int] = {}
        self._arrived: dict[tuple[int, int], asyncio.Event] = {}
        self._broadcast_rounds: dict[tuple[int, int], int] = {}
        self._relays: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ aggregation
    async def contribute(self, key: int, part: int, round_: int, value: Value,
                         meta: dict[str, Any]) -> Message:
        """Enter ``value`` (owned: it is added into) into the merge tree; returns the
        receiver's acknowledgement once this node's buffer has been sent."""
        if (key, part) in self._bufs:
            raise RuntimeError(f"{self.node.name}: key {key} part {part} is already in the "
                               f"{self.overlay} merge tree")
        buf = _Merge(round_, value, 1, [self.node.name], dict(meta))
        self._bufs[(key, part)] = buf
        self.node.spawn(self._ask(key, part, round_))
        return await buf.sent

    def root_ready(self, key: int, part: int, round_: int = 0) -> None:
        """The root of (key, part) enters the queue (and again after every receipt)."""
        self.node.spawn(self._ask(key, part, round_, root=True))

    async def _ask(self, key: int, part: int, round_: int, *, root: bool = False) -> None:
        meta: dict[str, Any] = {TS_META: self.overlay}
        if root:
            meta["root"] = True
        reply = await self.node.request(Message(Kind.ASK_PUSH, self.node.name,
                                                self.coordinator, key=key, part=part,
                                                version=round_, meta=meta),
                                        timeout_s=math.inf)
        to = reply.meta.get("to")
        if to is None:
            return  # paired as the receiver: the data comes from the sender
        buf = self._bufs.pop((key, part))
        meta = {**buf.meta, TS_META: self.overlay, TS_COUNT: buf.count, TS_FROM: buf.senders}
        data = Message(Kind.PUSH, self.node.name, str(to), key=key, part=part,
                       version=buf.round, meta=meta, channel=TS_DATA_CHANNEL,
                       payloads=[_payload(buf.value)])
        t0 = self.node.now()
        ack = await self.node.request(data)
        self._span("merge", data, t0)
        buf.sent.set_result(ack)

    def _span(self, what: str, data: Message, t0: float) -> None:
        """A ``ts_xfer`` span on the sender, one trace track per overlay edge."""
        self.node.record("ts_xfer", t_start=t0, dur=self.node.now() - t0, edge=f"->{data.dst}",
                         msg=what, overlay=self.overlay, key=data.key, part=data.part,
                         round=data.version, bytes=data.nbytes)

    def _check_peer(self, msg: Message) -> None:
        if msg.src not in self.peers:
            raise ValueError(f"{msg.src} is not a peer of {self.node.name} in the "
                             f"{self.overlay} overlay")

    def on_merge(self, msg: Message) -> None:
        """A merged push arrived: acknowledge it, add it, ask again."""
        self._check_peer(msg)
        count = int(msg.meta.get(TS_COUNT, 1))
        senders = [str(s) for s in msg.meta.get(TS_FROM, [msg.src])]
        if len(msg.payloads) != 1 or count != len(senders) or count < 1:
            raise ValueError("a TSEngine merge carries one payload and ts_n = len(ts_from)")
        if self.root_receive is not None:
            self.root_receive(msg, from_payload(msg.payloads[0]), count, senders)
            self.node.post(msg.reply(Kind.PUSH_ACK, payloads=[], channel=0))
            self.root_ready(msg.key, msg.part, msg.version)
            return
        buf = self._bufs.get((msg.key, msg.part))
        if buf is None or buf.round != msg.version:
            raise ValueError(f"no {self.overlay} merge buffer for key {msg.key} part "
                             f"{msg.part} round {msg.version} at {self.node.name}")
        p = msg.payloads[0]
        add_into(buf.value, p if p.data is None else p.data)
        buf.count += count
        buf.senders += senders
        if msg.meta.get("stop"):
            buf.meta["stop"] = True
        self.node.post(msg.reply(Kind.PUSH_ACK, payloads=[], channel=0))
        self.node.spawn(self._ask(msg.key, msg.part, buf.round))

    # ------------------------------------------------------------------ broadcast
    def broadcast(self, key: int, part: int, round_: int, payloads: list[Payload],
                  meta: dict[str, Any]) -> None:
        """The root holds round ``round_`` of (key, part): start its relay loop (once)."""
        if self._broadcast_rounds.get((key, part), -1) >= round_:
            return
        self._broadcast_rounds[(key, part)] = round_
        self._start_relay(key, part, round_, payloads, meta)

    def _start_relay(self, key: int, part: int, round_: int, payloads: list[Payload],
                     meta: dict[str, Any]) -> None:
        task = self.node.spawn(self._relay(key, part, round_, payloads, meta))
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
            reply = await self.node.request(
                Message(Kind.ASK_PULL, self.node.name, self.coordinator, key=key, part=part,
                        version=round_, meta={TS_META: self.overlay, "last": last, "thr": thr,
                                              "bytes": nbytes}),
                timeout_s=math.inf)
            to = reply.meta.get("to")
            if to is None:
                return
            data = Message(Kind.RELAY, self.node.name, str(to), key=key, part=part,
                           version=round_, meta={**meta, TS_META: self.overlay},
                           channel=TS_DATA_CHANNEL, payloads=payloads)
            t0 = self.node.now()
            await self.node.request(data)
            dt = self.node.now() - t0
            self._span("relay", data, t0)
            last, thr, nbytes = str(to), (data.nbytes / dt if dt > 0 else -1.0), data.nbytes

    def on_relay(self, msg: Message) -> None:
        """The new model arrived: acknowledge (AUTOPULLREPLY), forward it, hand it over."""
        self._check_peer(msg)
        self.node.post(msg.reply(Kind.RELAY_ACK, channel=0))
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

    async def receive(self, key: int, part: int) -> Message:
        """The next broadcast round of (key, part) this node has not consumed."""
        k = (key, part)
        while True:
            msg = self._latest.get(k)
            if msg is not None and msg.version > self._consumed.get(k, 0):
                self._consumed[k] = msg.version
                return msg
            ev = self._event(k)
            ev.clear()
            await ev.wait()


def _payload(v: Value) -> Payload:
    if isinstance(v, Payload):
        return v
    return Payload.of(np.ascontiguousarray(v))
