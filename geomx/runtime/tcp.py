"""The real-socket ``Transport``: TCP streams for reliable channels, UDP for unreliable ones.

Model (ps-lite's van, without ZeroMQ)
-------------------------------------
* A node listens on one TCP port (and binds a UDP socket on the same port number, see
  :mod:`geomx.runtime.udp`); its address is ``"host:port"``.
* To send, a node opens **one TCP connection per (peer, channel)** for the reliable
  channels 0..7, lazily, on the first message (retrying with exponential backoff while
  the peer is still starting, then failing with a :class:`ConnectionError` that names
  the peer). Connections carry messages in one direction only; replies travel on the
  peer's own connection back. A separate connection per channel keeps a bulk transfer
  on one channel from delaying a small message on another (head-of-line blocking).
* Every connection starts with the handshake of :mod:`geomx.runtime.security` (names,
  channel, optional shared-secret HMAC challenge) inside optional TLS; no message frame
  is accepted before it completes.
* Frames are those of :mod:`geomx.runtime.framing`; array payloads are written with
  ``writelines`` of zero-copy views and read straight into their final buffer.

* With a shared secret, a message whose ``src`` is not the name its connection
  authenticated as is rejected (``stats()["rejected"]["src_mismatch"]``); without one,
  names are taken on trust.

Ordering and back-pressure
--------------------------
Each connection has a send queue ordered by ``msg.priority`` (higher first, FIFO among
equal priorities) and one writer task. ``send()`` returns once the message is queued;
it waits first while the connection's queued bytes (queued + being written, until the
socket's buffer drains) would exceed ``send_queue_limit_bytes`` -- a limit *per
(peer, channel) connection*; a message larger than the limit is admitted alone. So a
peer that stops reading stalls its senders instead of growing their memory. When a
connection is idle (nothing queued or being written) a message of up to 4 MiB is
written by ``send()`` itself, which keeps the same guarantees and saves a task switch.
Larger messages are written in 4 MiB batches, each after the socket has drained, so the
event loop never buffers a whole tensor. On the receiving side decoded messages wait
in an inbox for ``recv()``; above ``recv_queue_limit_bytes`` the transport stops
reading the sockets, which closes the TCP windows and pushes the stall back to the
senders (UDP messages arriving while the inbox is over the limit are dropped and
counted).

Delivery is in order per (src, dst, channel) and exactly once while both ends live. If
an established connection breaks, the messages still queued on it are dropped, logged
and counted (``stats()["dropped_messages"]``; a message already partly written is lost
with the connection), and the next ``send()`` reconnects.

Shaping
-------
With a :class:`~geomx.runtime.shaper.Shaper` the writer paces each message's bytes by
the peer's token bucket in 64 KiB pieces and hands them to a delay line that writes
them when due, so the link is never serialised by its delay (see the shaper module).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import socket
import ssl
from collections import deque
from collections.abc import Iterator

from geomx.runtime import security
from geomx.runtime.framing import (CONTROL_TYPES, DEFAULT_MAX_FRAME_BYTES,
                                   MAX_CONTROL_FRAME_BYTES, PREAMBLE_BYTES, SCRATCH_BYTES, Body,
                                   FrameDecoder, FrameType,
                                   FramingError, RejectLog, control_frame, decode_message,
                                   message_frames, parse_control)
from geomx.runtime.shaper import PACING_LEAD_S, DelayLine, Shaper, ShapedLink, now_s
from geomx.runtime.udp import (DEFAULT_CHUNK_PAYLOAD_BYTES, DEFAULT_REASSEMBLY_TIMEOUT_S,
                               UdpEndpoint)
from geomx.wire import UNRELIABLE_BASE, Message, WireError

log = logging.getLogger("geomx.runtime.tcp")

DEFAULT_SEND_QUEUE_LIMIT_BYTES = 64 * 1024 * 1024
DEFAULT_RECV_QUEUE_LIMIT_BYTES = 256 * 1024 * 1024
DEFAULT_CONNECT_TIMEOUT_S = 30.0
#: How long a send waits for a peer's address to arrive in the address book.
DEFAULT_ADDRESS_WAIT_S = 60.0
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
#: The asyncio transport's write-buffer high-water mark (``drain`` waits above it).
WRITE_HIGH_WATER_BYTES = 1024 * 1024
#: Messages up to this size are joined into one buffer before writing (cheaper than a
#: scatter write for a few hundred bytes).
SMALL_MESSAGE_BYTES = 16 * 1024
#: Larger messages are written in batches of this many bytes, waiting for the socket
#: between batches: the event loop never holds more than one batch (the stock asyncio
#: loop and TLS transports copy what they are given; uvloop keeps zero-copy views).
WRITE_BATCH_BYTES = 4 * 1024 * 1024
#: Piece size used to pace shaped traffic.
SHAPED_PIECE_BYTES = 64 * 1024
#: First and largest wait between connection attempts.
CONNECT_BACKOFF_S = (0.05, 1.0)
HANDSHAKE_VERSION = 1
MAX_NAME_BYTES = 255

_HANDSHAKE, _OPEN, _CLOSED = 0, 1, 2


class HandshakeRefused(ConnectionError):
    """The peer (or this side) refused the handshake; retrying will not help."""


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


class _PeerCounters:
    __slots__ = ("bytes_sent", "bytes_received", "msgs_sent", "msgs_received")

    def __init__(self) -> None:
        self.bytes_sent = self.bytes_received = self.msgs_sent = self.msgs_received = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


class _Conn(asyncio.BufferedProtocol):
    """One TCP connection (either direction): framing, handshake frames, write flow control."""

    def __init__(self, tr: "TcpTransport", *, incoming: bool, label: str):
        self.tr = tr
        self.incoming = incoming
        self.label = label
        self.peer: str | None = None
        self.channel = -1
        self.out: _Outgoing | None = None
        self.transport: asyncio.Transport | None = None
        self.state = _HANDSHAKE
        self.aborted = False
        self.write_paused = False
        self.reading_paused = False
        # outgoing connections only ever read handshake frames: a small scratch will do
        self.decoder = FrameDecoder(self._on_frame, max_frame_bytes=MAX_CONTROL_FRAME_BYTES,
                                    scratch_bytes=SCRATCH_BYTES if incoming else 8192)
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
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)  # type: ignore[attr-defined]
        peername = transport.get_extra_info("peername")
        if peername and self.incoming:
            self.label = f"{peername[0]}:{peername[1]}"
        if self.incoming:
            self.tr._accepted(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.state == _CLOSED:
            return
        try:
            self.decoder.buffer_updated(nbytes)
        except FramingError as e:
            self.tr._rejects.reject(self.label, e.reason, e.category)
            self.abort()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        was_aborted = self.aborted
        self.state = _CLOSED
        if not was_aborted and self.decoder.pending_bytes():
            self.tr._rejects.reject(self.label, "connection closed mid-frame ("
                                    + self.decoder.pending_description() + ")", "truncated")
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
    async def drain(self) -> None:
        if self.state == _CLOSED:
            raise ConnectionError(f"connection to {self.label} is closed")
        if not self.write_paused:
            return
        fut = self._drain_waiter
        if fut is None or fut.done():
            fut = self._drain_waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(fut)

    def write(self, data: bytes) -> None:
        if self.transport is not None and self.state != _CLOSED:
            self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection now (frames in flight are lost)."""
        self.aborted = True
        if self.state != _CLOSED and self.transport is not None:
            self.state = _CLOSED
            self.transport.abort()

    def close(self) -> None:
        """Close after writing what is buffered."""
        if self.transport is not None and not self.transport.is_closing():
            self.aborted = True  # a close we asked for: nothing is "truncated"
            self.transport.close()

    def open(self, peer: str, channel: int) -> None:
        self.peer = peer
        self.channel = channel
        self.state = _OPEN
        self.decoder.max_frame_bytes = self.tr.max_frame_bytes
        self.label = f"{peer} ({self.label}, channel {channel})"

    async def next_control(self) -> tuple[FrameType, dict]:
        """The next handshake frame as ``(type, fields)``."""
        while not self._control:
            if self.state == _CLOSED:
                raise ConnectionError(f"connection to {self.label} closed during the handshake")
            fut = self._control_waiter = asyncio.get_running_loop().create_future()
            await fut
        ftype, body = self._control.popleft()
        try:
            return FrameType(ftype), parse_control(body)
        except ValueError as e:
            raise HandshakeRefused(str(e)) from None

    def _on_frame(self, ftype: int, flags: int, body: Body) -> None:
        if self.state == _CLOSED:
            return
        if ftype == FrameType.MESSAGE:
            if self.state == _OPEN and self.incoming:
                if flags:
                    self.tr._rejects.reject(self.label, f"reserved frame flags {flags:#x} set",
                                            "bad_flags")
                    return
                self.tr._on_message_frame(self, body)
                return
            where = "before the handshake completed" if self.state != _OPEN else \
                "on an outgoing connection"
            raise FramingError(f"message frame {where}", "protocol")
        if ftype in CONTROL_TYPES:
            if self.state != _HANDSHAKE:
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


def _batches(frames: list, size: int) -> Iterator[list]:
    """Group ``frames`` into lists of zero-copy views of at most ``size`` bytes each."""
    batch: list = []
    room = size
    for f in frames:
        mv = memoryview(f)
        n = mv.nbytes
        off = 0
        while off < n:
            take = min(room, n - off)
            batch.append(mv[off:off + take] if take != n else mv)
            off += take
            room -= take
            if room == 0:
                yield batch
                batch, room = [], size
    if batch:
        yield batch


def _pieces(frames: list, size: int) -> Iterator[memoryview]:
    for f in frames:
        mv = memoryview(f)
        n = mv.nbytes
        if n <= size:
            yield mv
        else:
            for off in range(0, n, size):
                yield mv[off:off + size]


class _Outgoing:
    """The sending side of one (peer, channel): connection, priority queue, writer task."""

    def __init__(self, tr: "TcpTransport", peer: str, channel: int):
        self.tr = tr
        self.peer = peer
        self.channel = channel
        self.proto: _Conn | None = None
        self._connecting: asyncio.Task | None = None
        self.heap: list[tuple[int, int, list, int]] = []
        self._seq = itertools.count()
        self.queued_bytes = 0
        self.peak_queued_bytes = 0
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._writer: asyncio.Task | None = None
        self._line: DelayLine | None = None
        self.link: ShapedLink | None = tr.shaper.link(peer) if tr.shaper is not None else None
        self._flow = self.link.flow_bucket() if self.link is not None else None
        self.generation = 0  # bumped by _fail(): byte counts from before belong to no one

    # -- connection -------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self.proto is not None and self.proto.state == _OPEN

    async def ready(self) -> None:
        if self.is_open:
            return
        task = self._connecting
        if task is None:
            task = self._connecting = asyncio.get_running_loop().create_task(
                self._connect(), name=f"{self.tr.name}->{self.peer}/ch{self.channel}:connect")
            task.add_done_callback(self._connect_done)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current is not None and current.cancelling()):
                # the connection attempt was abandoned by close(), not this caller
                raise ConnectionError(f"{self.tr.name}: transport closed while connecting to "
                                      f"{self.peer!r}") from None
            raise

    def _connect_done(self, task: asyncio.Task) -> None:
        self._connecting = None
        if not task.cancelled():
            task.exception()  # retrieved: the awaiting senders re-raise it

    async def _connect(self) -> None:
        tr = self.tr
        loop = asyncio.get_running_loop()
        host, port = await tr.address_of(self.peer)
        deadline = loop.time() + tr.connect_timeout_s
        backoff, max_backoff = CONNECT_BACKOFF_S
        attempts = 0
        hint = ""
        while True:
            attempts += 1
            last: BaseException | None = None
            proto: _Conn | None = None
            try:
                _, proto = await asyncio.wait_for(loop.create_connection(
                    lambda: _Conn(tr, incoming=False, label=f"{host}:{port}"), host, port,
                    ssl=tr.ssl_client, server_hostname=host if tr.ssl_client else None),
                    timeout=max(0.01, deadline - loop.time()))
                await asyncio.wait_for(self._client_handshake(proto, host, port),
                                       timeout=min(tr.handshake_timeout_s,
                                                   max(0.01, deadline - loop.time())))
            except HandshakeRefused:
                if proto is not None:
                    proto.abort()
                raise
            except ssl.SSLError as e:
                if proto is not None:
                    proto.abort()
                raise HandshakeRefused(f"{tr.name}: TLS with {self.peer!r} at {host}:{port} "
                                       f"failed: {e}") from None
            except (OSError, ConnectionError, asyncio.TimeoutError) as e:
                hint = ""
                if proto is not None:  # TCP connected, the handshake did not complete
                    proto.abort()
                    hint = (" (the TCP connection opened but the handshake did not complete: "
                            "does one side use TLS and the other not?)")
                last = e
            else:
                proto.out = self
                self.proto = proto
                self._start_writer()
                log.debug("%s: connected to %s at %s:%d, channel %d", tr.name, self.peer, host,
                          port, self.channel)
                return
            if loop.time() + backoff > deadline or tr.closed:
                raise ConnectionError(
                    f"{tr.name}: cannot reach peer {self.peer!r} at {host}:{port} (channel "
                    f"{self.channel}) after {attempts} attempt(s) in {tr.connect_timeout_s:g} s: "
                    f"{type(last).__name__}: {last}{hint}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)

    async def _client_handshake(self, proto: _Conn, host: str, port: int) -> None:
        tr, peer, ch = self.tr, self.peer, self.channel
        secret = tr.secret
        where = f"{peer!r} at {host}:{port}"
        proto.write(control_frame(FrameType.HELLO, v=HANDSHAKE_VERSION, name=tr.name, to=peer,
                                  ch=ch, auth=secret is not None))
        ftype, body = await proto.next_control()
        if ftype == FrameType.REFUSE:
            raise HandshakeRefused(f"{tr.name}: {where} refused the connection: "
                                   f"{body.get('reason', '?')}")
        if body.get("name") != peer:
            raise HandshakeRefused(f"{tr.name}: {host}:{port} answers as {body.get('name')!r}, "
                                   f"not {peer!r} (is the address book stale?)")
        if ftype == FrameType.CHALLENGE:
            if secret is None:
                raise HandshakeRefused(f"{tr.name}: {where} requires a shared secret and this "
                                       "node has none")
            ns = _hex_field(body, "nonce", security.NONCE_BYTES)
            nc = security.new_nonce()
            proof = security.client_proof(secret, ns, nc, tr.name, peer, ch)
            proto.write(control_frame(FrameType.AUTH, nonce=nc.hex(), mac=proof.hex()))
            ftype, body = await proto.next_control()
            if ftype == FrameType.REFUSE:
                raise HandshakeRefused(f"{tr.name}: {where} refused the connection: "
                                       f"{body.get('reason', '?')} (do both nodes use the "
                                       "same shared secret?)")
            if ftype != FrameType.WELCOME:
                raise HandshakeRefused(f"{tr.name}: {where} sent {ftype.name} instead of WELCOME")
            mac = _hex_field(body, "mac", 32)
            if not security.verify(security.server_proof(secret, ns, nc, tr.name, peer, ch), mac):
                raise HandshakeRefused(f"{tr.name}: {where} failed to prove the shared secret; "
                                       "refusing it")
        elif ftype == FrameType.WELCOME:
            if secret is not None:
                raise HandshakeRefused(f"{tr.name}: {where} accepted without authentication "
                                       "(it has no shared secret); refusing it")
        else:
            raise HandshakeRefused(f"{tr.name}: unexpected {ftype.name} frame from {where}")
        proto.open(peer, ch)

    # -- queue and back-pressure --------------------------------------------------------
    async def reserve(self, nbytes: int) -> None:
        """Wait until ``nbytes`` fit under the send-queue limit, then count them as queued."""
        limit = self.tr.send_queue_limit_bytes
        if not self._waiters and (self.queued_bytes == 0 or self.queued_bytes + nbytes <= limit):
            self._add_queued(nbytes)
            return
        fut = asyncio.get_running_loop().create_future()
        entry = (nbytes, fut)
        self._waiters.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release(nbytes)  # it was admitted just as we were cancelled
            else:
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
            raise

    def _add_queued(self, nbytes: int) -> None:
        self.queued_bytes += nbytes
        if self.queued_bytes > self.peak_queued_bytes:
            self.peak_queued_bytes = self.queued_bytes
        self._idle.clear()

    def _release(self, nbytes: int) -> None:
        self.queued_bytes -= nbytes
        limit = self.tr.send_queue_limit_bytes
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if self.queued_bytes and self.queued_bytes + n > limit:
                break
            self._waiters.popleft()
            self._add_queued(n)
            fut.set_result(None)
        if self.queued_bytes == 0 and not self.heap:
            self._idle.set()

    def idle_unshaped(self) -> bool:
        """True when a message may be written at once: unshaped, open, nothing queued."""
        proto = self.proto
        return (self.link is None and self.queued_bytes == 0 and not self.heap
                and not self._waiters and proto is not None and proto.state == _OPEN
                and not proto.write_paused)

    async def write_now(self, frames: list, nbytes: int) -> None:
        """Write directly (see :meth:`idle_unshaped`); wait for the socket if it fills up."""
        proto = self.proto
        if nbytes <= SMALL_MESSAGE_BYTES:  # one buffer: one immediate send() in the loop
            proto.transport.write(b"".join(frames))  # type: ignore[union-attr]
        else:
            proto.transport.writelines(frames)  # type: ignore[union-attr]
        counters = self.tr._counters(self.peer)
        counters.msgs_sent += 1
        counters.bytes_sent += nbytes
        if not proto.write_paused:  # type: ignore[union-attr]
            return
        generation = self.generation
        self._add_queued(nbytes)
        try:
            await proto.drain()  # type: ignore[union-attr]
        except ConnectionError:
            pass  # _fail() has reset the queue and logged the loss
        finally:
            if generation == self.generation:
                self._release(nbytes)

    def push(self, priority: int, frames: list, nbytes: int) -> None:
        heapq.heappush(self.heap, (-priority, next(self._seq), frames, nbytes))
        self._wake.set()

    async def flush(self) -> None:
        await self._idle.wait()

    # -- writing ----------------------------------------------------------------------
    def _start_writer(self) -> None:
        if self.link is not None:
            self._line = DelayLine(self._line_write, drain=self._line_drain,
                                   must_drain=self._line_must_drain, on_written=self._written,
                                   on_error=self._fail,
                                   name=f"{self.tr.name}->{self.peer}/ch{self.channel}:delay")
        self._writer = asyncio.get_running_loop().create_task(
            self._run(), name=f"{self.tr.name}->{self.peer}/ch{self.channel}:writer")

    def _line_write(self, piece: object) -> None:
        proto = self.proto
        if proto is None or proto.state != _OPEN:
            raise ConnectionError(f"connection to {self.peer!r} (channel {self.channel}) lost")
        proto.transport.write(piece)  # type: ignore[union-attr, arg-type]

    async def _line_drain(self) -> None:
        if self.proto is not None:
            await self.proto.drain()

    def _line_must_drain(self) -> bool:
        return self.proto is not None and self.proto.write_paused

    def _written(self, nbytes: int) -> None:
        self.tr._counters(self.peer).bytes_sent += nbytes
        self._release(nbytes)

    async def _run(self) -> None:
        try:
            while True:
                while not self.heap:
                    self._wake.clear()
                    await self._wake.wait()
                _, _, frames, nbytes = heapq.heappop(self.heap)
                proto = self.proto
                if proto is None or proto.state != _OPEN:
                    raise ConnectionError(f"connection to {self.peer!r} lost")
                counters = self.tr._counters(self.peer)
                counters.msgs_sent += 1
                if self.link is None:
                    if nbytes <= WRITE_BATCH_BYTES:
                        proto.transport.writelines(frames)  # type: ignore[union-attr]
                        if proto.write_paused:
                            await proto.drain()
                    else:
                        for batch in _batches(frames, WRITE_BATCH_BYTES):
                            if proto.state != _OPEN:
                                raise ConnectionError(f"connection to {self.peer!r} lost")
                            proto.transport.writelines(batch)  # type: ignore[union-attr]
                            if proto.write_paused:
                                await proto.drain()
                    counters.bytes_sent += nbytes
                    self._release(nbytes)
                    continue
                link, flow, line = self.link, self._flow, self._line
                delay = link.sample_delay()
                for piece in _pieces(frames, SHAPED_PIECE_BYTES):
                    now = now_s()
                    t_done = link.transmit(piece.nbytes, now, flow)
                    line.put(t_done + delay, piece, piece.nbytes)  # type: ignore[union-attr]
                    if t_done - now > PACING_LEAD_S:
                        await asyncio.sleep(t_done - now - PACING_LEAD_S)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, OSError) as e:
            self._fail(e)

    def _fail(self, exc: BaseException) -> None:
        """The connection broke: drop what is queued, wake blocked senders, reset."""
        dropped = len(self.heap)
        self.generation += 1
        self.heap.clear()
        if self._line is not None:
            self._line.clear()
            self._line.close()
            self._line = None
        if self._writer is not None and self._writer is not asyncio.current_task():
            self._writer.cancel()
        self._writer = None
        proto, self.proto = self.proto, None
        if proto is not None:
            proto.abort()
        self.queued_bytes = 0
        err = ConnectionError(f"{self.tr.name}: connection to {self.peer!r} (channel "
                              f"{self.channel}) lost: {exc}")
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(err)
        self._idle.set()
        self.tr._dropped += dropped
        if not self.tr.closed:
            lvl = logging.WARNING if dropped else logging.INFO
            log.log(lvl, "%s: connection to %s (channel %d) lost: %s; %d queued message(s) "
                    "dropped", self.tr.name, self.peer, self.channel, exc, dropped)

    def shutdown(self, abort: bool = False) -> None:
        """Stop for good: fail blocked senders, stop the tasks, close (or abort) the socket."""
        err = ConnectionError(f"{self.tr.name}: transport closed")
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(err)
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        if self._line is not None:
            self._line.close()
            self._line = None
        if self._connecting is not None:
            self._connecting.cancel()
        if self.proto is not None:
            if abort:
                self.proto.abort()
            else:
                self.proto.close()


def _hex_field(body: dict, key: str, size: int) -> bytes:
    v = body.get(key)
    try:
        b = bytes.fromhex(v) if isinstance(v, str) else b""
    except ValueError:
        b = b""
    if len(b) != size:
        raise HandshakeRefused(f"handshake field {key!r} must be {size} hex-encoded bytes")
    return b


class _Refuse(Exception):
    def __init__(self, reason: str, category: str, public: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.category = category
        self.public = public or reason


class TcpTransport:
    """A node's real-socket transport (implements :class:`geomx.transport.Transport`).

    ``TcpTransport(name, host=, port=, secret=, ssl_server=, ssl_client=, shaper=,
    max_frame_bytes=, send_queue_limit_bytes=)``; then ``await start()``,
    ``set_address_book({...})``, ``send``/``recv``, ``await close()``. See the module
    docstring for the model.
    """

    def __init__(self, name: str, *, host: str = "127.0.0.1", port: int = 0,
                 secret: bytes | str | None = None,
                 ssl_server: ssl.SSLContext | None = None,
                 ssl_client: ssl.SSLContext | None = None,
                 shaper: Shaper | None = None,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 send_queue_limit_bytes: int = DEFAULT_SEND_QUEUE_LIMIT_BYTES,
                 recv_queue_limit_bytes: int = DEFAULT_RECV_QUEUE_LIMIT_BYTES,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 address_wait_s: float = DEFAULT_ADDRESS_WAIT_S,
                 handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
                 udp: bool = True,
                 udp_chunk_bytes: int = DEFAULT_CHUNK_PAYLOAD_BYTES,
                 udp_reassembly_timeout_s: float = DEFAULT_REASSEMBLY_TIMEOUT_S,
                 advertise_host: str | None = None):
        if not name or len(name.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"node name must be 1..{MAX_NAME_BYTES} bytes, got {name!r}")
        if not 0 <= port < 65536:
            raise ValueError(f"port must be within 0..65535 (0 = any free port), got {port}")
        if not PREAMBLE_BYTES < max_frame_bytes <= (1 << 32) - 1:
            raise ValueError(f"max_frame_bytes must be within ({PREAMBLE_BYTES}, 2**32 - 1], "
                             f"got {max_frame_bytes}")
        for label, v in (("send_queue_limit_bytes", send_queue_limit_bytes),
                         ("recv_queue_limit_bytes", recv_queue_limit_bytes),
                         ("connect_timeout_s", connect_timeout_s),
                         ("address_wait_s", address_wait_s),
                         ("handshake_timeout_s", handshake_timeout_s)):
            if not v > 0:
                raise ValueError(f"{label} must be > 0, got {v!r}")
        self.name = name
        self.host = host
        self.port = port
        self.advertise_host = advertise_host
        self.secret = security.normalize_secret(secret)
        self.ssl_server = ssl_server
        self.ssl_client = ssl_client
        self.shaper = shaper
        self.max_frame_bytes = max_frame_bytes
        self.send_queue_limit_bytes = send_queue_limit_bytes
        self.recv_queue_limit_bytes = recv_queue_limit_bytes
        self.connect_timeout_s = connect_timeout_s
        self.address_wait_s = address_wait_s
        self._book_event: asyncio.Event | None = None
        self.handshake_timeout_s = handshake_timeout_s
        self.closed = False
        self._use_udp = udp
        self._udp_chunk_bytes = udp_chunk_bytes
        self._udp_timeout_s = udp_reassembly_timeout_s
        self._udp: UdpEndpoint | None = None
        self._udp_addrs: dict[str, tuple] = {}
        self._server: asyncio.AbstractServer | None = None
        self._book: dict[str, tuple[str, int]] = {}
        self._out: dict[tuple[str, int], _Outgoing] = {}
        self._incoming: set[_Conn] = set()
        self._tasks: set[asyncio.Task] = set()
        self._peers: dict[str, _PeerCounters] = {}
        self._rejects = RejectLog(name, log)
        self._refused = 0
        self._dropped = 0
        self._udp_inbox_dropped = 0
        self._inbox: deque[tuple[Message, int]] = deque()
        self._inbox_bytes = 0
        self._inbox_event: asyncio.Event | None = None
        self._paused: set[_Conn] = set()

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the listening TCP socket (and the UDP socket on the same port); return."""
        if self._server is not None:
            raise RuntimeError(f"{self.name}: transport already started")
        loop = asyncio.get_running_loop()
        self._inbox_event = asyncio.Event()
        self._book_event = asyncio.Event()
        tries = 20 if (self.port == 0 and self._use_udp) else 1
        last: OSError | None = None
        for _ in range(tries):
            server = await loop.create_server(
                lambda: _Conn(self, incoming=True, label="?"), self.host, self.port,
                ssl=self.ssl_server, reuse_address=True, backlog=1024)
            port = server.sockets[0].getsockname()[1]
            if not self._use_udp:
                self._server, self.port = server, port
                break
            udp = UdpEndpoint(self.name, on_message=self._on_udp_message, rejects=self._rejects,
                              secret=self.secret, chunk_payload_bytes=self._udp_chunk_bytes,
                              reassembly_timeout_s=self._udp_timeout_s)
            try:
                await udp.start(self.host, port)
            except OSError as e:  # the UDP port number is taken: try another TCP port
                last = e
                server.close()
                continue
            self._server, self.port, self._udp = server, port, udp
            break
        else:
            raise OSError(f"{self.name}: cannot bind TCP and UDP on the same port at "
                          f"{self.host}:{self.port}: {last}")
        log.debug("%s: listening on %s", self.name, self.local_address())

    def local_address(self) -> str:
        """``"host:port"`` that peers should dial (``advertise_host`` if set)."""
        host = self.advertise_host or self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.port}"

    def set_address_book(self, book: dict[str, str]) -> None:
        """Learn peers' addresses: entries are added or replaced, never forgotten.

        Calling it again with a partial book (say, the peers a rendezvous just announced)
        is fine. Open connections stay on the address they were opened with.
        """
        parsed = {}
        for peer, addr in book.items():
            try:
                parsed[peer] = parse_address(addr)
            except ValueError as e:
                raise ValueError(f"address book entry for {peer!r}: {e}") from None
        self._book.update(parsed)
        for peer in parsed:
            self._udp_addrs.pop(peer, None)
        self._notify_book()

    def _notify_book(self) -> None:
        """Wake every send waiting in :meth:`address_of` (they re-check the book)."""
        event = self._book_event
        if event is not None:
            self._book_event = asyncio.Event()
            event.set()

    async def address_of(self, peer: str) -> tuple[str, int]:
        """``peer``'s address, waiting up to ``address_wait_s`` for it to be announced.

        A peer can talk to us before our own copy of the address book has arrived: the
        scheduler answers every member's registration at once, and one member may get its
        answer and send us a request while ours is still in flight. Dropping our reply
        then would leave that peer waiting forever (the start-up hang of issue 9), so a
        send to a peer we cannot place yet waits for ``set_address_book`` instead; past
        the bound it fails with :class:`UnknownPeer`, which names the peer.
        """
        addr = self._book.get(peer)
        if addr is not None:
            return addr
        if self._book_event is None or self.closed:
            raise self._unknown(peer, waited_s=0.0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            async with asyncio.timeout(self.address_wait_s):
                while peer not in self._book:
                    if self.closed:
                        raise self._unknown(peer, waited_s=loop.time() - t0)
                    await self._book_event.wait()
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

    async def close(self, *, flush_timeout_s: float = 5.0) -> None:
        """Flush queued messages (up to ``flush_timeout_s``), then close every socket."""
        if self.closed:
            return
        self.closed = True
        if self._server is not None:
            self._server.close()
        outs = list(self._out.values())
        pending = [o.flush() for o in outs if o.is_open]
        flushed = True
        if pending:
            try:
                await asyncio.wait_for(asyncio.gather(*pending), flush_timeout_s)
            except asyncio.TimeoutError:
                flushed = False
                log.warning("%s: close(): queued messages not flushed within %g s; dropping "
                            "them", self.name, flush_timeout_s)
        conns = []
        for o in outs:
            if o.proto is not None:
                conns.append(o.proto)
            o.shutdown(abort=not flushed)
        for c in list(self._incoming):
            conns.append(c)
            c.close()
        for t in list(self._tasks):
            t.cancel()
        if self._udp is not None:
            self._udp.close()
        if self._inbox_event is not None:
            self._inbox_event.set()
        self._notify_book()
        waits = [c.closed for c in conns if not c.closed.done()]
        if waits:
            await asyncio.wait(waits, timeout=1.0)
            for c in conns:
                if not c.closed.done():  # a peer that does not read: stop waiting for it
                    c.abort()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except asyncio.TimeoutError:  # pragma: no cover
                pass

    # -- sending ----------------------------------------------------------------------
    async def connect(self, peer: str, channel: int = 0) -> None:
        """Open (and handshake) the connection to ``peer`` on ``channel`` now."""
        if self.closed:
            raise ConnectionError(f"{self.name}: transport is closed")
        await self._outgoing(peer, channel).ready()

    def _outgoing(self, peer: str, channel: int) -> _Outgoing:
        key = (peer, channel)
        out = self._out.get(key)
        if out is None:
            out = self._out[key] = _Outgoing(self, peer, channel)
        return out

    async def send(self, msg: Message) -> None:
        """Queue ``msg`` for ``msg.dst``; waits for the connection and for queue space."""
        if self.closed:
            raise ConnectionError(f"{self.name}: transport is closed")
        ch = msg.channel
        if ch < 0:
            raise ValueError(f"channel must be >= 0, got {ch}")
        if ch >= UNRELIABLE_BASE:
            await self._send_udp(msg)
            return
        frames, nbytes = message_frames(msg)
        if nbytes - PREAMBLE_BYTES > self.max_frame_bytes:
            raise WireError(f"message of {nbytes - PREAMBLE_BYTES} bytes exceeds max_frame_bytes "
                            f"({self.max_frame_bytes})")
        out = self._outgoing(msg.dst, ch)
        if not out.is_open:
            await out.ready()
        if nbytes <= WRITE_BATCH_BYTES and out.idle_unshaped():
            # Fast path: nothing queued or being written, so writing now keeps every
            # ordering guarantee and saves a hop through the writer task.
            await out.write_now(frames, nbytes)
            return
        await out.reserve(nbytes)
        if not out.is_open:  # the connection broke while we waited (_fail resets the count)
            raise ConnectionError(f"{self.name}: connection to {msg.dst!r} (channel {ch}) lost")
        out.push(msg.priority, frames, nbytes)

    async def _send_udp(self, msg: Message) -> None:
        if self._udp is None:
            raise ConnectionError(f"{self.name}: UDP channels are disabled (udp=False) but the "
                                  f"message to {msg.dst!r} is on channel {msg.channel}")
        addr = self._udp_addrs.get(msg.dst)
        if addr is None:
            host, port = await self.address_of(msg.dst)
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_DGRAM)
            addr = self._udp_addrs[msg.dst] = infos[0][4][:2]
        link = self.shaper.link(msg.dst) if self.shaper is not None else None
        n = await self._udp.send(msg, addr, link)
        c = self._counters(msg.dst)
        c.bytes_sent += n
        c.msgs_sent += 1

    # -- receiving --------------------------------------------------------------------
    async def recv(self) -> Message:
        """The next message for this node, from any peer (FIFO in arrival order)."""
        event = self._inbox_event
        if event is None:
            raise RuntimeError(f"{self.name}: call start() before recv()")
        while not self._inbox:
            if self.closed:
                raise ConnectionError(f"{self.name}: transport is closed")
            event.clear()
            await event.wait()
        msg, n = self._inbox.popleft()
        self._inbox_bytes -= n
        if self._paused and self._inbox_bytes <= self.recv_queue_limit_bytes // 2:
            for c in self._paused:
                c.reading_paused = False
                if c.transport is not None and not c.transport.is_closing():
                    c.transport.resume_reading()
            self._paused.clear()
        return msg

    def pending(self) -> int:
        """Messages waiting for ``recv()``."""
        return len(self._inbox)

    def _deliver(self, msg: Message, nbytes: int) -> None:
        self._inbox.append((msg, nbytes))
        self._inbox_bytes += nbytes
        self._inbox_event.set()  # type: ignore[union-attr]

    def _on_message_frame(self, conn: _Conn, body: Body) -> None:
        counters = self._counters(conn.peer)  # type: ignore[arg-type]
        counters.bytes_received += PREAMBLE_BYTES + len(body)
        msg = decode_message(body, conn.label, self._rejects, max_bytes=self.max_frame_bytes)
        if msg is None:
            return
        if self.secret is not None and msg.src != conn.peer:
            self._rejects.reject(conn.label, f"message claims src {msg.src!r} but the "
                                 f"connection authenticated as {conn.peer!r}", "src_mismatch")
            return
        counters.msgs_received += 1
        self._deliver(msg, len(body))
        if self._inbox_bytes > self.recv_queue_limit_bytes and not conn.reading_paused:
            conn.reading_paused = True
            self._paused.add(conn)
            conn.transport.pause_reading()  # type: ignore[union-attr]

    def _on_udp_message(self, msg: Message, nbytes: int) -> None:
        if self._inbox_bytes + nbytes > self.recv_queue_limit_bytes:
            self._udp_inbox_dropped += 1
            log.debug("%s: inbox full, dropped a UDP message from %s", self.name, msg.src)
            return
        c = self._counters(msg.src)
        c.bytes_received += nbytes
        c.msgs_received += 1
        self._deliver(msg, nbytes)

    # -- incoming connections ---------------------------------------------------------
    def _accepted(self, conn: _Conn) -> None:
        if self.closed:
            conn.abort()
            return
        self._incoming.add(conn)
        task = asyncio.get_running_loop().create_task(self._serve_handshake(conn),
                                                      name=f"{self.name}:handshake")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_handshake(self, conn: _Conn) -> None:
        claimed = "?"
        challenged = False
        try:
            async with asyncio.timeout(self.handshake_timeout_s):
                ftype, hello = await conn.next_control()
                if ftype != FrameType.HELLO:
                    raise _Refuse(f"expected HELLO, got {ftype.name}", "protocol")
                claimed = hello.get("name")
                ch = hello.get("ch")
                if hello.get("v") != HANDSHAKE_VERSION:
                    raise _Refuse(f"handshake version {hello.get('v')!r}, this node speaks "
                                  f"{HANDSHAKE_VERSION}", "protocol")
                if not isinstance(claimed, str) or not 0 < len(claimed.encode()) <= MAX_NAME_BYTES:
                    raise _Refuse(f"bad node name {claimed!r}", "protocol")
                if not isinstance(ch, int) or isinstance(ch, bool) or not 0 <= ch < UNRELIABLE_BASE:
                    raise _Refuse(f"bad channel {ch!r} (reliable channels are 0..7)", "protocol")
                if hello.get("to") != self.name:
                    raise _Refuse(f"this node is {self.name!r}, not {hello.get('to')!r} (stale "
                                  "address book?)", "misrouted")
                if self.secret is not None:
                    ns = security.new_nonce()
                    conn.write(control_frame(FrameType.CHALLENGE, name=self.name, nonce=ns.hex()))
                    challenged = True
                    ftype, auth = await conn.next_control()
                    if ftype != FrameType.AUTH:
                        raise _Refuse(f"expected AUTH, got {ftype.name} (peer has no shared "
                                      "secret?)", "auth", "authentication required")
                    try:
                        nc = _hex_field(auth, "nonce", security.NONCE_BYTES)
                        mac = _hex_field(auth, "mac", 32)
                    except HandshakeRefused as e:
                        raise _Refuse(str(e), "auth", "authentication failed") from None
                    expected = security.client_proof(self.secret, ns, nc, claimed, self.name, ch)
                    if not security.verify(expected, mac):
                        raise _Refuse("wrong shared secret", "auth", "authentication failed")
                    proof = security.server_proof(self.secret, ns, nc, claimed, self.name, ch)
                    conn.write(control_frame(FrameType.WELCOME, name=self.name, mac=proof.hex()))
                else:
                    conn.write(control_frame(FrameType.WELCOME, name=self.name))
                conn.open(claimed, ch)
        except _Refuse as r:
            self._refused += 1
            self._rejects.reject(conn.label, f"refused connection claiming to be {claimed!r}: "
                                 f"{r.reason}", r.category)
            conn.write(control_frame(FrameType.REFUSE, reason=r.public))
            conn.close()
        except HandshakeRefused as e:
            self._refused += 1
            self._rejects.reject(conn.label, f"refused connection: {e}", "protocol")
            conn.abort()
        except TimeoutError:
            self._refused += 1
            self._rejects.reject(conn.label, f"handshake not completed within "
                                 f"{self.handshake_timeout_s:g} s", "handshake_timeout")
            conn.abort()
        except ConnectionError as e:
            if challenged:  # it could not answer the challenge: a peer without the secret
                self._refused += 1
                self._rejects.reject(conn.label, f"peer claiming to be {claimed!r} closed the "
                                     "connection instead of answering the challenge (no "
                                     "shared secret?)", "auth")
            else:
                log.debug("%s: connection from %s closed during the handshake: %s", self.name,
                          conn.label, e)

    def _conn_lost(self, conn: _Conn, exc: Exception | None) -> None:
        if conn.incoming:
            self._incoming.discard(conn)
            self._paused.discard(conn)
            return
        out = conn.out
        if out is not None and out.proto is conn and not self.closed:
            out._fail(exc or ConnectionError("closed by the peer"))

    # -- statistics -------------------------------------------------------------------
    def _counters(self, peer: str) -> _PeerCounters:
        c = self._peers.get(peer)
        if c is None:
            c = self._peers[peer] = _PeerCounters()
        return c

    def stats(self) -> dict:
        """Counters: per-peer bytes/messages, rejections by reason, queues, UDP, shaper."""
        peers = {p: c.as_dict() for p, c in sorted(self._peers.items())}
        outs = list(self._out.values())
        d = {
            "name": self.name,
            "address": self.local_address(),
            "peers": peers,
            "bytes_sent": sum(c["bytes_sent"] for c in peers.values()),
            "bytes_received": sum(c["bytes_received"] for c in peers.values()),
            "msgs_sent": sum(c["msgs_sent"] for c in peers.values()),
            "msgs_received": sum(c["msgs_received"] for c in peers.values()),
            "rejected_frames": self._rejects.total,
            "rejected": dict(self._rejects.categories),
            "refused_connections": self._refused,
            "dropped_messages": self._dropped,
            "queued_bytes": sum(o.queued_bytes for o in outs),
            "max_queued_bytes": max((o.peak_queued_bytes for o in outs), default=0),
            "inbox_messages": len(self._inbox),
            "inbox_bytes": self._inbox_bytes,
            "connections_out": sum(1 for o in outs if o.is_open),
            "connections_in": len(self._incoming),
            "udp_inbox_dropped": self._udp_inbox_dropped,
        }
        if self._udp is not None:
            d["udp"] = self._udp.stats()
        if self.shaper is not None:
            d["shaper"] = self.shaper.stats()
        return d

    def __repr__(self) -> str:
        return f"TcpTransport({self.name!r}, {self.local_address()})"
