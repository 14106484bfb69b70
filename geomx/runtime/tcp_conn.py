"""One TCP connection of the real-socket transport: the asyncio protocol and its framing.

ps-lite's van leaves the socket work to a concrete van (``ZMQVan::SendMsg`` /
``RecvMsg`` in ``zmq_van.h``) and keeps the rest of the van above it; geomx draws the
same line. This module owns what happens on *one* socket, in either direction:

* :class:`Conn`, the ``asyncio.BufferedProtocol``: TCP_NODELAY, the dead-peer bound
  (:mod:`geomx.runtime.tcp_liveness`) and the write-buffer limits, frames read straight into :class:`~geomx.runtime.framing.FrameDecoder`'s
  buffer, the connection's state (``HANDSHAKE`` -> ``OPEN`` -> ``CLOSED``), handshake
  frames queued for :mod:`geomx.runtime.tcp_handshake`, message frames handed to the
  transport only once the connection is open (and only on incoming connections),
  write flow control (``drain``), and bad frames counted in the transport's reject log;
  on a resumable stream (:mod:`geomx.runtime.tcp_resume`) SEQ_MESSAGE frames go to the
  transport with their stream, and ACK frames coming back on an outgoing connection go
  to the :class:`~geomx.runtime.tcp_outgoing.Outgoing` writing on it (frame types a
  connection did not negotiate are unknown to it, as any other);
* :class:`PeerCounters`, the per-peer byte and message counters behind ``stats()``.

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
                                   SEQ, SEQ_BYTES, Body, FrameDecoder, FrameType,
                                   SPLIT_BATCH, FramingError, RejectLog)
from geomx.runtime.tcp_liveness import apply_dead_after

#: The asyncio transport's write-buffer high-water mark (``drain`` waits above it).
WRITE_HIGH_WATER_BYTES = 1024 * 1024

#: Scratch buffer of a connection before its handshake completes (then SCRATCH_BYTES).
PRE_HANDSHAKE_SCRATCH_BYTES = 8192

#: A connection's states: handshake frames only, then message frames, then nothing.
HANDSHAKE, OPEN, CLOSED = 0, 1, 2


class ConnOwner(Protocol):
    """What a :class:`Conn` needs from the transport that owns it."""

    max_frame_bytes: int
    dead_after_s: float
    _rejects: RejectLog

    def _reserve_frame(self, nbytes: int) -> bool: ...

    def _release_frame(self, nbytes: int) -> None: ...

    def _wait_for_frame_budget(self, conn: "Conn") -> None: ...

    def _accepted(self, conn: "Conn") -> None: ...

    def _on_message_frame(self, conn: "Conn", body: Body) -> None: ...

    def _on_seq_frame(self, conn: "Conn", body: Body) -> None: ...

    def _conn_lost(self, conn: "Conn", exc: Exception | None) -> None: ...


class PeerCounters:
    """Bytes and messages sent to and received from one peer."""

    __slots__ = ("bytes_sent", "bytes_received", "msgs_sent", "msgs_received")

    def __init__(self) -> None:
        self.bytes_sent = self.bytes_received = self.msgs_sent = self.msgs_received = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


class Conn(asyncio.BufferedProtocol):
    """One TCP connection (either direction): framing, handshake frames, write flow control."""

    def __init__(self, tr: ConnOwner, *, incoming: bool, label: str):
        self.tr = tr
        self.incoming = incoming
        self.label = label
        self.peer: str | None = None
        self.channel = -1
        self.out: Any = None  # the tcp_outgoing.Outgoing writing on it (outgoing only)
        self.stream: Any = None  # the tcp_resume.InStream it carries (resumable, incoming)
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
        self.decoder = FrameDecoder(self._on_frame, max_frame_bytes=MAX_CONTROL_FRAME_BYTES,
                                    scratch_bytes=PRE_HANDSHAKE_SCRATCH_BYTES,
                                    reserve=tr._reserve_frame if incoming else None,
                                    release=tr._release_frame if incoming else None,
                                    alloc=tr._recv_pool.take,
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
            self.tr._accepted(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.state == CLOSED:
            return
        try:
            self.decoder.buffer_updated(nbytes)
        except FramingError as e:
            self.tr._rejects.reject(self.label, e.reason, e.category)
            self.abort()
            return
        if self.decoder.waiting and "budget" not in self._pause_reasons:
            self.pause("budget")
            self.tr._wait_for_frame_budget(self)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        was_aborted = self.aborted
        self.state = CLOSED
        # a resumable stream cut mid-frame is no attack: the sender writes it again
        if not was_aborted and self.stream is None and self.decoder.pending_bytes():
            self.tr._rejects.reject(self.label, "connection closed mid-frame ("
                                    + self.decoder.pending_description() + ")", "truncated")
        self.decoder.abandon()  # its large frame's budget goes back to the transport
        err = ConnectionError(f"connection to {self.label} closed"
                              + (f": {exc}" if exc else ""))
        for fut in (self._control_waiter, self._drain_waiter):
            if fut is not None and not fut.done():
                fut.set_exception(err)
        if not self.closed.done():
            self.closed.set_result(None)
        self.tr._conn_lost(self, exc)

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

    def open(self, peer: str, channel: int) -> None:
        self.peer = peer
        self.channel = channel
        self.state = OPEN
        if self.incoming:
            # a SEQ_MESSAGE frame is a message and its sequence number
            self.decoder.max_frame_bytes = self.tr.max_frame_bytes + (
                SEQ_BYTES if self.stream is not None else 0)
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
        return self.tr._route_frame(self, ftype, first, length)

    def _on_frame(self, ftype: int, flags: int, body: Body) -> None:
        if self.state == CLOSED:
            return
        if ftype == FrameType.SEQ_MESSAGE and self.state == OPEN and self.stream is not None:
            if flags & ~SPLIT_BATCH:
                self.tr._rejects.reject(self.label, f"reserved frame flags {flags:#x} set",
                                        "bad_flags")
                return
            self.tr._on_seq_frame(self, body, flags)
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
        if ftype == FrameType.MESSAGE:
            if self.state == OPEN and self.incoming:
                if flags:
                    self.tr._rejects.reject(self.label, f"reserved frame flags {flags:#x} set",
                                            "bad_flags")
                    return
                if self.stream is not None:
                    self.tr._rejects.reject(self.label, "unsequenced message on a resumable "
                                            "stream", "protocol")
                    return
                self.tr._on_message_frame(self, body)
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
        self.tr._rejects.reject(self.label, f"unknown frame type {ftype} ({len(body)} bytes "
                                "skipped)", "unknown_frame_type")

