"""Membership of the real-socket transport: the address book and how a node learns its peers.

ps-lite keeps membership apart from its van: the ``Postoffice`` knows the nodes of the job
and the van only learns their addresses from the scheduler's ``ADD_NODE`` answer
(``Van::ProcessAddNodeCommand``) before it connects. geomx follows that split. This
module owns

* ``parse_address`` -- the ``"host:port"`` / ``"[v6]:port"`` form every address takes;
* :class:`AddressBook` -- peer name -> address, filled by ``set_address_book`` (the
  scheduler hands the book out at registration, see ``node/scheduler.py``); entries
  are added or replaced, never forgotten;
* the start-up race: a peer can talk to us before our own copy of the book has
  arrived, so a send to a peer whose address is not known yet *waits* for the book,
  up to ``address_wait_s``, and then fails with :class:`UnknownPeer`, which names the
  peer and lists what the book holds.

It knows nothing of sockets: :mod:`geomx.runtime.tcp` asks it for an address before it
dials a TCP connection (:mod:`geomx.runtime.tcp_outgoing`) or sends a UDP datagram.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

# the transport's logger: these messages have always been the TCP transport's
log = logging.getLogger("geomx.runtime.tcp")

#: How long a send waits for a peer's address to arrive in the address book.
DEFAULT_ADDRESS_WAIT_S = 60.0


class UnknownPeer(ConnectionError):
    """No address for the peer arrived within ``address_wait_s``."""


def parse_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) -> ``(host, port)``; ValueError naming the problem."""
    host, sep, port_s = str(addr).rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_s)
    except ValueError:
        port = -1
    if not sep or not host or not 0 < port < 65536:
        raise ValueError(f"bad address {addr!r}: expected 'host:port' with a port in 1..65535")
    return host, port


class AddressBook:
    """Peer name -> ``(host, port)`` as this node has learnt it; sends wait here for a peer.

    ``wait_s`` bounds how long :meth:`address_of` waits for a missing peer (the transport's
    ``address_wait_s``, which may be changed while running); ``is_closed`` tells whether
    the owning transport has been closed (then nobody waits any more).
    """

    def __init__(self, name: str, *, wait_s: float, is_closed: Callable[[], bool]) -> None:
        self.name = name
        self.wait_s = wait_s
        self._is_closed = is_closed
        self._book: dict[str, tuple[str, int]] = {}
        self._event: asyncio.Event | None = None

    def start(self) -> None:
        """Start accepting waiters (called by the transport's ``start()``, inside the loop)."""
        self._event = asyncio.Event()

    def update(self, book: Mapping[str, str]) -> Iterable[str]:
        """Parse and add (or replace) ``book``'s entries; return the peers it names.

        All entries are checked before any is added: a bad one raises ValueError naming
        its peer and leaves the book as it was. Waiters are not woken: call
        :meth:`notify` once the caller has finished its own bookkeeping.
        """
        parsed = {}
        for peer, addr in book.items():
            try:
                parsed[peer] = parse_address(addr)
            except ValueError as e:
                raise ValueError(f"address book entry for {peer!r}: {e}") from None
        self._book.update(parsed)
        return parsed.keys()

    def notify(self) -> None:
        """Wake every send waiting in :meth:`address_of` (they re-check the book)."""
        event = self._event
        if event is not None:
            self._event = asyncio.Event()
            event.set()

    async def address_of(self, peer: str) -> tuple[str, int]:
        """``peer``'s address, waiting up to ``wait_s`` for it to be announced.

        A peer can talk to us before our own copy of the address book has arrived: the
        scheduler answers every member's registration at once, and one member may get its
        answer and send us a request while ours is still in flight. Dropping our reply
        then would leave that peer waiting forever (a start-up hang), so a
        send to a peer we cannot place yet waits for ``set_address_book`` instead; past
        the bound it fails with :class:`UnknownPeer`, which names the peer.
        """
        addr = self._book.get(peer)
        if addr is not None:
            return addr
        if self._event is None or self._is_closed():
            raise self._unknown(peer, waited_s=0.0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            async with asyncio.timeout(self.wait_s):
                while peer not in self._book:
                    if self._is_closed():
                        raise self._unknown(peer, waited_s=loop.time() - t0)
                    await self._event.wait()
        except TimeoutError:
            raise self._unknown(peer, waited_s=loop.time() - t0) from None
        waited = loop.time() - t0
        if waited > 0.5:
            log.info("%s: waited %.2f s for the address of %s", self.name, waited, peer)
        return self._book[peer]

    def _unknown(self, peer: str, *, waited_s: float) -> UnknownPeer:
        known = ", ".join(sorted(self._book)) or "none"
        return UnknownPeer(f"{self.name}: no address for peer {peer!r} after waiting "
                           f"{waited_s:.1f} s (address book has: {known})")
