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
from typing import Any, Protocol, runtime_checkable

import numpy as np

from geomx.wire import Message


@runtime_checkable
class Transport(Protocol):
    """Moves messages between named nodes.

    Guarantees: per (src, dst, channel) order on reliable channels (channel < 8) and
    exactly-once delivery while both ends live. Unreliable channels may drop.
    """

    name: str

    async def send(self, msg: Message) -> None:
        """Hand ``msg`` to the network; may wait (back-pressure), never for the reply."""
        ...

    async def recv(self) -> Message:
        """The next message addressed to this node."""
        ...

    # Optional: ``send_nowait(msg) -> bool`` hands a message over without waiting when
    # that is possible right now (False: use ``send``). Nodes use it to skip their outbox
    # task when nothing is queued for the destination; order is preserved either way.
    # Optional: ``async listen(handler)`` calls ``handler(msg)`` for every message, in the
    # order and at the loop positions a ``while True: handler(await recv())`` task would,
    # until cancelled; ``Node`` uses it instead of that loop when present (the emulator).

    def set_address_book(self, book: dict[str, str]) -> None:
        """Learn peers' addresses ("host:port"); the emulator ignores it."""
        ...

    def local_address(self) -> str:
        """The address peers should use to reach this node ("" in the emulator)."""
        ...

    async def close(self) -> None:
        ...


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
