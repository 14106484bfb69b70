"""Resumable TCP streams: sequence numbers, acknowledgements, resend after a reconnect, dedupe.

A TCP connection that drops (a NAT or firewall forgets it, a middlebox resets it, a WAN
link blinks) takes with it the messages still queued on it and the ones in flight;
without more, the job would then fail by request timeout. ps-lite answers this with its
``Resender`` (``resender.h``): the sender keeps every message until the receiver
acknowledges it, resends after a timeout, and the receiver drops what it has seen
(by a signature of sender, timestamp and command). geomx keeps the idea and fits it to
TCP, which already retransmits within a connection: only a *new* connection needs a
resend, and order within a stream makes one cumulative number enough.

* Each (sender, receiver, reliable channel) stream is one :class:`SendWindow` at the
  sender: a random session id, and every message written gets the next sequence number
  (1, 2, ...) in its SEQ_MESSAGE frame (:mod:`geomx.runtime.framing`). Written messages
  stay in the window, as zero-copy views of their arrays, until the receiver
  acknowledges them; node code never changes an array it has sent (it sends snapshots,
  see ``_snapshot`` in ``geomx/node/global_server.py``), which is what makes holding
  views safe, as it already was for queued messages. The window is bounded: with more
  than ``limit_bytes`` unacknowledged the writer waits for acks (a larger message is
  admitted once at most :data:`OVERSIZE_ADMIT_FRACTION` of the limit is unacknowledged),
  so a receiver that stops acknowledging stalls its sender instead of growing its memory.
* The receiver keeps, per stream, the last sequence number it delivered
  (:class:`InStreams`): it acknowledges with small ACK frames on the same connection,
  back to the sender, every ``ack_every_bytes`` / ``ack_every_frames`` or after
  ``ack_delay_s``, and drops a message whose number it has already delivered.
* When a connection drops, the sender dials again (with backoff, for up to the
  transport's ``reconnect_timeout_s``) and says its session in the HELLO; after
  authentication the receiver answers, in its WELCOME, the last number it delivered
  for that session and its own incarnation (a random id per transport). The sender
  forgets what that acknowledges and writes the rest again, in order, before anything
  new: every message arrives exactly once, in order.
* A receiver with a new incarnation is a new process: what the old one did not
  acknowledge was meant for a process that is gone, so it is dropped and counted, as
  before resumable streams (the sender then numbers from where the new process is).
  A sender that gives up (the bound passed, or the peer refused the handshake) drops
  its window and starts a new session, so the receiver starts a fresh count for it.

The session id is only ever looked at after the handshake authenticated the peer (with
a shared secret): a stranger cannot resume, or take over, someone else's stream.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict, deque
from typing import Any

from geomx.runtime.framing import ack_frame, stamp_sequence

#: Unacknowledged bytes one stream may hold before its writer waits for acks.
DEFAULT_RETAIN_LIMIT_BYTES = 64 * 1024 * 1024
#: How long a sender keeps trying to re-establish a dropped connection that still has
#: messages to deliver, before it drops them and fails as an unreachable peer would.
DEFAULT_RECONNECT_TIMEOUT_S = 30.0
#: The receiver acknowledges after this many bytes or frames, or this long after the
#: first unacknowledged one (whichever comes first).
ACK_EVERY_BYTES = 256 * 1024
ACK_EVERY_FRAMES = 64
ACK_DELAY_S = 0.02
#: A message larger than the retain limit waits until at most this fraction of the limit
#: is unacknowledged, not until nothing is: small messages before it (a PUSH_ACK before a
#: pull reply, a pull request before the next push) are acknowledged only after
#: ``ack_delay_s``, and waiting for that stalled every large message by 20 ms. The window
#: then holds at most this fraction of the limit beyond the large message itself.
OVERSIZE_ADMIT_FRACTION = 1 / 16
#: Streams a receiver remembers; beyond it the oldest ones without a live connection
#: are forgotten (a stranger without the secret claiming many names cannot grow it).
MAX_STREAMS = 4096
#: The length of a session id and of an incarnation id, in bytes (hex on the wire).
SESSION_BYTES = 8


def new_session() -> str:
    """A random session (or incarnation) id, hex."""
    return secrets.token_hex(SESSION_BYTES)


class SendWindow:
    """The sender's side of one stream: sequence numbers and unacknowledged messages."""

    def __init__(self, limit_bytes: int = DEFAULT_RETAIN_LIMIT_BYTES):
        if not limit_bytes > 0:
            raise ValueError(f"retain limit must be > 0 bytes, got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        self.session = new_session()
        self.next_seq = 1
        self.acked = 0
        #: (sequence number, frames, bytes), oldest first
        self.entries: deque[tuple[int, list, int]] = deque()
        self.bytes = 0
        self.peak_bytes = 0
        #: the receiver's incarnation as of the last handshake (None: never connected)
        self.peer_incarnation: str | None = None
        self._changed = asyncio.Event()

    def has_room(self, nbytes: int) -> bool:
        """May a message of ``nbytes`` be written now (or must the writer wait for acks)?"""
        return (self.bytes + nbytes <= self.limit_bytes
                or self.bytes <= self.limit_bytes * OVERSIZE_ADMIT_FRACTION)

    async def wait_room(self, nbytes: int) -> None:
        while not self.has_room(nbytes):
            self._changed.clear()
            await self._changed.wait()

    async def wait_empty(self) -> None:
        while self.entries:
            self._changed.clear()
            await self._changed.wait()

    def assign(self, frames: list, nbytes: int) -> int:
        """Give the message in ``frames`` the next sequence number and keep it."""
        seq = self.next_seq
        self.next_seq += 1
        stamp_sequence(frames, seq)
        self.entries.append((seq, frames, nbytes))
        self.bytes += nbytes
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes
        return seq

    def ack(self, seq: int) -> int:
        """The receiver has everything up to ``seq``: forget it; the messages freed.

        ``ValueError`` for a number never sent (the peer is confused or lying)."""
        if seq >= self.next_seq:
            raise ValueError(f"acknowledgement of message {seq}, only {self.next_seq - 1} sent")
        freed = 0
        while self.entries and self.entries[0][0] <= seq:
            self.bytes -= self.entries.popleft()[2]
            freed += 1
        if seq > self.acked:
            self.acked = seq
        if freed:
            self._changed.set()
        return freed

    def resume(self, ack: int, incarnation: str) -> tuple[list[tuple[int, list, int]], int, str]:
        """After a handshake: what to write again, how many were dropped, and why.

        ``ack`` and ``incarnation`` are the receiver's WELCOME. The same process that
        delivered up to ``ack``: the rest of the window, in order, is to be written
        again. A new process (or one that lost the stream, or claims what was never
        sent): the window is dropped and numbering goes on from ``ack`` (the reason
        says which)."""
        same = self.peer_incarnation is None or incarnation == self.peer_incarnation
        self.peer_incarnation = incarnation
        why = ""
        if not same:
            why = "the peer restarted"
        elif ack < self.acked:
            why = f"the peer lost the stream (it has {ack}, had acknowledged {self.acked})"
        elif ack >= self.next_seq:
            why = f"the peer claims message {ack}, only {self.next_seq - 1} were sent"
        if why:
            dropped = len(self.entries)
            self.entries.clear()
            self.bytes = 0
            self.acked = ack
            self.next_seq = ack + 1
            self._changed.set()
            return [], dropped, why
        if ack > self.acked:
            self.ack(ack)
        return list(self.entries), 0, ""

    def reset(self) -> int:
        """Give up on the stream: drop the window, start a new session; the count dropped."""
        dropped = len(self.entries)
        self.entries.clear()
        self.bytes = 0
        self.session = new_session()
        self.next_seq = 1
        self.acked = 0
        self._changed.set()
        return dropped


class InStream:
    """The receiver's side of one stream: the last sequence number delivered."""

    __slots__ = ("peer", "channel", "session", "delivered", "acked", "unacked_bytes",
                 "unacked_frames", "conn", "timer")

    def __init__(self, peer: str, channel: int, session: str):
        self.peer = peer
        self.channel = channel
        self.session = session
        self.delivered = 0
        self.acked = 0
        self.unacked_bytes = 0
        self.unacked_frames = 0
        self.conn: Any = None  # the tcp_conn.Conn carrying it now (None between connections)
        self.timer: asyncio.TimerHandle | None = None


class InStreams:
    """Every stream a node receives, keyed by (peer, channel, session); acks and dedupe."""

    def __init__(self, *, max_streams: int = MAX_STREAMS, ack_every_bytes: int = ACK_EVERY_BYTES,
                 ack_every_frames: int = ACK_EVERY_FRAMES, ack_delay_s: float = ACK_DELAY_S):
        self.max_streams = max_streams
        self.ack_every_bytes = ack_every_bytes
        self.ack_every_frames = ack_every_frames
        self.ack_delay_s = ack_delay_s
        self._streams: OrderedDict[tuple[str, int, str], InStream] = OrderedDict()
        self.incarnation = new_session()
        self.resumed = 0      # handshakes that found their stream (a reconnect)
        self.duplicates = 0   # messages dropped because they were delivered before
        self.acks_sent = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._streams)

    def attach(self, conn: Any, peer: str, channel: int, session: str) -> dict[str, Any]:
        """An authenticated connection carries ``peer``'s stream ``session`` on ``channel``:
        the fields of the WELCOME (the last message delivered, this incarnation).

        A connection still attached to the stream is aborted (the sender has given up on
        it and dialled again; its bytes must not interleave with the resend)."""
        key = (peer, channel, session)
        st = self._streams.get(key)
        if st is None:
            st = self._streams[key] = InStream(peer, channel, session)
        else:
            self._streams.move_to_end(key)
            self.resumed += 1
            old = st.conn
            if old is not None and old is not conn:
                old.carry_stream(None)
                old.abort()
        self._cancel_timer(st)
        st.conn = conn
        st.acked = st.delivered  # the WELCOME acknowledges it
        st.unacked_bytes = st.unacked_frames = 0
        conn.carry_stream(st)
        self._evict()
        return {"ack": st.delivered, "inc": self.incarnation}

    def detach(self, conn: Any) -> None:
        """``conn`` is gone; its stream stays (the sender may come back)."""
        st = conn.stream
        if st is not None and st.conn is conn:
            st.conn = None
            self._cancel_timer(st)

    def accept(self, st: InStream, seq: int) -> bool | None:
        """Message ``seq`` arrived: True = deliver it, False = a duplicate (dropped and
        counted), None = out of order (a protocol error: the caller drops the connection)."""
        if seq <= st.delivered:
            self.duplicates += 1
            return False
        if seq != st.delivered + 1:
            return None
        st.delivered = seq
        return True

    def delivered(self, st: InStream, nbytes: int) -> None:
        """Count a delivered message toward the next acknowledgement; send or schedule it."""
        st.unacked_bytes += nbytes
        st.unacked_frames += 1
        if st.unacked_bytes >= self.ack_every_bytes or st.unacked_frames >= self.ack_every_frames:
            self.flush(st)
        elif st.timer is None:
            st.timer = asyncio.get_running_loop().call_later(self.ack_delay_s, self.flush, st)

    def flush(self, st: InStream) -> None:
        """Acknowledge everything delivered on ``st`` now (if it has a connection)."""
        self._cancel_timer(st)
        if st.delivered > st.acked and st.conn is not None:
            st.conn.write(ack_frame(st.delivered))
            st.acked = st.delivered
            st.unacked_bytes = st.unacked_frames = 0
            self.acks_sent += 1

    def flush_all(self) -> None:
        for st in list(self._streams.values()):
            self.flush(st)

    def _cancel_timer(self, st: InStream) -> None:
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None

    def _evict(self) -> None:
        while len(self._streams) > self.max_streams:
            for key, st in self._streams.items():  # oldest first
                if st.conn is None:
                    del self._streams[key]
                    self._cancel_timer(st)
                    self.evicted += 1
                    break
            else:
                return  # every stream has a live connection (bounded by the connection cap)
