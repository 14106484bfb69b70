"""Unreliable datagram channels (``channel >= wire.UNRELIABLE_BASE``) over UDP.

What DGT uses for its low-priority gradient blocks: lossy but cheap. A message is
encoded once, cut into chunks that fit one datagram each, and reassembled by the
receiver; a message with a chunk missing after ``reassembly_timeout_s`` is dropped and
counted, never delivered partly.

Datagram format::

    offset  size  field
    0       2     magic   b"GU"
    2       1     version 1
    3       1     flags   bit 0: a 16-byte HMAC tag ends the datagram (set iff the job has a secret)
    4       4     message id (u32, per sending endpoint, wraps)
    8       2     chunk index (u16)
    10      2     chunk count (u16, >= 1; a message has at most 65535 chunks)
    12      ...   payload: bytes [index * chunk, (index + 1) * chunk) of the encoded message
    end-16  16    tag = HMAC-SHA256(datagram key, header || payload)[:16]   (when flagged)

All fields little-endian. The default chunk payload is 1400 bytes so a tagged datagram
(1428 bytes) fits a 1500-byte Ethernet MTU with IPv4/UDP headers. Reassembly is keyed
by (sender address, message id). Bounds: a message may not exceed ``max_message_bytes``
and the partial messages held at once may not exceed ``max_pending_bytes`` (the oldest
is evicted and counted as incomplete). The pending bound counts what a partial message
really costs -- its payload plus a fixed charge per message and per chunk held -- and
nothing is allocated for chunks not yet received, so a stranger's datagrams announcing
65,535 chunks cost what they carry, not a 65,535-slot table each.

Each endpoint binds the same port number as its node's TCP listener, so one
``"host:port"`` address-book entry serves both.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from geomx import wire
from geomx.runtime import security
from geomx.runtime.framing import RejectLog, decode_message
from geomx.runtime.shaper import PACING_LEAD_S, DelayLine, ShapedLink, now_s
from geomx.wire import Message

log = logging.getLogger("geomx.runtime.udp")

CHUNK_MAGIC = b"GU"
CHUNK_VERSION = 1
CHUNK_HEADER = struct.Struct("<2sBBIHH")
FLAG_TAGGED = 0x01
DEFAULT_CHUNK_PAYLOAD_BYTES = 1400
MAX_CHUNKS = 0xFFFF
#: The largest UDP payload over IPv4.
MAX_DATAGRAM_BYTES = 65507
DEFAULT_REASSEMBLY_TIMEOUT_S = 2.0
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
#: Socket buffer sizes asked for (the kernel may cap them).
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
#: When the unshaped send path has this much waiting in the transport, it waits.
WRITE_HIGH_WATER_BYTES = 1024 * 1024


#: IP ToS byte of the unreliable channels' datagrams (DGT's low-priority bands). GeoMX
#: marks band i with DSCP (C - i) * 8 through iptables, above
#: best effort; here TCP (channel 0, DGT's important blocks) stays unmarked best effort, so
#: the bands go *below* it: band 1 CS1 ("low-priority data", RFC 4594), bands 2.. LE
#: ("lower effort", RFC 8622). Set per datagram with setsockopt(IP_TOS / IPV6_TCLASS), no
#: iptables; where the OS refuses, datagrams go unmarked and ``tos_refused`` counts it.
TOS_CS1 = 0x20
TOS_LE = 0x04


def tos_of_channel(channel: int) -> int:
    """ToS byte for an unreliable channel (0 = unmarked)."""
    band = channel - wire.UNRELIABLE_BASE
    if band <= 0:
        return 0
    return TOS_CS1 if band == 1 else TOS_LE


class DatagramError(ValueError):
    def __init__(self, reason: str, category: str):
        super().__init__(reason)
        self.reason = reason
        self.category = category


def split_message(data: bytes | bytearray | memoryview, msg_id: int, chunk_payload_bytes: int,
                  key: bytes | None = None) -> list[bytes]:
    """Cut an encoded message into datagrams (header, payload slice, optional tag)."""
    mv = memoryview(data).cast("B")
    n = mv.nbytes
    count = max(1, math.ceil(n / chunk_payload_bytes))
    if count > MAX_CHUNKS:
        raise ValueError(f"message of {n} bytes needs {count} datagrams of "
                         f"{chunk_payload_bytes} bytes; at most {MAX_CHUNKS} are allowed")
    flags = FLAG_TAGGED if key is not None else 0
    msg_id &= 0xFFFFFFFF
    out = []
    for i in range(count):
        hdr = CHUNK_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, flags, msg_id, i, count)
        piece = mv[i * chunk_payload_bytes:(i + 1) * chunk_payload_bytes]
        if key is not None:
            out.append(b"".join((hdr, piece, security.datagram_tag(key, hdr, piece))))
        else:
            out.append(b"".join((hdr, piece)))
    return out


#: What one partial message and one held chunk cost beyond their payload bytes (Python
#: objects, dict slots), charged against ``max_pending_bytes``. Measured with tracemalloc:
#: ~420 B per partial (object, dict, key tuple), ~90 B per chunk (bytes header, dict slot).
PARTIAL_COST_BYTES = 512
CHUNK_COST_BYTES = 128


class _Partial:
    __slots__ = ("count", "chunks", "nbytes", "cost", "wire_bytes", "first_seen")

    def __init__(self, count: int, now: float):
        self.count = count
        self.chunks: dict[int, bytes] = {}  # only what arrived: no slot per announced chunk
        self.nbytes = 0
        self.cost = PARTIAL_COST_BYTES
        self.wire_bytes = 0
        self.first_seen = now


@dataclass
class ReassemblyStats:
    datagrams: int = 0
    messages: int = 0
    incomplete: int = 0      # dropped: timed out or evicted with chunks missing
    duplicates: int = 0
    rejected: int = 0        # malformed / unauthenticated datagrams


class Reassembler:
    """Collects chunks per (sender, message id); returns a message's bytes when complete."""

    def __init__(self, *, timeout_s: float = DEFAULT_REASSEMBLY_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 key: bytes | None = None):
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self.max_pending_bytes = max_pending_bytes
        self.key = key
        self.pending: dict[tuple[object, int], _Partial] = {}  # insertion order = age
        self.pending_bytes = 0
        self.stats = ReassemblyStats()
        #: Datagram bytes (headers and tags included) of the message :meth:`feed` last returned.
        self.last_wire_bytes = 0

    def feed(self, data: bytes, addr: object, now: float) -> bytearray | None:
        """Take one datagram; return the whole message when this completes it.

        Raises :class:`DatagramError` for a malformed or unauthenticated datagram.
        """
        st = self.stats
        st.datagrams += 1
        try:
            return self._feed(data, addr, now)
        except DatagramError:
            st.rejected += 1
            raise

    def _feed(self, data: bytes, addr: object, now: float) -> bytearray | None:
        n = len(data)
        if n < CHUNK_HEADER.size:
            raise DatagramError(f"datagram of {n} bytes is shorter than the "
                                f"{CHUNK_HEADER.size}-byte chunk header", "udp_truncated")
        magic, version, flags, mid, idx, count = CHUNK_HEADER.unpack_from(data, 0)
        if magic != CHUNK_MAGIC:
            raise DatagramError(f"bad datagram magic {magic!r}", "udp_bad_magic")
        if version != CHUNK_VERSION:
            raise DatagramError(f"unsupported datagram version {version}", "udp_version")
        if flags & ~FLAG_TAGGED:
            raise DatagramError(f"reserved datagram flags set: {flags:#x}", "udp_bad_flags")
        if count == 0 or idx >= count:
            raise DatagramError(f"chunk index {idx} of count {count}", "udp_bad_index")
        if self.key is not None:
            if not flags & FLAG_TAGGED or n < CHUNK_HEADER.size + security.DATAGRAM_TAG_BYTES:
                raise DatagramError("datagram carries no authentication tag", "udp_auth")
            body_end = n - security.DATAGRAM_TAG_BYTES
            mv = memoryview(data)
            tag = security.datagram_tag(self.key, mv[:CHUNK_HEADER.size],
                                        mv[CHUNK_HEADER.size:body_end])
            if not security.verify(tag, bytes(mv[body_end:])):
                raise DatagramError("datagram authentication tag does not match", "udp_auth")
            payload = bytes(mv[CHUNK_HEADER.size:body_end])
        else:
            if flags & FLAG_TAGGED:
                raise DatagramError("tagged datagram but this node has no secret", "udp_auth")
            payload = data[CHUNK_HEADER.size:]
        if count == 1:
            self.stats.messages += 1
            self.last_wire_bytes = n
            return bytearray(payload)
        if idx < count - 1 and (count - 1) * len(payload) > self.max_message_bytes:
            # every chunk but the last is full-size: the announced message is too big
            raise DatagramError(f"message {mid} announces {count} chunks of {len(payload)} "
                                f"bytes, past {self.max_message_bytes} bytes", "udp_oversize")
        k = (addr, mid)
        p = self.pending.get(k)
        if p is None:
            p = self.pending[k] = _Partial(count, now)
            self.pending_bytes += p.cost
        elif p.count != count:
            raise DatagramError(f"message {mid}: chunk count {count} differs from the "
                                f"{p.count} seen first", "udp_bad_index")
        if idx in p.chunks:
            self.stats.duplicates += 1
            return None
        p.chunks[idx] = payload
        p.nbytes += len(payload)
        p.cost += len(payload) + CHUNK_COST_BYTES
        p.wire_bytes += n
        self.pending_bytes += len(payload) + CHUNK_COST_BYTES
        if p.nbytes > self.max_message_bytes:
            self._drop(k)
            raise DatagramError(f"message {mid} grows past {self.max_message_bytes} bytes",
                                "udp_oversize")
        if len(p.chunks) == p.count:
            del self.pending[k]
            self.pending_bytes -= p.cost
            self.stats.messages += 1
            self.last_wire_bytes = p.wire_bytes
            return bytearray().join(p.chunks[i] for i in range(p.count))
        while self.pending_bytes > self.max_pending_bytes and len(self.pending) > 1:
            self._drop(next(iter(self.pending)))
            self.stats.incomplete += 1
        return None

    def _drop(self, k: tuple[object, int]) -> None:
        p = self.pending.pop(k)
        self.pending_bytes -= p.cost

    def expire(self, now: float) -> int:
        """Drop partial messages older than the timeout; return how many."""
        dropped = 0
        limit = now - self.timeout_s
        while self.pending:
            k = next(iter(self.pending))
            if self.pending[k].first_seen > limit:
                break
            self._drop(k)
            dropped += 1
        self.stats.incomplete += dropped
        return dropped


class UdpEndpoint(asyncio.DatagramProtocol):
    """One node's UDP socket: sends chunked messages, reassembles and delivers incoming ones.

    ``on_message(msg, nbytes)`` gets every complete, decodable message (``nbytes`` =
    datagram bytes received for it, headers and tags included); rejected datagrams go to
    ``rejects``.
    """

    def __init__(self, node: str, *, on_message: Callable[[Message, int], None],
                 rejects: RejectLog, secret: bytes | None = None,
                 chunk_payload_bytes: int = DEFAULT_CHUNK_PAYLOAD_BYTES,
                 reassembly_timeout_s: float = DEFAULT_REASSEMBLY_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES):
        overhead = CHUNK_HEADER.size + (security.DATAGRAM_TAG_BYTES if secret else 0)
        if not 1 <= chunk_payload_bytes <= MAX_DATAGRAM_BYTES - overhead:
            raise ValueError(f"chunk_payload_bytes must be within [1, "
                             f"{MAX_DATAGRAM_BYTES - overhead}], got {chunk_payload_bytes}")
        if reassembly_timeout_s <= 0:
            raise ValueError(f"reassembly_timeout_s must be > 0, got {reassembly_timeout_s}")
        self.node = node
        self._on_message = on_message
        self._rejects = rejects
        self._key = security.datagram_key(secret) if secret else None
        self.chunk_payload_bytes = chunk_payload_bytes
        self.max_message_bytes = max_message_bytes
        self.reassembler = Reassembler(timeout_s=reassembly_timeout_s,
                                       max_message_bytes=max_message_bytes,
                                       max_pending_bytes=max_pending_bytes, key=self._key)
        self._transport: asyncio.DatagramTransport | None = None
        self._sweeper: asyncio.Task | None = None
        self._next_id = 0
        self._lines: dict[tuple, DelayLine] = {}
        self.port = 0
        self.datagrams_sent = 0
        self.bytes_sent = 0
        self.messages_sent = 0
        self.datagrams_lost_by_shaper = 0
        self.send_errors = 0
        self.closed = False
        self._tos = 0                 # the socket's current ToS byte
        self._tos_level: tuple[int, int] | None = None
        self.tos_marked = 0           # datagrams written with a non-zero ToS
        self.tos_refused = 0          # setsockopt refusals (then marking stops)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 = any free port); return the port."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(host, port))
        sock = transport.get_extra_info("socket")
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
            except OSError:  # pragma: no cover - capped or refused by the kernel
                pass
        self.port = transport.get_extra_info("sockname")[1]
        self._tos_level = ((socket.IPPROTO_IPV6, socket.IPV6_TCLASS)
                           if sock.family == socket.AF_INET6 else (socket.IPPROTO_IP, socket.IP_TOS))
        period = max(0.01, self.reassembler.timeout_s / 4)
        self._sweeper = loop.create_task(self._sweep(period), name=f"{self.node}:udp-sweeper")
        return self.port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for line in self._lines.values():
            line.close()
        self._lines.clear()
        if self._transport is not None:
            self._transport.close()

    async def _sweep(self, period: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            n = self.reassembler.expire(loop.time())
            if n:
                log.debug("%s: dropped %d incomplete UDP message(s) after %.3g s", self.node,
                          n, self.reassembler.timeout_s)

    # -- receiving ----------------------------------------------------------------------
    def datagram_received(self, data: bytes, addr: tuple) -> None:
        loop = asyncio.get_running_loop()
        peer = f"udp {addr[0]}:{addr[1]}"
        try:
            body = self.reassembler.feed(data, addr, loop.time())
        except DatagramError as e:
            self._rejects.reject(peer, e.reason, e.category)
            return
        if body is None:
            return
        msg = decode_message(body, peer, self._rejects, max_bytes=self.max_message_bytes)
        if msg is not None:
            self._on_message(msg, self.reassembler.last_wire_bytes)

    def error_received(self, exc: Exception) -> None:
        # e.g. ICMP port unreachable while a peer is not up yet: datagrams are lossy anyway
        log.debug("%s: UDP error: %s", self.node, exc)

    # -- sending ------------------------------------------------------------------------
    def _line(self, addr: tuple) -> DelayLine:
        line = self._lines.get(addr)
        if line is None:
            transport = self._transport

            def write(piece: object, _addr: tuple = addr) -> None:
                tos, dgram = piece  # type: ignore[misc]
                self._mark(tos)
                transport.sendto(dgram, _addr)  # type: ignore[union-attr]

            line = self._lines[addr] = DelayLine(write, name=f"{self.node}:udp-delay")
        return line

    async def send(self, msg: Message, addr: tuple, link: ShapedLink | None = None) -> int:
        """Send ``msg`` as datagrams to ``addr``; return the datagram bytes handed to the network.

        With a ``link`` the datagrams are paced by its token bucket, delayed, and each
        is dropped with the link's loss probability (after using its bandwidth).
        """
        if self._transport is None or self.closed:
            raise ConnectionError(f"{self.node}: UDP endpoint is not open")
        data = wire.encode_bytes(msg)
        if len(data) > self.max_message_bytes:
            raise ValueError(f"message of {len(data)} bytes exceeds the UDP message limit "
                             f"of {self.max_message_bytes} bytes")
        mid = self._next_id
        self._next_id = (mid + 1) & 0xFFFFFFFF
        dgrams = split_message(data, mid, self.chunk_payload_bytes, self._key)
        total = sum(len(d) for d in dgrams)
        self.messages_sent += 1
        self.datagrams_sent += len(dgrams)
        self.bytes_sent += total
        transport = self._transport
        tos = tos_of_channel(msg.channel)
        if link is None:
            for d in dgrams:
                self._mark(tos)
                transport.sendto(d, addr)
            while (transport.get_write_buffer_size() > WRITE_HIGH_WATER_BYTES
                   and not transport.is_closing()):
                await asyncio.sleep(0.001)
            return total
        line = self._line(addr)
        delay = link.sample_delay()
        for d in dgrams:
            now = now_s()
            t_done = link.transmit(len(d), now)
            if link.lose():
                self.datagrams_lost_by_shaper += 1
            else:
                line.put(t_done + delay, (tos, d), len(d))
            ahead = t_done - now
            if ahead > PACING_LEAD_S:
                await asyncio.sleep(ahead - PACING_LEAD_S)
        return total

    def _mark(self, tos: int) -> None:
        """Set the socket's ToS before a datagram leaves (same thread, no interleaving; a
        datagram the kernel cannot take at once is queued by asyncio and may leave with a
        later ToS)."""
        if tos == self._tos or self._tos_level is None or self._transport is None:
            if tos:
                self.tos_marked += 1
            return
        sock = self._transport.get_extra_info("socket")
        try:
            sock.setsockopt(*self._tos_level, tos)
        except OSError as e:
            self.tos_refused += 1
            self._tos_level = None  # do not retry for every datagram
            log.info("%s: the OS refused ToS 0x%02x on UDP (%s); datagrams go unmarked",
                     self.node, tos, e)
            return
        self._tos = tos
        if tos:
            self.tos_marked += 1

    def stats(self) -> dict[str, int]:
        r = self.reassembler.stats
        return {
            "messages_sent": self.messages_sent,
            "datagrams_sent": self.datagrams_sent,
            "bytes_sent": self.bytes_sent,
            "datagrams_lost_by_shaper": self.datagrams_lost_by_shaper,
            "datagrams_received": r.datagrams,
            "messages_received": r.messages,
            "incomplete_dropped": r.incomplete,
            "duplicate_chunks": r.duplicates,
            "rejected_datagrams": r.rejected,
            "pending_messages": len(self.reassembler.pending),
            "tos_marked": self.tos_marked,
            "tos_refused": self.tos_refused,
        }
