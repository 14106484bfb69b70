"""What every policy may do on the node it runs on, whichever role that node plays.

A policy never holds the node object. It gets a context: a narrow, typed view that
offers exactly the operations below and the role-specific ones of its kind
(:mod:`geomx.policy.sync`, :mod:`geomx.policy.scheduling`). The same context class backs
a node in the emulator and over real sockets, so a policy written against it runs
unchanged in both runtimes (docs/extending.md).

Determinism: the emulator runs every node on one virtual clock; a policy that reads
only its context (never the wall clock, never an unseeded random generator, never the
iteration order of a ``set``) produces the same event log for the same scenario and
seed. ``now()`` is the virtual time in the emulator and the loop's clock over sockets.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol

from geomx.wire import Message

__all__ = ["NodeContext"]


class NodeContext(Protocol):
    """Operations every policy context offers."""

    @property
    def node_name(self) -> str:
        """The node this policy runs on (``"ls:party-a"``, ``"gs:0"``, ``"w:party-a:1"``)."""
        ...

    @property
    def dc(self) -> str:
        """The data centre the node runs in."""
        ...

    def now(self) -> float:
        """Seconds on the job's clock (virtual in the emulator)."""
        ...

    def record(self, event: str, **fields: Any) -> None:
        """Append an event to the node's event log (``geomx.metrics`` reads it back)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` as a task of the node; its failure fails the node."""
        ...

    async def request(self, msg: Message) -> Message:
        """Send ``msg`` and wait for its reply (raises if the peer answers an error)."""
        ...

    def post(self, msg: Message) -> None:
        """Send ``msg`` without waiting (a reply, or a one-way message)."""
        ...
