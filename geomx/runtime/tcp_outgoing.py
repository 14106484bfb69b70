"""The sending side of the TCP transport: one queue per (peer, channel), batching, pacing.

ps-lite's ``ZMQVan`` keeps one sender socket per peer (``senders_``), connected on
demand by ``Van::Connect``, and ``SendMsg`` writes a message's parts onto it. geomx
keeps that shape and does itself what ZeroMQ does for ps-lite. This module owns

* :class:`Outgoing`, one per (peer, reliable channel): the lazy connection (address from
  :mod:`geomx.runtime.membership`, retries with exponential backoff, then a
  ConnectionError naming the peer; the handshake itself is
  :func:`geomx.runtime.tcp_handshake.client_handshake`), the send queue ordered by
  priority (FIFO among equals) with its byte limit and back-pressure, the writer task,
  the fast path that writes an idle connection's message at once, shaped pacing
  through the :class:`~geomx.runtime.shaper.DelayLine`, and what happens when the
  connection breaks: every message written carries the next number of the stream's
  :class:`~geomx.runtime.tcp_resume.SendWindow` and stays there until acknowledged; a
  connection that drops with messages unacknowledged or queued is dialled again (with
  backoff, up to ``reconnect_timeout_s``), the handshake says where the receiver is, and
  the rest is written again, in order and paced again, before anything new. Past the
  bound (or refused) the messages are dropped, counted and logged, naming the peer;
* :func:`batches` (unshaped messages written in ``WRITE_BATCH_BYTES`` slices, waiting
  for the socket in between) and :func:`pieces` (shaped traffic paced in
  ``SHAPED_PIECE_BYTES`` pieces), both zero-copy views of the frames; a message too long
  for one frame is written as a stream of frames
  (:func:`geomx.runtime.framing.stream_frames`) when it leaves the queue.

The transport (:class:`OutgoingOwner`) provides its settings, addresses and the
:class:`~geomx.runtime.tcp_counters.TransportCounts` this module reports to.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import ssl
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from geomx.runtime.framing import (PREAMBLE_BYTES, SPLIT_BATCH, sequenced_frames,
                                   stream_frames, stream_piece_bytes)
from geomx.runtime.shaper import PACING_LEAD_S, DelayLine, Shaper, ShapedLink, now_s
from geomx.runtime.shm_ring import RING_MIN_MESSAGE_BYTES, SendRing
from geomx.runtime.shm_stream import ask_for_ring, write_ring_stream
from geomx.runtime.tcp_conn import OPEN, Conn, ConnOwner
from geomx.runtime.tcp_counters import PeerCounters, TransportCounts
from geomx.runtime.tcp_handshake import HandshakeRefused, client_handshake
from geomx.runtime.tcp_resume import SendWindow
from geomx.wire import Kind, Message

# the transport's logger: one name to filter for every part of the TCP transport
log = logging.getLogger("geomx.runtime.tcp")

DEFAULT_SEND_QUEUE_LIMIT_BYTES = 64 * 1024 * 1024
DEFAULT_CONNECT_TIMEOUT_S = 30.0
#: Messages up to this size are joined into one buffer before writing (cheaper than a
#: scatter write for a few hundred bytes).
SMALL_MESSAGE_BYTES = 16 * 1024
#: Small messages sent in one turn of the event loop are written together up to this
#: many bytes (:meth:`Outgoing.write_direct`): enough to save most send() calls, small
#: enough that the receiver starts on a burst while the sender is still producing it.
CORK_BYTES = 32 * 1024
#: Most small messages of one turn that travel together as one BATCH frame
#: (:meth:`Outgoing.hold`); a burst is framed in pieces this long or ``CORK_BYTES``.
HOLD_MESSAGES = 256
#: Larger messages are written in batches of this many bytes, waiting for the socket
#: between batches: the event loop never holds more than one batch (the stock asyncio
#: loop and TLS transports copy what they are given; uvloop keeps zero-copy views).
WRITE_BATCH_BYTES = 4 * 1024 * 1024
#: Piece size used to pace shaped traffic.
SHAPED_PIECE_BYTES = 64 * 1024
#: First and largest wait between connection attempts.
CONNECT_BACKOFF_S = (0.05, 1.0)


class OutgoingOwner(ConnOwner, Protocol):
    """What an :class:`Outgoing` needs from the transport that owns it."""

    name: str
    shaper: Shaper | None
    secret: bytes | None
    ssl_client: ssl.SSLContext | None
    send_queue_limit_bytes: int
    retain_limit_bytes: int
    max_frame_bytes: int
    piece_bytes: int
    connect_timeout_s: float
    reconnect_timeout_s: float
    handshake_timeout_s: float
    shm_ring_bytes: int
    closed: bool

    @property
    def counts(self) -> TransportCounts: ...

    def new_ring(self) -> SendRing | None: ...

    async def address_of(self, peer: str) -> tuple[str, int]: ...


def batches(frames: list, size: int) -> Iterator[list]:
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


def pieces(frames: list, size: int) -> Iterator[memoryview]:
    """``frames`` as zero-copy views of at most ``size`` bytes each (for pacing)."""
    for f in frames:
        mv = memoryview(f)
        n = mv.nbytes
        if n <= size:
            yield mv
        else:
            for off in range(0, n, size):
                yield mv[off:off + size]


class Outgoing:
    """The sending side of one (peer, channel): connection, priority queue, writer task,
    and the stream's window of unacknowledged messages (resent after a reconnect)."""

    def __init__(self, tr: OutgoingOwner, peer: str, channel: int):
        self.tr = tr
        self.peer = peer
        self.channel = channel
        self.counts = tr.counts
        #: this peer's traffic counters, looked up with the first message counted
        self._peer_counts: PeerCounters | None = None
        self.proto: Conn | None = None
        self._connecting: asyncio.Task | None = None
        #: the connection attempt running is a reconnect (senders queue meanwhile)
        self.reconnecting = False
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
        self.generation = 0  # bumped by fail(): byte counts from before belong to no one
        self.window = SendWindow(tr.retain_limit_bytes)
        #: messages of the window to write again (after a reconnect), before the heap
        self._resend: deque[tuple[int, list, int]] = deque()
        #: small messages held until the end of this loop turn (:meth:`write_direct`);
        #: None: nothing written directly in this turn yet
        self._cork: list[bytes] | None = None
        self._cork_bytes = 0
        #: small messages of this turn not yet framed (:meth:`hold`): they leave as one
        #: BATCH frame, numbered when framed, before anything written after them
        self._held: list[Message] = []
        self._held_bytes = 0
        self.connections = 0  # handshakes completed (more than one: reconnected)
        #: ids of the streams large messages are written as (framing, "Large messages")
        self._stream_ids = itertools.count(1)
        #: a message whose frame body is longer is written as a stream of pieces this
        #: long: the transport's, or less where the peer said it takes shorter frames
        self.piece_bytes = tr.piece_bytes
        #: the largest message the peer said it takes (None: it did not say)
        self.peer_max_message_bytes: int | None = None

    # -- connection -------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self.proto is not None and self.proto.state == OPEN

    @property
    def active(self) -> bool:
        """Open, or dialling again with messages to deliver (a flush waits for either)."""
        return self.is_open or self.reconnecting

    async def ready(self) -> None:
        if self.is_open:
            return
        task = self._connecting
        if task is None:
            task = self._start_connect(reconnect=False)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current is not None and current.cancelling()):
                # the connection attempt was abandoned by close(), not this caller
                raise ConnectionError(f"{self.tr.name}: transport closed while connecting to "
                                      f"{self.peer!r}") from None
            raise

    def _start_connect(self, *, reconnect: bool) -> asyncio.Task:
        tr = self.tr
        self.reconnecting = reconnect
        timeout_s = tr.reconnect_timeout_s if reconnect else tr.connect_timeout_s
        task = self._connecting = asyncio.get_running_loop().create_task(
            self._connect(timeout_s, reconnect),
            name=f"{tr.name}->{self.peer}/ch{self.channel}:{'re' if reconnect else ''}connect")
        task.add_done_callback(self._connect_done)
        return task

    def _connect_done(self, task: asyncio.Task) -> None:
        self._connecting = None
        reconnect, self.reconnecting = self.reconnecting, False
        if task.cancelled():
            return
        exc = task.exception()  # retrieved: the awaiting senders re-raise it
        if exc is not None and reconnect:
            self._give_up(exc)

    async def _connect(self, timeout_s: float, reconnect: bool) -> None:
        tr = self.tr
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        deadline = t0 + timeout_s
        backoff, max_backoff = CONNECT_BACKOFF_S
        attempts = 0
        hint = ""
        host, port = "?", 0
        while True:
            attempts += 1
            last: BaseException | None = None
            proto: Conn | None = None
            # the address is looked up each time: a peer that came back elsewhere is
            # found there once the address book has it
            host, port = await tr.address_of(self.peer)
            try:
                _, proto = await asyncio.wait_for(loop.create_connection(
                    lambda: Conn(tr, incoming=False, label=f"{host}:{port}"), host, port,
                    ssl=tr.ssl_client, server_hostname=host if tr.ssl_client else None),
                    timeout=max(0.01, deadline - loop.time()))
                ack, inc = await asyncio.wait_for(
                    client_handshake(proto, name=tr.name, peer=self.peer, channel=self.channel,
                                     secret=tr.secret, host=host, port=port,
                                     session=self.window.session,
                                     # a same-host peer may take large pieces through
                                     # shared memory (unshaped traffic only: a shaped
                                     # link paces every byte)
                                     rings=self.link is None and tr.shm_ring_bytes != 0),
                    timeout=min(tr.handshake_timeout_s, max(0.01, deadline - loop.time())))
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
                if proto is not None:  # TCP connected, the handshake did not complete
                    proto.abort()
                    # kept even if later attempts find nobody listening (the peer may have
                    # finished meanwhile): it is the informative failure
                    hint = (f" (on attempt {attempts} the TCP connection opened but the "
                            "handshake did not complete: does one side use TLS and the "
                            "other not?)")
                last = e
            else:
                self._opened(proto, ack, inc, loop.time() - t0)
                log.debug("%s: connected to %s at %s:%d, channel %d", tr.name, self.peer, host,
                          port, self.channel)
                return
            if loop.time() + backoff > deadline or tr.closed:
                what = "reconnect to" if reconnect else "reach"
                raise ConnectionError(
                    f"{tr.name}: cannot {what} peer {self.peer!r} at {host}:{port} (channel "
                    f"{self.channel}) after {attempts} attempt(s) in {timeout_s:g} s: "
                    f"{type(last).__name__}: {last}{hint}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)

    def _opened(self, proto: Conn, ack: int, inc: str, took_s: float) -> None:
        """The handshake is done: resume the stream where the receiver is, start writing."""
        tr = self.tr
        proto.carry_outgoing(self)
        self.proto = proto
        self.piece_bytes = stream_piece_bytes(min(tr.max_frame_bytes,
                                                  proto.peer_max_frame_bytes
                                                  or tr.max_frame_bytes))
        self.peer_max_message_bytes = proto.peer_max_message_bytes
        again, dropped, why = self.window.resume(ack, inc)
        if dropped:
            self.counts.unacked_lost(dropped)
            log.warning("%s: %s (channel %d): %s; %d unacknowledged message(s) dropped",
                        tr.name, self.peer, self.channel, why, dropped)
        self.connections += 1
        if self.connections > 1:  # eagerly (messages to deliver) or by the next send
            self.counts.reconnected(len(again), sum(n for _, _, n in again))
            log.info("%s: reconnected to %s (channel %d) in %.3f s; %d message(s) to write "
                     "again from #%d", tr.name, self.peer, self.channel, took_s, len(again),
                     again[0][0] if again else self.window.next_seq)
        if again:
            self._resend.extend(again)
            self._add_queued(sum(n for _, _, n in again))
        self._start_writer()

    def _give_up(self, exc: BaseException) -> None:
        """A reconnect failed (or was refused): drop the stream's messages, as an
        unreachable peer's always were, and start a new session for the next send."""
        dropped = len(self.heap) + len(self.window.entries)
        self.heap.clear()
        self._resend.clear()
        self.window.reset()
        self.queued_bytes = 0
        err = ConnectionError(f"{self.tr.name}: connection to {self.peer!r} (channel "
                              f"{self.channel}) lost and not re-established: {exc}")
        self._fail_waiters(err)
        self._idle.set()
        self.counts.reconnect_failed(dropped)
        if not self.tr.closed:
            log.warning("%s: gave up reconnecting to %s (channel %d): %s; %d message(s) "
                        "dropped", self.tr.name, self.peer, self.channel, exc, dropped)

    def _fail_waiters(self, err: BaseException) -> None:
        """Senders blocked for room in the queue get ``err`` (the stream is gone)."""
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(err)

    def on_ack(self, proto: Conn, seq: int) -> None:
        """An ACK frame on ``proto``: the receiver has the stream up to ``seq``."""
        if proto is not self.proto:
            return  # a connection given up on
        self.counts.ack_received()
        self.window.ack(seq)

    def _count_peer(self) -> PeerCounters:
        c = self._peer_counts = self.counts.peer(self.peer)
        return c

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

    def idle_unshaped(self, nbytes: int) -> bool:
        """True when a message may be written at once: unshaped, open, nothing queued,
        room in the window."""
        proto = self.proto
        return (self.link is None and self.queued_bytes == 0 and not self.heap
                and not self._waiters and proto is not None and proto.state == OPEN
                and not proto.write_paused and self.window.has_room(nbytes)
                # a message a ring carries, or that first asks for one, goes through the
                # writer
                and (nbytes - PREAMBLE_BYTES < RING_MIN_MESSAGE_BYTES
                     or (proto.shm is None and (proto.shm_asked or not proto.shm_ok))))

    def write_direct(self, frames: list, nbytes: int) -> None:
        """Write at once, without waiting (see :meth:`idle_unshaped`).

        A small message is copied into one buffer and written now if it is the first of
        this turn of the event loop; small messages that follow it in the same turn are
        held and written together, :data:`CORK_BYTES` at a time and the rest at the end of
        the turn (:meth:`_uncork`): a burst of small messages (a worker's per-key pushes,
        a server's replies) costs a send() and a wake-up of the receiver per few of them
        instead of one each, and a lone message (a round trip) leaves at once.
        """
        proto = self.proto
        if self._held:  # the turn's held messages are numbered (and written) first
            self._frame_held()
        self.window.assign(frames, nbytes)
        if nbytes <= SMALL_MESSAGE_BYTES:
            data = b"".join(frames)  # a copy now: the sender may reuse its arrays
            cork = self._cork
            if cork is None:
                proto.transport.write(data)  # type: ignore[union-attr]
                self._cork = []
                self._cork_bytes = 0
                asyncio.get_running_loop().call_soon(self._uncork)
            else:
                cork.append(data)
                self._cork_bytes += nbytes
                if self._cork_bytes >= CORK_BYTES:  # let the receiver start on these
                    proto.transport.writelines(cork)  # type: ignore[union-attr]
                    self._cork = []
                    self._cork_bytes = 0
        else:
            self._uncork()
            proto.transport.writelines(frames)  # type: ignore[union-attr]
        (self._peer_counts or self._count_peer()).sent(1, nbytes)

    def hold(self, msg: Message, nbytes: int) -> bool:
        """Take small ``msg`` (``nbytes`` its size estimate) for the frame that the turn's
        other small messages to this peer travel in, if a message was written directly
        in this turn (:meth:`write_direct`); False: write it as usual. The caller has
        checked that it may be written now (:meth:`idle_unshaped`).

        Like ZeroMQ's batching of a burst of small messages in one write, and one step
        further: the held messages become one BATCH message (geomx/wire.py) and so one
        frame, one sequence number in the resend window and one message for the
        receiver to take from its socket, instead of one each; the frame's
        ``SPLIT_BATCH`` flag has the receiving transport deliver them one by one, so
        nothing but the framing changes. Framed at the end of the turn, when
        ``CORK_BYTES`` or ``HOLD_MESSAGES`` are held, or before anything else is
        written or queued on this stream (order and numbering stay those of sending).
        """
        held = self._held
        if self._cork is None or msg.batch is not None or (held and held[0].src != msg.src):
            return False  # (a BATCH cannot carry a BATCH; one carries one sender's messages)
        held.append(msg)
        self._held_bytes += nbytes
        if self._held_bytes >= CORK_BYTES or len(held) >= HOLD_MESSAGES:
            self._frame_held()
        return True

    def _frame_held(self) -> None:
        """Frame and number the held messages (one BATCH frame when there are several)
        and add them to the turn's cork."""
        held, self._held = self._held, []
        self._held_bytes = 0
        if len(held) == 1:
            frames, nbytes = sequenced_frames(held[0])
        else:
            frames, nbytes = sequenced_frames(Message(Kind.BATCH, held[0].src, self.peer,
                                                      channel=self.channel, batch=held),
                                              SPLIT_BATCH)
        self.window.assign(frames, nbytes)
        data = b"".join(frames)  # a copy now: the senders may reuse their arrays
        cork = self._cork
        if cork is None:  # (only once the stream broke: the window writes it again)
            cork = self._cork = []
            self._cork_bytes = 0
            asyncio.get_running_loop().call_soon(self._uncork)
        cork.append(data)
        self._cork_bytes += nbytes
        if self._cork_bytes >= CORK_BYTES and self.proto is not None \
                and self.proto.state == OPEN:
            self.proto.transport.writelines(cork)  # type: ignore[union-attr]
            self._cork = []
            self._cork_bytes = 0
        (self._peer_counts or self._count_peer()).sent(len(held), nbytes)

    def _uncork(self) -> None:
        """Write the small messages held since the first of this turn (in order)."""
        if self._held:
            self._frame_held()
        cork, self._cork = self._cork, None
        if cork:
            proto = self.proto
            if proto is not None and proto.state == OPEN:
                proto.transport.writelines(cork)  # type: ignore[union-attr]
            # else the connection broke meanwhile: the window writes them again

    async def write_now(self, frames: list, nbytes: int) -> None:
        """Write directly (:meth:`write_direct`); wait for the socket if it fills up."""
        proto = self.proto
        self.write_direct(frames, nbytes)
        if not proto.write_paused:  # type: ignore[union-attr]
            return
        generation = self.generation
        self._add_queued(nbytes)
        try:
            await proto.drain()  # type: ignore[union-attr]
        except ConnectionError:
            pass  # fail() has reset the queue; the window writes it again
        finally:
            if generation == self.generation:
                self._release(nbytes)

    def push(self, priority: int, frames: list, nbytes: int) -> None:
        if self._held:  # numbered before the queue's messages are
            self._frame_held()
        heapq.heappush(self.heap, (-priority, next(self._seq), frames, nbytes))
        self._wake.set()
        if self.proto is None and self._connecting is None and not self.tr.closed:
            # the connection dropped with nothing to deliver and now there is: dial again
            self._start_connect(reconnect=True)

    async def flush(self) -> None:
        """Wait until everything queued is written and acknowledged (or dropped)."""
        if self._held:
            self._frame_held()
        while True:
            await self._idle.wait()
            if not self.window.entries or not self.active:
                return
            await self.window.wait_empty()

    # -- writing ----------------------------------------------------------------------
    def _start_writer(self) -> None:
        if self.link is not None:
            self._line = DelayLine(self._line_write, drain=self._line_drain,
                                   must_drain=self._line_must_drain, on_written=self._written,
                                   on_error=self.fail,
                                   name=f"{self.tr.name}->{self.peer}/ch{self.channel}:delay")
        self._writer = asyncio.get_running_loop().create_task(
            self._run(), name=f"{self.tr.name}->{self.peer}/ch{self.channel}:writer")

    def _line_write(self, piece: object) -> None:
        proto = self.proto
        if proto is None or proto.state != OPEN:
            raise ConnectionError(f"connection to {self.peer!r} (channel {self.channel}) lost")
        proto.transport.write(piece)  # type: ignore[union-attr, arg-type]

    async def _line_drain(self) -> None:
        if self.proto is not None:
            await self.proto.drain()

    def _line_must_drain(self) -> bool:
        return self.proto is not None and self.proto.write_paused

    def _written(self, nbytes: int) -> None:
        (self._peer_counts or self._count_peer()).sent_bytes(nbytes)
        self._release(nbytes)

    async def _next(self) -> tuple[list, int]:
        """The next message to write: one to write again, else the queue's first once
        the window has room for it (numbered as it leaves the queue)."""
        while True:
            if self._resend:
                _, frames, nbytes = self._resend.popleft()
                return frames, nbytes
            while not self.heap:
                self._wake.clear()
                await self._wake.wait()
            nbytes = self.heap[0][3]
            if not self.window.has_room(nbytes):
                await self.window.wait_room(nbytes)
                continue  # a higher priority message may have been queued meanwhile
            _, _, frames, nbytes = heapq.heappop(self.heap)
            self.window.assign(frames, nbytes)
            (self._peer_counts or self._count_peer()).sent_msgs(1)
            return frames, nbytes

    async def _run(self) -> None:
        try:
            while True:
                frames, nbytes = await self._next()
                self._uncork()  # what the fast path wrote before this message goes first
                proto = self.proto
                if proto is None or proto.state != OPEN:
                    raise ConnectionError(f"connection to {self.peer!r} lost")
                counters = self._peer_counts or self._count_peer()
                wire, wire_nbytes = frames, nbytes
                ring = proto.shm
                large = nbytes - PREAMBLE_BYTES >= RING_MIN_MESSAGE_BYTES
                if ring is None and large and proto.shm_ok and not proto.shm_asked:
                    # the connection's first large message: a same-host peer may take
                    # it through shared memory
                    ring = await ask_for_ring(proto, self.tr.new_ring)
                    if proto.state != OPEN:
                        raise ConnectionError(f"connection to {self.peer!r} lost")
                if ring is not None and large:
                    # a same-host peer: the pieces pass through shared memory
                    wire_nbytes = await write_ring_stream(
                        proto, ring, frames, next(self._stream_ids), self.piece_bytes)
                    counters.sent_bytes(wire_nbytes)
                    self._release(nbytes)
                    frames = wire = None  # type: ignore[assignment]
                    continue
                if nbytes - PREAMBLE_BYTES > self.piece_bytes:
                    # too long for one frame: a stream of pieces (the window keeps the
                    # message as one frame, so a resend streams it again)
                    wire, wire_nbytes = stream_frames(frames, next(self._stream_ids),
                                                      self.piece_bytes)
                if self.link is None:
                    if wire_nbytes <= WRITE_BATCH_BYTES:
                        proto.transport.writelines(wire)  # type: ignore[union-attr]
                        if proto.write_paused:
                            await proto.drain()
                    else:
                        for batch in batches(wire, WRITE_BATCH_BYTES):
                            if proto.state != OPEN:
                                raise ConnectionError(f"connection to {self.peer!r} lost")
                            proto.transport.writelines(batch)  # type: ignore[union-attr]
                            if proto.write_paused:
                                await proto.drain()
                    counters.sent_bytes(wire_nbytes)
                    self._release(nbytes)
                    # hold no views of a written message while waiting for the next: the
                    # sender reuses a buffer once nothing references it (push_snapshots)
                    frames = wire = batch = None  # type: ignore[assignment]
                    continue
                link, flow, line = self.link, self._flow, self._line
                delay = link.sample_delay()
                if wire_nbytes != nbytes:
                    # the delay line releases what it writes: the stream's headers too
                    self._add_queued(wire_nbytes - nbytes)
                for piece in pieces(wire, SHAPED_PIECE_BYTES):
                    now = now_s()
                    t_done = link.transmit(piece.nbytes, now, flow)
                    line.put(t_done + delay, piece, piece.nbytes)  # type: ignore[union-attr]
                    if t_done - now > PACING_LEAD_S:
                        await asyncio.sleep(t_done - now - PACING_LEAD_S)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, OSError) as e:
            self.fail(e)

    def fail(self, exc: BaseException) -> None:
        """The connection broke: stop writing; dial again if the stream has messages to
        deliver (the window's unacknowledged ones, the queue), else just forget it."""
        if self.proto is None:
            return  # already handled (the writer and the socket both report a break)
        self.generation += 1
        if self._line is not None:
            self._line.clear()
            self._line.close()
            self._line = None
        if self._writer is not None and self._writer is not asyncio.current_task():
            self._writer.cancel()
        self._writer = None
        proto, self.proto = self.proto, None
        proto.abort()
        if self._held:  # numbered into the window, which writes them again
            self._frame_held()
        self._cork = None  # as _resend: the window has them
        self._resend.clear()  # the window has them; the next handshake says which
        unacked, queued = len(self.window.entries), len(self.heap)
        if self.tr.closed or not (unacked or queued):
            self.counts.dropped(queued)
            self.heap.clear()
            self.queued_bytes = 0
            err = ConnectionError(f"{self.tr.name}: connection to {self.peer!r} (channel "
                                  f"{self.channel}) lost: {exc}")
            self._fail_waiters(err)
            self._idle.set()
            if self.tr.closed:  # nobody will resend it: a flush waiting on it returns
                self.counts.dropped(self.window.reset())
            else:
                log.info("%s: connection to %s (channel %d) lost: %s", self.tr.name,
                         self.peer, self.channel, exc)
            return
        # what was being written is in the window; only the queue is still "queued"
        self.queued_bytes = 0
        for _, _, _, n in self.heap:
            self._add_queued(n)
        self._release(0)  # wakes senders that now fit, sets idle if nothing is queued
        log.info("%s: connection to %s (channel %d) lost: %s; reconnecting (%d "
                 "unacknowledged, %d queued message(s))", self.tr.name, self.peer, self.channel,
                 exc, unacked, queued)
        if self._connecting is None:
            self._start_connect(reconnect=True)

    def shutdown(self, abort: bool = False) -> None:
        """Stop for good: fail blocked senders, stop the tasks, close (or abort) the socket."""
        err = ConnectionError(f"{self.tr.name}: transport closed")
        self._fail_waiters(err)
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        if self._line is not None:
            self._line.close()
            self._line = None
        if self._connecting is not None:
            self._connecting.cancel()
        if not abort:
            self._uncork()
        if self.proto is not None:
            if abort:
                self.proto.abort()
            else:
                self.proto.close()
