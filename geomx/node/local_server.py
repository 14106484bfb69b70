"""Local server (LS): aggregates its DC's workers and speaks for the DC across the WAN.

Follows docs/geomx-behaviour.md §3.1–3.2. Per key: sum the pushes of all local workers
and park their requests; then the local side of the job's sync algorithm
(``geomx/policy/sync.py``, reached through a :class:`LocalSyncContext`) decides what the
round is. A forwarding side pushes the DC sum to the global server(s) owning the key
(split by the placement rule), waits for every part's acknowledgement, pulls the new
value back, stores it, and only then acknowledges the parked worker pushes — so only
LS<->GS traffic crosses the WAN. A side may also answer most rounds locally (§3.4).

Initialisation (§3.1): the DC's rank-0 worker INITs the key here; the LS immediately
pulls the global value (the master worker's) and serves workers' pulls from it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geomx.node.base import Node
from geomx.node import checkpoint as ckpt
from geomx.node.link_codec import CodecNotice, LinkCodec
from geomx.node.sched_context import SchedNodeContext
from geomx.node.scheduler import leave, register
from geomx.node.spec import JobSpec
from geomx.node.sync_contexts import LocalSyncContext
from geomx.node.values import (Value, add_into, flat_slice, from_payload, write_slice,
                               zeros_like_spec)
from geomx.policy.scheduling import SchedLocalSide, local_side_of
from geomx.sched.placement import place
from geomx.policy.sync import LocalSide
from geomx.wire import Kind, Message, Payload

#: message kinds of the per-message paths (a module global reads faster than the enum)
_PUSH = Kind.PUSH
_PULL = Kind.PULL
_PUSH_ACK = Kind.PUSH_ACK
_PULL_REPLY = Kind.PULL_REPLY


def _snapshot(v: Value) -> Value:
    """A copy for the relayed broadcast (the store may be replaced or updated meanwhile)."""
    return v if isinstance(v, Payload) else v.copy()


@dataclass
class LocalSlot:
    shape: tuple[int, ...] = ()
    dtype: str = "<f4"
    phantom: bool = False
    store: Value | None = None
    initialized: bool = False
    merged: Value | None = None
    count: int = 0
    round: int = 0
    contributors: set[str] = field(default_factory=set)
    waiting_pushes: list[Message] = field(default_factory=list)
    waiting_pulls: list[Message] = field(default_factory=list)
    stop_requested: bool = False
    parts: list[Any] | None = None
    early_pushes: list[Message] = field(default_factory=list)  # init then push, no pull
    priority: int = 0          # the workers' priority, carried on to the global tier
    key: int = -1
    ckpt_round: int = 0        # the global round just finished is a checkpoint round
    answered: int = 0          # the last round whose workers were answered
    global_version: int = 0    # the lowest version of the key's parts in the last pull
    part_versions: dict[int, int] = field(default_factory=dict)  # part -> that version
    #: part -> (global version, the global side's handover) of the newest value pulled,
    #: handed back to a global server's successor (empty unless one may take over)
    handovers: dict[int, tuple[int, Any]] = field(default_factory=dict)


class LocalServer(Node):
    role = "local_server"

    def __init__(self, name: str, dc: str, transport: Any, services: Any, job: JobSpec):
        super().__init__(name, dc, transport, services)
        self.job = job
        self.workers = list(job.workers_of[dc])
        #: workers still in the job (a lost one leaves it: [membership] on_worker_loss),
        #: and each worker's pushes applied in completed rounds (nothing counts twice)
        self.live = list(self.workers)  # (a property: a set beside the list, see below)
        self.applied: dict[str, int] = {w: 0 for w in self.workers}
        self.slots: dict[int, LocalSlot] = {}
        # one codec for both hops: it picks per tier and keys its state by tier
        self.codec = LinkCodec(job.codec, num_dcs=len(job.party_dcs))
        #: this server's side of the job's sync algorithm, and what it sees of the server
        self.policy: LocalSide = job.sync_algorithm.local_side(job)
        self.sync_ctx = LocalSyncContext(self)
        self.global_stop = False
        self._done = asyncio.Event()
        self._stopped_workers: set[str] = set()
        #: rejoined workers waiting for a round boundary, their parked pulls, and the
        #: rounds being exchanged right now
        self._joining: list[str] = []
        self._join_pulls: list[Message] = []
        self._rounds_running = 0
        #: [membership] on_server_loss = "wait" (``taking_over``: this process took over
        #: the server's name): worker pushes being handled, by (sender, request id), and
        #: pushes that arrived twice (resent after a takeover) and were answered, not applied
        self._open_pushes: set[tuple[str, int]] = set()
        #: a taken-over server: requests for keys no worker has declared to it yet (they
        #: can overtake the declarations: sent before the sender heard of the takeover)
        self._undeclared: list[Message] = []
        self.deduped: dict[str, int] = {w: 0 for w in self.workers}
        self.on(Kind.INIT, self._on_init)
        self.on(Kind.PUSH, self._on_push)
        self.on(Kind.PULL, self._on_pull)
        self.on(Kind.SHUTDOWN, self._on_stop)
        self.on(Kind.COMMAND, self._on_command)
        self.codec_notice = CodecNotice()
        #: the transfer schedulers' side (geomx/policy/scheduling.py): how the DC's sum
        #: travels to the global tier and back (None: push each part, then pull)
        self.sched: SchedLocalSide | None = local_side_of(
            job.transfer_schedulers,
            SchedNodeContext(self, job, accept_merged=self._accept_merged, workers=self.workers))
        #: checkpoints (geomx/node/checkpoint.py): round -> keys answered after it
        self.ckpt = ckpt.NodeCheckpoints(job, name)
        self._ckpt_answered: dict[int, set[int]] = {}
        self._restored: dict[int, Any] = {}
        self._restored_sched: Any = None  # the scheduler side's, handed back in main()
        loaded = self.ckpt.load()
        if loaded is not None:
            tree, meta, arrays = loaded
            state = ckpt.unpack(tree, arrays)
            self._restored = {int(k): v for k, v in state["slots"]}
            ckpt.restore_codec_states(self.codec, state["codec"], self.record)
            self._restored_sched = state.get("sched")
            self.record("restore", round=meta["round"], keys=len(self._restored))

    # ------------------------------------------------------------------ commands
    def _on_command(self, msg: Message) -> None:
        """GeoMX's global server forwards ``set_gradient_compression`` to every local
        server; this one installs it and hands it to its workers with their next reply.
        ``set_sync`` (a ``dist_async`` store under ``[sync] algorithm = "auto"``) switches
        this server to that algorithm's local side."""
        cmd = msg.meta.get("cmd")
        problem = self.sched.command_problem(str(cmd)) if self.sched is not None else None
        if problem:
            self.reply_error(msg, problem)
            return
        if msg.src not in self.job.global_servers or cmd not in ("set_gradient_compression",
                                                                   "set_sync"):
            self.reply_error(msg, "local servers take only set_gradient_compression and "
                                  "set_sync, from a global server")
            return
        if cmd == "set_sync":
            from geomx.node.global_server import switch_sync

            problem = switch_sync(self, msg.meta.get("algorithm"))
            if problem:
                self.reply_error(msg, problem)
                return
            self.policy = self.job.sync_algorithm.local_side(self.job)
            self.record("command", cmd=cmd, algorithm=self.job.sync_algorithm.name)
            self.post(msg.reply(Kind.COMMAND_ACK))
            return
        config = dict(msg.meta["config"])
        self.codec = self.codec.replaced(config)
        self.codec_notice.command(config)
        self.record("command", cmd="set_gradient_compression")
        self.post(msg.reply(Kind.COMMAND_ACK))

    def _parts(self, key: int, slot: LocalSlot):
        if slot.parts is None:
            n = 1
            for d in slot.shape:
                n *= d
            slot.parts = place(key, n, len(self.job.global_servers), self.job.bigarray_bound,
                               split=not self.codec.enabled)
        return slot.parts

    # ------------------------------------------------------------------ init
    def _on_init(self, msg: Message) -> None:
        if msg.meta.get("takeover") and msg.src in self.workers and not msg.payloads:
            self._on_takeover_init(msg)
            return
        if msg.src not in self.workers or len(msg.payloads) != 1:
            self.reply_error(msg, "INIT must come from a worker of this DC with one payload")
            return
        p = msg.payloads[0]
        if msg.key in self.slots:
            self.post(msg.reply(Kind.INIT_ACK, meta=self.codec_notice.tell(msg.src, {})))
            return
        slot = LocalSlot(shape=p.shape, dtype=p.dtype, phantom=p.is_phantom, key=msg.key)
        slot.store = from_payload(p)
        self.slots[msg.key] = slot
        self.post(msg.reply(Kind.INIT_ACK, meta=self.codec_notice.tell(msg.src, {})))
        self.spawn(self._initialise(msg.key, slot))

    def before_resend(self, server: str) -> None:
        """A global server was taken over: before this server's unanswered requests go to
        it again, hand it the value and version of each (key, part) it owns, as last
        pulled (``on_server_loss = "wait"``; geomx/node/global_server.py)."""
        if server not in self.job.global_servers:
            return
        rank = self.job.global_servers.index(server)
        sent = 0
        for key, slot in sorted(self.slots.items()):
            if not slot.initialized or slot.store is None:
                continue
            parts = [p for p in self._parts(key, slot) if p.server == rank]
            for part in parts:
                v = flat_slice(slot.store, part.lo, part.hi) if len(slot.parts or ()) > 1 \
                    else slot.store
                payloads, _ = self.codec.encode_pull(key, _snapshot(v), tier="wan",
                                                     weights=True)
                sent += 1
                meta: dict[str, Any] = {"takeover": True}
                version = slot.part_versions.get(part.index, slot.answered)
                if part.index in slot.handovers:
                    version, meta["handover"] = slot.handovers[part.index]
                self.post(Message(Kind.INIT, self.name, server, key=key, part=part.index,
                                  version=version, meta=meta, payloads=payloads))
        self.post(Message(Kind.INIT, self.name, server, key=-1,
                          meta={"takeover": True, "last": True, "values": sent}))

    def _on_takeover_init(self, msg: Message) -> None:
        """A worker declares a key to the process that took over this server (its shape
        and dtype, no value): the key's value and round come from the global tier."""
        if msg.key not in self.slots:
            shape = tuple(int(d) for d in msg.meta.get("shape", ()))
            dtype = str(msg.meta.get("dtype", "<f4"))
            phantom = bool(msg.meta.get("phantom"))
            slot = LocalSlot(shape=shape, dtype=dtype, phantom=phantom, key=msg.key)
            slot.store = zeros_like_spec(shape, dtype, phantom)
            self.slots[msg.key] = slot
            self.spawn(self._initialise(msg.key, slot))
            early = [m for m in self._undeclared if m.key == msg.key]
            self._undeclared = [m for m in self._undeclared if m.key != msg.key]
            for m in early:
                self.dispatch(m)
        if msg.request_id:
            self.post(msg.reply(Kind.INIT_ACK))

    @property
    def taking_over(self) -> bool:
        """This process took over the server's name (geomx/node/restart.py)."""
        return self.restarted_as == "takeover"

    def _park_undeclared(self, msg: Message) -> bool:
        """A taken-over server: a worker's push or pull of a key not declared yet waits
        for the declaration (bounded by the workers' keys: a stranger is refused first)."""
        if not self.taking_over or msg.src not in self.workers \
                or len(self._undeclared) >= 64 * len(self.workers) + 1024:
            return False
        self._undeclared.append(msg)
        return True

    def _duplicate_push(self, msg: Message, slot: LocalSlot) -> bool:
        """``on_server_loss = "wait"``: whether ``msg`` is a push this server already has
        (the same request twice: the original and the resend after a takeover) or one of
        a round already applied (its predecessor pushed the DC's sum before it died);
        the latter is answered now. Workers number their pushes by round
        (``meta["round"]``, the round after the last one they were answered)."""
        rnd = msg.meta.get("round")
        if rnd is None:
            return False
        ident = (msg.src, msg.request_id)
        if ident in self._open_pushes:
            self.deduped[msg.src] = self.deduped.get(msg.src, 0) + 1
            self.record("dedupe", src=msg.src, key=msg.key, round=int(rnd), why="resent")
            return True
        if int(rnd) <= slot.answered:
            self.deduped[msg.src] = self.deduped.get(msg.src, 0) + 1
            self.record("dedupe", src=msg.src, key=msg.key, round=int(rnd), why="applied")
            self.post(msg.reply(Kind.PUSH_ACK, version=slot.answered,
                                meta={"stop": True} if self.global_stop else {}))
            return True
        self._open_pushes.add(ident)
        return False

    # ------------------------------------------------------------------ push
    def _on_push(self, msg: Message) -> None:
        if self.sched is not None and self.sched.receive_push(msg):
            return  # the transfer scheduler's own (an overlay merge)
        slot = self.slots.get(msg.key)
        if slot is not None and not slot.initialized and msg.src in self.workers:
            # GeoMX: init then push without a pull; the push waits for the global value
            slot.early_pushes.append(msg)
            return
        if slot is None and self._park_undeclared(msg):
            return
        if slot is None or not slot.initialized:
            # (kv.init's barrier keeps honest workers from getting here)
            self.reply_error(msg, f"key {msg.key} is not initialised yet (kv.init it first)")
            return
        if msg.src not in self._live_set:
            self.reply_error(msg, f"{msg.src} is not a (live) worker of {self.dc}")
            return
        if self._duplicate_push(msg, slot):
            return
        if msg.src in slot.contributors:
            self.reply_error(msg, f"{msg.src} pushed key {msg.key} twice in one round")
            return
        try:
            value = self.codec.decode(msg, like=slot.store)
        except ValueError as e:
            self.reply_error(msg, str(e))
            return
        slot.contributors.add(msg.src)
        if self.sched is not None:
            self.sched.note_worker_push(msg)
        slot.priority = msg.priority
        if slot.merged is None:
            slot.merged = value  # decode() returned a fresh array: take it, no copy
        else:
            add_into(slot.merged, value)
        slot.count += 1
        if msg.meta.get("stop"):
            slot.stop_requested = True
        slot.waiting_pushes.append(msg)
        self._complete_round(slot)

    def _complete_round(self, slot: LocalSlot) -> None:
        """Every live worker pushed ``slot``'s key: hand the DC's sum to the sync side.
        Without a lost worker's push the sum is scaled by workers / contributors, so the
        DC keeps its weight in the global aggregate."""
        # (counts first: the subset test then runs once a round, not once a push)
        if (slot.count == 0 or len(slot.contributors) < len(self._live)
                or not self._live_set <= slot.contributors):
            return
        merged, slot.merged = slot.merged, None
        n = len(slot.contributors)
        if n < len(self.workers) and isinstance(merged, np.ndarray):
            merged *= merged.dtype.type(len(self.workers) / n)
            self.record("reweight", key=slot.key, contributors=n, workers=len(self.workers))
        for w in slot.contributors:
            self.applied[w] += 1
        slot.count = 0
        slot.contributors.clear()
        live = self._live_set
        waiting = [m for m in slot.waiting_pushes if m.src in live]
        slot.waiting_pushes = []
        stop, slot.stop_requested = slot.stop_requested, False
        self._rounds_running += 1
        self.spawn(self._run_round(slot, merged, waiting, stop))

    async def _run_round(self, slot: LocalSlot, merged: Value, waiting: list[Message],
                         stop: bool) -> None:
        try:
            await self.policy.on_round(self.sync_ctx, slot.key, slot, merged, waiting, stop)
        finally:
            self._rounds_running -= 1
        self._admit_joining()

    @property
    def live(self) -> list[str]:
        """Workers still in the job, in rank order (assign a new list to change it)."""
        return self._live

    @live.setter
    def live(self, workers: list[str]) -> None:
        self._live = list(workers)
        self._live_set = frozenset(workers)  # membership per push, O(1) at any DC size

    def on_member_rejoined(self, node: str) -> None:
        """A lost worker of this DC restarted (``geomx node --rejoin``): it joins at the
        next round boundary -- its pulls wait until then, so it starts from a model every
        key agrees on, and its first push belongs to the next round."""
        if node in self.workers and node not in self.live and node not in self._joining:
            self._joining.append(node)
            self._stopped_workers.discard(node)
            self._admit_joining()

    def _admit_joining(self) -> None:
        if not self._joining or self._rounds_running:
            return
        slots = list(self.slots.values())
        if any(not s.initialized or s.count for s in slots) or len({s.round for s in slots}) > 1:
            return  # mid-round: the next boundary admits them
        for w in self._joining:
            self.record("worker_rejoined", worker=w, round=slots[0].round if slots else 0)
        self.live = [w for w in self.workers if w in self.live or w in self._joining]
        self._joining = []
        parked, self._join_pulls = self._join_pulls, []
        for pull in parked:
            self._serve_pull(pull, self.slots[pull.key])

    def on_member_lost(self, node: str) -> None:
        """A worker of this DC is gone and the job goes on: stop waiting for it; rounds it
        held up complete now with the pushes that arrived."""
        if node not in self.live:
            return
        self.live = [w for w in self.live if w != node]
        for slot in self.slots.values():
            if slot.initialized:
                self._complete_round(slot)
        if self._stopped_workers and set(self.live) <= self._stopped_workers:
            self._done.set()

    def _accept_merged(self, msg: Message, value: Value, count: int,
                       senders: list[str]) -> None:
        """A merged push of ``count`` workers' gradients (the transfer scheduler's overlay)
        counts as that many pushes (docs/geomx-behaviour.md §4.5, aggregation steps 5-7)."""
        slot = self.slots.get(msg.key)
        if slot is None or not slot.initialized:
            raise ValueError(f"key {msg.key} is not initialised yet")
        bad = [s for s in senders if s not in self.workers or s in slot.contributors]
        if bad or len(set(senders)) != len(senders):
            raise ValueError(f"merged push names {senders}: {bad or 'a duplicate'} is not a "
                             f"worker of {self.dc} pushing once this round")
        slot.contributors.update(senders)
        if slot.merged is None:
            slot.merged = value
        else:
            add_into(slot.merged, value)
        slot.count += count
        if msg.meta.get("stop"):
            slot.stop_requested = True
        if slot.count == len(self.workers):
            merged, slot.merged = slot.merged, None
            slot.count = 0
            slot.contributors.clear()
            stop, slot.stop_requested = slot.stop_requested, False
            self.spawn(self.policy.on_round(self.sync_ctx, msg.key, slot, merged, [], stop))

    # called by the sync side (through LocalSyncContext) ------------------------------
    async def exchange_global(self, key: int, slot: LocalSlot, value: Value, *,
                              stop: bool) -> Value:
        """Push ``value`` to the global server(s) owning ``key``, wait for every part's
        acknowledgement, then pull the new global value back and return it (unless the
        transfer scheduler carries it another way)."""
        sched = self.sched
        parts = self._parts(key, slot)
        meta_stop: dict[str, Any] = {"stop": True} if stop else {}
        if sched is not None:
            results = await sched.exchange(key, parts, slot.round, value, meta_stop)
            if results is not None:
                return self._assemble(slot, results)
            sched.global_push_meta(meta_stop)

        async def push_part(part) -> Message:
            v = flat_slice(value, part.lo, part.hi) if len(parts) > 1 else value
            if sched is not None:
                ack = await sched.push_part(self.job.global_servers[part.server], key,
                                            part.index, slot.round, v, meta_stop)
                if ack is not None:
                    return ack
            payloads, meta = self.codec.encode_push(key, v, tier="wan")
            meta.update(meta_stop)
            return await self.request(Message(_PUSH, self.name,
                                              self.job.global_servers[part.server], key=key,
                                              part=part.index, version=slot.round, meta=meta,
                                              priority=slot.priority, payloads=payloads))

        while True:
            acks = ([await push_part(parts[0])] if len(parts) == 1
                    else await asyncio.gather(*(push_part(p) for p in parts)))
            if any(a.meta.get("stop") for a in acks):
                self.global_stop = True
            slot.ckpt_round = max([slot.ckpt_round,
                                   *(int(a.meta.get("ckpt", 0)) for a in acks)])
            if sched is not None and sched.acks_carry_value(acks):
                return self._assemble(slot, list(zip(parts, acks)))
            new = await self.pull_global(key, slot)
            if self.policy.dc_round(key, slot.global_version) >= slot.round \
                    or not self.replaceable_peers:
                return new
            # a global server died after taking this round and before anybody pulled its
            # result: its successor restarted from the round before; push the sum again
            self.record("repush", key=key, round=slot.round, version=slot.global_version)

    def answer_workers(self, slot: LocalSlot, waiting: list[Message]) -> None:
        """Acknowledge the parked worker pushes of a finished round."""
        reply_meta: dict[str, Any] = {"stop": True} if self.global_stop else {}
        round_, slot.ckpt_round = slot.ckpt_round, 0
        slot.answered = slot.round
        for req in waiting:
            self._open_pushes.discard((req.src, req.request_id))
        if round_:
            reply_meta["ckpt"] = round_
        sched = self.sched
        if sched is not None:
            sched.on_round_answered(slot.key, slot.round, slot.store, reply_meta)
        for req in waiting:
            if sched is not None and sched.reply_carries_value(req):
                # push/pull fusion: the acknowledgement carries the new value
                payloads, meta = self.codec.encode_pull(req.key, slot.store, tier="lan")
                meta.update(reply_meta)
                self.post(req.answer(_PUSH_ACK, slot.round,
                                     self.codec_notice.tell(req.src, meta), payloads))
            else:
                self.post(req.answer(_PUSH_ACK, slot.round,
                                     self.codec_notice.tell(req.src, dict(reply_meta))))
        if round_:
            self._answered_checkpoint_round(round_, slot.key)

    # ------------------------------------------------------------------ checkpoints
    def _answered_checkpoint_round(self, round_: int, key: int) -> None:
        """Snapshot once every key of checkpoint round ``round_`` has been answered."""
        keys = self._ckpt_answered.setdefault(round_, set())
        keys.add(key)
        if len(keys) < ckpt.keys_in_round(round_, self.slots.values(), lambda s: s.round > 0):
            return
        del self._ckpt_answered[round_]
        for old in [r for r in self._ckpt_answered if r < round_]:
            del self._ckpt_answered[old]  # a round 1 that a broadcast-only key held open
        slots = [[k, {"store": s.store, "round": s.round, "policy": self.policy.key_state(k)}]
                 for k, s in sorted(self.slots.items())]
        state = {"slots": slots, "codec": ckpt.codec_states(self.codec),
                 "sched": ckpt.sched_state(self.sched)}
        # the workers whose files the round needs (a lost one has none)
        path = self.ckpt.save(round_, state, {"t": self.now(), "live": self.live})
        self.record("checkpoint", round=round_, file=path.name)

    def _restore_slot(self, key: int, slot: LocalSlot) -> None:
        """Resuming: after the global initial pull, the checkpoint's value and round of
        ``key`` and its sync side's state replace what initialisation set."""
        saved = self._restored.pop(key, None)
        if saved is None:
            return
        slot.store = saved["store"]
        slot.round = int(saved["round"])
        if saved["policy"] is not None:
            self.policy.load_key_state(key, saved["policy"])

    async def pull_global(self, key: int, slot: LocalSlot, *, initial: bool = False) -> Value:
        """The current global value of ``key``, reassembled from its parts (``initial``:
        the first pull, which the global server always answers dense)."""
        parts = self._parts(key, slot)

        async def pull_part(part) -> tuple[Any, Message]:
            reply = await self.request(Message(_PULL, self.name,
                                               self.job.global_servers[part.server], key=key,
                                               part=part.index, version=slot.round,
                                               priority=slot.priority,
                                               meta={"initial": True} if initial else {}))
            return part, reply

        results = ([await pull_part(parts[0])] if len(parts) == 1
                   else await asyncio.gather(*(pull_part(p) for p in parts)))
        # the global tier's rounds of this key; a side that counts rounds per pusher
        # says this DC's own (``round``)
        rounds = {part.index: int(reply.meta.get("round", reply.version))
                  for part, reply in results}
        slot.global_version = min(rounds.values())
        slot.part_versions = rounds
        return self._assemble(slot, results)

    def _assemble(self, slot: LocalSlot, results: list[tuple[Any, Message]]) -> Value:
        """Decode the global tier's replies (pull replies, or fused push acks) into
        the key's new value."""
        parts = slot.parts or []
        new = zeros_like_spec(slot.shape, slot.dtype, slot.phantom) if len(parts) > 1 else None
        for part, reply in results:
            if reply.meta.get("stop"):
                self.global_stop = True
            like = slot.store if len(parts) == 1 else flat_slice(slot.store, part.lo, part.hi)
            value = self.codec.decode(reply, like=like)
            slot.ckpt_round = max(slot.ckpt_round, int(reply.meta.get("ckpt", 0)))
            if "handover" in reply.meta:
                slot.handovers[part.index] = (reply.version, reply.meta["handover"])
            if new is None:
                new = value
            else:
                write_slice(new, part.lo, part.hi, value)
        assert new is not None
        return new

    async def _initialise(self, key: int, slot: LocalSlot) -> None:
        """Every DC starts from the global initial value, also with a sync side that
        averages locally (docs/geomx-behaviour.md §3.1)."""
        slot.store = await self.pull_global(key, slot, initial=True)
        slot.initialized = True
        self.policy.on_initialized(self.sync_ctx, key, slot)
        if self._restored:
            self._restore_slot(key, slot)
        if self.taking_over:
            # the global tier has applied ``global_version`` rounds of this key (of
            # every part, at least); the sync side says which DC round that is, and
            # this DC's next round is the one after
            slot.round = slot.answered = self.policy.dc_round(key, slot.global_version)
            slot.ckpt_round = 0
            self.record("takeover_init", key=key, round=slot.round)
        if self.sched is not None:
            self.sched.on_key_ready(key)
        self.record("init", key=key)
        waiting, slot.waiting_pulls = slot.waiting_pulls, []
        for pull in waiting:
            self._serve_pull(pull, slot)
        early, slot.early_pushes = slot.early_pushes, []
        for push in early:
            self._on_push(push)

    # ------------------------------------------------------------------ pull
    def _on_pull(self, msg: Message) -> None:
        slot = self.slots.get(msg.key)
        if slot is None and self._park_undeclared(msg):
            return
        if slot is None:
            # a pull that beats the rank-0 INIT: park it on a placeholder slot
            self.reply_error(msg, f"key {msg.key} is not initialised")
            return
        if not slot.initialized:
            slot.waiting_pulls.append(msg)
            return
        if msg.src in self._joining:
            self._join_pulls.append(msg)  # a rejoined worker starts at a round boundary
            return
        self._serve_pull(msg, slot)

    def _serve_pull(self, msg: Message, slot: LocalSlot) -> None:
        assert slot.store is not None
        payloads, meta = self.codec.encode_pull(msg.key, slot.store, tier="lan")
        if self.global_stop:
            meta["stop"] = True
        self.codec_notice.tell(msg.src, meta)
        self.post(msg.answer(_PULL_REPLY, slot.round, meta, payloads))

    # ------------------------------------------------------------------ lifecycle
    def _on_stop(self, msg: Message) -> None:
        if msg.src not in self.workers:
            return
        if self.job.on_worker_loss != "continue":
            self._done.set()  # GeoMX: the DC's rank-0 worker, after the workers' barrier
            return
        # a worker may be lost at any time: every live worker says it is done
        self._stopped_workers.add(msg.src)
        if set(self.live) <= self._stopped_workers:
            self._done.set()

    async def main(self) -> None:
        if self.taking_over:
            self._restored = {}  # the job's state is the global tier's, not a checkpoint's
            self._restored_sched = None
        ckpt.restore_sched_state(self.sched, self._restored_sched)
        await register(self, self.job.global_scheduler)
        await register(self, self.job.local_scheduler_of[self.dc])
        done = set(self.members_left or ()) & set(self.workers)
        if self.taking_over and done:
            # the predecessor died after the DC finished: the workers that said so (the
            # rank-0 worker, or every live one) have left; nothing is left to serve
            self._stopped_workers |= done
            if self.workers[0] in done or set(self.live) <= done:
                self._done.set()
        await self._done.wait()
        if self.sched is not None:
            await self.sched.drain()  # forward what this node still owes others
        for gs in self.job.global_servers:
            self.post(Message(Kind.SHUTDOWN, self.name, gs))
        if self.sched is not None:
            self.sched.on_done()
        counts: dict[str, Any] = {}
        if self.job.on_worker_loss == "continue":
            counts.update(applied=dict(sorted(self.applied.items())),
                          lost=sorted(set(self.workers) - set(self.live)))
        if self.job.on_server_loss == "wait":
            counts.update(applied=dict(sorted(self.applied.items())),
                          deduped=dict(sorted(self.deduped.items())),
                          took_over=self.taking_over)
        self.record("server_done", rounds=sum(s.round for s in self.slots.values()), **counts)
        leave(self, self.job.global_scheduler)
        leave(self, self.job.local_scheduler_of[self.dc])
