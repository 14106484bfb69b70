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
import logging
import weakref
from collections import Counter, deque
from collections.abc import Coroutine
from typing import Any

from geomx.sim.network import Network

__all__ = ["SimFabric", "SimTransport", "TransportClosed", "fabric_of"]

log = logging.getLogger(__name__)


class TransportClosed(ConnectionError):
    """``send``/``recv`` on a transport that was closed."""


class _Inbox:
    """Messages delivered to one node, waiting for ``recv``.

    Leaner than :class:`asyncio.Queue` (no task accounting, no size limit), with the
    same cancellation safety: ``put`` appends and merely *wakes* a waiter, and the woken
    ``recv`` takes the message itself, so a ``recv`` cancelled (e.g. by ``wait_for``)
    right after being woken loses nothing.
    """

    __slots__ = ("messages", "waiters", "closed")

    def __init__(self) -> None:
        self.messages: deque[Any] = deque()
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False

    def put(self, msg: Any) -> None:
        self.messages.append(msg)
        self._wake_one()

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
        self._deliver = self._deliver_impl  # one bound method, reused per message

    def transport(self, name: str) -> SimTransport:
        """A new transport for node ``name`` (which must be in the network's topology)."""
        return SimTransport(name, self.network, fabric=self)

    def _register(self, name: str, inbox: _Inbox) -> None:
        if name in self._inboxes:
            raise ValueError(f"a transport named {name!r} is already open on this network")
        if not self.network.has_node(name):
            raise ValueError(f"transport {name!r}: no such node in the network topology")
        self._inboxes[name] = inbox

    def _unregister(self, name: str) -> None:
        self._inboxes.pop(name, None)

    def _drop(self, msg: Any, reason: str) -> None:
        key = (reason, msg.dst)
        if key not in self.undeliverable:
            log.warning("dropping message %s->%s (channel %s): %s", msg.src, msg.dst,
                        msg.channel, reason)
        self.undeliverable[key] += 1

    def _deliver_impl(self, msg: Any) -> None:
        inbox = self._inboxes.get(msg.dst)
        if inbox is None:
            self._drop(msg, "destination not open (closed or never started)")
        else:
            inbox.put(msg)

    def send(self, msg: Any) -> None:
        if not self.network.has_node(msg.dst):
            self._drop(msg, "unknown destination node")
            return
        self.network.transmit(msg, self._deliver)


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
        self._inbox = _Inbox()
        self._closed = False
        self._fabric._register(name, self._inbox)

    async def send(self, msg: Any) -> None:
        """Hand ``msg`` to the emulated network; returns at once (no back-pressure)."""
        if self._closed:
            raise TransportClosed(f"transport {self.name!r} is closed")
        if msg.src != self.name:
            raise ValueError(f"transport {self.name!r} cannot send a message whose src is {msg.src!r}")
        self._fabric.send(msg)

    def send_nowait(self, msg: Any) -> bool:
        """Hand ``msg`` over at once (always possible in the emulator): lets a node skip its
        outbox task for a message that would leave immediately anyway."""
        if self._closed or msg.src != self.name:
            return False
        self._fabric.send(msg)
        return True

    def recv(self) -> Coroutine[Any, Any, Any]:
        """The next message delivered to this node, in arrival order (awaitable: the
        inbox's own coroutine, one frame fewer per message than wrapping it)."""
        return self._inbox.get(self.name)

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
        self._fabric._unregister(self.name)
        self._inbox.close()

    def __repr__(self) -> str:
        return f"SimTransport({self.name!r}{', closed' if self._closed else ''})"
