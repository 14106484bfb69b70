"""Scheduler role and the member side of the rendezvous (docs/geomx-behaviour.md §1.4).

A scheduler waits for every expected member to ``REGISTER`` (with the address it listens
on), then answers each with the full address book. Barriers are counted per group name;
when a group is complete every member is released. Members ``SHUTDOWN`` (leave) when
they are done; the scheduler ends when all have left.

Differences from ps-lite, on purpose: node names and ranks come from the scenario, so
they are stable across runs (ps-lite's sort makes ranks effectively random); barrier
groups are named, so the local and global tiers cannot be confused.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from geomx.node.base import CLAIM_PREFIX, Node, NodeFailure
from geomx.policy.scheduling import SchedCoordinatorSide
from geomx.wire import Kind, Message

log = logging.getLogger(__name__)


#: Open barrier groups a scheduler keeps at most (bad input cannot grow it further).
MAX_OPEN_BARRIERS = 4096


class Scheduler(Node):
    role = "scheduler"

    def __init__(self, name: str, dc: str, transport: Any, services: Any, members: list[str],
                 *, heartbeat_timeout_s: float = 0.0, register_timeout_s: float = 0.0,
                 losable: set[str] | None = None, replaceable: set[str] | None = None,
                 replace_timeout_s: float = 0.0):
        super().__init__(name, dc, transport, services)
        self.members = list(members)
        #: servers another process may take over ([membership] on_server_loss = "wait"),
        #: those lost now (name -> when), and how long the job waits for each
        self.replaceable = set(replaceable or ()) & set(self.members)
        self.down: dict[str, float] = {}
        self.replace_timeout_s = replace_timeout_s
        #: members whose death the job survives ([membership] on_worker_loss = "continue"),
        #: and those lost so far
        self.losable = set(losable or ()) & set(self.members)
        self.lost: list[str] = []
        self.addresses: dict[str, str] = {}
        self._register_requests: dict[str, Message] = {}
        self._barriers: dict[str, list[Message]] = {}
        self._barrier_size: dict[str, int] = {}
        self._left: set[str] = set()
        self._all_left = asyncio.Event()
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.register_timeout_s = register_timeout_s
        self.last_seen: dict[str, float] = {}
        self.dead: str | None = None
        self.registered = False
        #: member -> token of the process that claimed that name (rank claims, see
        #: geomx/runtime/rank_claim.py); at most one entry per member
        self._claims: dict[str, str] = {}
        self._claimants: set[str] = set()
        self._max_claimants = 2 * len(self.members) + 8
        self.on(Kind.REGISTER, self._on_register)
        self.on(Kind.BARRIER, self._on_barrier)
        self.on(Kind.SHUTDOWN, self._on_leave)
        self.on(Kind.HEARTBEAT, self._on_heartbeat)
        self.on(Kind.NODE_FAILED, self._on_member_failed)
        #: the transfer schedulers' coordinators on this node that hear of replaced
        #: members (geomx/node/sched_context.py)
        self.coordinators: list[SchedCoordinatorSide] = []

    def _on_register(self, msg: Message) -> None:
        claim = msg.meta.get("claim")
        if claim is not None:
            self._on_claim(msg, str(claim)[:64])
            return
        if msg.src not in self.members:
            self.reply_error(msg, f"{msg.src} is not a member of {self.name}")
            return
        holder = self._claims.get(msg.src)
        if holder is not None and msg.meta.get("claim_token") != holder:
            self.reply_error(msg, f"{msg.src} was claimed by another process that started "
                                  "without a rank; give this one a free rank, or none")
            return
        if msg.src in self.losable and self.registered and msg.src not in self._left:
            # a live member registers again: its process restarted (``geomx node
            # --rejoin``) before its silence was noticed; the old one is gone
            self.lose(msg.src, "it registered again (restarted)")
        if msg.src in self.lost and self.registered:
            self._rejoin(msg)
            return
        if msg.src in self.replaceable and self.registered and msg.src not in self._left:
            self._take_over(msg)
            return
        self.addresses[msg.src] = str(msg.meta.get("address", ""))
        self._register_requests[msg.src] = msg
        self.down.pop(msg.src, None)  # died before the job started; a successor is here
        if self.addresses[msg.src]:
            # members heartbeat while they wait for the others: answer them (an address
            # is only ever installed, never used to reach a stranger)
            self.learn_addresses({msg.src: self.addresses[msg.src]})
        self.last_seen[msg.src] = self.now()
        self.record("register", member=msg.src)
        if len(self._register_requests) == len(self.members):
            # heartbeats start when members get the book: their clocks start now, not
            # at each one's registration (a slow starter must not get an early member
            # declared dead)
            self.registered = True
            now = self.now()
            for m in self.members:
                self.last_seen[m] = now
            book = dict(self.addresses)
            book[self.name] = self.transport.local_address()
            self.learn_addresses(book)
            for m in self.members:
                req = self._register_requests[m]
                self.post(req.reply(Kind.REGISTER_ACK, meta={"book": book}))

    def _on_claim(self, msg: Message, token: str) -> None:
        """A process started without a rank asks, under a provisional ``claim:TOKEN``
        name, for the first free member name of a kind (``meta["kind"]``: ``w:DC:`` or
        ``gs:``), as ps-lite numbers nodes in registration order. The name is reserved
        for the token: the node's own registration must carry it."""
        if not msg.src.startswith(CLAIM_PREFIX) or len(self._claimants) >= self._max_claimants:
            self.record("reject", src=msg.src[:100], msg="REGISTER", reason="claim refused")
            return  # a stranger flooding claims gets nothing, and cannot grow our book
        kind = str(msg.meta.get("kind", ""))
        address = str(msg.meta.get("address", ""))[:300]
        if not address:
            return  # nowhere to answer
        try:  # to answer the claimant (at most _max_claimants of them)
            self.learn_addresses({msg.src: address})
        except ValueError:  # not host:port
            return
        self._claimants.add(msg.src)
        granted = [m for m, t in self._claims.items() if t == token]
        free = [m for m in self.members if kind.endswith(":") and m.startswith(kind)
                and m not in self._register_requests and m not in self._claims]
        if granted or free:
            name = granted[0] if granted else free[0]
            self._claims[name] = token
            self.record("rank_claimed", member=name)
            self.post(msg.reply(Kind.REGISTER_ACK, meta={"claimed": name, "token": token}))
        else:
            self.reply_error(msg, f"no free {kind or '?'}* name at {self.name} (members: "
                                  f"{', '.join(self.members)})")

    def _on_barrier(self, msg: Message) -> None:
        group = str(msg.meta.get("group", ""))
        try:
            size = int(msg.meta.get("size", 0))
        except (TypeError, ValueError):
            size = 0
        if msg.src not in self.members:
            self.reply_error(msg, f"{msg.src} is not a member of {self.name}")
            return
        if not 1 <= size <= len(self.members) or not group:
            self.reply_error(msg, f"barrier needs a group name and 1 <= size <= "
                                  f"{len(self.members)}")
            return
        waiting = self._barriers.get(group)
        if waiting is None:
            if len(self._barriers) >= MAX_OPEN_BARRIERS:
                self.reply_error(msg, f"too many open barriers ({MAX_OPEN_BARRIERS})")
                return
            waiting = self._barriers[group] = []
            self._barrier_size[group] = size
        elif size != self._barrier_size[group]:
            self.reply_error(msg, f"barrier {group!r} has size {self._barrier_size[group]}, "
                                  f"not {size}")
            return
        if any(m.src == msg.src for m in waiting):
            self.reply_error(msg, f"{msg.src} is already waiting at barrier {group!r}")
            return
        waiting.append(msg)
        size = self._barrier_size[group]
        self._release_if_complete(group)

    def _release_if_complete(self, group: str) -> None:
        """Release a barrier once its members are in; lost members are not waited for."""
        waiting = self._barriers[group]
        size = self._barrier_size[group]
        if len(waiting) >= size - len(self.lost):
            del self._barriers[group]
            del self._barrier_size[group]
            self.record("barrier", group=group, size=size)
            for req in waiting:
                self.post(req.reply(Kind.BARRIER_RELEASE))

    def _on_heartbeat(self, msg: Message) -> None:
        if msg.src in self._left:
            return  # it is shutting down: an answer could only chase a closed socket
        self.last_seen[msg.src] = self.now()
        if msg.request_id:
            self.post(msg.reply(Kind.HEARTBEAT_ACK))

    def _on_leave(self, msg: Message) -> None:
        self._left.add(msg.src)
        if set(self.members) <= self._left:
            self._all_left.set()

    def _on_member_failed(self, msg: Message) -> None:
        """A member stopped on a failure (its own, or one it heard of from another
        scheduler): stop every member now."""
        if msg.src not in self.members or self.dead is not None:
            return
        node = str(msg.meta.get("node", msg.src))[:200]
        reason = str(msg.meta.get("reason", "no reason given"))[:2000]
        self.declare_dead(node, reason, reported_by=msg.src)

    def declare_dead(self, node: str, reason: str, *, reported_by: str = "",
                     wait: bool = True) -> None:
        """Tell every live member that ``node`` died, then stop with that error (or, for a
        worker the job survives, go on without it: :meth:`lose`)."""
        if self.dead is not None:
            return  # the job is failing already
        if node in self.losable and not reported_by and self.registered:
            self.lose(node, reason)  # (one that never registered still fails the job)
            return
        if node in self.replaceable and wait and not reported_by and self.registered \
                and node not in self.down:
            self._server_down(node, reason)
            return
        self.dead = node
        if reported_by:
            reason = f"{reason} (reported by {reported_by})"
        self.record("node_failed", failed=node, reason=reason)
        log.error("%s: node %s failed: %s", self.name, node, reason)
        for m in self.members:
            if m != node and m not in self._left and m in self.addresses:
                self.post(Message(Kind.NODE_FAILED, self.name, m,
                                  meta={"node": node, "reason": reason}))
        self.failure = NodeFailure(f"node {node} failed: {reason}")
        self.stop()

    def lose(self, node: str, reason: str) -> None:
        """``node`` died and the job goes on: tell the live members (NODE_FAILED with
        ``continue``: a local server stops waiting for it), count it as gone for the
        barriers and for the end of the job."""
        if node in self.lost or node in self._left:
            return
        self.lost.append(node)
        self._left.add(node)
        self.record("worker_lost", lost=node, reason=reason)
        log.warning("%s: %s lost (%s); the job continues without it", self.name, node, reason)
        for m in self.members:
            if m != node and m not in self._left and m in self.addresses:
                self.post(Message(Kind.NODE_FAILED, self.name, m,
                                  meta={"node": node, "reason": reason, "continue": True}))
        for group in list(self._barriers):
            self._barriers[group] = [w for w in self._barriers[group] if w.src != node]
            self._release_if_complete(group)
        if set(self.members) <= self._left:
            self._all_left.set()

    def _rejoin(self, msg: Message) -> None:
        """A lost worker registers again (``geomx node --rejoin``): it gets the book, the
        barriers count it again, and the live members learn where it now listens."""
        node = msg.src
        self.lost.remove(node)
        self._left.discard(node)
        self.addresses[node] = str(msg.meta.get("address", ""))
        if self.addresses[node]:
            self.learn_addresses({node: self.addresses[node]})
        self.last_seen[node] = self.now()
        self.record("worker_rejoined", member=node)
        log.warning("%s: %s rejoined", self.name, node)
        book = dict(self.addresses)
        book[self.name] = self.transport.local_address()
        self.post(msg.reply(Kind.REGISTER_ACK, meta={"book": book}))
        for m in self.members:
            if m != node and m not in self._left and m in self.addresses:
                self.post(Message(Kind.NODE_REJOINED, self.name, m,
                                  meta={"node": node, "address": self.addresses[node]}))

    def member_died(self, node: str, reason: str) -> None:
        """The process of ``node`` died, as the launcher that started it saw (a node killed
        before it registered is otherwise indistinguishable from a slow starter; see
        :mod:`geomx.runtime.launcher`). Once the book is out, heartbeats decide, as they do
        on any host. Before, a server the job waits for starts its
        ``server_loss_timeout`` now (a process that registers under its name in time lets
        the job start); any other member fails the job at once, by name."""
        if self.registered or self.dead is not None or node not in self.members \
                or node in self._left:
            return
        self._register_requests.pop(node, None)  # the book must wait for its successor
        reason = f"its process {reason} before the job started"
        if node in self.replaceable:
            if node not in self.down:
                self._server_down(node, reason)
            return
        self.declare_dead(node, reason)

    def _server_down(self, node: str, reason: str) -> None:
        """A server the job can wait for is lost: hold (its peers' requests stay parked
        with them) until a new process takes over its name, or fail naming it after
        ``replace_timeout_s``."""
        self.down[node] = self.now()
        self.record("server_lost", lost=node, reason=reason,
                    timeout_s=self.replace_timeout_s)
        log.warning("%s: server %s lost (%s); waiting up to %g s for it to come back",
                    self.name, node, reason, self.replace_timeout_s)
        self.spawn(self._server_deadline(node, self.down[node]))

    async def _server_deadline(self, node: str, since: float) -> None:
        await asyncio.sleep(self.replace_timeout_s)
        if self.down.get(node) == since:
            del self.down[node]
            self.declare_dead(node, f"lost at {since:.2f} s and not taken over within "
                                    f"membership.server_loss_timeout = "
                                    f"{self.replace_timeout_s:g} s", wait=False)

    def _take_over(self, msg: Message) -> None:
        """A new process registers under a server's name (ps-lite's id takeover): it gets
        the book, and the members learn where it listens and resend what its predecessor
        left unanswered (base.Node._on_server_replaced)."""
        node = msg.src
        lost_since = self.down.pop(node, None)
        self.addresses[node] = str(msg.meta.get("address", ""))
        if self.addresses[node]:
            self.learn_addresses({node: self.addresses[node]})
        self.last_seen[node] = self.now()
        self.record("server_takeover", member=node,
                    down_s=(self.now() - lost_since) if lost_since is not None else None)
        for c in self.coordinators:
            c.on_member_replaced(node)  # before the members hear of it
        log.warning("%s: %s taken over by a new process", self.name, node)
        book = dict(self.addresses)
        book[self.name] = self.transport.local_address()
        # members that finished already cannot resend anything: the successor must not
        # wait for them
        self.post(msg.reply(Kind.REGISTER_ACK, meta={"book": book,
                                                     "left": sorted(self._left)}))
        for m in self.members:
            if m != node and m not in self._left and m in self.addresses:
                self.post(Message(Kind.NODE_REJOINED, self.name, m,
                                  meta={"node": node, "address": self.addresses[node],
                                        "takeover": True}))

    async def _watch(self) -> None:
        """Declare a member dead when it misses heartbeats or never registers."""
        t0 = self.now()
        period = max(self.heartbeat_timeout_s / 4, 0.05) if self.heartbeat_timeout_s > 0 else 1.0
        while not self._all_left.is_set():
            await asyncio.sleep(period)
            now = self.now()
            if self.register_timeout_s > 0 and len(self._register_requests) < len(self.members) \
                    and now - t0 > self.register_timeout_s:
                missing = sorted(set(self.members) - set(self._register_requests))
                self.declare_dead(missing[0], f"did not register within "
                                              f"{self.register_timeout_s:g} s (missing: "
                                              f"{', '.join(missing)})")
                return
            if self.heartbeat_timeout_s > 0:
                # before the book is out, the members that registered heartbeat while they
                # wait: one that dies then is found as quickly as one that dies later
                watched = self.members if self.registered else list(self._register_requests)
                for m in watched:
                    seen = self.last_seen.get(m)
                    if seen is not None and m not in self._left and m not in self.down \
                            and now - seen > self.heartbeat_timeout_s:
                        self.declare_dead(m, f"no heartbeat for {now - seen:.1f} s "
                                             f"(timeout {self.heartbeat_timeout_s:g} s)")
                        if m not in self.down:
                            return
                        # a server the job waits for: keep watching the others

    async def main(self) -> None:
        if self.heartbeat_timeout_s > 0 or self.register_timeout_s > 0:
            self.spawn(self._watch())
        await self._all_left.wait()
        self.record("scheduler_done", members=len(self.members))


async def register(node: Node, scheduler: str) -> dict[str, str]:
    """Register ``node`` with ``scheduler``; learn and install the address book."""
    if scheduler not in node.schedulers:
        node.schedulers.append(scheduler)
    timeout_s = None
    if node.register_timeout_s > 0:
        # the scheduler gives up on missing members after register_timeout; wait a little
        # longer for its answer, then fail by name rather than hang
        timeout_s = node.register_timeout_s + max(node.heartbeat_timeout_s, 10.0)
    # heartbeats start now, not with the book: a member that waits for slow starters
    # proves it is alive, so the scheduler can tell it apart from a dead one
    if node.heartbeat_interval_s > 0:
        node.spawn(node.heartbeat(scheduler))
    try:
        meta = {"address": node.transport.local_address(), "role": node.role}
        token = node.claim_token
        if token:  # this process claimed its name (it started without a rank)
            meta["claim_token"] = token
        reply = await node.request(Message(Kind.REGISTER, node.name, scheduler, meta=meta),
                                   timeout_s=timeout_s)
    except asyncio.TimeoutError:
        raise NodeFailure(f"scheduler {scheduler} did not complete the registration within "
                          f"{timeout_s:g} s") from None
    book = dict(reply.meta.get("book", {}))
    node.learn_addresses(book)
    if "left" in reply.meta:  # a takeover: members done before this process started
        node.note_members_left(reply.meta["left"])
    return book


async def barrier(node: Node, scheduler: str, group: str, size: int, *,
                  timeout_s: float | None = None) -> None:
    """Wait until ``size`` members have entered barrier ``group`` at ``scheduler``
    (``timeout_s`` as in :meth:`Node.request`)."""
    if size <= 1:
        return
    await node.request(Message(Kind.BARRIER, node.name, scheduler,
                               meta={"group": group, "size": size}), timeout_s=timeout_s)


def leave(node: Node, scheduler: str) -> None:
    """Tell ``scheduler`` this node is done (and stop heartbeating it)."""
    node.post(Message(Kind.SHUTDOWN, node.name, scheduler))
    node.left.add(scheduler)
