"""The real-socket ``Transport``: TCP streams for reliable channels, UDP for unreliable ones.

Where things live (split the way ps-lite splits its van)
--------------------------------------------------------
ps-lite's ``Van`` composes a concrete socket layer (``ZMQVan``: per-peer sender
sockets, ``SendMsg``/``RecvMsg``) with membership kept by the ``Postoffice`` (node ids
and addresses learnt from the scheduler's ``ADD_NODE``). :class:`TcpTransport` here is
the van: it composes

* :mod:`geomx.runtime.tcp_conn` -- one socket's protocol: framing, connection state,
  write flow control, and the budget of large frames arriving on all of them;
* :mod:`geomx.runtime.tcp_counters` -- per-peer traffic, dropped messages and stream
  resumption, which every part reports to;
* :mod:`geomx.runtime.tcp_outgoing` -- the send queue of each (peer, channel): lazy
  connect with backoff, priority order, back-pressure, batching and shaped pacing;
* :mod:`geomx.runtime.tcp_handshake` -- hello, shared-secret authentication, refusal;
* :mod:`geomx.runtime.membership` -- the address book and the bounded wait for a peer
  whose address has not arrived yet (the start-up race);

and keeps for itself the listening socket, the inbox and receive-side back-pressure,
the UDP endpoint (:mod:`geomx.runtime.udp`), ``close()`` and ``stats()``. The names
other modules import (``TcpTransport``, ``HandshakeRefused``, ``UnknownPeer``,
``parse_address``, the ``DEFAULT_*`` and ``WRITE_*`` constants) are importable from here.

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
event loop never buffers a whole tensor; a message longer than one piece
(``piece_bytes``, 4 MiB) travels as a stream of frames of at most that size, read on
arrival straight into its destination buffer (:mod:`geomx.runtime.framing`, "Large
messages"), so no frame comes near ``max_frame_bytes`` and a value's size is bounded only
by ``max_message_bytes``. On the receiving side decoded messages wait
in an inbox for ``recv()``; above ``recv_queue_limit_bytes`` the transport stops
reading the sockets, which closes the TCP windows and pushes the stall back to the
senders (UDP messages arriving while the inbox is over the limit are dropped and
counted).

Delivery is in order per (src, dst, channel) and exactly once while both ends live,
even across a connection that drops (:mod:`geomx.runtime.tcp_resume`): every message is
numbered and kept until the receiver acknowledges it (at most ``retain_limit_bytes``
unacknowledged per connection, then the writer waits); a connection that breaks with
messages unacknowledged or queued is dialled again for up to ``reconnect_timeout_s``,
the receiver says in the handshake what it has, and the sender writes the rest again,
in order; the receiver drops what it already delivered. Only past that bound (or when
the peer refuses the handshake, or turns out to be a new process) are the messages
dropped, logged naming the peer, and counted (``stats()["dropped_messages"]``); the
next ``send()`` dials again. ``stats()["streams"]`` counts reconnects, resent messages
and bytes, duplicates dropped and acknowledgements. A connection that dies without a
word (a NAT forgets it) is noticed within about ``dead_after_s`` by keepalive probes
and a TCP user timeout (:mod:`geomx.runtime.tcp_liveness`), and then handled as any
other that drops.

Same-host peers
---------------
An outgoing connection of an unshaped stream offers its peer a shared-memory ring
(:mod:`geomx.runtime.shm_ring`, ``shm_ring_bytes``, 0 = never) when it first has a
message of 1 MiB or more to write, never before: a connection that carries only small
messages (a scheduler's, most control traffic) holds no ring. A peer on the same host,
namespace and user maps it (within ``max_shm_mapped_bytes`` and a count of rings over
its incoming connections), and the pieces of messages of 1 MiB and more then pass through
it, copied once in by the writer and once out into the stream's destination buffer by
the receiver (:mod:`geomx.runtime.shm_stream`), with only small frames on the socket.
Nothing above the transport knows: a message arrives the same either way.

Shaping
-------
With a :class:`~geomx.runtime.shaper.Shaper` the writer paces each message's bytes by
the peer's token bucket in 64 KiB pieces and hands them to a delay line that writes
them when due, so the link is never serialised by its delay (see the shaper module).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections import deque
from typing import Any, Callable

from geomx.runtime import security
from geomx.runtime.framing import (DEFAULT_MAX_FRAME_BYTES, PREAMBLE_BYTES, SEQ, SEQ_BYTES,
                                   Body, FrameType, RejectLog, SplitBody, decode_message,
                                   sequenced_frames, stream_piece_bytes)
from geomx.runtime.membership import (DEFAULT_ADDRESS_WAIT_S, AddressBook, UnknownPeer,
                                      parse_address)
from geomx.runtime.recv_pool import RecvBufferPool
from geomx.runtime.shaper import Shaper
from geomx.runtime.shm_ring import (DEFAULT_MAX_MAPPED_BYTES, DEFAULT_RING_BYTES,
                                    MIN_RING_BYTES, RecvRing, RingBudget, RingRefused,
                                    SendRing)
from geomx.runtime.tcp_conn import HANDSHAKE, WRITE_HIGH_WATER_BYTES, Conn, FrameBudget
from geomx.runtime.tcp_counters import TransportCounts
from geomx.runtime.tcp_handshake import (DEFAULT_HANDSHAKE_TIMEOUT_S, HANDSHAKE_VERSION,
                                         MAX_NAME_BYTES, HandshakeRefused, serve_handshake)
from geomx.runtime.tcp_liveness import DEFAULT_DEAD_AFTER_S
from geomx.runtime.tcp_outgoing import (CONNECT_BACKOFF_S, DEFAULT_CONNECT_TIMEOUT_S,
                                        DEFAULT_SEND_QUEUE_LIMIT_BYTES, SHAPED_PIECE_BYTES,
                                        SMALL_MESSAGE_BYTES, WRITE_BATCH_BYTES, Outgoing)
from geomx.runtime.tcp_resume import (DEFAULT_RECONNECT_TIMEOUT_S, DEFAULT_RETAIN_LIMIT_BYTES,
                                      InStreams)
from geomx.runtime.udp import (DEFAULT_CHUNK_PAYLOAD_BYTES, DEFAULT_REASSEMBLY_TIMEOUT_S,
                               UdpEndpoint)
from geomx.wire import UNRELIABLE_BASE, Kind, Message, WireError, peek_single_payload

__all__ = [
    "TcpTransport", "HandshakeRefused", "UnknownPeer", "parse_address",
    "DEFAULT_SEND_QUEUE_LIMIT_BYTES", "DEFAULT_RECV_QUEUE_LIMIT_BYTES",
    "DEFAULT_CONNECT_TIMEOUT_S", "DEFAULT_ADDRESS_WAIT_S", "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_RECONNECT_TIMEOUT_S", "DEFAULT_RETAIN_LIMIT_BYTES",
    "WRITE_HIGH_WATER_BYTES", "SMALL_MESSAGE_BYTES", "WRITE_BATCH_BYTES", "SHAPED_PIECE_BYTES",
    "CONNECT_BACKOFF_S", "HANDSHAKE_VERSION", "MAX_NAME_BYTES",
]

log = logging.getLogger("geomx.runtime.tcp")

DEFAULT_RECV_QUEUE_LIMIT_BYTES = 256 * 1024 * 1024
#: Largest message accepted unless the owner says otherwise (``geomx node`` derives it
#: from the job): a longer one travels as a stream of bounded frames, so this bounds a
#: stream's announced length, not a frame's.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 40
MAX_MESSAGE_BYTES = (1 << 64) - 1
#: ``max_frame_bytes`` below this is refused: a burst of small messages sent in one turn
#: (``CORK_BYTES`` in geomx.runtime.tcp_outgoing) travels as one frame.
MIN_MAX_FRAME_BYTES = 64 * 1024
#: Bodies of large frames held while they arrive, summed over every connection: a frame
#: that would go past it waits (its connection stops reading) until another completes.
#: One frame alone is always admitted, so no message is too big to ever arrive.
DEFAULT_MAX_PARTIAL_FRAME_BYTES = 1 << 30
#: Incoming connections at once, and of those still in their handshake: more are refused
#: (a job has a few connections per peer and channel; a stranger opening thousands must
#: not cost memory).
DEFAULT_MAX_INCOMING_CONNECTIONS = 1024
DEFAULT_MAX_PENDING_HANDSHAKES = 64


class TcpTransport:
    """A node's real-socket transport (implements :class:`geomx.transport.Transport`).

    ``TcpTransport(name, host=, port=, secret=, ssl_server=, ssl_client=, shaper=,
    max_frame_bytes=, max_message_bytes=, send_queue_limit_bytes=, reconnect_timeout_s=,
    dead_after_s=, retain_limit_bytes=)``;
    then ``await start()``,
    ``set_address_book({...})``, ``send``/``recv``, ``await close()``. See the module
    docstring for the model.
    """

    def __init__(self, name: str, *, host: str = "127.0.0.1", port: int = 0,
                 secret: bytes | str | None = None,
                 ssl_server: ssl.SSLContext | None = None,
                 ssl_client: ssl.SSLContext | None = None,
                 shaper: Shaper | None = None,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 send_queue_limit_bytes: int = DEFAULT_SEND_QUEUE_LIMIT_BYTES,
                 recv_queue_limit_bytes: int = DEFAULT_RECV_QUEUE_LIMIT_BYTES,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
                 dead_after_s: float = DEFAULT_DEAD_AFTER_S,
                 retain_limit_bytes: int = DEFAULT_RETAIN_LIMIT_BYTES,
                 address_wait_s: float = DEFAULT_ADDRESS_WAIT_S,
                 handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
                 udp: bool = True,
                 udp_chunk_bytes: int = DEFAULT_CHUNK_PAYLOAD_BYTES,
                 udp_reassembly_timeout_s: float = DEFAULT_REASSEMBLY_TIMEOUT_S,
                 advertise_host: str | None = None,
                 max_partial_frame_bytes: int = DEFAULT_MAX_PARTIAL_FRAME_BYTES,
                 max_incoming_connections: int = DEFAULT_MAX_INCOMING_CONNECTIONS,
                 max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES,
                 shm_ring_bytes: int = DEFAULT_RING_BYTES,
                 max_shm_mapped_bytes: int = DEFAULT_MAX_MAPPED_BYTES):
        if not name or len(name.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"node name must be 1..{MAX_NAME_BYTES} bytes, got {name!r}")
        if not 0 <= port < 65536:
            raise ValueError(f"port must be within 0..65535 (0 = any free port), got {port}")
        if not MIN_MAX_FRAME_BYTES <= max_frame_bytes <= (1 << 32) - 1:
            raise ValueError(f"max_frame_bytes must be within [{MIN_MAX_FRAME_BYTES}, "
                             f"2**32 - 1], got {max_frame_bytes}")
        if not 0 < max_message_bytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes must be within [1, 2**64 - 1], got "
                             f"{max_message_bytes}")
        for label, v in (("send_queue_limit_bytes", send_queue_limit_bytes),
                         ("recv_queue_limit_bytes", recv_queue_limit_bytes),
                         ("connect_timeout_s", connect_timeout_s),
                         ("reconnect_timeout_s", reconnect_timeout_s),
                         ("retain_limit_bytes", retain_limit_bytes),
                         ("address_wait_s", address_wait_s),
                         ("handshake_timeout_s", handshake_timeout_s),
                         ("max_partial_frame_bytes", max_partial_frame_bytes),
                         ("max_incoming_connections", max_incoming_connections),
                         ("max_pending_handshakes", max_pending_handshakes)):
            if not v > 0:
                raise ValueError(f"{label} must be > 0, got {v!r}")
        if shm_ring_bytes != 0 and shm_ring_bytes < MIN_RING_BYTES:
            raise ValueError(f"shm_ring_bytes must be 0 (no shared-memory rings) or >= "
                             f"{MIN_RING_BYTES}, got {shm_ring_bytes!r}")
        if max_shm_mapped_bytes < 0:
            raise ValueError(f"max_shm_mapped_bytes must be >= 0, got {max_shm_mapped_bytes!r}")
        if not 0 <= dead_after_s < float("inf"):
            raise ValueError(f"dead_after_s must be >= 0 seconds (0 = the kernel's defaults), "
                             f"got {dead_after_s!r}")
        self.name = name
        self.host = host
        self.port = port
        self.advertise_host = advertise_host
        self.secret = security.normalize_secret(secret)
        self.ssl_server = ssl_server
        self.ssl_client = ssl_client
        self.shaper = shaper
        self.max_frame_bytes = max_frame_bytes
        self.max_message_bytes = max_message_bytes
        #: a message whose frame body is longer travels as a stream of frames this long
        self.piece_bytes = stream_piece_bytes(max_frame_bytes)
        #: what wire.decode may be given: one frame's body, or a stream's
        self._decode_limit = max(max_frame_bytes, max_message_bytes)
        self.send_queue_limit_bytes = send_queue_limit_bytes
        self.recv_queue_limit_bytes = recv_queue_limit_bytes
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.dead_after_s = dead_after_s
        self.retain_limit_bytes = retain_limit_bytes
        self._streams = InStreams()
        # large frames' bodies, reused once the values decoded from them are dropped
        self._recv_pool = RecvBufferPool()
        # request id -> (peer, array): replies received straight into the caller's buffer
        self._sinks: dict[int, tuple[str, Any]] = {}
        #: traffic per peer, dropped messages, stream resumption (its parts add to it)
        self._counts = TransportCounts()
        self._members = AddressBook(name, wait_s=address_wait_s, is_closed=lambda: self.closed)
        self.handshake_timeout_s = handshake_timeout_s
        self.closed = False
        self._use_udp = udp
        self._udp_chunk_bytes = udp_chunk_bytes
        self._udp_timeout_s = udp_reassembly_timeout_s
        self._udp: UdpEndpoint | None = None
        self._udp_addrs: dict[str, tuple] = {}
        self._server: asyncio.AbstractServer | None = None
        self._out: dict[tuple[str, int], Outgoing] = {}
        self._incoming: set[Conn] = set()
        self._frame_budget = FrameBudget(max_partial_frame_bytes)
        #: data bytes of the ring each outgoing connection offers a same-host peer
        #: (geomx.runtime.shm_ring); 0: none
        self.shm_ring_bytes = shm_ring_bytes
        #: rings of incoming connections mapped at once, in bytes
        self._ring_budget = RingBudget(max_shm_mapped_bytes)
        self._ring_refusals = 0
        self._rings_unavailable: str | None = None  # why this host makes none
        self.max_incoming_connections = max_incoming_connections
        self.max_pending_handshakes = max_pending_handshakes
        self._tasks: set[asyncio.Task] = set()
        self._rejects = RejectLog(name, log)
        self._refused = 0
        self._udp_inbox_dropped = 0
        self._inbox: deque[tuple[Message, int]] = deque()
        self._inbox_bytes = 0
        self._inbox_event: asyncio.Event | None = None
        self._paused: set[Conn] = set()

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the listening TCP socket (and the UDP socket on the same port); return."""
        if self._server is not None:
            raise RuntimeError(f"{self.name}: transport already started")
        loop = asyncio.get_running_loop()
        self._inbox_event = asyncio.Event()
        self._members.start()
        tries = 20 if (self.port == 0 and self._use_udp) else 1
        last: OSError | None = None
        for _ in range(tries):
            server = await loop.create_server(
                lambda: Conn(self, incoming=True, label="?"), self.host, self.port,
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

    # -- what its connections and send queues share (ConnOwner, OutgoingOwner) ----------
    @property
    def rejects(self) -> RejectLog:
        """Bad frames and refused peers, logged and counted by category."""
        return self._rejects

    @property
    def frame_budget(self) -> FrameBudget:
        """Bytes of large frames held while they arrive, over every incoming connection."""
        return self._frame_budget

    @property
    def max_partial_frame_bytes(self) -> int:
        return self._frame_budget.limit_bytes

    @property
    def recv_pool(self) -> RecvBufferPool:
        """Large frames' bodies, reused once the values decoded from them are dropped."""
        return self._recv_pool

    @property
    def counts(self) -> TransportCounts:
        """Traffic per peer, dropped messages and stream resumption, behind ``stats()``."""
        return self._counts

    def new_ring(self) -> SendRing | None:
        """A shared-memory ring for an outgoing connection to offer (None: rings are off,
        or this host cannot make one; the connection then carries everything itself)."""
        if not self.shm_ring_bytes or self._rings_unavailable is not None:
            return None
        try:
            return SendRing(self.shm_ring_bytes)
        except (OSError, AttributeError) as e:  # no memfd here (or no memory for one)
            self._rings_unavailable = str(e)
            log.info("%s: no shared-memory rings on this host (%s): same-host peers get "
                     "every byte through their sockets", self.name, e)
            return None

    def attach_ring(self, conn: Conn, offer: Any) -> bool:
        """The handshake of incoming ``conn`` offers the peer's ring: map it and attach
        it (True), or say why not in the debug log (False: the socket carries all)."""
        if not self.shm_ring_bytes:
            return False
        try:
            ring = RecvRing(offer, self._ring_budget)
        except RingRefused as e:
            self._ring_refusals += 1
            log.debug("%s: not mapping the ring of %s: %s", self.name, conn.label, e)
            return False
        conn.attach_ring(ring)
        return True

    def local_address(self) -> str:
        """``"host:port"`` that peers should dial (``advertise_host`` if set)."""
        host = self.advertise_host or self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.port}"

    @property
    def address_wait_s(self) -> float:
        """How long a send waits for a peer's address (see :meth:`address_of`)."""
        return self._members.wait_s

    @address_wait_s.setter
    def address_wait_s(self, value: float) -> None:
        self._members.wait_s = value

    def set_address_book(self, book: dict[str, str]) -> None:
        """Learn peers' addresses: entries are added or replaced, never forgotten.

        Calling it again with a partial book (say, the peers a rendezvous just announced)
        is fine. Open connections stay on the address they were opened with.
        """
        for peer in self._members.update(book):
            self._udp_addrs.pop(peer, None)
        self._members.notify()

    async def address_of(self, peer: str) -> tuple[str, int]:
        """``peer``'s address, waiting up to ``address_wait_s`` for it to be announced.

        Past the bound it fails with :class:`UnknownPeer`, which names the peer; why a
        send waits at all (the start-up race) is told in :mod:`geomx.runtime.membership`.
        """
        return await self._members.address_of(peer)

    async def close(self, *, flush_timeout_s: float = 5.0) -> None:
        """Flush queued messages (up to ``flush_timeout_s``), then close every socket."""
        if self.closed:
            return
        self.closed = True
        if self._server is not None:
            self._server.close()
        outs = list(self._out.values())
        pending = [o.flush() for o in outs if o.active]
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
        self._streams.flush_all()  # what arrived is acknowledged: nobody resends it
        for c in list(self._incoming):
            conns.append(c)
            c.close()
        for t in list(self._tasks):
            t.cancel()
        if self._udp is not None:
            self._udp.close()
        if self._inbox_event is not None:
            self._inbox_event.set()
        self._members.notify()
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

    def _outgoing(self, peer: str, channel: int) -> Outgoing:
        key = (peer, channel)
        out = self._out.get(key)
        if out is None:
            out = self._out[key] = Outgoing(self, peer, channel)
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
        frames, nbytes = sequenced_frames(msg)
        if nbytes - PREAMBLE_BYTES - SEQ_BYTES > self.max_message_bytes:
            raise WireError(
                f"{self.name}: message of {nbytes - PREAMBLE_BYTES - SEQ_BYTES} bytes to "
                f"{msg.dst!r} exceeds max_message_bytes ({self.max_message_bytes}), the "
                "largest message its receiver accepts: raise `[real] max_message` in the "
                "scenario (its default is twice the model for a built-in model, this "
                "host's memory for a training program)")
        out = self._outgoing(msg.dst, ch)
        if not out.active:  # (while a dropped connection is dialled again, messages queue)
            await out.ready()
        limit = out.peer_max_message_bytes
        if limit is not None and nbytes - PREAMBLE_BYTES - SEQ_BYTES > limit:
            raise WireError(
                f"{self.name}: message of {nbytes - PREAMBLE_BYTES - SEQ_BYTES} bytes to "
                f"{msg.dst!r} exceeds the {limit} bytes its receiver accepts (its "
                "max_message_bytes): raise `[real] max_message` in the scenario (its "
                "default for a training program is the receiving host's memory)")
        if (nbytes <= WRITE_BATCH_BYTES and nbytes - PREAMBLE_BYTES <= out.piece_bytes
                and out.idle_unshaped(nbytes)):
            # Fast path: nothing queued or being written, so writing now keeps every
            # ordering guarantee and saves a hop through the writer task.
            await out.write_now(frames, nbytes)
            return
        await out.reserve(nbytes)
        if self.closed:
            raise ConnectionError(f"{self.name}: transport is closed")
        out.push(msg.priority, frames, nbytes)  # (dials again if the connection dropped)

    def send_nowait(self, msg: Message) -> bool:
        """Write ``msg`` now if :meth:`send` would have written it at once without
        waiting (its connection open, idle and unshaped; a reliable channel); False
        leaves it to :meth:`send`. Nodes call it to skip their outbox task
        (:meth:`geomx.node.base.Node.post`): two task switches fewer per message."""
        ch = msg.channel
        if self.closed or not 0 <= ch < UNRELIABLE_BASE:
            return False
        out = self._out.get((msg.dst, ch))
        if out is None:
            return False
        # msg.nbytes (an estimate of the encoded size) first, so that most refusals
        # cost no encoding
        estimate = msg.nbytes
        if estimate > SMALL_MESSAGE_BYTES or not out.idle_unshaped(estimate):
            return False
        if out.hold(msg, estimate):  # another small message left in this turn: join it
            return True
        frames, nbytes = sequenced_frames(msg)
        if nbytes - PREAMBLE_BYTES > out.piece_bytes or not out.idle_unshaped(nbytes):
            return False  # send() encodes it again (and streams one too large for a frame)
        out.write_direct(frames, nbytes)
        return True

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
        self._counts.peer(msg.dst).sent(1, n)

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
        return self._take()

    async def listen(self, handler: Callable[[Message], None]) -> None:
        """Call ``handler`` with every message, as ``while True: handler(await recv())``
        would (same order, same places in the loop) without a coroutine call per
        message; until cancelled, or the transport closes (ConnectionError, as ``recv``).
        ``recv`` must not be used meanwhile."""
        event = self._inbox_event
        if event is None:
            raise RuntimeError(f"{self.name}: call start() before listen()")
        inbox = self._inbox
        while True:
            while not inbox:
                if self.closed:
                    raise ConnectionError(f"{self.name}: transport is closed")
                event.clear()
                await event.wait()
            handler(self._take())

    def _take(self) -> Message:
        """The inbox's first message (there is one); reading resumes below half full."""
        msg, n = self._inbox.popleft()
        self._inbox_bytes -= n
        if self._paused and self._inbox_bytes <= self.recv_queue_limit_bytes // 2:
            for c in self._paused:
                c.unpause("inbox")
            self._paused.clear()
        return msg

    def pending(self) -> int:
        """Messages waiting for ``recv()``."""
        return len(self._inbox)

    def _deliver(self, msg: Message, nbytes: int) -> None:
        self._inbox.append((msg, nbytes))
        self._inbox_bytes += nbytes
        self._inbox_event.set()  # type: ignore[union-attr]

    def on_message_frame(self, conn: Conn, body: Body) -> None:
        """A MESSAGE frame on an open incoming connection: decode it into the inbox."""
        counters = self._counts.peer(conn.peer)  # type: ignore[arg-type]
        counters.received_bytes(conn.decoder.frame_wire_bytes)
        msg = decode_message(body, conn.label, self._rejects, max_bytes=self._decode_limit,
                             owned=True)  # a fresh body per frame: its arrays are the receiver's
        if msg is None:
            return
        if self.secret is not None and msg.src != conn.peer:
            self._rejects.reject(conn.label, f"message claims src {msg.src!r} but the "
                                 f"connection authenticated as {conn.peer!r}", "src_mismatch")
            return
        counters.received_msgs(1)
        self._deliver(msg, len(body))
        if self._inbox_bytes > self.recv_queue_limit_bytes and conn not in self._paused:
            self._paused.add(conn)
            conn.pause("inbox")

    # -- replies received straight into the caller's buffer -----------------------------
    def receive_into(self, peer: str, request_id: int, sink: Any) -> bool:
        """The reply to ``request_id`` from ``peer``, if it is one dense payload of exactly
        ``sink``'s dtype and size (and no meta), is read from the socket straight into
        ``sink`` (a writable C-contiguous array), with no buffer of its own and no copy;
        any other reply arrives as usual. Always True (taken): call
        :meth:`forget_receive` once the request is over, whatever happened; until then
        the sink may be written."""
        self._sinks[request_id] = (peer, sink)
        return True

    def forget_receive(self, request_id: int) -> None:
        """The request is over: its sink is no longer written."""
        self._sinks.pop(request_id, None)

    def route_frame(self, conn: Conn, ftype: int, first: memoryview,
                    length: int) -> tuple[int, Any] | None:
        """Where the body of a large frame arriving on ``conn`` goes: ``(split, sink)``
        when it is the awaited reply of a :meth:`receive_into` (its dense payload from
        ``split`` on is read into ``sink``), else None (a buffer of its own)."""
        if not self._sinks:
            return None
        skip = SEQ_BYTES if ftype == FrameType.SEQ_MESSAGE else 0
        if ftype not in (FrameType.MESSAGE, FrameType.SEQ_MESSAGE):
            return None
        peek = peek_single_payload(first[skip:])
        if peek is None:
            return None
        kind, rid, data_off, dtype, nbytes = peek
        entry = self._sinks.get(rid)
        if entry is None or kind != Kind.PULL_REPLY or entry[0] != conn.peer:
            return None
        sink = entry[1]
        split = skip + data_off
        if (sink.dtype.str != dtype or sink.nbytes != nbytes or split + nbytes != length
                or split > len(first)):
            return None
        return split, sink

    def on_seq_frame(self, conn: Conn, body: Body, flags: int = 0) -> None:
        """A SEQ_MESSAGE on a resumable stream: deliver it once, in order, and ack it
        (``SPLIT_BATCH``: the messages of the BATCH the sender made, one by one)."""
        counters = self._counts.peer(conn.peer)  # type: ignore[arg-type]
        counters.received_bytes(conn.decoder.frame_wire_bytes)
        st = conn.stream
        if len(body) < SEQ_BYTES:
            self._rejects.reject(conn.label, f"SEQ_MESSAGE frame of {len(body)} bytes",
                                 "protocol")
            conn.abort()
            return
        seq = SEQ.unpack_from(body.head if isinstance(body, SplitBody) else body, 0)[0]
        verdict = self._streams.accept(st, seq)
        if verdict is None:
            self._rejects.reject(conn.label, f"message #{seq} out of order (#{st.delivered} "
                                 "was the last delivered)", "protocol")
            conn.abort()
            return
        if verdict:
            # numbered, so a malformed one is acknowledged like any other (never resent)
            rest = (SplitBody(memoryview(body.head)[SEQ_BYTES:], body.tail)  # type: ignore
                    if isinstance(body, SplitBody) else memoryview(body)[SEQ_BYTES:])
            msg = decode_message(rest, conn.label, self._rejects,
                                 max_bytes=self._decode_limit, owned=True)
            if msg is not None and self.secret is not None and msg.src != conn.peer:
                self._rejects.reject(conn.label, f"message claims src {msg.src!r} but the "
                                     f"connection authenticated as {conn.peer!r}",
                                     "src_mismatch")
                msg = None
            if msg is not None and flags and msg.batch is not None:
                subs = msg.batch
                counters.received_msgs(len(subs))
                self._deliver(subs[0], len(body))  # (the inbox counts the frame's bytes once)
                for sub in subs[1:]:
                    self._deliver(sub, 0)
            elif msg is not None:
                counters.received_msgs(1)
                self._deliver(msg, len(body))
        self._streams.delivered(st, len(body))
        if self._inbox_bytes > self.recv_queue_limit_bytes and conn not in self._paused:
            self._paused.add(conn)
            conn.pause("inbox")

    def _on_udp_message(self, msg: Message, nbytes: int) -> None:
        if self._inbox_bytes + nbytes > self.recv_queue_limit_bytes:
            self._udp_inbox_dropped += 1
            log.debug("%s: inbox full, dropped a UDP message from %s", self.name, msg.src)
            return
        self._counts.peer(msg.src).received(1, nbytes)
        self._deliver(msg, nbytes)

    # -- incoming connections ---------------------------------------------------------
    def on_conn_accepted(self, conn: Conn) -> None:
        """A peer connected: serve its handshake, unless over the connection limits."""
        if self.closed:
            conn.abort()
            return
        pending = sum(1 for c in self._incoming if c.state == HANDSHAKE)
        if len(self._incoming) >= self.max_incoming_connections \
                or pending >= self.max_pending_handshakes:
            self._refused += 1
            what = ("connections" if len(self._incoming) >= self.max_incoming_connections
                    else "handshakes in progress")
            self._rejects.reject(conn.label, f"too many {what} (limit "
                                 f"{self.max_incoming_connections} connections, "
                                 f"{self.max_pending_handshakes} handshakes)", "conn_limit")
            conn.abort()
            return
        self._incoming.add(conn)
        task = asyncio.get_running_loop().create_task(self._serve_handshake(conn),
                                                      name=f"{self.name}:handshake")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_handshake(self, conn: Conn) -> None:
        await serve_handshake(conn, name=self.name, secret=self.secret,
                              timeout_s=self.handshake_timeout_s, rejects=self._rejects,
                              on_refused=self._count_refused, resume=self._streams.attach,
                              rings=self.shm_ring_bytes != 0)

    def _count_refused(self) -> None:
        self._refused += 1

    def on_conn_lost(self, conn: Conn, exc: Exception | None) -> None:
        """A connection closed: forget an incoming one (its stream stays for the sender
        to come back to); an outgoing one's queue dials again or gives up."""
        if conn.incoming:
            self._incoming.discard(conn)
            self._paused.discard(conn)
            self._streams.detach(conn)
            return
        out = conn.out
        if out is not None and out.proto is conn:
            out.fail(exc or ConnectionError("closed by the peer"))

    # -- statistics -------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters: per-peer bytes/messages, rejections by reason, queues, UDP, shaper."""
        counts = self._counts
        peers = {p: c.as_dict() for p, c in sorted(counts.peers.items())}
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
            "partial_frame_bytes": self._frame_budget.used_bytes,
            "dropped_messages": counts.dropped_messages,
            "queued_bytes": sum(o.queued_bytes for o in outs),
            "max_queued_bytes": max((o.peak_queued_bytes for o in outs), default=0),
            "inbox_messages": len(self._inbox),
            "inbox_bytes": self._inbox_bytes,
            "connections_out": sum(1 for o in outs if o.is_open),
            "connections_in": len(self._incoming),
            "udp_inbox_dropped": self._udp_inbox_dropped,
            "streams": {
                **counts.stream_dict(),
                "resumed_in": self._streams.resumed,
                "duplicates_dropped": self._streams.duplicates,
                "acks_sent": self._streams.acks_sent,
                "streams_in": len(self._streams),
                "unacked_bytes": sum(o.window.bytes for o in outs),
                "max_unacked_bytes": max((o.window.peak_bytes for o in outs), default=0),
            },
        }
        rings_out = [o.proto.shm for o in outs if o.proto is not None and o.proto.shm]
        rings_in = [c.shm for c in self._incoming if c.shm is not None]
        d["shm"] = {"rings_out": len(rings_out), "rings_in": len(rings_in),
                    "pieces_out": sum(r.pieces for r in rings_out),
                    "pieces_in": sum(r.pieces for r in rings_in),
                    "mapped_bytes": self._ring_budget.used_bytes,
                    "refused_offers": self._ring_refusals}
        if self._udp is not None:
            d["udp"] = self._udp.stats()
        if self.shaper is not None:
            d["shaper"] = self.shaper.stats()
        return d

    def __repr__(self) -> str:
        return f"TcpTransport({self.name!r}, {self.local_address()})"
