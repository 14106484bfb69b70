"""One TCP connection of the real-socket transport: the asyncio protocol and its framing.

ps-lite's van leaves the socket work to a concrete van (``ZMQVan::SendMsg`` /
``RecvMsg`` in ``zmq_van.h``) and keeps the rest of the van above it; geomx draws the
same line. This module owns what happens on *one* socket, in either direction:

* :class:`Conn`, the ``asyncio.BufferedProtocol``: TCP_NODELAY, the dead-peer bound
  (:mod:`geomx.runtime.tcp_liveness`) and the write-buffer limits, frames read straight
  into :class:`~geomx.runtime.framing.FrameDecoder`'s buffer, the connection's state
  (``HANDSHAKE`` -> ``OPEN`` -> ``CLOSED``), handshake
  frames queued for :mod:`geomx.runtime.tcp_handshake`, message frames handed to the
  transport only once the connection is open (and only on incoming connections),
  write flow control (``drain``), and bad frames counted in the transport's reject log;
  on a resumable stream (:mod:`geomx.runtime.tcp_resume`) SEQ_MESSAGE frames go to the
  transport with their stream, and ACK frames coming back on an outgoing connection go
  to the :class:`~geomx.runtime.tcp_outgoing.Outgoing` writing on it (frame types a
  connection did not negotiate are unknown to it, as any other); where the handshake
  attached a shared-memory ring (:mod:`geomx.runtime.shm_ring`; offered by SHM_OFFER
  when the sender first has a large message, see :mod:`geomx.runtime.framing`, "Same-host
  pieces"), the decoder copies
  SHM_PIECE frames' bytes out of it, the connection answers SHM_FREED once per read, the
  sending side hands SHM_FREED frames to its ring, and closing unmaps it;
* :class:`FrameBudget`, the bytes of large frames' bodies (and of streamed messages,
  see :mod:`geomx.runtime.framing`) held while they arrive, shared by every incoming
  connection of a transport: a frame or stream that would go past it waits, its
  connection not reading, until another completes.

It does not know what a handshake says (:mod:`~geomx.runtime.tcp_handshake`), how
messages are queued and batched (:mod:`~geomx.runtime.tcp_outgoing`) or where peers
live (:mod:`~geomx.runtime.membership`); it reports to its owner (the transport,
:class:`ConnOwner`) when a connection is accepted, carries a message, or is lost.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any, Protocol

from geomx.runtime.framing import (CONTROL_TYPES, MAX_CONTROL_FRAME_BYTES, SCRATCH_BYTES,
                                   SEQ, SEQ_BYTES, SHM_FREED, Body, FrameDecoder, FrameType,
                                   SPLIT_BATCH, FramingError, RejectLog, parse_control,
                                   shm_answer_frame, shm_freed_frame, shm_offer_frame)
from geomx.runtime.recv_pool import RecvBufferPool
from geomx.runtime.tcp_liveness import apply_dead_after

#: The asyncio transport's write-buffer high-water mark (``drain`` waits above it).
WRITE_HIGH_WATER_BYTES = 1024 * 1024

#: Scratch buffer of a connection before its handshake completes (then SCRATCH_BYTES).
PRE_HANDSHAKE_SCRATCH_BYTES = 8192

#: A connection's states: handshake frames only, then message frames, then nothing.
HANDSHAKE, OPEN, CLOSED = 0, 1, 2


class FrameBudget:
    """Bytes of large frames' bodies and of streamed messages held while they arrive,
    summed over the incoming connections of one transport (the reserve/release of their
    :class:`~geomx.runtime.framing.FrameDecoder`). A stream received into a buffer the
    receiver named (a pull's ``out``) holds no new memory and takes none of it.

    A frame that would go past ``limit_bytes`` is refused; its connection stops reading
    and waits in line (:meth:`wait`) until a release makes room. One frame alone is
    always admitted, so no message is too big ever to arrive. While connections wait,
    a newcomer waits behind them even if it would fit: a message larger than the limit
    needs the budget to itself, and frames that keep coming on other connections must
    not keep it from ever being empty.
    """

    __slots__ = ("limit_bytes", "_used_bytes", "_waiters", "_serving")

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._used_bytes = 0
        self._waiters: deque[Conn] = deque()
        #: a release is retrying the first connection in line (which may reserve)
        self._serving = False

    @property
    def used_bytes(self) -> int:
        """Bytes reserved by frames still arriving."""
        return self._used_bytes

    def reserve(self, nbytes: int) -> bool:
        if self._waiters and not self._serving:
            return False  # others are in line first
        if self._used_bytes and self._used_bytes + nbytes > self.limit_bytes:
            return False
        self._used_bytes += nbytes
        return True

    def release(self, nbytes: int) -> None:
        """A frame completed (or was abandoned): connections waiting in line try again,
        first come first served; the first that still finds no room keeps its place."""
        self._used_bytes -= nbytes
        waiters = self._waiters
        while waiters:
            conn = waiters[0]
            if conn.state == CLOSED:
                waiters.popleft()
                continue
            self._serving = True
            try:
                conn.retry()  # may deliver frames, may reserve
            finally:
                self._serving = False
            if conn.decoder.waiting:
                break
            waiters.popleft()
            conn.unpause("budget")

    def wait(self, conn: "Conn") -> None:
        """``conn`` has paused reading for a frame the budget refused: retry it later."""
        self._waiters.append(conn)


class ConnOwner(Protocol):
    """What a :class:`Conn` needs from the transport that owns it: its limits, the
    shared receive resources, and the calls a connection reports its events with."""

    max_frame_bytes: int
    max_message_bytes: int
    dead_after_s: float

    @property
    def rejects(self) -> RejectLog: ...

    @property
    def frame_budget(self) -> FrameBudget: ...

    @property
    def recv_pool(self) -> RecvBufferPool: ...

    def on_conn_accepted(self, conn: "Conn") -> None: ...

    def on_message_frame(self, conn: "Conn", body: Body) -> None: ...

    def on_seq_frame(self, conn: "Conn", body: Body, flags: int) -> None: ...

    def attach_ring(self, conn: "Conn", offer: Any) -> bool: ...

    def route_frame(self, conn: "Conn", ftype: int, first: memoryview,
                    length: int) -> tuple[int, Any] | None: ...

    def on_conn_lost(self, conn: "Conn", exc: Exception | None) -> None: ...


class Conn(asyncio.BufferedProtocol):
    """One TCP connection (either direction): framing, handshake frames, write flow control."""

    def __init__(self, tr: ConnOwner, *, incoming: bool, label: str):
        self.tr = tr
        self.incoming = incoming
        self.label = label
        self.peer: str | None = None
        self.channel = -1
        #: what the peer accepts, from its WELCOME (outgoing connections; None: it did not
        #: say): the longest frame, the largest message
        self.peer_max_frame_bytes: int | None = None
        self.peer_max_message_bytes: int | None = None
        self.out: Any = None  # the tcp_outgoing.Outgoing writing on it (outgoing only)
        self.stream: Any = None  # the tcp_resume.InStream it carries (resumable, incoming)
        #: the shared-memory ring its stream pieces may pass through (geomx.runtime.shm_ring):
        #: the SendRing it writes (outgoing) or the peer's RecvRing it reads (incoming)
        self.shm: Any = None
        #: whether both ends agreed in the handshake that a ring may be offered later
        #: (without it the ring frames are unknown frames)
        self.shm_ok = False
        #: whether a ring was offered on this connection (at most once, by the sender)
        self.shm_asked = False
        self._ring_offer: Any = None  # the SendRing offered, until the peer answers
        self._ring_answer: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None
        self.state = HANDSHAKE
        self.aborted = False
        self.write_paused = False
        #: why reading is paused: "inbox" (the transport's inbox is full), "budget" (a
        #: large frame waits for the transport's budget); reading resumes when none is left
        self._pause_reasons: set[str] = set()
        # a small scratch until the handshake is done (outgoing connections only ever read
        # handshake frames; an unauthenticated incoming one must cost little), then
        # SCRATCH_BYTES (open); large frames are budgeted by the transport
        budget = tr.frame_budget
        self.decoder = FrameDecoder(self._on_frame, max_frame_bytes=MAX_CONTROL_FRAME_BYTES,
                                    scratch_bytes=PRE_HANDSHAKE_SCRATCH_BYTES,
                                    reserve=budget.reserve if incoming else None,
                                    release=budget.release if incoming else None,
                                    alloc=tr.recv_pool.take,
                                    route=self._route if incoming else None)
        self._control: deque[tuple[int, Body]] = deque()
        self._control_waiter: asyncio.Future | None = None
        self._drain_waiter: asyncio.Future | None = None
        self.closed = asyncio.get_running_loop().create_future()

    # -- asyncio protocol callbacks ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):  # pragma: no cover
                pass
            # a connection that dies silently (a NAT forgets it) is noticed in bounded time
            apply_dead_after(sock, self.tr.dead_after_s)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)  # type: ignore[attr-defined]
        peername = transport.get_extra_info("peername")
        if peername and self.incoming:
            self.label = f"{peername[0]}:{peername[1]}"
        if self.incoming:
            self.tr.on_conn_accepted(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.state == CLOSED:
            return
        try:
            self.decoder.buffer_updated(nbytes)
        except FramingError as e:
            self.tr.rejects.reject(self.label, e.reason, e.category)
            self.abort()
            return
        if self.shm is not None and self.incoming:
            self._report_freed()
        if self.decoder.waiting and "budget" not in self._pause_reasons:
            self.pause("budget")
            self.tr.frame_budget.wait(self)

    def retry(self) -> None:
        """Parse again what waited for the receive budget (:class:`FrameBudget`)."""
        self.decoder.retry()
        if self.shm is not None and self.incoming and self.state != CLOSED:
            self._report_freed()

    def _report_freed(self) -> None:
        """Tell the sender how far its ring's pieces have been copied out (one SHM_FREED
        for all the pieces of one read)."""
        pos = self.shm.take_unreported()
        if pos is not None and self.state != CLOSED:
            self.transport.write(shm_freed_frame(pos))  # type: ignore[union-attr]

    def attach_ring(self, ring: Any) -> None:
        """Stream pieces on this connection may pass through ``ring`` from now on (a
        RecvRing on an incoming connection, a SendRing on an outgoing one)."""
        self.shm = ring
        if self.incoming:
            self.decoder.shm = ring

    def agree_rings(self, ok: bool) -> None:
        """The handshake settled whether this connection may carry a ring later (the
        peer is on this host and both sides map rings)."""
        self.shm_ok = ok

    def forgo_ring(self) -> None:
        """This side makes no ring for the connection: its large messages take the
        socket, and it never offers one."""
        self.shm_asked = True

    def offer_ring(self, ring: Any) -> asyncio.Future:
        """Offer the peer ``ring`` (a SendRing, outgoing connections only): a future of
        whether it mapped it, resolved by its SHM_ANSWER (False if the connection closes
        first). The ring's fd stays open until then, for the peer to open it by."""
        self.shm_asked = True
        self._ring_offer = ring
        fut = self._ring_answer = asyncio.get_running_loop().create_future()
        self.transport.write(shm_offer_frame(ring.offer()))  # type: ignore[union-attr]
        return fut

    def _on_ring_offer(self, body: Body) -> None:
        """A SHM_OFFER: map the peer's ring if the transport takes it, and answer."""
        if self.shm_asked:
            raise FramingError("a second shared-memory ring offer", "protocol")
        self.shm_asked = True
        try:
            offer = parse_control(body).get("shm")
        except ValueError as e:
            raise FramingError(f"bad ring offer: {e}", "protocol") from None
        taken = bool(self.tr.attach_ring(self, offer))
        self.transport.write(shm_answer_frame(taken))  # type: ignore[union-attr]

    def _on_ring_answer(self, body: Body) -> None:
        """A SHM_ANSWER: attach the offered ring, or close it."""
        ring, fut = self._ring_offer, self._ring_answer
        if ring is None or len(body) != 1 or body[0] not in (0, 1):
            raise FramingError("a shared-memory ring answer nobody asked for, or malformed",
                               "protocol")
        self._ring_offer = self._ring_answer = None
        if body[0]:
            ring.attached()
            self.attach_ring(ring)
        else:
            ring.close()
        if fut is not None and not fut.done():
            fut.set_result(bool(body[0]))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        was_aborted = self.aborted
        self.state = CLOSED
        # a resumable stream cut mid-frame is no attack: the sender writes it again
        if not was_aborted and self.stream is None and self.decoder.pending_bytes():
            self.tr.rejects.reject(self.label, "connection closed mid-frame ("
                                    + self.decoder.pending_description() + ")", "truncated")
        self.decoder.abandon()  # its large frame's budget goes back to the transport
        ring, self.shm = self.shm, None
        if ring is not None:  # unmapped: the memory goes when both sides have let go
            self.decoder.shm = None
            ring.close()
        offered, fut = self._ring_offer, self._ring_answer
        self._ring_offer = self._ring_answer = None
        if offered is not None:  # never answered: the peer has not mapped it
            offered.close()
        if fut is not None and not fut.done():
            fut.set_result(False)
        err = ConnectionError(f"connection to {self.label} closed"
                              + (f": {exc}" if exc else ""))
        for fut in (self._control_waiter, self._drain_waiter):
            if fut is not None and not fut.done():
                fut.set_exception(err)
        if not self.closed.done():
            self.closed.set_result(None)
        self.tr.on_conn_lost(self, exc)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        fut = self._drain_waiter
        if fut is not None and not fut.done():
            fut.set_result(None)

    # -- helpers ------------------------------------------------------------------------
    def pause(self, reason: str) -> None:
        """Stop reading for ``reason`` (reading resumes when every reason is lifted)."""
        if not self._pause_reasons and self.transport is not None \
                and not self.transport.is_closing():
            self.transport.pause_reading()
        self._pause_reasons.add(reason)

    def unpause(self, reason: str) -> None:
        if reason not in self._pause_reasons:
            return
        self._pause_reasons.discard(reason)
        if not self._pause_reasons and self.transport is not None \
                and not self.transport.is_closing():
            self.transport.resume_reading()

    @property
    def reading_paused(self) -> bool:
        return bool(self._pause_reasons)

    async def drain(self) -> None:
        if self.state == CLOSED:
            raise ConnectionError(f"connection to {self.label} is closed")
        if not self.write_paused:
            return
        fut = self._drain_waiter
        if fut is None or fut.done():
            fut = self._drain_waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(fut)

    def write(self, data: bytes) -> None:
        if self.transport is not None and self.state != CLOSED:
            self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection now (frames in flight are lost)."""
        self.aborted = True
        if self.state != CLOSED and self.transport is not None:
            self.state = CLOSED
            self.transport.abort()

    def close(self) -> None:
        """Close after writing what is buffered."""
        if self.transport is not None and not self.transport.is_closing():
            self.aborted = True  # a close we asked for: nothing is "truncated"
            self.transport.close()

    def carry_outgoing(self, out: Any) -> None:
        """This outgoing connection now writes ``out``'s stream (ACK frames go to it)."""
        self.out = out

    def carry_stream(self, stream: Any) -> None:
        """This incoming connection now carries the resumable ``stream`` (None: no
        longer; it was handed to a newer connection)."""
        self.stream = stream

    def open(self, peer: str, channel: int, *, peer_max_frame_bytes: int | None = None,
             peer_max_message_bytes: int | None = None) -> None:
        """The handshake is done (on an outgoing connection, the peer's limits are known)."""
        self.peer = peer
        self.channel = channel
        self.peer_max_frame_bytes = peer_max_frame_bytes
        self.peer_max_message_bytes = peer_max_message_bytes
        self.state = OPEN
        if self.incoming:
            # a SEQ_MESSAGE frame is a message and its sequence number
            seq = SEQ_BYTES if self.stream is not None else 0
            self.decoder.max_frame_bytes = self.tr.max_frame_bytes + seq
            # a larger message arrives as a stream of frames (framing, "Large messages")
            self.decoder.max_stream_bytes = self.tr.max_message_bytes + seq
            self.decoder.grow(SCRATCH_BYTES)
        # an outgoing connection only ever reads ACK frames: its limit stays small
        self.label = f"{peer} ({self.label}, channel {channel})"

    async def next_control(self) -> tuple[int, Body]:
        """The next handshake frame as ``(frame type, body)``, unparsed.

        :func:`geomx.runtime.tcp_handshake.next_control` reads it into fields.
        """
        while not self._control:
            if self.state == CLOSED:
                raise ConnectionError(f"connection to {self.label} closed during the handshake")
            fut = self._control_waiter = asyncio.get_running_loop().create_future()
            await fut
        return self._control.popleft()

    def _route(self, ftype: int, first: memoryview, length: int):
        """Where a large frame's body goes (the transport's receive sinks), or None."""
        if self.state != OPEN:
            return None
        return self.tr.route_frame(self, ftype, first, length)

    def _on_frame(self, ftype: int, flags: int, body: Body) -> None:
        if self.state == CLOSED:
            return
        if ftype == FrameType.SEQ_MESSAGE and self.state == OPEN and self.stream is not None:
            if flags & ~SPLIT_BATCH:
                self.tr.rejects.reject(self.label, f"reserved frame flags {flags:#x} set",
                                        "bad_flags")
                return
            self.tr.on_seq_frame(self, body, flags)
            return
        if ftype == FrameType.ACK and self.state == OPEN and self.out is not None:
            if len(body) != SEQ_BYTES or flags:
                raise FramingError(f"malformed ACK frame ({len(body)} bytes, flags "
                                   f"{flags:#x})", "protocol")
            try:
                self.out.on_ack(self, SEQ.unpack_from(body, 0)[0])
            except ValueError as e:
                raise FramingError(str(e), "protocol") from None
            return
        if ftype == FrameType.SHM_FREED and self.state == OPEN and self.out is not None \
                and self.shm is not None:
            if len(body) != SHM_FREED.size or flags:
                raise FramingError(f"malformed SHM_FREED frame ({len(body)} bytes, flags "
                                   f"{flags:#x})", "protocol")
            try:
                self.shm.freed(SHM_FREED.unpack_from(body, 0)[0])
            except ValueError as e:
                raise FramingError(str(e), "protocol") from None
            return
        if ftype == FrameType.SHM_OFFER and self.state == OPEN and self.shm_ok \
                and self.incoming:
            if flags:
                raise FramingError(f"reserved frame flags {flags:#x} set", "bad_flags")
            self._on_ring_offer(body)
            return
        if ftype == FrameType.SHM_ANSWER and self.state == OPEN and self.shm_ok \
                and not self.incoming:
            if flags:
                raise FramingError(f"reserved frame flags {flags:#x} set", "bad_flags")
            self._on_ring_answer(body)
            return
        if ftype == FrameType.MESSAGE:
            if self.state == OPEN and self.incoming:
                if flags:
                    self.tr.rejects.reject(self.label, f"reserved frame flags {flags:#x} set",
                                            "bad_flags")
                    return
                if self.stream is not None:
                    self.tr.rejects.reject(self.label, "unsequenced message on a resumable "
                                            "stream", "protocol")
                    return
                self.tr.on_message_frame(self, body)
                return
            where = "before the handshake completed" if self.state != OPEN else \
                "on an outgoing connection"
            raise FramingError(f"message frame {where}", "protocol")
        if ftype in CONTROL_TYPES:
            if self.state != HANDSHAKE:
                raise FramingError(f"handshake frame {FrameType(ftype).name} after the "
                                   "handshake", "protocol")
            if len(self._control) >= 4:
                raise FramingError("too many handshake frames", "protocol")
            self._control.append((ftype, body))
            fut = self._control_waiter
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        self.tr.rejects.reject(self.label, f"unknown frame type {ftype} ({len(body)} bytes "
                                "skipped)", "unknown_frame_type")

