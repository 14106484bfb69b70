"""Stream framing for the TCP transport: how ``wire.encode`` frames travel on a byte stream.

Frame format
------------
Every frame on a geomx TCP stream is an 8-byte *preamble* followed by a body::

    offset  size  field
    0       2     magic  b"GF"  (geomx frame; a stream that does not start a frame with
                                  it is out of sync and is closed)
    2       1     type   1 = MESSAGE (body = one wire.encode'd Message)
                         2 = HELLO, 3 = CHALLENGE, 4 = AUTH, 5 = WELCOME, 6 = REFUSE
                             (handshake, body = a small UTF-8 JSON object, <= 4 KiB)
                         7 = SEQ_MESSAGE (body = u64 sequence number + one Message),
                         8 = ACK (body = u64: every sequence number up to it arrived)
                             (resumable streams only, see geomx.runtime.tcp_resume)
                         9 = STREAM_HEAD, 10 = STREAM_PIECE (one large frame carried as
                             bounded pieces, see "Large messages" below)
                         11 = SHM_PIECE, 12 = SHM_FREED (a stream's piece passed through
                             shared memory, see "Same-host pieces" below)
    3       1     flags  0, except SEQ_MESSAGE's bit 0 (``SPLIT_BATCH``): the message is a
                         BATCH the sending transport made of several small messages
                         (one frame for a burst); the receiver delivers them one by one
    4       4     length u32 little-endian byte length of the body (not counting the preamble)

A u32 length caps one frame at 4 GiB - 1; ``max_frame_bytes`` (default 2 GiB, the same
as :data:`geomx.wire.DEFAULT_MAX_FRAME_BYTES`) caps it lower. The wire header carries
its own magic ("GX") and version, so the preamble only has to delimit frames and tell
handshake frames from messages.

Large messages
--------------
A MESSAGE or SEQ_MESSAGE frame whose body is longer than the piece size
(:func:`stream_piece_bytes`: :data:`STREAM_PIECE_BYTES`, or less when ``max_frame_bytes``
is lower) travels as a *stream*: one STREAM_HEAD frame, then STREAM_PIECE frames, back to
back on the connection (a connection's writer writes one message at a time)::

    STREAM_HEAD   body = u32 stream id, u8 carried frame type, u8 carried flags,
                         u16 reserved (0), u64 carried body length L,
                         then the body's first bytes (its wire header; at most
                         STREAM_HEAD_MAX_BYTES)
    STREAM_PIECE  body = u32 stream id, then the next bytes of the body (1..piece size)

The receiver makes the carried frame's buffer -- the receiver's own sink for an awaited
reply (``route``), else one buffer of exactly L bytes -- when the head arrives, and reads
every piece from the socket straight into its place there; when the L-th byte has
arrived the carried frame is handed on as if it had come in one frame. So every frame
on the wire stays within ``max_frame_bytes``, a value of any size can travel, and no
piece is copied twice. The receiver holds a stream's bytes within the same budget as a
large frame's (``reserve``, :class:`geomx.runtime.tcp_conn.FrameBudget`); a stream
received into a sink takes none (its memory is the receiver's already). ps-lite sends a
message as ZeroMQ multipart frames and leaves their transport to ZeroMQ
(docs/geomx-behaviour.md §1.5); this is that layer, for geomx's own framing.

The emulator (geomx/sim/transport.py) passes a message whole and charges its
``nbytes``: a stream's headers (12 bytes per 4 MiB piece, 24 for the head) are not
modelled, and nothing else about a value's travel differs.

A stream that lies is a stream error (the connection is closed, the rejection counted by
category, the half-received buffer freed): a head announcing more than
``max_stream_bytes`` ("oversize"), a piece for a stream that is not the one open
("stream_unknown"), a piece past the announced length ("stream_overrun"), and any other
frame before the stream's last byte ("stream_unfinished": the sender abandoned it).
A connection that closes mid-stream frees it as a connection closing mid-frame does.

Same-host pieces
----------------
A connection's sender asks for a shared-memory ring (:mod:`geomx.runtime.shm_ring`)
when it first has a message large enough for one to write, never before (a connection
that only carries small messages holds no ring), at most once per connection, and only
where both handshake frames said ``shm: true`` (:mod:`geomx.runtime.tcp_handshake`;
elsewhere these are unknown frame types)::

    SHM_OFFER  body = JSON {"shm": the ring's offer} (sender -> receiver)
    SHM_ANSWER body = u8 1 (mapped) or 0 (declined) (receiver -> sender)

A second SHM_OFFER on a connection, or a SHM_ANSWER nobody asked for, is a protocol
error. Once the ring is mapped, a stream's pieces may travel through it instead of the
socket::

    SHM_PIECE  body = u32 stream id, u64 ring position, u32 piece length (16 bytes)
    SHM_FREED  body = u64 ring position (receiver -> sender: everything before it is
                      copied out and may be written again)

A SHM_PIECE takes the place of a STREAM_PIECE of the same length: its bytes are copied
from the ring into the same place of the stream's destination buffer, under the same
checks (a piece for another stream, past the announced length, or outside the ring is
a stream error). SHM_FREED travels back on the same connection, as ACK does. The
emulator models neither (a piece costs the bytes it carries either way).

:class:`FrameDecoder` is driven by an ``asyncio.BufferedProtocol``: the event loop reads
from the socket straight into the buffer it hands out. Small frames are parsed out of a
64 KiB scratch buffer (many frames per ``recv``, one small copy each into a ``bytearray``
of their own); a frame larger than the scratch gets its own buffer of exactly the
announced length -- an uninitialised ``numpy.uint8`` array, so nothing is zero-filled and
pages are only touched as data arrives -- and the socket reads the rest of the body
directly into it: no intermediate copies, and the decoded payload arrays are writable
views of that buffer. The announced length is checked against ``max_frame_bytes``
*before* anything is allocated.

Errors
------
* Stream errors (bad magic, a length over the limit, the peer closing mid-frame) mean
  the stream can no longer be trusted: :class:`FramingError` is raised and the
  connection is closed.
* A body that ``wire.decode`` rejects (:class:`geomx.wire.WireError`), a reserved flag
  set, or an unknown frame type is a bad *frame* on a good stream: it is logged with the
  peer and the reason, counted, and dropped; the connection keeps serving
  (:class:`RejectLog`).
"""

from __future__ import annotations

import enum
import json
import logging
import struct
from collections import Counter
from collections.abc import Callable
from typing import Any, Union

import numpy as np

from geomx import wire
from geomx.wire import Message, WireError

log = logging.getLogger("geomx.runtime.framing")

FRAME_MAGIC = b"GF"
#: ``<2sBBI``: magic, frame type, flags, body length.
PREAMBLE = struct.Struct("<2sBBI")
PREAMBLE_BYTES = PREAMBLE.size
#: The u32 length field's ceiling.
MAX_FRAME_LENGTH = (1 << 32) - 1
DEFAULT_MAX_FRAME_BYTES = wire.DEFAULT_MAX_FRAME_BYTES
#: Largest handshake (control) frame; also the limit before a connection is authenticated.
MAX_CONTROL_FRAME_BYTES = 4096
#: Size of the decoder's scratch buffer; larger frames get a buffer of their own.
SCRATCH_BYTES = 64 * 1024
#: Largest piece of a streamed message (module docstring, "Large messages"): large enough
#: that a piece costs one frame parse per 4 MiB, small enough that no frame comes near
#: ``max_frame_bytes``.
STREAM_PIECE_BYTES = 4 << 20
#: Most bytes of the carried body a STREAM_HEAD frame holds (the message's wire header:
#: what the receiver needs to choose the destination buffer).
STREAM_HEAD_MAX_BYTES = 16 << 10
#: STREAM_HEAD's fields: stream id, carried frame type and flags, reserved, body length.
STREAM_HEAD = struct.Struct("<IBBHQ")
#: STREAM_PIECE's field: stream id.
STREAM_PIECE = struct.Struct("<I")
#: SHM_PIECE's fields: stream id, ring position, piece length.
SHM_PIECE = struct.Struct("<IQI")
#: SHM_FREED's field: the ring position everything before which is copied out.
SHM_FREED = struct.Struct("<Q")
#: The per-frame bound that lets a message of any size travel: a piece and its header.
STREAM_FRAME_BYTES = STREAM_PIECE_BYTES + STREAM_HEAD.size
#: The smallest ``max_frame_bytes`` a stream can be cut to (a head's fields and one byte).
MIN_STREAM_FRAME_BYTES = STREAM_HEAD.size + 1


class SplitBody:
    """A large frame body received in two places: ``head`` (its first bytes, a
    ``bytearray``) and ``tail`` (the rest, read straight into an array the receiver
    named in advance through the decoder's ``route``; see :func:`wire.peek_single_payload`)."""

    __slots__ = ("head", "tail")

    def __init__(self, head: bytearray, tail: np.ndarray):
        self.head = head
        self.tail = tail

    def __len__(self) -> int:
        return len(self.head) + self.tail.nbytes


#: A frame body handed to ``on_frame``: a ``bytearray`` (small frames) or a 1-D
#: ``numpy.uint8`` array (large frames), both writable and owned by the callee, or a
#: :class:`SplitBody` (a large frame routed into a receiver's buffer).
Body = Union[bytearray, np.ndarray, SplitBody]


class FrameType(enum.IntEnum):
    MESSAGE = 1
    HELLO = 2
    CHALLENGE = 3
    AUTH = 4
    WELCOME = 5
    REFUSE = 6
    SEQ_MESSAGE = 7
    ACK = 8
    STREAM_HEAD = 9
    STREAM_PIECE = 10
    SHM_PIECE = 11
    SHM_FREED = 12
    SHM_OFFER = 13
    SHM_ANSWER = 14


CONTROL_TYPES = frozenset({FrameType.HELLO, FrameType.CHALLENGE, FrameType.AUTH,
                           FrameType.WELCOME, FrameType.REFUSE})
_FRAME_TYPES = frozenset(int(t) for t in FrameType)
#: The sequence number of a SEQ_MESSAGE frame and the body of an ACK: u64 little-endian.
SEQ = struct.Struct("<Q")
SEQ_BYTES = SEQ.size
#: SEQ_MESSAGE flag: deliver the BATCH message's messages one by one (module docstring).
SPLIT_BATCH = 1


class FramingError(Exception):
    """The byte stream is unusable (out of sync, oversized frame, cut mid-frame)."""

    def __init__(self, reason: str, category: str):
        super().__init__(reason)
        self.reason = reason
        self.category = category


def pack_preamble(ftype: int, length: int, flags: int = 0) -> bytes:
    if not 0 <= length <= MAX_FRAME_LENGTH:
        raise ValueError(f"frame body of {length} bytes does not fit the u32 length field")
    return PREAMBLE.pack(FRAME_MAGIC, ftype, flags, length)


def message_frames(msg: Message) -> tuple[list[bytes | memoryview], int]:
    """Frames for ``msg`` -- ``[preamble + wire header, *zero-copy array views]`` -- and size.

    The preamble is glued to the (small) wire header so a message is one write of
    ``1 + n_payloads`` buffers; array data is never copied.
    """
    frames = wire.encode(msg)
    body = wire.frame_length(frames)
    frames[0] = pack_preamble(FrameType.MESSAGE, body) + frames[0]
    return frames, body + PREAMBLE_BYTES


def sequenced_frames(msg: Message,
                     flags: int = 0) -> tuple[list[bytes | bytearray | memoryview], int]:
    """Frames of a SEQ_MESSAGE for ``msg`` with its sequence number still blank, and size.

    Like :func:`message_frames`; the first frame is a ``bytearray`` (preamble, sequence
    number, wire header) that :func:`stamp_sequence` fills in when the message is given
    its place in the stream (when it is written, not when it is queued: priorities
    reorder the queue).
    """
    frames = wire.encode(msg)
    body = SEQ_BYTES + wire.frame_length(frames)
    frames[0] = bytearray(pack_preamble(FrameType.SEQ_MESSAGE, body, flags) + bytes(SEQ_BYTES)
                          + frames[0])
    return frames, body + PREAMBLE_BYTES


def stamp_sequence(frames: list, seq: int) -> None:
    """Write ``seq`` into frames made by :func:`sequenced_frames` (once, before writing)."""
    SEQ.pack_into(frames[0], PREAMBLE_BYTES, seq)


def stream_piece_bytes(max_frame_bytes: int) -> int:
    """The piece size of streams on a connection whose frames may be ``max_frame_bytes``
    long: :data:`STREAM_PIECE_BYTES`, or less so that a head or a piece fits the limit.
    A frame whose body is longer travels as a stream (:func:`stream_frames`)."""
    return max(1, min(STREAM_PIECE_BYTES, max_frame_bytes - STREAM_HEAD.size))


def stream_head(frames: list, stream_id: int,
                piece_bytes: int) -> tuple[bytes, list[memoryview], int]:
    """The STREAM_HEAD frame that starts the stream of the frame ``frames`` (its preamble
    first, as :func:`sequenced_frames` makes it, sequence number stamped), the zero-copy
    views of the body bytes its pieces carry, and the carried body's length. Only the
    head's few header bytes are copied."""
    _, ftype, flags, length = PREAMBLE.unpack_from(frames[0], 0)
    views = [memoryview(frames[0])[PREAMBLE_BYTES:]]
    views += [memoryview(f).cast("B") for f in frames[1:]]
    head_n = min(views[0].nbytes, STREAM_HEAD_MAX_BYTES, piece_bytes, length - 1)
    head = (pack_preamble(FrameType.STREAM_HEAD, STREAM_HEAD.size + head_n)
            + STREAM_HEAD.pack(stream_id & 0xFFFFFFFF, ftype, flags, 0, length)
            + bytes(views[0][:head_n]))
    views[0] = views[0][head_n:]
    return head, [v for v in views if v.nbytes], length - head_n


def stream_frames(frames: list, stream_id: int,
                  piece_bytes: int) -> tuple[list[bytes | memoryview], int]:
    """The frame ``frames`` (see :func:`stream_head`) as a STREAM_HEAD and STREAM_PIECE
    frames of at most ``piece_bytes`` body bytes each, and their size on the wire. The
    array data stays zero-copy views; only the head's few header bytes are copied."""
    head, views, left = stream_head(frames, stream_id, piece_bytes)
    sid = stream_id & 0xFFFFFFFF
    out: list[bytes | memoryview] = [head]
    nbytes = len(head)
    room = 0
    for v in views:
        off, n = 0, v.nbytes
        while off < n:
            if room == 0:
                room = min(piece_bytes, left)
                left -= room
                out.append(pack_preamble(FrameType.STREAM_PIECE, STREAM_PIECE.size + room)
                           + STREAM_PIECE.pack(sid))
                nbytes += PREAMBLE_BYTES + STREAM_PIECE.size + room
            take = min(room, n - off)
            out.append(v[off:off + take] if take != n else v)
            off += take
            room -= take
    return out, nbytes


def shm_piece_frame(stream_id: int, pos: int, nbytes: int) -> bytes:
    """A SHM_PIECE frame: ``nbytes`` of stream ``stream_id`` at ring position ``pos``."""
    return (pack_preamble(FrameType.SHM_PIECE, SHM_PIECE.size)
            + SHM_PIECE.pack(stream_id & 0xFFFFFFFF, pos, nbytes))


def shm_freed_frame(pos: int) -> bytes:
    """A SHM_FREED frame: the ring may be written again up to ``pos``."""
    return pack_preamble(FrameType.SHM_FREED, SHM_FREED.size) + SHM_FREED.pack(pos)


def shm_offer_frame(offer: dict[str, Any]) -> bytes:
    """A SHM_OFFER frame: the sender's ring (:meth:`geomx.runtime.shm_ring.SendRing.offer`)."""
    body = json.dumps({"shm": offer}, separators=(",", ":"), sort_keys=True).encode()
    return pack_preamble(FrameType.SHM_OFFER, len(body)) + body


def shm_answer_frame(taken: bool) -> bytes:
    """A SHM_ANSWER frame: whether the receiver mapped the offered ring."""
    return pack_preamble(FrameType.SHM_ANSWER, 1) + (b"\x01" if taken else b"\x00")


def ack_frame(seq: int) -> bytes:
    """An ACK frame: the receiver has every message of the stream up to ``seq``."""
    return pack_preamble(FrameType.ACK, SEQ_BYTES) + SEQ.pack(seq)


def control_frame(ftype: FrameType, **fields: Any) -> bytes:
    """A handshake frame: the preamble and a compact JSON body."""
    body = json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
    if len(body) > MAX_CONTROL_FRAME_BYTES:
        raise ValueError(f"control frame of {len(body)} bytes > {MAX_CONTROL_FRAME_BYTES}")
    return pack_preamble(ftype, len(body)) + body


def parse_control(body: bytes | Body) -> dict[str, Any]:
    """The JSON object of a handshake frame; :class:`ValueError` if it is not one."""
    try:
        obj = json.loads(bytes(body))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"handshake frame is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError("handshake frame is not a JSON object")
    return obj


class FrameDecoder:
    """Incremental frame parser behind a ``BufferedProtocol`` (see the module docstring).

    ``on_frame(ftype, flags, body)`` is called once per complete frame, with a fresh
    :data:`Body` the callee owns. It may raise :class:`FramingError` to stop
    parsing (the caller then closes the connection). ``max_frame_bytes`` may be changed
    between frames (it is lowered until a connection is authenticated).

    ``max_stream_bytes``: the longest frame body a stream may carry (module docstring,
    "Large messages"); 0, the default, refuses streams (a connection allows them once
    authenticated). A stream's pieces go straight into its destination buffer, and the
    carried frame reaches ``on_frame`` like any other once complete.
    """

    __slots__ = ("_on_frame", "max_frame_bytes", "max_stream_bytes", "_scratch", "_view",
                 "_start", "_end", "_big", "_big_view", "_big_filled", "_big_type",
                 "_big_flags", "frames", "bytes", "_reserve", "_release", "waiting",
                 "_parsing", "_grow_to", "_alloc", "_route", "_big_len", "_stream",
                 "_big_piece", "frame_wire_bytes", "shm")

    def __init__(self, on_frame: Callable[[int, int, Body], None], *,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 scratch_bytes: int = SCRATCH_BYTES,
                 reserve: Callable[[int], bool] | None = None,
                 release: Callable[[int], None] | None = None,
                 alloc: Callable[[int], np.ndarray] | None = None,
                 route: Callable[[int, memoryview, int], tuple[int, np.ndarray] | None]
                 | None = None):
        """``reserve(n)`` / ``release(n)``: the owner's budget for bodies of large frames
        held while they arrive (see :class:`geomx.runtime.tcp.TcpTransport`). When
        ``reserve`` says no, parsing stops with ``waiting`` set (the frame's first bytes
        stay in the scratch buffer); the owner stops reading and calls :meth:`retry`
        once budget is released. ``alloc(n)``: where the ``uint8`` body of a large frame
        comes from (a :class:`geomx.runtime.recv_pool.RecvBufferPool`'s ``take``, so
        its pages are already mapped); a fresh ``numpy.empty`` without one.
        ``route(ftype, first_body_bytes, length)``: ``(split, sink)`` to receive the body
        from byte ``split`` on straight into ``sink`` (exactly ``length - split`` bytes;
        ``split`` within the bytes already here), or None for a buffer of its own."""
        if scratch_bytes < 4096:
            raise ValueError("scratch_bytes must be >= 4096")
        self._on_frame = on_frame
        self._reserve = reserve
        self._release = release
        self._alloc = alloc
        self._route = route
        self._big_len = 0
        self.waiting = False
        self._parsing = False
        self._grow_to = 0
        self.max_frame_bytes = max_frame_bytes
        self.max_stream_bytes = 0
        #: the stream being received (between its head and its last piece), or None
        self._stream: _InStream | None = None
        #: the large body being read is a stream piece's (it goes to ``_stream``)
        self._big_piece = False
        self._scratch = bytearray(scratch_bytes)
        self._view = memoryview(self._scratch)
        self._start = 0
        self._end = 0
        self._big: np.ndarray | None = None
        self._big_view: memoryview | None = None
        self._big_filled = 0
        self._big_type = 0
        self._big_flags = 0
        self.frames = 0  # complete frames seen
        self.bytes = 0   # bytes of complete frames, preambles included
        #: bytes on the wire of the frame ``on_frame`` is given (preamble included; a
        #: stream's: every frame of it)
        self.frame_wire_bytes = 0
        #: the peer's shared-memory ring SHM_PIECE frames point into
        #: (a :class:`geomx.runtime.shm_ring.RecvRing`), or None: they are refused
        self.shm: Any = None

    # -- BufferedProtocol plumbing -------------------------------------------------------
    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._big_view is not None:
            return self._big_view[self._big_filled:]
        if len(self._scratch) - self._end < 4096 and self._start > 0:
            self._compact()
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._big_view is not None:
            self._big_filled += nbytes
            if self._big_piece and self._big_filled == len(self._big_view):
                st = self._stream
                st.filled += self._big_filled  # type: ignore[union-attr]
                self._big_view = None
                self._big_piece = False
                self.frames += 1
                self.bytes += PREAMBLE_BYTES + self._big_len
                st.wire_bytes += PREAMBLE_BYTES + self._big_len  # type: ignore[union-attr]
                if st.filled == st.length:  # type: ignore[union-attr]
                    self._finish_stream()
                return
            if self._big_filled == len(self._big_view):
                body, ftype, flags = self._big, self._big_type, self._big_flags
                self._big = self._big_view = None
                self.frames += 1
                self.bytes += PREAMBLE_BYTES + self._big_len
                if self._release is not None:
                    self._release(self._big_len)
                self.frame_wire_bytes = PREAMBLE_BYTES + self._big_len
                self._on_frame(ftype, flags, body)  # type: ignore[arg-type]
            return
        self._end += nbytes
        self._parse()

    def retry(self) -> None:
        """Parse again after :attr:`waiting` (the owner released budget)."""
        if self.waiting and self._big_view is None:
            self._parse()

    def abandon(self) -> None:
        """The connection is gone: give back the budget of a frame (or a stream) still
        arriving, and its buffer."""
        if self._big_view is not None:
            if self._release is not None and not self._big_piece:
                self._release(self._big_len)
            self._big = self._big_view = None
            self._big_piece = False
        self._drop_stream()
        self.waiting = False

    def _drop_stream(self) -> None:
        """Forget the stream being received: its budget goes back, its buffer is freed."""
        st, self._stream = self._stream, None
        if st is not None and st.reserved and self._release is not None:
            self._release(st.reserved)

    def _finish_stream(self) -> None:
        """The stream's last byte arrived: hand on the frame it carried."""
        st, self._stream = self._stream, None
        if st.reserved and self._release is not None:  # type: ignore[union-attr]
            self._release(st.reserved)  # type: ignore[union-attr]
        self.frame_wire_bytes = st.wire_bytes  # type: ignore[union-attr]
        self._on_frame(st.ftype, st.flags, st.body)  # type: ignore[union-attr]

    def grow(self, scratch_bytes: int) -> None:
        """Use a larger scratch buffer from now on (a connection that passed its handshake:
        until then it holds only a small one, so unauthenticated connections cost little).
        Deferred to the end of a parse in progress."""
        if scratch_bytes <= len(self._scratch):
            return
        if self._parsing or self._big_view is not None:
            self._grow_to = max(self._grow_to, scratch_bytes)
            return
        n = self._end - self._start
        new = bytearray(scratch_bytes)
        new[:n] = self._view[self._start:self._end]
        self._scratch, self._view = new, memoryview(new)
        self._start, self._end = 0, n

    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame (or stream) held right now (0 at a frame
        boundary with no stream open)."""
        st = self._stream
        if st is not None:
            return st.filled + self._big_filled + self._end - self._start
        if self._big_view is not None:
            return PREAMBLE_BYTES + self._big_filled
        return self._end - self._start

    def pending_description(self) -> str:
        st = self._stream
        if st is not None:
            got = st.filled + (self._big_filled if self._big_piece else 0)
            return (f"{got} of {st.length} body bytes of a type-{st.ftype} frame carried by "
                    f"stream {st.sid}")
        if self._big_view is not None:
            return (f"{self._big_filled} of {len(self._big_view)} body bytes of a "
                    f"type-{self._big_type} frame")
        n = self._end - self._start
        if n >= PREAMBLE_BYTES:
            _, ftype, _, length = PREAMBLE.unpack_from(self._scratch, self._start)
            return f"{n - PREAMBLE_BYTES} of {length} body bytes of a type-{ftype} frame"
        return f"{n} of {PREAMBLE_BYTES} preamble bytes"

    # -- parsing -------------------------------------------------------------------------
    def _compact(self) -> None:
        n = self._end - self._start
        if n:
            tail = bytes(self._view[self._start:self._end])  # regions may overlap: copy out
            self._view[:n] = tail
        self._start, self._end = 0, n

    def _parse(self) -> None:
        self._parsing = True
        try:
            self._parse_frames()
        finally:
            self._parsing = False
        if self._grow_to:
            size, self._grow_to = self._grow_to, 0
            self.grow(size)

    def _parse_frames(self) -> None:
        scratch = self._scratch
        view = self._view
        cap = len(scratch)
        while self._end - self._start >= PREAMBLE_BYTES:
            start = self._start
            magic, ftype, flags, length = PREAMBLE.unpack_from(scratch, start)
            if magic != FRAME_MAGIC:
                raise FramingError(f"bad frame magic {bytes(magic)!r} (stream out of sync)",
                                   "bad_magic")
            if length > self.max_frame_bytes:
                raise FramingError(f"frame of {length} bytes announced, limit is "
                                   f"{self.max_frame_bytes}", "oversize")
            if ftype == _PIECE or ftype == _SHM_PIECE:
                step = (self._piece(start, length) if ftype == _PIECE
                        else self._shm_piece(start, length))
                if step == _NEXT:
                    continue
                if step == _MORE:
                    break
                return
            if self._stream is not None:
                st = self._stream
                raise FramingError(f"a type-{ftype} frame came after {st.filled} of the "
                                   f"{st.length} bytes stream {st.sid} announced (the stream "
                                   "was never finished)", "stream_unfinished")
            if ftype == _HEAD:
                step = self._head(start, length)
                if step == _NEXT:
                    continue
                if step == _MORE:
                    break
                return
            total = PREAMBLE_BYTES + length
            have = self._end - start
            if have >= total:
                body = bytearray(view[start + PREAMBLE_BYTES:start + total])
                self._start = start + total
                self.frames += 1
                self.bytes += total
                self.frame_wire_bytes = total
                self._on_frame(ftype, flags, body)
                continue
            if total > cap:
                # A large frame: a buffer of its own, filled straight from the socket --
                # within the owner's budget for frames in flight, or wait for it
                if self._reserve is not None and not self._reserve(length):
                    self.waiting = True
                    return
                self.waiting = False
                got = have - PREAMBLE_BYTES
                body0 = start + PREAMBLE_BYTES
                routed = (None if self._route is None
                          else self._route(ftype, view[body0:self._end], length))
                if routed is not None:
                    split, sink = routed
                    head = bytearray(view[body0:body0 + split])
                    big_view = memoryview(sink).cast("B")
                    got -= split
                    if got:
                        big_view[:got] = view[body0 + split:self._end]
                    big: Any = SplitBody(head, sink)
                else:
                    big = (np.empty(length, dtype=np.uint8) if self._alloc is None
                           else self._alloc(length))
                    big_view = memoryview(big)
                    if got:
                        big_view[:got] = view[body0:self._end]
                self._big_len = length
                self._big = big
                self._big_view = big_view
                self._big_filled = got
                self._big_type = ftype
                self._big_flags = flags
                self._start = self._end = 0
                return
            if start + total > cap:
                self._compact()
            break
        if self._start == self._end:
            self._start = self._end = 0

    def _head(self, start: int, length: int) -> int:
        """A STREAM_HEAD frame at ``start``: open its stream (module docstring)."""
        if self.max_stream_bytes <= 0:
            raise FramingError("stream frame on a connection that does not allow streams "
                               "(before its handshake completed)", "protocol")
        if not STREAM_HEAD.size < length <= STREAM_HEAD.size + STREAM_HEAD_MAX_BYTES:
            raise FramingError(f"STREAM_HEAD frame of {length} bytes (allowed: "
                               f"{STREAM_HEAD.size + 1}..{STREAM_HEAD.size + STREAM_HEAD_MAX_BYTES})",
                               "protocol")
        total = PREAMBLE_BYTES + length
        if self._end - start < total:
            if start + total > len(self._scratch):
                self._compact()
            return _MORE
        fields = start + PREAMBLE_BYTES
        sid, ftype, flags, reserved, carried = STREAM_HEAD.unpack_from(self._scratch, fields)
        got = length - STREAM_HEAD.size
        if ftype not in _STREAMABLE or reserved:
            raise FramingError(f"stream {sid} carries a type-{ftype} frame (reserved field "
                               f"{reserved}); only MESSAGE and SEQ_MESSAGE frames stream",
                               "protocol")
        if carried > self.max_stream_bytes:
            raise FramingError(f"stream of {carried} bytes announced, limit is "
                               f"{self.max_stream_bytes}", "oversize")
        if carried <= got:
            raise FramingError(f"stream {sid} of {carried} bytes has a {got}-byte head (a "
                               "stream has at least one piece)", "protocol")
        first = self._view[fields + STREAM_HEAD.size:start + total]
        routed = None if self._route is None else self._route(ftype, first, carried)
        reserved_bytes = 0
        if routed is not None:
            split, sink = routed
            body: Any = SplitBody(bytearray(first[:split]), sink)
            dest = memoryview(sink).cast("B")
            dest[:got - split] = first[split:]
            base = split
        else:
            if self._reserve is not None and not self._reserve(carried):
                self.waiting = True
                return _WAIT
            self.waiting = False
            reserved_bytes = carried
            body = (np.empty(carried, dtype=np.uint8) if self._alloc is None
                    else self._alloc(carried))
            dest = memoryview(body)
            dest[:got] = first
            base = 0
        self._stream = _InStream(sid, ftype, flags, carried, got, body, dest, base,
                                 reserved_bytes, total)
        self._start = start + total
        self.frames += 1
        self.bytes += total
        return _NEXT

    def _piece(self, start: int, length: int) -> int:
        """A STREAM_PIECE frame at ``start``: its bytes go to their place in the open
        stream's buffer, from the scratch or straight from the socket."""
        if length <= STREAM_PIECE.size:
            raise FramingError(f"STREAM_PIECE frame of {length} bytes (no data)", "protocol")
        data0 = start + PREAMBLE_BYTES + STREAM_PIECE.size
        if self._end < data0:
            if data0 > len(self._scratch):
                self._compact()
            return _MORE
        (sid,) = STREAM_PIECE.unpack_from(self._scratch, start + PREAMBLE_BYTES)
        st = self._stream
        if st is None or st.sid != sid:
            open_ = f" (stream {st.sid} is open)" if st is not None else " (none is open)"
            raise FramingError(f"piece for unknown stream {sid}{open_}", "stream_unknown")
        n = length - STREAM_PIECE.size
        if st.filled + n > st.length:
            raise FramingError(f"piece of {n} bytes at byte {st.filled} runs past the "
                               f"{st.length} bytes stream {sid} announced", "stream_overrun")
        here = min(self._end - data0, n)
        at = st.filled - st.base
        if here:
            st.dest[at:at + here] = self._view[data0:data0 + here]
            st.filled += here
        if here == n:
            self._start = data0 + n
            self.frames += 1
            self.bytes += PREAMBLE_BYTES + length
            st.wire_bytes += PREAMBLE_BYTES + length
            if st.filled == st.length:
                self._finish_stream()
            return _NEXT
        # the rest of the piece is read from the socket straight into its place
        self._big_view = st.dest[at + here:at + n]
        self._big_filled = 0
        self._big_len = length
        self._big_piece = True
        self._start = self._end = 0
        return _WAIT


    def _shm_piece(self, start: int, length: int) -> int:
        """A SHM_PIECE frame at ``start``: its bytes are copied from the peer's ring to
        their place in the open stream's buffer (module docstring, "Same-host pieces")."""
        if length != SHM_PIECE.size:
            raise FramingError(f"SHM_PIECE frame of {length} bytes (it has "
                               f"{SHM_PIECE.size})", "protocol")
        total = PREAMBLE_BYTES + length
        if self._end - start < total:
            if start + total > len(self._scratch):
                self._compact()
            return _MORE
        ring = self.shm
        if ring is None:
            raise FramingError("shared-memory piece on a connection without a ring",
                               "protocol")
        sid, pos, n = SHM_PIECE.unpack_from(self._scratch, start + PREAMBLE_BYTES)
        st = self._stream
        if st is None or st.sid != sid:
            open_ = f" (stream {st.sid} is open)" if st is not None else " (none is open)"
            raise FramingError(f"piece for unknown stream {sid}{open_}", "stream_unknown")
        if st.filled + n > st.length:
            raise FramingError(f"piece of {n} bytes at byte {st.filled} runs past the "
                               f"{st.length} bytes stream {sid} announced", "stream_overrun")
        try:
            src = ring.piece(pos, n)
        except ValueError as e:
            raise FramingError(str(e), "protocol") from None
        at = st.filled - st.base
        st.dest[at:at + n] = src
        del src
        ring.consumed(pos + n)
        st.filled += n
        self._start = start + total
        self.frames += 1
        self.bytes += total
        st.wire_bytes += total + n  # (counted as the bytes it stands for)
        if st.filled == st.length:
            self._finish_stream()
        return _NEXT


#: what a stream frame's handler tells the parse loop: parse the next frame, wait for
#: more bytes in the scratch, or stop (waiting for budget, or for a piece's body)
_NEXT, _MORE, _WAIT = 0, 1, 2
_HEAD = int(FrameType.STREAM_HEAD)
_PIECE = int(FrameType.STREAM_PIECE)
_SHM_PIECE = int(FrameType.SHM_PIECE)
_STREAMABLE = (int(FrameType.MESSAGE), int(FrameType.SEQ_MESSAGE))


class _InStream:
    """A stream being received: the carried frame's type, flags and length, how many of
    its bytes have arrived, its body (what ``on_frame`` gets), ``dest`` (where the body's
    bytes from ``base`` on are written), the budget it holds and its frames' bytes so far."""

    __slots__ = ("sid", "ftype", "flags", "length", "filled", "body", "dest", "base",
                 "reserved", "wire_bytes")

    def __init__(self, sid: int, ftype: int, flags: int, length: int, filled: int,
                 body: Any, dest: memoryview, base: int, reserved: int, wire_bytes: int):
        self.sid = sid
        self.ftype = ftype
        self.flags = flags
        self.length = length
        self.filled = filled
        self.body = body
        self.dest = dest
        self.base = base
        self.reserved = reserved
        self.wire_bytes = wire_bytes


class RejectLog:
    """Counts and logs rejected frames/connections: one log line per rejection, with the peer.

    ``categories`` counts by kind of problem ("wire", "oversize", "bad_magic",
    "truncated", "unknown_frame_type", "bad_flags", "protocol", "auth", ...).
    """

    def __init__(self, node: str, logger: logging.Logger = log):
        self.node = node
        self.logger = logger
        self.categories: Counter[str] = Counter()
        self.total = 0

    def reject(self, peer: str, reason: str, category: str, *,
               level: int = logging.WARNING) -> None:
        self.total += 1
        self.categories[category] += 1
        self.logger.log(level, "%s: rejected %s from %s: %s", self.node, category, peer, reason)


def decode_message(body: Body | memoryview | bytes, peer: str, rejects: RejectLog, *,
                   max_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                   owned: bool = False) -> Message | None:
    """``wire.decode`` a MESSAGE frame body; on :class:`WireError` log, count, return None.

    ``owned``: the body is the caller's fresh :data:`Body`, handed over (the decoded
    arrays may be kept as values without a copy; see ``wire.decode``)."""
    try:
        if isinstance(body, SplitBody):
            return wire.decode(body.head, max_bytes=max_bytes, external=body.tail)
        return wire.decode(body, max_bytes=max_bytes, owned=owned)
    except WireError as e:
        rejects.reject(peer, str(e), "wire")
        return None


def is_known_frame_type(ftype: int) -> bool:
    return ftype in _FRAME_TYPES
