"""The two interfaces between node code and a runtime: ``Transport`` and ``NodeServices``.

Node code (``geomx/node``, ``sync``, ``codec``, ``sched``, ``optim``) sees only these two
objects and plain asyncio. That is the whole trick behind "one node implementation, two
runtimes" (docs/architecture.md): the emulator supplies a ``SimTransport`` and virtual
time; the real runtime supplies a TCP/UDP transport and the monotonic clock.
This follows ps-lite's split of *van* (transport) from *postoffice* (membership) and
*customer* (request tracking).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from geomx.wire import Message


@runtime_checkable
class Transport(Protocol):
    """Moves messages between named nodes.

    Guarantees: per (src, dst, channel) order on reliable channels (channel < 8) and
    exactly-once delivery while both ends live. Unreliable channels may drop. A message
    may be of any size: the real transport carries one longer than a frame as a stream
    of bounded pieces (geomx/runtime/framing.py, "Large messages"); node code only ever
    sends and receives whole messages.

    Besides ``send`` and ``recv``, the contract has three features a transport may
    decline, each with an answer that says so: ``send_nowait`` (False: use ``send``),
    ``listen`` (the plain receive loop) and ``receive_into`` (False: the reply arrives
    as usual). Node code calls them unconditionally; :class:`TransportDefaults` gives a
    transport that has only ``send`` and ``recv`` the declining answers.
    """

    name: str

    async def send(self, msg: Message) -> None:
        """Hand ``msg`` to the network; may wait (back-pressure), never for the reply."""
        ...

    async def recv(self) -> Message:
        """The next message addressed to this node."""
        ...

    def send_nowait(self, msg: Message) -> bool:
        """Hand ``msg`` over now if that is possible without waiting; False leaves it to
        ``send``, and nothing has happened. Nodes use it to skip their outbox task when
        nothing is queued for the destination; order is preserved either way."""
        ...

    async def listen(self, handler: Callable[[Message], None]) -> None:
        """Call ``handler(msg)`` for every message, in the order and at the loop positions
        a ``while True: handler(await recv())`` task would, until cancelled (or until
        ``handler`` raises or the transport closes: then it raises what that loop would
        have). ``recv`` is not used meanwhile."""
        ...

    def receive_into(self, peer: str, request_id: int, sink: Any) -> bool:
        """Offer ``sink`` (a writable C-contiguous array) for the reply to ``request_id``
        from ``peer``: a reply that is one dense payload of exactly its dtype and size is
        then read straight into it. True: taken, and ``forget_receive(request_id)`` must
        follow once the request is over; False: declined, the reply arrives as usual."""
        ...

    def forget_receive(self, request_id: int) -> None:
        """The request a :meth:`receive_into` was taken for is over."""
        ...

    def set_address_book(self, book: dict[str, str]) -> None:
        """Learn peers' addresses ("host:port"); the emulator ignores it."""
        ...

    def local_address(self) -> str:
        """The address peers should use to reach this node ("" in the emulator)."""
        ...

    async def close(self) -> None:
        ...


class TransportDefaults:
    """The declining answers to :class:`Transport`'s optional features, for a transport
    (a test's stand-in, a wrapper) that implements only ``send`` and ``recv``."""

    def send_nowait(self, msg: Message) -> bool:
        """Never possible here: every message goes through ``send``."""
        return False

    async def listen(self, handler: Callable[[Message], None]) -> None:
        """The plain receive loop the contract describes."""
        while True:
            handler(await self.recv())  # type: ignore[attr-defined]

    def receive_into(self, peer: str, request_id: int, sink: Any) -> bool:
        """Declined: replies arrive as messages with buffers of their own."""
        return False

    def forget_receive(self, request_id: int) -> None:
        """Nothing was taken."""


class NodeServices(Protocol):
    """What a runtime provides to a node besides messaging."""

    def now(self) -> float:
        """Seconds on the job clock: emulated time, or wall time since job start."""
        ...

    async def compute(self, declared_s: float, measured_s: float) -> None:
        """Charge compute time.

        ``declared_s`` comes from the scenario's compute profile; ``measured_s`` is how long
        the real numpy maths took. The emulator advances virtual time by ``declared_s``
        (real maths takes no virtual time); the real runtime sleeps the difference when the
        profile asks for more than the maths took, so heterogeneity shows on both.
        """
        ...

    def record(self, ev: str, node: str, **fields: Any) -> None:
        """Append an event to the run's event log."""
        ...

    def count_bytes(self, msg: Message) -> None:
        """Count a sent message's bytes (LAN/WAN, per DC pair)."""
        ...

    def rng(self, name: str) -> np.random.Generator:
        """A generator seeded from the scenario seed and ``name`` (stable across runs)."""
        ...


def derive_seed(seed: int, name: str) -> int:
    """A 32-bit seed from the scenario seed and a stable name (crc32, not ``hash``)."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) & 0xFFFFFFFF


class BaseServices:
    """Shared parts of both runtimes' services: seeded RNGs, byte counting, events."""

    def __init__(self, seed: int, recorder: Any, counters: Any, dc_of: dict[str, str]):
        self._wall0 = time.perf_counter()
        self._seed = seed
        self._recorder = recorder
        self._counters = counters
        self._dc_of = dc_of

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def wall_elapsed_s(self) -> float:
        """Real seconds since this process's job started (for ``run.max_wall_time``; in the
        emulator this limit is, by its nature, not reproducible across machines)."""
        return time.perf_counter() - self._wall0

    def record(self, ev: str, node: str, **fields: Any) -> None:
        if self._recorder is not None:
            self._recorder.record(ev, node, **fields)

    def count_bytes(self, msg: Message) -> None:
        if self._counters is not None:
            self._counters.add(self._dc_of.get(msg.src, "?"), self._dc_of.get(msg.dst, "?"),
                               msg.nbytes, None)

    def rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng(derive_seed(self._seed, name))
