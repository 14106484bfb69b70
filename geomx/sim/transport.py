"""``SimTransport``: the emulator's implementation of :class:`geomx.transport.Transport`.

A transport is a name plus an inbox. ``send`` hands the message to the shared
:class:`~geomx.sim.network.Network`, which calls back at the emulated arrival time; the
:class:`SimFabric` (one per network) then puts it into the destination's inbox. Node code
cannot tell this apart from the socket runtime except by the clock.

Messages that cannot be delivered (no such node in the topology, or the destination's
transport is closed or was never opened) are dropped, counted per reason in
:attr:`SimFabric.undeliverable` and logged once per (reason, destination), mirroring a
real network where a datagram to a dead peer simply vanishes.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import weakref
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from typing import Any

from geomx.sim.loop import VirtualTimeLoop
from geomx.sim.network import Network, NetworkError

__all__ = ["SimFabric", "SimTransport", "TransportClosed", "fabric_of"]

log = logging.getLogger(__name__)


class TransportClosed(ConnectionError):
    """``send``/``recv`` on a transport that was closed."""


class _Inbox:
    """Messages delivered to one node, waiting for ``recv`` (or for a listener).

    Leaner than :class:`asyncio.Queue` (no task accounting, no size limit), with the
    same cancellation safety: ``put`` appends and merely *wakes* a waiter, and the woken
    ``recv`` takes the message itself, so a ``recv`` cancelled (e.g. by ``wait_for``)
    right after being woken loses nothing.

    With a listener (:meth:`listen`) ``put`` schedules one ``drain`` callback
    where it would have woken the waiting receive loop (``call_soon``, the same place in
    the loop's FIFO as the waiter's wake-up), and the drain hands every message queued by
    then to the handler, as the woken loop would have: same order of everything, without
    a future, a task switch and a coroutine resume per wake-up.
    """

    __slots__ = ("name", "messages", "waiters", "closed", "handler", "parked", "context",
                 "scheduled", "loop", "_drain", "_ready_append", "_entry")

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.messages: deque[Any] = deque()
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False
        #: the listener: called with each message; ``parked`` is the future its task
        #: waits on (done = the listener has stopped: cancelled, failed or closed)
        self.handler: Callable[[Any], None] | None = None
        self.parked: asyncio.Future[None] | None = None
        self.context: contextvars.Context | None = None
        self.scheduled = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain = self.drain  # one bound method, reused per wake-up
        #: on a VirtualTimeLoop: its ready queue's append and the plain entry that runs
        #: ``context.run(drain)`` from it (a call_soon without building a Handle)
        self._ready_append: Callable[[Any], None] | None = None
        self._entry: tuple[float, int, Callable[[Any], Any], Any] | None = None

    def put(self, msg: Any) -> None:
        self.messages.append(msg)
        if self.handler is not None and not self.parked.done():
            if not self.scheduled:
                self.scheduled = True
                if self._ready_append is not None:
                    self._ready_append(self._entry)
                else:
                    self.loop.call_soon(self._drain, context=self.context)
            return
        self._wake_one()

    def drain(self) -> None:
        """Hand every queued message to the listener (a loop callback; see ``put``)."""
        self.scheduled = False
        messages = self.messages
        handler = self.handler
        parked = self.parked
        if handler is None or parked.done():
            return
        try:
            while messages:
                handler(messages.popleft())
                if parked.done():
                    return
        except Exception as exc:  # the listener's task fails with it, as a receive loop would
            if not parked.done():
                parked.set_exception(exc)

    def _wake_one(self) -> None:
        waiters = self.waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def close(self) -> None:
        self.closed = True
        self.messages.clear()
        while self.waiters:
            w = self.waiters.popleft()
            if not w.done():
                w.set_result(None)
        if self.parked is not None and not self.parked.done():
            self.parked.set_exception(TransportClosed(f"transport {self.name!r} is closed"))

    async def listen(self, handler: Callable[[Any], None]) -> None:
        """Hand every message to ``handler`` until the calling task is cancelled, the
        handler raises or the inbox closes (:meth:`SimTransport.listen` tells why).

        Messages already here are handled now; then the calling task parks on a future
        that only stopping completes, and ``put`` schedules :meth:`drain` where it would
        have woken a receive loop. On a :class:`VirtualTimeLoop` that schedule is the
        loop's plain ready-queue entry (no Handle built per wake-up).
        """
        if self.handler is not None:
            raise RuntimeError(f"transport {self.name!r} already has a listener")
        messages = self.messages
        while messages:
            if self.closed:
                raise TransportClosed(f"transport {self.name!r} is closed")
            handler(messages.popleft())
        if self.closed:
            raise TransportClosed(f"transport {self.name!r} is closed")
        loop = self.loop = asyncio.get_running_loop()
        parked = self.parked = loop.create_future()
        context = self.context = contextvars.copy_context()
        if isinstance(loop, VirtualTimeLoop):
            self._ready_append, self._entry = loop.soon_plain_entry(context.run, self._drain)
        self.handler = handler
        try:
            await parked
        finally:
            self.handler = None
            self.parked = None
            self.context = None
            self.scheduled = False
            self._ready_append = self._entry = None

    async def get(self, name: str) -> Any:
        messages = self.messages
        while not messages:
            if self.closed:
                raise TransportClosed(f"transport {name!r} is closed")
            w = asyncio.get_running_loop().create_future()
            self.waiters.append(w)
            try:
                await w
            except BaseException:
                if w.cancel():  # still waiting: forget it (wait_for loops must not leak)
                    try:
                        self.waiters.remove(w)
                    except ValueError:
                        pass
                if messages:
                    self._wake_one()  # we may have been woken: pass the wake-up on
                raise
        if self.closed:
            raise TransportClosed(f"transport {name!r} is closed")
        return messages.popleft()


class SimFabric:
    """Routes the network's deliveries to the inboxes of the transports built on it."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self._inboxes: dict[str, _Inbox] = {}
        #: dropped messages by (reason, destination)
        self.undeliverable: Counter[tuple[str, str]] = Counter()
        self._deliver = self.deliver  # one bound method, reused per message
        self._transmit = network.transmit

    def transport(self, name: str) -> SimTransport:
        """A new transport for node ``name`` (which must be in the network's topology)."""
        return SimTransport(name, self.network, fabric=self)

    def open_inbox(self, name: str, inbox: _Inbox) -> None:
        """Deliver the messages addressed to ``name`` into ``inbox`` from now on."""
        if name in self._inboxes:
            raise ValueError(f"a transport named {name!r} is already open on this network")
        if not self.network.has_node(name):
            raise ValueError(f"transport {name!r}: no such node in the network topology")
        self._inboxes[name] = inbox

    def close_inbox(self, name: str) -> None:
        """Drop (and count) the messages addressed to ``name`` from now on."""
        self._inboxes.pop(name, None)

    def _drop(self, msg: Any, reason: str) -> None:
        key = (reason, msg.dst)
        if key not in self.undeliverable:
            log.warning("dropping message %s->%s (channel %s): %s", msg.src, msg.dst,
                        msg.channel, reason)
        self.undeliverable[key] += 1

    def deliver(self, msg: Any) -> None:
        """Put a message the network delivered into its destination's inbox (or drop and
        count it); the network calls it at the message's arrival time."""
        inbox = self._inboxes.get(msg.dst)
        if inbox is None:
            self._drop(msg, "destination not open (closed or never started)")
        else:
            inbox.put(msg)

    def send(self, msg: Any) -> None:
        try:
            self._transmit(msg, self._deliver)
        except NetworkError:
            # (checked only on failure: the network opens a connection to a known node)
            if self.network.has_node(msg.dst):
                raise
            self._drop(msg, "unknown destination node")


_fabrics: weakref.WeakKeyDictionary[Network, SimFabric] = weakref.WeakKeyDictionary()


def fabric_of(network: Network) -> SimFabric:
    """The (single) fabric of ``network``, created on first use."""
    fabric = _fabrics.get(network)
    if fabric is None:
        fabric = _fabrics[network] = SimFabric(network)
    return fabric


class SimTransport:
    """A node's endpoint in the emulator (implements ``geomx.transport.Transport``)."""

    def __init__(self, name: str, network: Network, *, fabric: SimFabric | None = None) -> None:
        self.name = name
        self.network = network
        self._fabric = fabric if fabric is not None else fabric_of(network)
        self._send = self._fabric.send
        self._inbox = _Inbox(name)
        self._closed = False
        self._fabric.open_inbox(name, self._inbox)

    async def send(self, msg: Any) -> None:
        """Hand ``msg`` to the emulated network; returns at once (no back-pressure)."""
        if self._closed:
            raise TransportClosed(f"transport {self.name!r} is closed")
        if msg.src != self.name:
            raise ValueError(f"transport {self.name!r} cannot send a message whose src is "
                             f"{msg.src!r}")
        self._fabric.send(msg)

    def send_nowait(self, msg: Any) -> bool:
        """Hand ``msg`` over at once (always possible in the emulator): lets a node skip its
        outbox task for a message that would leave immediately anyway."""
        if self._closed or msg.src != self.name:
            return False
        self._send(msg)
        return True

    def recv(self) -> Coroutine[Any, Any, Any]:
        """The next message delivered to this node, in arrival order (awaitable: the
        inbox's own coroutine, one frame fewer per message than wrapping it)."""
        return self._inbox.get(self.name)

    def listen(self, handler: Callable[[Any], None]) -> Coroutine[Any, Any, None]:
        """Hand every message delivered to this node to ``handler``, in arrival order, until
        the calling task is cancelled (or ``handler`` raises, or the transport closes:
        then this raises what the receive loop ``while True: handler(await recv())``
        would have raised).

        The same calls, in the same order and at the same places in the event loop's
        FIFO as that loop's (messages already here are handled now; a later delivery
        schedules one callback where it would have woken the loop), for a fraction of
        the cost: no future, task switch or coroutine resume per wake-up (the inbox's
        own coroutine, as :meth:`recv`). ``recv`` must not be used meanwhile.
        """
        return self._inbox.listen(handler)

    def receive_into(self, peer: str, request_id: int, sink: Any) -> bool:
        """Declined: an emulated reply is the sender's message object itself, with no
        bytes to read into a buffer."""
        return False

    def forget_receive(self, request_id: int) -> None:
        """Nothing was taken (see :meth:`receive_into`)."""

    def pending(self) -> int:
        """Messages delivered but not yet received."""
        return len(self._inbox.messages)

    def set_address_book(self, book: dict[str, str]) -> None:
        """Addresses mean nothing in the emulator; the network routes by node name."""

    def local_address(self) -> str:
        return ""

    async def close(self) -> None:
        """Stop receiving: later deliveries to this node are dropped and counted."""
        if self._closed:
            return
        self._closed = True
        self._fabric.close_inbox(self.name)
        self._inbox.close()

    def __repr__(self) -> str:
        return f"SimTransport({self.name!r}{', closed' if self._closed else ''})"
