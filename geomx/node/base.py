"""The node skeleton shared by every role: dispatch, request tracking, ordered sending.

This is ps-lite's *customer* idea in asyncio: a node owns one ``Transport``; a receive
loop hands each incoming message either to the future of the request it answers
(matched by ``request_id``) or to the handler registered for its kind. Handlers are
plain functions that update state and ``post`` replies; anything that must wait runs
as its own task. Sending goes through one outbox task per destination, so messages of
equal priority leave in the order they were posted (deterministic in the emulator, ordered
per peer on sockets), a message of higher ``priority`` overtakes queued lower ones (P3's
send queue, geomx/sched/p3.py), and a slow transport applies back-pressure to that task
rather than to the handlers.

Nothing here knows which runtime it is in.
"""

from __future__ import annotations

import asyncio
import logging
import math
from types import CoroutineType
from collections.abc import Iterable
from typing import Any, Awaitable, Callable

from geomx.node.restart import RESTART_MODES, RestartMode
from geomx.transport import NodeServices, Transport
from geomx.wire import Kind, Message
from geomx.policy.guard import PolicyFailed  # a user policy's one-line failure

log = logging.getLogger(__name__)

Handler = Callable[[Message], Any]

#: Kinds that answer a request; they resolve the requester's future when ``request_id``
#: matches an outstanding request.
#: Provisional name of a process that claims a rank before it starts (not a member of the
#: job; see geomx/runtime/rank_claim.py): answers to it are best effort.
CLAIM_PREFIX = "claim:"

REPLY_KINDS = frozenset({
    Kind.REGISTER_ACK, Kind.BARRIER_RELEASE, Kind.HEARTBEAT_ACK, Kind.COMMAND_ACK,
    Kind.INIT_ACK, Kind.PUSH_ACK, Kind.PULL_REPLY, Kind.STATE_REPLY, Kind.SCHED_REPLY,
    Kind.RELAY_ACK, Kind.PROBE_REPLY, Kind.ROUTE_PLAN, Kind.ERROR,
})


_BATCH = Kind.BATCH
_SHUTDOWN = Kind.SHUTDOWN
_ERROR = Kind.ERROR  # (module globals read faster than the enum's attributes)


class RemoteError(RuntimeError):
    """A peer answered a request with ``Kind.ERROR``."""


class NodeStopped(RuntimeError):
    """The node stopped while a request was outstanding."""


class NodeFailure(RuntimeError):
    """A node of the job died or became unreachable; the message names it."""


class Node:
    """Base of every role. Subclasses register handlers and implement ``main``."""

    role = "node"

    def __init__(self, name: str, dc: str, transport: Transport, services: NodeServices):
        self.name = name
        self.dc = dc
        self.transport = transport
        self.services = services
        self._handlers: dict[Kind, Handler] = {}
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._next_request_id = 1
        self._outboxes: dict[str, asyncio.PriorityQueue[tuple[float, int, Message | None]]] = {}
        self._outbox_seq = 0
        self._senders: dict[str, asyncio.Task[None]] = {}
        self._running = False
        self._sending: dict[str, int] = {}
        #: peers that said goodbye to us (SHUTDOWN): no waiting at teardown for messages
        #: to them that can no longer be delivered
        self.gone: set[str] = set()
        #: schedulers this node has left: no more heartbeats to them
        self.left: set[str] = set()
        #: schedulers this node has asked to register with (told if the node fails)
        self.schedulers: list[str] = []
        #: the node whose failure stopped this one, and why (its own name when the failure
        #: is its own): passed on to every scheduler so the whole job stops in seconds
        self.failed_node: str = ""
        self.failed_reason: str = ""
        self._send_nowait = transport.send_nowait
        #: while a BATCH's requests are dispatched: the peer it came from and the replies
        #: its handlers gave at once (they go back as one BATCH)
        self._collect_dst: str | None = None
        self._collected: list[Message] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        #: requests in flight as futures, not tasks (geomx/node/calls.py): cancelled with
        #: the tasks when the node stops
        self._calls: set[asyncio.Future[Any]] = set()
        self._stopping = False
        self.failure: BaseException | None = None
        #: nodes lost while the job went on ([membership] on_worker_loss = "continue")
        self.lost_members: set[str] = set()
        #: Everything this node knows of peers' addresses (merged across schedulers);
        #: the real runtime seeds it with the schedulers' addresses.
        self.address_book: dict[str, str] = {}
        #: Liveness (set from the job's [membership]); 0 = no heartbeats.
        self.heartbeat_interval_s = 0.0
        self.heartbeat_timeout_s = 0.0
        self.register_timeout_s = 0.0
        #: set when this process claimed its name at start-up (started without a rank):
        #: carried in its registration so nobody else can take the name
        self.claim_token = ""
        #: Default bound on a request's reply (0 = none): a lost reply fails the node by
        #: name instead of hanging it (``[membership] request_timeout``).
        self.request_timeout_s = 0.0
        #: ``(start_s, end_s, factor)``: compute started in [start, end) takes factor x as
        #: long (``[[fault]] kind = "slow"``: a straggler for a while, in both runtimes)
        self.slow_periods: tuple[tuple[float, float, float], ...] = ()
        #: servers another process may take over ([membership] on_server_loss = "wait"):
        #: requests to them are kept until answered and sent again to the successor
        #: (ps-lite's resender, across a process's death rather than a connection's)
        self.replaceable_peers: set[str] = set()
        self._resendable: dict[int, Message] = {}
        #: how this process joined the job: None with the job, or in place of one the job
        #: lost (geomx/node/restart.py); set once, before it runs, by :meth:`restart_as`
        self._restarted_as: RestartMode | None = None
        #: a process that took over a server: the members that had finished when it
        #: registered (None: its registration came back without that list)
        self._members_left: frozenset[str] | None = None
        self.on(Kind.NODE_FAILED, self._on_node_failed)
        self.on(Kind.NODE_REJOINED, self._on_node_rejoined)

    # ---------------------------------------------------------------- restart
    @property
    def restarted_as(self) -> RestartMode | None:
        """``"rejoin"`` or ``"takeover"`` when this process replaces one the job lost
        (geomx/node/restart.py), None when it started with the job."""
        return self._restarted_as

    def restart_as(self, mode: RestartMode) -> None:
        """Declare, before the node runs, that this process replaces one the job lost.
        :func:`geomx.node.restart.restart_node` checks first that the job allows it."""
        if mode not in RESTART_MODES:
            raise ValueError(f"restart mode {mode!r}; allowed: {', '.join(RESTART_MODES)}")
        if self._running:
            raise RuntimeError(f"{self.name}: restart_as() after the node started")
        self._restarted_as = mode

    @property
    def members_left(self) -> frozenset[str] | None:
        """The members that had finished when this process registered to take over a
        server (geomx/node/scheduler.py), or None when the scheduler sent no such list
        (the process's predecessor died before the job began)."""
        return self._members_left

    def note_members_left(self, members: Iterable[str]) -> None:
        """The scheduler's registration reply lists the members already done (a takeover)."""
        self._members_left = frozenset(str(m) for m in members)

    # ---------------------------------------------------------------- plumbing
    def on(self, kind: Kind, handler: Handler) -> None:
        self._handlers[kind] = handler

    def learn_addresses(self, book: dict[str, str]) -> None:
        """Add peers' addresses to what this node knows and hand them to its transport
        (which refuses a malformed one with ValueError, leaving both unchanged)."""
        self.transport.set_address_book({**self.address_book, **book})
        self.address_book.update(book)

    def record(self, ev: str, **fields: Any) -> None:
        self.services.record(ev, self.name, **fields)

    def now(self) -> float:
        return self.services.now()

    def compute_factor(self) -> float:
        """How many times slower compute starting now is (1 outside ``slow`` faults)."""
        factor = 1.0
        if self.slow_periods:
            t = self.now()
            for start, end, f in self.slow_periods:
                if start <= t < end:
                    factor *= f
        return factor

    def post(self, msg: Message) -> None:
        """Queue ``msg`` for sending without waiting.

        One outbox per destination, each drained by its own task: messages to a peer
        leave highest ``priority`` first and in the order they were posted among equal
        priorities, and a slow or dead peer (a transport still retrying its connection)
        holds up only its own queue, never heartbeats or replies to anybody else.
        """
        assert self._running, "node not running"
        dst = msg.dst
        if dst == self._collect_dst and msg.kind in REPLY_KINDS and msg.reliable:
            self._collected.append(msg)
            return
        q = self._outboxes.get(dst)
        if (q is None or q.empty()) and not self._sending.get(dst):
            # nothing queued or in flight for this peer: hand it over directly (same order)
            if self._send_nowait(msg):
                self.services.count_bytes(msg)
                return
        if q is None:
            q = self._outboxes[dst] = asyncio.PriorityQueue()
            self._senders[dst] = self.spawn(self._send_loop(q))
        self._outbox_seq += 1
        q.put_nowait((-msg.priority, self._outbox_seq, msg))

    async def request(self, msg: Message, *, timeout_s: float | None = None,
                      sink: Any = None) -> Message:
        """Send ``msg`` with a fresh request id and wait for its reply.

        ``sink``: an array the reply's one dense payload may be received straight into,
        when the transport takes it (``Transport.receive_into``); the reply's payload is
        then a view of ``sink``.

        ``timeout_s=None`` applies the node's ``request_timeout_s``: past it the node fails
        with a :class:`NodeFailure` naming the peer and the request (a reply that cannot
        come must not hang the job). An explicit ``timeout_s`` raises
        :class:`asyncio.TimeoutError` to the caller instead; ``math.inf`` waits forever.
        """
        fut, into = self.open_request(msg, sink)
        rid = msg.request_id
        self.post(msg)
        bound = timeout_s
        if bound is None and self.request_timeout_s > 0:
            bound = self.request_timeout_s
        timer = None
        if bound is not None and bound != math.inf:
            # a timer that fails the future, rather than asyncio.wait_for: the reply then
            # wakes this task directly, one loop turn sooner and two callbacks fewer
            timer = asyncio.get_running_loop().call_later(bound, expire_reply, fut)
        try:
            try:
                reply = await fut
            except asyncio.TimeoutError:
                if timeout_s is not None:
                    raise
                raise no_reply(self.name, msg, bound) from None
        finally:
            if timer is not None:
                timer.cancel()
            self.close_request(rid, into)
        if reply.kind == _ERROR:
            raise refused(msg, reply)
        return reply

    def open_request(self, msg: Message, sink: Any) -> tuple[asyncio.Future[Message], bool]:
        """Give ``msg`` a fresh request id and register the future its reply resolves, its
        copy to resend to a server's successor, and ``sink`` for a dense reply when the
        transport takes it (whether it did is the second value); :meth:`close_request`
        undoes it. :meth:`request` is built on it, and so are the task-less calls of
        geomx/node/calls.py."""
        rid = self._next_request_id
        self._next_request_id += 1
        msg.request_id = rid
        fut: asyncio.Future[Message] = (self._loop or asyncio.get_running_loop()).create_future()
        self._pending[rid] = fut
        if msg.dst in self.replaceable_peers:
            self._resendable[rid] = msg
        into = sink is not None and self.transport.receive_into(msg.dst, rid, sink)
        return fut, into

    def close_request(self, rid: int, into: bool) -> None:
        """The request ``rid`` is over (answered, failed or abandoned): forget it."""
        self._pending.pop(rid, None)
        self._resendable.pop(rid, None)
        if into:
            self.transport.forget_receive(rid)

    async def request_many(self, msgs: list[Message]) -> list[Message]:
        """:meth:`request` for many messages, those to one peer sent as one BATCH.

        The replies come back in order; a peer answers the requests its handlers can
        answer at once in one BATCH too (see :meth:`dispatch`). Like ps-lite, which sends
        a worker's list of keys to a server as one message rather than one per key.
        """
        by_dst: dict[str, list[Message]] = {}
        for m in msgs:
            by_dst.setdefault(m.dst, []).append(m)
        if all(len(group) == 1 for group in by_dst.values()):
            return list(await asyncio.gather(*(self.request(m) for m in msgs)))
        futs = [self.open_request(m, None)[0] for m in msgs]
        for dst, group in by_dst.items():
            self.post(group[0] if len(group) == 1 else
                      Message(Kind.BATCH, self.name, dst, priority=max(m.priority for m in group),
                              batch=group))
        try:
            if self.request_timeout_s > 0:
                try:
                    replies = await asyncio.wait_for(asyncio.gather(*futs), self.request_timeout_s)
                except asyncio.TimeoutError:
                    late = next(m for m, f in zip(msgs, futs) if not f.done())
                    raise no_reply(self.name, late, self.request_timeout_s) from None
            else:
                replies = await asyncio.gather(*futs)
        finally:
            for m in msgs:
                self.close_request(m.request_id, False)
        for m, reply in zip(msgs, replies):
            if reply.kind == Kind.ERROR:
                raise refused(m, reply)
        return list(replies)

    def spawn(self, coro: Awaitable[Any], name: str = "") -> asyncio.Task[Any]:
        """Run ``coro`` as a task owned by this node; a crash stops the node with the error."""
        if type(coro) is CoroutineType:  # ensure_future's answer, without its checks
            task = (self._loop or asyncio.get_running_loop()).create_task(coro)
        else:
            task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self.set_failure(exc):
            if isinstance(exc, PolicyFailed):
                # one line that says where the policy raised; the job's failure (the
                # emulator's, or node_main's over sockets) prints it, so only debug here
                log.debug("%s: task failed: %s", self.name, exc)
            else:
                log.error("%s: task failed: %r", self.name, exc, exc_info=exc)
            self.stop()

    def set_failure(self, exc: BaseException) -> bool:
        """Make ``exc`` the failure this node stops with, unless it is the node stopping
        (:func:`caused_by_stop`) or the node has already failed; whether it did. The
        caller logs it and stops the node."""
        if caused_by_stop(exc) or self.failure is not None:
            return False
        self.failure = exc
        return True

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop this node runs in (the running loop, before :meth:`run` starts)."""
        return self._loop or asyncio.get_running_loop()

    def track_call(self, call: asyncio.Future[Any]) -> None:
        """``call`` is a request in flight as a future, not a task (geomx/node/calls.py):
        cancelled with the node's tasks when the node stops, unless :meth:`untrack_call`
        says it is over first."""
        self._calls.add(call)

    def untrack_call(self, call: asyncio.Future[Any]) -> None:
        self._calls.discard(call)

    def reply_error(self, msg: Message, reason: str) -> None:
        """Answer a bad request with ERROR (and log it) instead of crashing."""
        log.warning("%s: rejecting %s from %s: %s", self.name, msg.kind.name, msg.src, reason)
        self.record("reject", src=msg.src, msg=msg.kind.name, key=msg.key, reason=reason)
        if msg.request_id:
            self.post(msg.reply(Kind.ERROR, meta={"reason": reason}, payloads=[]))

    # ---------------------------------------------------------------- lifecycle
    async def _send_loop(self,
                         outbox: asyncio.PriorityQueue[tuple[float, int, Message | None]]) -> None:
        while True:
            _, _, msg = await outbox.get()
            if msg is None:
                return
            self.services.count_bytes(msg)
            self._sending[msg.dst] = self._sending.get(msg.dst, 0) + 1
            try:
                await self.transport.send(msg)
            except (ConnectionError, OSError) as e:
                self.record("send_failed", dst=msg.dst, msg=msg.kind.name, reason=str(e))
                if msg.dst.startswith(CLAIM_PREFIX):
                    # a process claiming a rank, not a member: nobody in the job waits on
                    # this answer, and a stranger's bad address must not stop the node
                    log.info("%s: did not answer %s: %s", self.name, msg.dst[:80], e)
                    continue
                if self._stopping or msg.dst in self.gone:
                    # leaving, or the peer said goodbye: nobody waits for this message
                    log.info("%s: did not send %s to %s (%s): %s", self.name, msg.kind.name,
                             msg.dst, "leaving" if self._stopping else "it left", e)
                    continue
                # A message that cannot be delivered is never dropped silently: the peer
                # (or whoever waits on it) would hang. Fail by name; the membership layer
                # tells the rest of the job.
                raise NodeFailure(f"{self.name}: could not deliver {msg.kind.name} to "
                                  f"{msg.dst}: {e}") from None
            finally:
                self._sending[msg.dst] -= 1
                # hold no sent message while waiting for the next: its arrays go back to
                # their buffer pools (push snapshots, the server's receive buffers) only
                # once nothing references them
                msg = None

    async def _recv_loop(self) -> None:
        # the transport calls dispatch where a ``dispatch(await recv())`` loop would
        # (Transport.listen); the emulator's and the TCP transport's do it with no task
        # switch per wake-up
        await self.transport.listen(self.dispatch)

    def dispatch(self, msg: Message) -> None:
        kind = msg.kind
        if kind in REPLY_KINDS:
            fut = self._pending.pop(msg.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            elif fut is None:
                # late (its request timed out or was cancelled) or stray: never answer a
                # reply, or two nodes could bounce ERRORs at each other forever
                self.record("late_reply", src=msg.src, msg=msg.kind.name,
                            request_id=msg.request_id)
            return
        if kind == _BATCH:
            self._dispatch_batch(msg)
            return
        if kind == _SHUTDOWN:
            self.gone.add(msg.src)
        handler = self._handlers.get(kind)
        if handler is None:
            self.reply_error(msg, f"{self.role} does not handle {msg.kind.name}")
            return
        try:
            handler(msg)
        except PolicyFailed as e:  # a policy's bug, not a bad request: the node stops
            if self.set_failure(e):
                # the job's failure line names the node and the policy (see _task_done)
                log.debug("%s: handler for %s failed: %s", self.name, msg.kind.name, e)
                self.stop()
        except Exception as e:  # a bad request must not take the node down
            log.exception("%s: handler for %s failed", self.name, msg.kind.name)
            self.reply_error(msg, f"{type(e).__name__}: {e}")

    def _dispatch_batch(self, msg: Message) -> None:
        """Each message of a BATCH as if it came alone; the replies given at once go back
        as one BATCH (those given later, e.g. a pull waiting for its round, go alone)."""
        outer = self._collect_dst, self._collected
        self._collect_dst, self._collected = msg.src, []
        try:
            for sub in msg.batch or ():
                self.dispatch(sub)
        finally:
            replies = self._collected
            self._collect_dst, self._collected = outer
        if len(replies) == 1:
            self.post(replies[0])
        elif replies:
            self.post(Message(Kind.BATCH, self.name, msg.src, batch=replies))

    def _on_node_failed(self, msg: Message) -> None:
        """A scheduler says a node died: stop with an error naming it -- or, when the job
        survives that node (``meta.continue``, [membership] on_worker_loss), go on."""
        if msg.meta.get("continue") and msg.src in self.schedulers:
            node = str(msg.meta.get("node", "?"))
            self.lost_members.add(node)
            self.gone.add(node)  # nothing more to deliver to it, nor to wait for at the end
            self.record("member_lost", lost=node, by=msg.src)
            self.on_member_lost(node)
            return
        if self.failure is None:
            self.failed_node = str(msg.meta.get("node", "?"))
            self.failed_reason = str(msg.meta.get("reason", "no reason given"))
            self.failure = NodeFailure(f"node {msg.meta.get('node', '?')} failed: "
                                       f"{msg.meta.get('reason', 'no reason given')} "
                                       f"(reported by {msg.src})")
            self.record("node_failed", failed=msg.meta.get("node"), by=msg.src)
        self.stop()

    def _on_node_rejoined(self, msg: Message) -> None:
        """A scheduler says a lost node is back (at a new address, perhaps)."""
        node = str(msg.meta.get("node", ""))
        if msg.meta.get("takeover") and msg.src in self.schedulers:
            self._on_server_replaced(node, str(msg.meta.get("address", "")))
            return
        if msg.src not in self.schedulers or node not in self.lost_members:
            return
        address = str(msg.meta.get("address", ""))
        if address:
            self.learn_addresses({node: address})
        self.lost_members.discard(node)
        self.gone.discard(node)
        self.record("member_rejoined", member=node, by=msg.src)
        self.on_member_rejoined(node)

    def on_member_rejoined(self, node: str) -> None:
        """A lost node is back; nothing to do by default."""

    def _on_server_replaced(self, node: str, address: str) -> None:
        """A new process took over server ``node`` ([membership] on_server_loss = "wait"):
        whatever this node asked of its predecessor and got no answer for is sent again,
        in the order first sent, with the same request ids (the successor drops what it
        already has, by FSA round; an answer to either copy settles the request)."""
        if address:
            self.learn_addresses({node: address})
        self.gone.discard(node)
        again = [m for _, m in sorted(self._resendable.items()) if m.dst == node]
        self.record("server_replaced", server=node, resent=len(again))
        if node not in self.replaceable_peers:
            return
        self.before_resend(node)
        for m in again:
            self.post(m)

    def before_resend(self, server: str) -> None:
        """Called when ``server`` was taken over, before the unanswered requests go to it
        again (a worker declares its keys first); nothing by default."""

    def on_member_lost(self, node: str) -> None:
        """A node this one may wait for is gone for good and the job goes on (a local
        server stops counting the worker); nothing to do by default."""

    async def heartbeat(self, scheduler: str) -> None:
        """Heartbeat ``scheduler`` until the node stops; fail if it stops answering."""
        if self.heartbeat_interval_s <= 0:
            return
        while not self._stopping:
            await asyncio.sleep(self.heartbeat_interval_s)
            if self._stopping or scheduler in self.left or scheduler in self.gone:
                return
            try:
                # channel 7: its own connection, never queued behind bulk data
                await self.request(Message(Kind.HEARTBEAT, self.name, scheduler, channel=7),
                                   timeout_s=self.heartbeat_timeout_s)
            except asyncio.TimeoutError:
                if self._stopping:
                    return  # leaving: the scheduler no longer answers us
                raise NodeFailure(f"scheduler {scheduler} did not answer heartbeats for "
                                  f"{self.heartbeat_timeout_s:g} s") from None

    def _tell_schedulers_of_failure(self) -> None:
        """A failing node tells every scheduler it registered with (or tried to) which node
        failed and why, so each stops its members now instead of after a heartbeat timeout
        (ps-lite would only notice the missing heartbeats; a cascade of those takes one
        timeout per tier). Best effort: posted before the outboxes are flushed."""
        node = self.failed_node or self.name
        reason = self.failed_reason or f"{type(self.failure).__name__}: {self.failure}"
        for sch in self.schedulers:
            if sch in self.left or sch in self.gone or sch == self.name:
                continue
            try:
                self.post(Message(Kind.NODE_FAILED, self.name, sch,
                                  meta={"node": node, "reason": reason}))
            except Exception:  # the node is failing already: never mask its error
                log.debug("%s: could not tell %s of the failure", self.name, sch, exc_info=True)

    def stop(self) -> None:
        """Ask ``run`` to finish (idempotent)."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()

    _stop_event: asyncio.Event | None = None
    #: the loop ``run`` runs in, read instead of ``asyncio.get_running_loop()`` (a getpid()
    #: system call each time) by the per-message paths while the node runs
    _loop: asyncio.AbstractEventLoop | None = None

    async def main(self) -> None:
        """The role's own work; the node stops when it returns."""
        raise NotImplementedError

    async def run(self) -> None:
        """Serve until ``main`` returns or ``stop`` is called; re-raise a task failure."""
        self._loop = asyncio.get_running_loop()
        self._running = True
        self._stop_event = asyncio.Event()
        if self._stopping:  # stop() came first (an abort before the node started): honour it
            self._stop_event.set()
        receiver = self.spawn(self._recv_loop())
        main = self.spawn(self.main(), "main")
        stopper = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._stopping = True  # no more heartbeats: the node is leaving
            if self.failure is not None:
                self._tell_schedulers_of_failure()
            # flush what was posted, then tear down
            for q in self._outboxes.values():
                self._outbox_seq += 1
                q.put_nowait((math.inf, self._outbox_seq, None))  # after everything queued
            senders = [t for dst, t in self._senders.items() if dst not in self.gone]
            if senders:
                # a failed job may have a dead peer in an outbox: do not wait on it long
                # (control messages only by now: data rounds end before anyone stops)
                await asyncio.wait(senders, timeout=2.0 if self.failure is not None else 10.0)
            senders = list(self._senders.values())
            for t in (receiver, stopper, *senders, *self._tasks):
                t.cancel()
            for call in list(self._calls):
                call.cancel()
            self._calls.clear()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(NodeStopped(self.name))
                    fut.exception()  # mark retrieved
            await asyncio.gather(receiver, stopper, *senders, *list(self._tasks),
                                 return_exceptions=True)
            self._running = False
            self._loop = None
        if self.failure is not None:
            raise self.failure


def caused_by_stop(exc: BaseException) -> bool:
    """Whether ``exc`` is the node being stopped, directly or through what it caused (a
    kvstore call failing because its node was stopped is not a second failure to log
    with a traceback)."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, NodeStopped):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def no_reply(node: str, msg: Message, bound_s: float) -> NodeFailure:
    """The failure of a request ``msg`` that ``node`` sent and got no reply to in time."""
    what = msg.kind.name + (f" key={msg.key}" if msg.key >= 0 else "")
    return NodeFailure(f"{node}: no reply from {msg.dst} to {what} within {bound_s:g} s "
                       f"(membership.request_timeout)")


def refused(msg: Message, reply: Message) -> RemoteError:
    """The error of a request ``msg`` its peer answered with ERROR ``reply``."""
    return RemoteError(f"{reply.src} refused {msg.kind.name} key={msg.key}: "
                       f"{reply.meta.get('reason', '?')}")


def expire_reply(fut: asyncio.Future[Any]) -> None:
    """A request's timer: fail its reply future (a reply that came first wins)."""
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())
