"""What the TCP transport counts, kept in one object its parts add to.

The transport's connections (:mod:`geomx.runtime.tcp_conn`), its send queues
(:mod:`geomx.runtime.tcp_outgoing`) and its receive side (:mod:`geomx.runtime.tcp`) all
count traffic, dropped messages and stream resumption. Each of them is handed this one
:class:`TransportCounts` and says what happened through its methods; ``stats()`` reads
the result. The counters are plain integers: nothing here waits or allocates per message
beyond the first message to a new peer.
"""

from __future__ import annotations

__all__ = ["PeerCounters", "TransportCounts"]


class PeerCounters:
    """Bytes and messages sent to and received from one peer."""

    __slots__ = ("bytes_sent", "bytes_received", "msgs_sent", "msgs_received")

    def __init__(self) -> None:
        self.bytes_sent = self.bytes_received = self.msgs_sent = self.msgs_received = 0

    def sent(self, msgs: int, nbytes: int) -> None:
        """``msgs`` messages of ``nbytes`` bytes in all were written to the peer."""
        self.msgs_sent += msgs
        self.bytes_sent += nbytes

    def sent_msgs(self, msgs: int) -> None:
        """Messages taken from a queue for writing (their bytes follow as written)."""
        self.msgs_sent += msgs

    def sent_bytes(self, nbytes: int) -> None:
        """Bytes of messages already counted by :meth:`sent_msgs` have been written."""
        self.bytes_sent += nbytes

    def received_msgs(self, msgs: int) -> None:
        """Messages from the peer delivered to the inbox."""
        self.msgs_received += msgs

    def received_bytes(self, nbytes: int) -> None:
        """Bytes read from the peer (whether or not they made a message)."""
        self.bytes_received += nbytes

    def received(self, msgs: int, nbytes: int) -> None:
        """``msgs`` messages of ``nbytes`` bytes in all arrived from the peer."""
        self.msgs_received += msgs
        self.bytes_received += nbytes

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


class TransportCounts:
    """Per-peer traffic, dropped messages and stream resumption of one transport."""

    __slots__ = ("peers", "dropped_messages", "reconnects", "reconnect_failures",
                 "resent_messages", "resent_bytes", "unacked_dropped", "acks_received")

    def __init__(self) -> None:
        #: peer name -> its counters, created with the first message either way
        self.peers: dict[str, PeerCounters] = {}
        #: messages given up on: queued or unacknowledged when their stream was lost
        self.dropped_messages = 0
        self.reconnects = 0
        self.reconnect_failures = 0
        self.resent_messages = 0
        self.resent_bytes = 0
        self.unacked_dropped = 0
        self.acks_received = 0

    def peer(self, name: str) -> PeerCounters:
        """``name``'s counters (created on first use)."""
        c = self.peers.get(name)
        if c is None:
            c = self.peers[name] = PeerCounters()
        return c

    def dropped(self, msgs: int) -> None:
        """``msgs`` queued messages will never be written (the stream is gone)."""
        self.dropped_messages += msgs

    def unacked_lost(self, msgs: int) -> None:
        """The receiver of a resumed stream no longer has what ``msgs`` written but
        unacknowledged messages were sent to (it is a new process): they are dropped."""
        self.dropped_messages += msgs
        self.unacked_dropped += msgs

    def reconnected(self, resent_msgs: int, resent_bytes: int) -> None:
        """A stream's connection was opened again; that many messages go out again."""
        self.reconnects += 1
        self.resent_messages += resent_msgs
        self.resent_bytes += resent_bytes

    def reconnect_failed(self, dropped_msgs: int) -> None:
        """Dialling a lost stream again failed: its messages are dropped."""
        self.reconnect_failures += 1
        self.dropped_messages += dropped_msgs

    def ack_received(self) -> None:
        self.acks_received += 1

    def stream_dict(self) -> dict[str, int]:
        """The resumption counters, as ``stats()["streams"]`` starts."""
        return {"reconnects": self.reconnects, "reconnect_failures": self.reconnect_failures,
                "resent_messages": self.resent_messages, "resent_bytes": self.resent_bytes,
                "unacked_dropped": self.unacked_dropped, "acks_received": self.acks_received}
