"""Global server (GS): aggregates the DCs' pushes and runs the global step.

Follows docs/geomx-behaviour.md §3.1–3.3. For each (key, part) the GS keeps ``store`` (the
weights when an optimizer is installed, otherwise the aggregated sum). When a push is
applied and answered is the global side of the job's sync algorithm
(``geomx/policy/sync.py``), which it reaches through a :class:`GlobalSyncContext`: a
synchronous side collects one push per contributor (a local server per DC in HiPS;
every worker in the flat-PS baseline), then runs the optimizer and answers all parked
pushes; an asynchronous one applies each push as a step of its own. Pulls are served from ``store`` once the key is initialised
(parked until then); each pull is noted for optimizers that keep a per-sender backup
(DC-ASGD), and every update names its sender.

Fixes relative to GeoMX: commands are acknowledged (no ``sleep(1)``); the optimizer is
sent as a JSON config, never a pickle; the optimizer sees the *mean* gradient
(``rescale_grad = 1/num_all_workers``) so learning rates mean the same thing on every
topology; a push for an unknown key or with a wrong shape gets an ERROR reply and
changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from geomx.node.base import Node, NodeFailure
from geomx.node import checkpoint as ckpt
from geomx.node.link_codec import CodecNotice, LinkCodec
from geomx.node.sched_context import SchedNodeContext
from geomx.node.scheduler import leave, register
from geomx.node.spec import JobSpec
from geomx.node.sync_contexts import GlobalSyncContext
from geomx.node.values import Value, add_into, freeze, from_payload, is_phantom, thaw
from geomx.policy.scheduling import (HELD, MERGED_FROM_META, SchedGlobalSide,
                                     global_side_of, sync_problem_of)
from geomx.policy.sync import KVSTORE_ALGORITHMS, GlobalSide
from geomx.wire import Kind, Message

#: message kinds of the per-message paths (a module global reads faster than the enum)
_PUSH_ACK = Kind.PUSH_ACK
_PULL_REPLY = Kind.PULL_REPLY

log = logging.getLogger(__name__)


#: Most (key, part) slots a global server keeps; beyond it requests are refused, so
#: pulls for made-up keys cannot grow memory without bound.
MAX_SLOTS = 1 << 20


@dataclass
class Slot:
    """Server state of one (key, part)."""

    store: Value | None = None
    merged: Value | None = None
    count: int = 0
    version: int = 0
    waiting_pushes: list[Message] = field(default_factory=list)
    #: pulls (and flat-PS pushes) that arrived before the master worker's INIT
    waiting_for_init: list[Message] = field(default_factory=list)
    opt_state: Any = None
    contributors: set[str] = field(default_factory=set)


def switch_sync(node: Any, algorithm: Any) -> str:
    """``kv.create("dist_async")`` under ``[sync] algorithm = "auto"``: the node's job now
    runs the algorithm a ``dist_async`` store stands for (``KVSTORE_ALGORITHMS``). Returns
    the problem, or "" when switched. Only before any key exists (GeoMX sends its sync
    mode at kvstore creation, before ``init``)."""
    allowed = KVSTORE_ALGORITHMS["dist_async"]
    if algorithm != allowed:
        return f"set_sync: algorithm {algorithm!r}; allowed: {allowed!r}"
    problem = sync_problem_of(node.job.transfer_schedulers, algorithm)
    if problem:
        return problem
    if not node.job.sync.get("auto"):
        return (f"set_sync: the scenario chose [sync] algorithm = "
                f"{node.job.sync.get('algorithm')!r} explicitly")
    if node.slots:
        return "set_sync: keys are already initialised; create the kvstore before kv.init"
    job = dataclasses.replace(node.job, sync={**node.job.sync, "algorithm": algorithm,
                                              "auto": False})
    if not job.sync_algorithm.global_takeover and node.name in job.replaceable_servers():
        return (f"set_sync: a dist_async store runs {allowed}, whose global server a "
                "successor cannot rebuild, and this job restarts a lost global server "
                "(membership.on_server_loss = 'wait' with checkpoint.every); use dist_sync")
    node.job = job
    return ""


class GlobalServer(Node):
    role = "global_server"

    def __init__(self, name: str, dc: str, transport: Any, services: Any, job: JobSpec):
        super().__init__(name, dc, transport, services)
        self.job = job
        self.rank = job.global_servers.index(name)
        self.slots: dict[tuple[int, int], Slot] = {}
        self.optimizer: Any = None
        self.codec = LinkCodec(job.codec, num_dcs=len(job.party_dcs))
        #: this server's side of the job's sync algorithm, and what it sees of the server
        self.policy: GlobalSide = job.sync_algorithm.global_side(job)
        self.sync_ctx = GlobalSyncContext(self)
        self.stop_requested = False
        #: (key, part) -> the first version of that slot whose replies carry the stop:
        #: the round in progress when the stop was first requested (see _request_stop)
        self._stop_from: dict[tuple[int, int], int] = {}
        self._stopped_by: set[str] = set()
        self._done = asyncio.Event()
        if job.mode == "flat_ps":
            self.pushers = job.all_workers
        else:
            self.pushers = [job.local_server_of[d] for d in job.party_dcs]
        self._pullers = set(self.pushers) | {job.master_worker}
        #: a flat PS's workers learn a codec the master worker set with
        #: ``set_gradient_compression`` from this server's next reply to each of them (a
        #: local server does it for its workers under HiPS)
        self.codec_notice = CodecNotice()
        self._pusher_set = frozenset(self.pushers)  # per-push membership, O(1) at any scale
        #: the transfer schedulers' side (geomx/policy/scheduling.py): pushes in blocks or
        #: merged, replies fused or broadcast (None: one push, one acknowledgement)
        self.sched: SchedGlobalSide | None = global_side_of(
            job.transfer_schedulers,
            SchedNodeContext(self, job, accept_merged=self._accept_merged, pushers=self.pushers))
        #: checkpoints (geomx/node/checkpoint.py): round -> is it a checkpoint round;
        #: round -> keys that finished it
        self.ckpt = ckpt.NodeCheckpoints(job, name)
        self._ckpt_due: dict[int, bool] = {}
        self._ckpt_reached: dict[int, int] = {}
        self._ckpt_newest = 0  # the newest round a key finished
        self._restored_opt: dict[str, Any] = {}
        self._restored_sched: Any = None  # the scheduler side's, handed back in main()
        self._restored_sync: Any = None  # the sync side's (again if set_sync replaces it)
        #: (key, part)s that have a value here but not yet the master worker's INIT: a
        #: flat-PS worker's INIT came first, or the value is a checkpoint's (_restore).
        #: Their pulls and pushes wait for that INIT or the master's SHUTDOWN (_on_init)
        self._unpublished: set[tuple[int, int]] = set()
        #: of those, the ones whose value is a flat-PS worker's INIT (the master's replaces it)
        self._worker_valued: set[tuple[int, int]] = set()
        #: the master worker's program returned (flat PS: its SHUTDOWN): no INIT is to come
        self._master_done = False
        self._restore()
        #: [membership] on_server_loss = "wait": a local server's successor pushes the round
        #: its predecessor may have pushed already; pushes taken per pusher, and those
        #: dropped as such duplicates
        self._dedupe_rounds = job.on_server_loss == "wait" and job.mode == "hips"
        #: a successor may take this server over: replies carrying a value carry the sync
        #: side's handover with it (``GlobalSide.handover``), which the pushers hand back
        self._hands_over = name in job.replaceable_servers()
        self._handovers: dict[tuple[int, int], Any] = {}
        self.applied: dict[str, int] = {p: 0 for p in self.pushers}
        self.deduped: dict[str, int] = {p: 0 for p in self.pushers}
        #: this process took over the server's name (``taking_over``): it waits for
        #: every local server's values (``_awaiting``), parking other requests meanwhile
        self._taking_over = False
        self._awaiting: set[str] = set()
        self._parked: list[Message] = []
        self._snapshot_state: dict[str, Any] | None = None
        self.on(Kind.COMMAND, self._on_command)
        self.on(Kind.INIT, self._on_init)
        self.on(Kind.PUSH, self._on_push)
        self.on(Kind.PULL, self._on_pull)
        self.on(Kind.SHUTDOWN, self._on_stop)

    # ------------------------------------------------------------------ commands
    def _on_command(self, msg: Message) -> None:
        if self._park(msg):
            return
        if msg.src != self.job.master_worker:
            self.reply_error(msg, f"only the master worker ({self.job.master_worker}) may "
                                  f"configure the global servers, not {msg.src}")
            return
        cmd = msg.meta.get("cmd")
        if cmd == "set_optimizer" and not self.policy.uses_optimizer:
            # the sync algorithm's global tier only sums (model deltas)
            self.record("warning", text=f"sync algorithm {self.job.sync_algorithm.name!r} "
                                        "runs no global optimizer; set_optimizer ignored")
        elif cmd == "set_optimizer":
            from geomx.optim import optimizer_from_config

            self.optimizer = optimizer_from_config(dict(msg.meta["config"]))
            if "rescale_grad" not in msg.meta["config"]:  # explicit (1.0 = GeoMX's sum) wins
                self.optimizer.rescale_grad = 1.0 / max(1, self.job.num_all_workers)
            self._restore_optimizer()
            self.record("command", cmd=cmd, optimizer=msg.meta["config"].get("name"))
        elif cmd == "set_gradient_compression":
            self.codec = self.codec.replaced(dict(msg.meta["config"]))
            if self.job.mode == "flat_ps":
                self.codec_notice.command(msg.meta["config"])
            self.record("command", cmd=cmd)
            if self.rank == 0 and self.job.mode == "hips":
                # GeoMX: global server 0 forwards it to every local server; acknowledged
                # once they all have it, so the master's await covers every tier
                self.spawn(self._forward_command(msg))
                return
        elif cmd == "set_sync":
            problem = switch_sync(self, msg.meta.get("algorithm"))
            if problem:
                self.reply_error(msg, problem)
                return
            self.policy = self.job.sync_algorithm.global_side(self.job)
            if self._restored_sync is not None:
                self.policy.load_state_dict(self._restored_sync)
            self.record("command", cmd=cmd, algorithm=self.job.sync_algorithm.name)
            if self.rank == 0 and self.job.mode == "hips":
                self.spawn(self._forward_command(msg))
                return
        else:
            self.reply_error(msg, f"unknown command {cmd!r}; allowed: set_optimizer, "
                                  "set_gradient_compression, set_sync")
            return
        self.post(msg.reply(Kind.COMMAND_ACK))

    async def _forward_command(self, msg: Message) -> None:
        """GeoMX's global server 0 passes the master's configuration on to every local
        server; the master's acknowledgement waits for theirs."""
        await asyncio.gather(*(self.request(Message(Kind.COMMAND, self.name, ls, meta=dict(msg.meta)))
                               for ls in self.job.local_server_of.values()))
        self.post(msg.reply(Kind.COMMAND_ACK))

    def _on_stop(self, msg: Message) -> None:
        if msg.src == self.job.master_worker and self.job.master_says_goodbye:
            self._on_master_done()
        elif msg.src not in self.pushers:
            self.record("reject", src=msg.src, msg=msg.kind.name, reason="not a pusher")
            return
        else:
            self._stopped_by.add(msg.src)
            self.policy.on_pusher_left(self.sync_ctx, msg.src)
        self._finish_if_all_left()

    def _finish_if_all_left(self) -> None:
        """This server stops once every pusher has said goodbye, and on a flat PS the
        master worker too: its SHUTDOWN (:meth:`_on_master_done`) then always finds this
        server up, however long its program runs after the workers'."""
        if set(self.pushers) <= self._stopped_by and (self._master_done or
                                                       not self.job.master_says_goodbye):
            self._done.set()

    @property
    def departed(self) -> set[str]:
        """Pushers that have finished (sent SHUTDOWN)."""
        return self._stopped_by

    # ------------------------------------------------------------------ data
    def _on_init(self, msg: Message) -> None:
        """The master worker's INIT publishes a key: its value becomes the key's (unless a
        checkpoint's is restored) and the requests waiting for it are served.

        Why the master's: it sends its INITs after its commands (``set_optimizer``,
        ``set_gradient_compression``, acknowledged end to end), so a key it has
        initialised is served with the job's optimizer and codec installed. GeoMX's
        global servers hear INITs from the master alone, and it is the master's value
        every worker starts from (docs/geomx-behaviour.md §2.1). On a flat PS each DC's
        rank-0 worker INITs these servers too, as under HiPS it INITs its local server;
        served from that INIT, its DC's first push could reach this server before
        ``set_optimizer`` (applied as the new weights) or leave the worker before it
        learnt the codec (sent dense), as over real sockets it did when the master
        started last. Such a key waits for the master's INIT, or, when the master's
        program returned without one (it initialises nothing), for its SHUTDOWN
        (:meth:`_on_master_done`), and is then served from the worker's value."""
        if msg.meta.get("takeover") and self._awaiting and msg.src in self._awaiting:
            self._on_takeover_value(msg)
            return
        if self._park(msg):
            return
        from_master = msg.src == self.job.master_worker
        if not from_master and not (self.job.mode == "flat_ps" and msg.src in self._pusher_set):
            self.reply_error(msg, f"{msg.src} may not initialise keys on {self.name}")
            return
        if len(msg.payloads) != 1:
            self.reply_error(msg, "INIT needs exactly one payload")
            return
        problem = optimizer_mismatch(self.job.sync_algorithm, self.policy) or \
            self.policy.start_problem(self.sync_ctx)
        if problem:
            self.reply_error(msg, problem)
            return
        key = (msg.key, msg.part)
        slot = self.slots.get(key)
        if slot is None and len(self.slots) >= MAX_SLOTS:
            self.reply_error(msg, f"too many keys ({MAX_SLOTS}); key {msg.key} refused")
            return
        slot = self.slots.setdefault(key, Slot())
        if not from_master:
            fresh = slot.store is None
            if fresh:
                self._set_initial(msg.key, slot, msg.payloads[0])
                self._worker_valued.add(key)
                self._unpublished.add(key)
            self.post(msg.reply(Kind.INIT_ACK, meta=self._tell_codec(msg.src, {})))
            if fresh and self._master_done:
                self._publish(key, slot, fresh=True)
            return
        # the master's value replaces a worker's that is not served yet (a served key
        # leaves _worker_valued); a checkpoint's value (restored, unpublished) stays
        fresh = slot.store is None or key in self._worker_valued
        if fresh:
            self._set_initial(msg.key, slot, msg.payloads[0])
        self.post(msg.reply(Kind.INIT_ACK, meta=self._tell_codec(msg.src, {})))
        self._publish(key, slot, fresh=fresh)

    def _set_initial(self, key: int, slot: Slot, payload: Any) -> None:
        slot.store = from_payload(payload)
        slot.opt_state = (self.optimizer.create_state(key, slot.store)
                          if self.optimizer is not None and not is_phantom(slot.store) else None)

    def _publish(self, key: tuple[int, int], slot: Slot, *, fresh: bool) -> None:
        """Serve ``key`` from now on, and the requests that waited for it. ``fresh``: its
        value is an INIT's (not a checkpoint's), announced as the key's ``init``."""
        if fresh:
            self.record("init", key=key[0], part=key[1])
            if self.sched is not None:
                self.sched.on_key_ready(key[0], key[1])
        self._unpublished.discard(key)
        self._worker_valued.discard(key)
        waiting, slot.waiting_for_init = slot.waiting_for_init, []
        for request in waiting:
            self._serve_waiting(request)

    def _on_master_done(self) -> None:
        """The master worker's program returned (its SHUTDOWN, sent on a flat PS): no INIT
        of its is still to come, so the keys still waiting for one are served from the
        value they have (a worker's INIT, or the checkpoint's), in key order."""
        self._master_done = True
        for key in sorted(self._unpublished):
            slot = self.slots[key]
            if slot.store is not None:
                self._publish(key, slot, fresh=key in self._worker_valued)

    def _waits_for_init(self, msg: Message) -> bool:
        """Hold a pull, or a push of a key a flat-PS worker has INITed, until the master
        worker's INIT (or SHUTDOWN) publishes the key (:meth:`_on_init`). Bounded: the
        sender is a member (checked by the caller), and past a few requests per member
        and key the request is refused."""
        key = (msg.key, msg.part)
        slot = self.slots.get(key)
        if slot is not None and slot.store is not None and key not in self._unpublished:
            return False
        if msg.kind == Kind.PUSH and key not in self._unpublished:
            return False  # nobody INITed it: _check_push refuses it
        slot = self.slots.setdefault(key, Slot())
        if len(slot.waiting_for_init) >= 8 * len(self._pullers) + 16:
            self.reply_error(msg, f"key {msg.key} part {msg.part}: too many requests wait "
                                  "for the master worker's INIT")
            return True
        slot.waiting_for_init.append(msg)
        return True

    def _serve_waiting(self, msg: Message) -> None:
        """Handle a request that waited for its key's INIT as if it arrived now."""
        if msg.kind == Kind.PUSH:
            self._on_push(msg)
        else:
            self._on_pull(msg)

    def _check_push(self, msg: Message) -> Slot | None:
        slot = self.slots.get((msg.key, msg.part))
        if slot is None or slot.store is None:
            self.reply_error(msg, f"key {msg.key} part {msg.part} is not initialised")
            return None
        if msg.src not in self._pusher_set:
            self.reply_error(msg, f"{msg.src} may not push to {self.name}")
            return None
        return slot

    def _on_push(self, msg: Message) -> None:
        if self._park(msg):
            return
        if msg.src in self._pusher_set and self._waits_for_init(msg):
            return
        slot = self._check_push(msg)
        if slot is None:
            return
        sched = self.sched
        if sched is not None and sched.receive_push(msg):
            return  # the transfer scheduler's own (an overlay merge: _accept_merged)
        try:
            value = sched.decode_push(msg, slot.store) if sched is not None else None
            if value is HELD:
                return  # a piece of a push: its last piece completes it
            if value is None:
                value = self.codec.decode(msg, like=slot.store)
        except ValueError as e:
            self.reply_error(msg, str(e))
            return
        if msg.meta.get("stop"):
            self._request_stop()
        if self._dedupe_rounds and self._duplicate_round(msg, slot):
            return
        self.applied[msg.src] = self.applied.get(msg.src, 0) + 1
        self.policy.on_push(self.sync_ctx, msg, slot, value)

    def _duplicate_round(self, msg: Message, slot: Slot) -> bool:
        """``on_server_loss = "wait"``: a local server's push that this server already has
        (its predecessor pushed the round before dying). The sync side tells, and answers
        it or puts it in the old push's place (``GlobalSide.resent_push``)."""
        why = self.policy.resent_push(self.sync_ctx, msg, slot)
        if why is None:
            return False
        self.deduped[msg.src] = self.deduped.get(msg.src, 0) + 1
        self.record("dedupe", src=msg.src, key=msg.key, part=msg.part, round=msg.version,
                    why=why)
        return True

    def _accept_merged(self, msg: Message, value: Value, count: int,
                       senders: list[str]) -> None:
        """A merged push of ``count`` local servers' sums (the transfer scheduler's overlay,
        docs/geomx-behaviour.md §4.5, aggregation step 5: recorded as that many pushes)."""
        slot = self.slots[(msg.key, msg.part)]
        assert slot.store is not None
        if not is_phantom(value) and (is_phantom(slot.store) or value.size != slot.store.size):
            raise ValueError(f"merged push of key {msg.key} part {msg.part} has "
                             f"{getattr(value, 'size', '?')} elements, not {slot.store.size}")
        if msg.meta.get("stop"):
            self._request_stop()
        self.policy.on_push(self.sync_ctx, msg, slot, value.reshape(slot.store.shape)
                            if not is_phantom(value) else value)

    def _request_stop(self) -> None:
        """A pusher carries the job's stop request (a worker reached its target): from
        which version of each (key, part) on the replies say so is the sync side's call
        (``GlobalSide.stop_version``). For a synchronous side it is the round in
        progress, which every DC finishes before it stops: a DC still a round behind
        (a longer WAN latency) must not learn of the stop from the previous round's
        replies, or it leaves while the others wait in the next round for its push
        (an FSA round, docs/geomx-behaviour.md §3.2; the shutdown, §1.4)."""
        if self.stop_requested:
            return
        self.stop_requested = True
        for where, slot in self.slots.items():
            if slot.store is not None:
                self._stop_from[where] = self.policy.stop_version(self.sync_ctx, slot)

    def contributors_of(self, msg: Message) -> list[str]:
        """Whose pushes ``msg`` carries: its sender, or a merged push's senders."""
        if MERGED_FROM_META not in msg.meta and msg.src in self._pusher_set:
            return [msg.src]  # (the common case, without the checks a merge needs)
        senders = [str(s) for s in msg.meta.get(MERGED_FROM_META, [])] \
            if MERGED_FROM_META in msg.meta else [msg.src]
        pushers = self._pusher_set
        bad = [s for s in senders if s not in pushers]
        if bad or len(set(senders)) != len(senders):
            raise ValueError(f"merged push names {senders}: each must be one of "
                             f"{sorted(self.pushers)}, once")
        return senders

    # called by the sync side (through GlobalSyncContext) -----------------------
    def accumulate(self, slot: Slot, value: Value, count: int = 1) -> None:
        if slot.merged is None:
            slot.merged = value  # decode() returned a fresh array: take it, no copy
        else:
            add_into(slot.merged, value)
        slot.count += count

    def apply_update(self, key: int, slot: Slot, grad: Value, *, sender: str | None = None,
                     completes: int | None = None) -> None:
        """The global step: optimizer update of ``store`` by ``grad``, or ``store <- grad``;
        ``completes``: the global round it completes, when not ``slot.version`` (0: none)."""
        assert slot.store is not None
        if self.optimizer is None:
            slot.store = grad
        elif not is_phantom(slot.store) and not is_phantom(grad):
            if slot.opt_state is None:
                slot.opt_state = self.optimizer.create_state(key, slot.store)
            slot.store = thaw(slot.store)  # copy-on-write: a pull reply may still send it
            self.optimizer.update(key, slot.store, grad, slot.opt_state, sender=sender)
        slot.version += 1
        if self.ckpt.enabled:
            round_ = slot.version if completes is None else completes
            if round_ > 0:
                self._round_done(round_)

    def reply_push(self, msg: Message, slot: Slot) -> None:
        sched = self.sched
        if sched is not None:
            if sched.reply_push(msg, slot.version, slot.store):
                return  # answered by the scheduler (an overlay broadcast)
            if sched.reply_carries_value(msg):
                # push/pull fusion: the acknowledgement is also the pull of the new value
                payloads, meta = self._pull_payloads(msg, slot)
                self.post(msg.answer(_PUSH_ACK, slot.version, meta, payloads))
                return
        self.post(msg.answer(_PUSH_ACK, slot.version, self._tell_codec(
            msg.src, self.reply_meta(slot.version, msg.key, msg.part,
                                     round_=self.policy.reply_round(msg, slot)))))

    def _tell_codec(self, dst: str, meta: dict[str, Any]) -> dict[str, Any]:
        """``meta``, with the master worker's codec when ``dst`` is a flat-PS worker that
        has not been told it yet."""
        return self.codec_notice.tell(dst, meta) if dst in self._pusher_set else meta

    def _on_pull(self, msg: Message) -> None:
        if self._park(msg):
            return
        if msg.src not in self._pullers:
            self.reply_error(msg, f"{msg.src} may not pull from {self.name}")
            return
        slot = self.slots.get((msg.key, msg.part))
        if slot is None and len(self.slots) >= MAX_SLOTS:
            self.reply_error(msg, f"too many keys ({MAX_SLOTS}); key {msg.key} refused")
            return
        # GeoMX polls every 100 ms; we park the pull and answer on the master's INIT
        if self._waits_for_init(msg):
            return
        self._serve_pull(msg, self.slots[(msg.key, msg.part)])

    def _serve_pull(self, msg: Message, slot: Slot) -> None:
        payloads, meta = self._pull_payloads(msg, slot)
        self.post(msg.answer(_PULL_REPLY, slot.version, meta, payloads))

    def _pull_payloads(self, msg: Message, slot: Slot) -> tuple[list[Any], dict[str, Any]]:
        """The encoded current value of a slot, for a pull (or a fused push reply)."""
        assert slot.store is not None
        if (self.optimizer is not None and self.optimizer.needs_pull_notes
                and not is_phantom(slot.store)):
            # per-sender DC-ASGD: this is the model the puller's next gradient will be from
            self.optimizer.note_pull(msg.key, msg.src, slot.store)
        # the initial pull carries weights even without an optimizer: never sparsify it
        dense = self.optimizer is not None or bool(msg.meta.get("initial"))
        # the reply sends the store itself, frozen (no snapshot copy per pull): the next
        # in-place update copies it first (apply_update's thaw), so queued replies and
        # the resend window keep the value they were given
        value = self.policy.initial_value(msg.key, msg.part, slot) \
            if msg.meta.get("initial") else slot.store
        payloads, meta = self.codec.encode_pull(msg.key, freeze(value), tier="wan",
                                                weights=dense)
        round_ = self.policy.reply_round(msg, slot)
        meta.update(self.reply_meta(slot.version, msg.key, msg.part, round_=round_))
        if self._dedupe_rounds and round_ != slot.version:
            # the puller's own round, which a local server's successor starts from
            meta["round"] = round_
        if self._hands_over:
            handover = self.policy.handover(msg.key, msg.part)
            if handover is not None:
                meta["handover"] = handover
        return payloads, self._tell_codec(msg.src, meta)

    # ------------------------------------------------------------------ checkpoints
    def reply_meta(self, version: int, key: int, part: int, *,
                   round_: int | None = None) -> dict[str, Any]:
        """What every reply of (``key``, ``part``) at slot version ``version`` carries
        besides the value, however it travels: the stop request (from the version
        :meth:`_request_stop` set for the slot on), and the checkpoint round that tells
        the tiers below to snapshot after it (geomx/node/checkpoint.py). ``round_``: the
        global round the reply belongs to (``GlobalSide.reply_round``; the slot's version
        when the side completes a round per update)."""
        stop = self.stop_requested and version >= self._stop_from.get((key, part), 0)
        meta: dict[str, Any] = {"stop": True} if stop else {}
        round_ = version if round_ is None else round_
        if self._ckpt_due.get(round_):
            meta["ckpt"] = round_
        return meta

    def is_checkpoint_round(self, round_: int) -> bool:
        """Is global round ``round_`` a checkpoint round? Decided the first time it is
        asked (by the sync side, or when a key first completes it), then kept."""
        if not self.ckpt.enabled or round_ <= 0:
            return False
        due = self._ckpt_due.get(round_)
        if due is None:
            due = self._ckpt_due[round_] = self.ckpt.due(round_, self.now())
        return due

    def _round_done(self, round_: int) -> None:
        """A key finished global round ``round_``: decide (first key) whether it is a
        checkpoint round; snapshot once every key has finished it (nothing of the next
        round can have arrived yet, see geomx/node/checkpoint.py)."""
        due = self.is_checkpoint_round(round_)
        if round_ > self._ckpt_newest:
            # rounds two behind the newest one a key finished are not asked about again
            # (a sync side may have asked ahead, about rounds not finished yet: they stay)
            self._ckpt_newest = round_
            for old in [r for r in self._ckpt_due if r < round_ - 2]:
                del self._ckpt_due[old]
            for old in [r for r in self._ckpt_reached if r < round_ - 2]:
                del self._ckpt_reached[old]
        done = self._ckpt_reached[round_] = self._ckpt_reached.get(round_, 0) + 1
        if done < ckpt.keys_in_round(round_, (s for s in self.slots.values()
                                              if s.store is not None),
                                     lambda s: s.version > 0):
            return
        del self._ckpt_reached[round_]
        if due:
            self._save_checkpoint(round_)

    def _save_checkpoint(self, round_: int) -> None:
        slots = [[k, p, s.store, s.version, s.opt_state]
                 for (k, p), s in sorted(self.slots.items()) if s.store is not None]
        state = {"slots": slots, "optimizer": ckpt.optimizer_private(self.optimizer),
                 "optimizer_config": (self.optimizer.to_config()
                                      if self.optimizer is not None else None),
                 "codec": ckpt.codec_states(self.codec), "last_t": self.ckpt.last_t,
                 "sched": ckpt.sched_state(self.sched), "sync": self.policy.state_dict()}
        path = self.ckpt.save(round_, state, {"t": self.now()})
        self.record("checkpoint", round=round_, file=path.name)

    def _restore(self) -> None:
        """Resuming: the stores, versions and codec state of the checkpoint; optimizer
        states wait for the master's set_optimizer (_restore_optimizer).

        A restored key's pulls (and flat-PS pushes) are served only once the master
        worker's INIT of it comes again (its program runs from its start), as in an
        uninterrupted run, where none is served before that INIT: the master sends its
        INITs after its configuration commands (set_optimizer, set_gradient_compression,
        acknowledged by every tier), so the first round after the checkpoint runs with
        the job's optimizer and codec installed everywhere. Answered at once, a local
        server's first push could reach this server before set_optimizer (applied as
        the new weights) or leave before set_gradient_compression reached it (sent
        dense)."""
        loaded = self.ckpt.load()
        if loaded is None:
            return
        tree, meta, arrays = loaded
        state = ckpt.unpack(tree, arrays)
        for key, part, store, version, opt_state in state["slots"]:
            self.slots[(int(key), int(part))] = Slot(store=store, version=int(version),
                                                     opt_state=opt_state)
        self._unpublished = set(self.slots)
        self._restored_opt = dict(state["optimizer"])
        ckpt.restore_codec_states(self.codec, state["codec"], self.record)
        self._restored_sched = state.get("sched")
        self._restored_sync = state.get("sync")
        if self._restored_sync is not None:
            self.policy.load_state_dict(self._restored_sync)
        self.record("restore", round=meta["round"], keys=len(self.slots))

    def _restore_optimizer(self) -> None:
        assert self.optimizer is not None
        for (key, _), slot in self.slots.items():
            if isinstance(slot.opt_state, ckpt.Deferred) or slot.opt_state is not None:
                slot.opt_state = ckpt.restore_into(
                    slot.opt_state, self.optimizer.create_state(key, slot.store))
        for name, value in self._restored_opt.items():
            setattr(self.optimizer, name, ckpt.restore_into(value, getattr(self.optimizer,
                                                                           name, None)))
        self._restored_opt = {}

    # ------------------------------------------------------------------ takeover
    def _park(self, msg: Message) -> bool:
        """While a successor gathers its state, requests wait (bounded: the job's
        members only, a few per key)."""
        if not self._awaiting or msg.src not in self._pullers:
            return False
        if len(self._parked) >= 64 * (len(self._pullers) + len(self.slots)) + 1024:
            return False
        self._parked.append(msg)
        return True

    def _load_own_snapshot(self) -> None:
        """A successor reads its predecessor's newest checkpoint file (complete checkpoint
        or not: each file is written atomically): the optimizer's configuration and
        per-key states, and the values, which the local servers' newer ones replace."""
        if self.ckpt.dir is None or not self.ckpt.dir.is_dir():
            return
        rounds = sorted((int(d.name) for d in self.ckpt.dir.iterdir() if d.name.isdigit()),
                        reverse=True)
        for r in rounds:
            path = self.ckpt.dir / str(r) / ckpt.file_name(self.name)
            try:
                meta, arrays = ckpt.read_node_file(path)
            except (OSError, ValueError):
                continue
            state = ckpt.unpack(meta.pop("state"), arrays)
            self._snapshot_state = {"round": r, **state}
            for key, part, store, version, opt_state in state["slots"]:
                self.slots[(int(key), int(part))] = Slot(store=store, version=int(version),
                                                         opt_state=opt_state)
            if state.get("sync") is not None:
                self.policy.load_state_dict(state["sync"])
            return

    def _on_takeover_value(self, msg: Message) -> None:
        """A local server's last pulled value of a (key, part), at its version: the newest
        one of all local servers is the global model (FSA: none can be ahead of it)."""
        if msg.key >= 0 and len(msg.payloads) == 1:
            slot = self.slots.setdefault((msg.key, msg.part), Slot())
            if slot.store is None or msg.version > slot.version:
                slot.store = from_payload(msg.payloads[0])
                slot.version = msg.version
                if "handover" in msg.meta:
                    self._handovers[(msg.key, msg.part)] = msg.meta["handover"]
                else:
                    self._handovers.pop((msg.key, msg.part), None)
        if msg.meta.get("last"):
            self._awaiting.discard(msg.src)
            if not self._awaiting:
                self._finish_takeover()

    def _finish_takeover(self) -> None:
        """Every local server has handed in its values: install the optimizer of the last
        snapshot with its per-key states (stale by the steps between the snapshot's version
        and the value's, for keys the dead process updated after it) and the sync side's
        state of each value taken (``GlobalSide.take_over``), then serve what waited."""
        snap = self._snapshot_state or {}
        for (key, part), handover in sorted(self._handovers.items()):
            self.policy.take_over(key, part, handover)
        self._handovers = {}
        config = snap.get("optimizer_config")
        stale: dict[str, int] = {}
        # the snapshot's version of each (key, part): its optimizer state's updates
        snap_versions = {(int(k), int(p)): int(v) for k, p, _, v, _ in snap.get("slots", ())}
        if config and self.policy.uses_optimizer:
            from geomx.optim import optimizer_from_config

            self.optimizer = optimizer_from_config(dict(config))
            for name, value in dict(snap.get("optimizer", {})).items():
                setattr(self.optimizer, name, ckpt.restore_into(
                    value, getattr(self.optimizer, name, None)))
            for (key, part), slot in self.slots.items():
                if slot.store is None or is_phantom(slot.store):
                    continue
                fresh = self.optimizer.create_state(key, slot.store)
                slot.opt_state = (ckpt.restore_into(slot.opt_state, fresh)
                                  if slot.opt_state is not None else fresh)
                behind = slot.version - snap_versions.get((key, part), int(snap.get("round", 0)))
                if behind:
                    stale[f"{key}.{part}"] = behind
        self.record("takeover_restore", snapshot=snap.get("round"),
                    versions=sorted({s.version for s in self.slots.values()}),
                    optimizer=(config or {}).get("name"), stale_steps=stale)
        parked, self._parked = self._parked, []
        for m in parked:
            self.dispatch(m)

    # ------------------------------------------------------------------ lifecycle
    @property
    def taking_over(self) -> bool:
        """This process took over the server's name (geomx/node/restart.py) from one that
        had joined the job."""
        return self._taking_over

    async def main(self) -> None:
        self.ckpt.last_t = self.now()  # a checkpoint period counts from the (re)start
        self._taking_over = self.restarted_as == "takeover"
        restored = [] if self.taking_over else sorted(
            k for k, s in self.slots.items() if s.store is not None)
        if self.taking_over:
            self._unpublished.clear()  # the job is under way: no INIT comes again
            self._restored_sched = None  # a successor's scheduler side starts afresh
            self._load_own_snapshot()
            self._awaiting = set(self.pushers)
        ckpt.restore_sched_state(self.sched, self._restored_sched)
        await register(self, self.job.global_scheduler)
        if self.taking_over and self.members_left is None:
            # its predecessor died before the job began: an ordinary start
            self._taking_over = False
            self._awaiting = set()
            parked, self._parked = self._parked, []
            for m in parked:
                self.dispatch(m)
        if self.taking_over and self._snapshot_state is None:
            raise NodeFailure(f"{self.name}: a new process took over its name, but its "
                              f"predecessor left no snapshot in {self.ckpt.dir} (it died "
                              f"before the first checkpoint: checkpoint.every); the job "
                              f"cannot go on")
        if self.sched is not None:
            for key, part in restored:  # a checkpoint set them: no INIT will
                self.sched.on_key_ready(key, part)
        if self.taking_over:
            # local servers that finished before this process started hand nothing in
            done = set(self.members_left or ()) & set(self.pushers)
            self._stopped_by |= done
            self._awaiting -= done
            if not self._awaiting:
                self._finish_takeover()
            self._finish_if_all_left()
        await self._done.wait()
        if self.sched is not None:
            await self.sched.drain()
            self.sched.on_done()
        self.record("server_done", versions=sum(s.version for s in self.slots.values()),
                    **({"applied": dict(sorted(self.applied.items())),
                        "deduped": dict(sorted(self.deduped.items()))}
                       if self._dedupe_rounds else {}))
        leave(self, self.job.global_scheduler)


def optimizer_mismatch(algorithm: Any, side: GlobalSide) -> str | None:
    """Why ``side`` cannot serve ``algorithm``'s workers, or None.

    Two flags say who runs the optimizer (geomx/policy/sync.py):
    ``SyncAlgorithm.uses_global_optimizer`` tells the workers that a pull returns
    weights, and ``GlobalSide.uses_optimizer`` tells the server to keep a plain sum.
    With the first True and the second False the workers would take the sum of the
    gradients for their weights and train nothing, silently; the job is refused instead.
    The other way round is consistent: no optimizer is sent, the server sums and the
    workers step locally.
    """
    if side.uses_optimizer or not algorithm.uses_global_optimizer:
        return None
    return (f"sync policy {algorithm.name!r}: its global side {type(side).__name__} keeps "
            "a plain sum (uses_optimizer = False), but "
            f"{type(algorithm).__name__}.uses_global_optimizer is True, so the workers "
            "would pull that sum as their weights; set uses_global_optimizer = False on "
            "the algorithm (workers then step locally with the sum), or uses_optimizer = "
            "True on the global side")
