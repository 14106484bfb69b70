"""Per-neighbour FIFO send queues of a mesh server (docs/papers.md §1 (b) Step 5).

Each neighbour server has its own queue; at most ``window`` data messages to it are in
flight (sent, not yet acknowledged by the receiver's RELAY_ACK), the rest wait here in
order. The waiting count is what multipath looks at: a chunk whose main first-hop queue
holds more than 2·L messages leaves on the first auxiliary route whose first-hop queue
holds fewer than L. (The repo runs one sender thread per queue over a ZMQ socket; the
window plays the socket buffer's part, and the acknowledgements are the repo's
back-pressure ACKs.) The send stamp for passive awareness is taken here, just before the
message is handed to the transport.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from geomx.wire import Message

__all__ = ["NeighbourQueues"]


class NeighbourQueues:
    def __init__(self, node: Any, window: int) -> None:
        if window < 1:
            raise ValueError(f"send window = {window}; allowed: >= 1")
        self.node = node
        self.window = window
        self._waiting: dict[str, deque[Message]] = {}
        self._in_flight: dict[str, int] = {}
        self._backlog_bytes: dict[str, int] = {}
        self.sent: dict[str, int] = {}

    def depth(self, neighbour: str) -> int:
        """Messages waiting (not yet sent) for ``neighbour``."""
        q = self._waiting.get(neighbour)
        return len(q) if q else 0

    def in_flight(self, neighbour: str) -> int:
        """Messages to ``neighbour`` sent and not yet acknowledged."""
        return self._in_flight.get(neighbour, 0)

    def backlog_bytes(self, neighbour: str) -> int:
        """Bytes of the messages to ``neighbour`` waiting or in flight (not yet
        acknowledged): what a new message there has to wait behind."""
        return self._backlog_bytes.get(neighbour, 0)

    def put(self, msg: Message) -> None:
        self._waiting.setdefault(msg.dst, deque()).append(msg)
        self._backlog_bytes[msg.dst] = self._backlog_bytes.get(msg.dst, 0) + msg.nbytes
        self._pump(msg.dst)

    def _pump(self, neighbour: str) -> None:
        q = self._waiting[neighbour]
        while q and self._in_flight.get(neighbour, 0) < self.window:
            msg = q.popleft()
            self._in_flight[neighbour] = self._in_flight.get(neighbour, 0) + 1
            self.node.spawn(self._send(neighbour, msg))

    async def _send(self, neighbour: str, msg: Message) -> None:
        msg.meta["ts"] = self.node.now()
        try:
            await self.node.request(msg)
        finally:
            self._in_flight[neighbour] -= 1
            self._backlog_bytes[neighbour] -= msg.nbytes
            self.sent[neighbour] = self.sent.get(neighbour, 0) + 1
            self._pump(neighbour)
