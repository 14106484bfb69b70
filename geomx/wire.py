"""Messages: the one on-the-wire format of geomx, shared by every role and both runtimes.

Why a custom binary format: ps-lite sends a protobuf meta plus raw data frames and never
pickles tensors. We keep that shape without the protobuf
dependency: a fixed little-endian header, a small JSON ``meta`` dict for the rare
free-form fields, payload descriptors (dtype code, shape), then the raw array buffers.
``encode`` returns the array buffers as zero-copy ``memoryview``s so a transport can
``writelines`` them; ``decode`` maps them back with ``np.frombuffer`` (no copy).

A *phantom* payload carries a dtype and a shape but no data. The emulator charges its
``nbytes`` exactly like a real array, so ResNet-50-sized studies need no memory.

``decode`` trusts nothing: every length, code and count is checked and any problem
raises :class:`WireError` with a reason, so a node can log it, drop the frame and keep
serving (the "bad input loses nothing" rule).
"""

from __future__ import annotations

import enum
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Wire protocol version carried in every frame header. Bump on incompatible changes.
WIRE_VERSION = 1
MAGIC = b"GX"
#: Channels >= this are unreliable datagram channels (UDP / dropped in the emulator).
UNRELIABLE_BASE = 8
#: Largest frame accepted by :func:`decode` unless the caller says otherwise.
DEFAULT_MAX_FRAME_BYTES = 1 << 31
#: Bytes charged for a message's header by the network model (see :attr:`Message.nbytes`).
HEADER_ESTIMATE_BYTES = 64
PAYLOAD_DESCRIPTOR_ESTIMATE_BYTES = 16


class WireError(ValueError):
    """A frame that cannot be decoded; the message says why."""


class Kind(enum.IntEnum):
    """Message kinds (u8 on the wire). Grouped as ps-lite groups its commands."""

    # membership (scheduler rendezvous, barriers, liveness)
    REGISTER = 1
    REGISTER_ACK = 2
    BARRIER = 3
    BARRIER_RELEASE = 4
    HEARTBEAT = 5
    HEARTBEAT_ACK = 6
    SHUTDOWN = 7
    NODE_FAILED = 8
    NODE_REJOINED = 9      # a lost worker is back ([membership] on_worker_loss = "continue")
    # control commands (optimizer, codec, sync mode), acknowledged end to end
    COMMAND = 16
    COMMAND_ACK = 17
    # data plane
    INIT = 32
    INIT_ACK = 33
    PUSH = 34
    PUSH_ACK = 35
    PULL = 36
    PULL_REPLY = 37
    ERROR = 38
    # scheduling / sync extensions (ESync state server, TSEngine, NETSTORM)
    STATE_QUERY = 48
    STATE_REPLY = 49
    ASK_PUSH = 50
    ASK_PULL = 51
    SCHED_REPLY = 52
    RELAY = 53
    RELAY_ACK = 54
    PROBE = 55
    PROBE_REPLY = 56
    ROUTE_RELEASE = 57     # NETSTORM: a server reached an iteration boundary (a barrier)
    ROUTE_PLAN = 58        # NETSTORM: the controller's answer: the plan for that iteration
    SPEED_REPORT = 59      # NETSTORM: a server's passive estimate of one incoming link
    # many requests (or replies) to one peer as one message: a list push/pull (ps-lite
    # sends a list of keys to a server as one message too)
    BATCH = 64


#: value -> member (a dict lookup: ``Kind(value)`` costs a call into enum per message)
_KIND_OF = {int(k): k for k in Kind}
_BATCH = Kind.BATCH

# dtype <-> u8 code. bfloat16 travels as its raw uint16 bits (dtype "<u2") with meta.
_DTYPE_CODES: dict[str, int] = {
    "<f2": 1, "<f4": 2, "<f8": 3,
    "|i1": 4, "|u1": 5, "<i2": 6, "<u2": 7, "<i4": 8, "<u4": 9, "<i8": 10, "<u8": 11,
    "|b1": 12,
}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}
_ITEMSIZE = {k: np.dtype(k).itemsize for k in _DTYPE_CODES}


def normalize_dtype(dtype: Any) -> str:
    """Return the canonical little-endian dtype string, or raise WireError if unsupported."""
    if type(dtype) is str:
        known = _NORMALIZED.get(dtype)
        if known is not None:
            return known
        s = _normalize_dtype(dtype)
        if len(_NORMALIZED) < 1024:
            _NORMALIZED[dtype] = s
        return s
    return _normalize_dtype(dtype)


#: dtype strings already normalised (a phantom payload is made per emulated message, and
#: ``np.dtype()`` costs more than the rest of it)
_NORMALIZED: dict[str, str] = {}


def _normalize_dtype(dtype: Any) -> str:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise WireError(f"unsupported dtype {dtype!r}: {e}") from None
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    s = dt.str
    if s not in _DTYPE_CODES:
        raise WireError(f"unsupported dtype {dtype!r}; allowed: {sorted(_DTYPE_CODES)}")
    return s


class Payload:
    """One array on the wire: a dtype, a shape, and the data (or none: a phantom).

    ``owned``: ``data`` is a view of a receive buffer handed over to whoever decoded it
    (see :func:`decode`'s ``owned``), so the first taker may keep and update it in place
    instead of copying (:func:`geomx.node.values.from_payload` with ``take=True``).
    Payloads built from a sender's arrays (the emulator passes them by reference) are
    never owned.
    """

    __slots__ = ("dtype", "shape", "data", "nbytes", "owned")

    def __init__(self, dtype: str, shape: tuple[int, ...], data: np.ndarray | None = None,
                 owned: bool = False):
        self.dtype = dtype
        self.shape = tuple(map(int, shape))
        self.data = data
        self.nbytes = _ITEMSIZE[dtype] * math.prod(self.shape)
        self.owned = owned

    @classmethod
    def of(cls, array: np.ndarray) -> "Payload":
        """Wrap a numpy array (made C-contiguous little-endian if it is not)."""
        a = np.asarray(array)
        s = a.dtype.str
        dt = normalize_dtype(s)  # (a str: normalize_dtype's cache knows it)
        if s != dt or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a, dtype=dt)
        return _checked_payload(dt, a.shape, a, a.nbytes, False)

    @classmethod
    def phantom(cls, shape: tuple[int, ...] | int, dtype: Any = "<f4") -> "Payload":
        """A payload with a size but no memory: the emulator charges ``nbytes`` for it."""
        if isinstance(shape, int):
            shape = (shape,)
        return cls(normalize_dtype(dtype), tuple(shape), None)

    @property
    def is_phantom(self) -> bool:
        return self.data is None

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    def array(self) -> np.ndarray:
        """The data; raises if this is a phantom."""
        if self.data is None:
            raise ValueError("phantom payload has no data")
        return self.data

    def __repr__(self) -> str:
        tag = "phantom" if self.data is None else "data"
        return f"Payload({self.dtype}, {self.shape}, {tag})"


def _checked_payload(dtype: str, shape: tuple[int, ...], data: np.ndarray | None,
                     nbytes: int, owned: bool) -> Payload:
    """A payload whose fields the caller (:func:`decode`, :meth:`Payload.of`) has already
    checked and computed: no second normalisation of the shape, no second product."""
    p = Payload.__new__(Payload)
    p.dtype = dtype
    p.shape = shape
    p.data = data
    p.nbytes = nbytes
    p.owned = owned
    return p


@dataclass(slots=True)
class Message:
    """A message between two nodes. ``nbytes`` is what the network model charges."""

    kind: Kind
    src: str
    dst: str
    key: int = -1
    part: int = 0
    version: int = 0
    request_id: int = 0
    priority: int = 0
    channel: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    payloads: list[Payload] = field(default_factory=list)
    #: ``Kind.BATCH`` only: the messages it carries (same src and dst, none a batch)
    batch: list["Message"] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: a fixed header estimate plus the payloads.

        The header estimate (64 B + 16 B per payload) is close to the real encoded header
        for typical messages; computing the exact JSON length for every emulated message
        would cost more than it is worth.
        """
        n = HEADER_ESTIMATE_BYTES
        if self.batch is not None:
            for m in self.batch:
                n += m.nbytes
        for p in self.payloads:
            n += PAYLOAD_DESCRIPTOR_ESTIMATE_BYTES + p.nbytes
        return n

    @property
    def reliable(self) -> bool:
        return self.channel < UNRELIABLE_BASE

    def reply(self, kind: Kind, **kw: Any) -> "Message":
        """A reply to this message: swapped endpoints, same key/part/request id/channel."""
        if kw.keys() <= _REPLY_FIELDS:  # what servers give (one call per reply: no dicts)
            return self.answer(kind, kw["version"] if "version" in kw else self.version,
                               kw["meta"] if "meta" in kw else {}, kw.get("payloads"))
        base = dict(kind=kind, src=self.dst, dst=self.src, key=self.key, part=self.part,
                    version=self.version, request_id=self.request_id,
                    priority=self.priority, channel=self.channel if self.reliable else 0)
        base.update(kw)
        return Message(**base)

    def answer(self, kind: Kind, version: int, meta: dict[str, Any],
               payloads: list[Payload] | None = None) -> "Message":
        """:meth:`reply` for a server's every-message answers (an acknowledgement, a
        pull's value): the same message, built without keyword arguments (a third of
        the cost: servers build one per push and per pull)."""
        return Message(kind, self.dst, self.src, self.key, self.part, version,
                       self.request_id, self.priority,
                       self.channel if self.channel < UNRELIABLE_BASE else 0, meta,
                       [] if payloads is None else payloads)

    def __repr__(self) -> str:
        return (f"Message({self.kind.name} {self.src}->{self.dst} key={self.key} part={self.part} "
                f"v={self.version} req={self.request_id} ch={self.channel} "
                f"payloads={self.payloads!r} meta={self.meta!r})")


_REPLY_FIELDS = frozenset({"version", "meta", "payloads"})

# Fixed header: magic, version, kind, channel, n_payloads, flags, src_len, dst_len,
# meta_len, key, part, version, request_id, priority.
_HEADER = struct.Struct("<2sBBBBBBHIqiqqi")
_DESC = struct.Struct("<BBB")  # dtype code, ndim, phantom flag
_DIM = struct.Struct("<q")
MAX_NDIM = 8
#: a shape of n dims, packed or read in one call
_DIMS = [struct.Struct(f"<{n}q") for n in range(MAX_NDIM + 1)]
MAX_PAYLOADS = 64
MAX_NAME_BYTES = 255
MAX_META_BYTES = 1 << 20
#: Most messages one BATCH carries.
MAX_BATCH = 1 << 16
_LEN = struct.Struct("<Q")
#: a one-dimensional payload's descriptor and its one dimension, read in one call
_DESC_1D = struct.Struct("<BBBq")
#: a frame's name bytes (source then destination) -> (source length, source, destination)
_NAMES_OF: dict[bytes, tuple[int, str, str]] = {}


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"meta value of type {type(o).__name__} is not JSON-able")


#: node name -> its UTF-8 bytes (checked for length once)
_NAME_BYTES: dict[str, bytes] = {}


def encode(msg: Message) -> list[bytes | memoryview]:
    """Encode ``msg`` as frames: one header ``bytes`` then one zero-copy view per data payload.

    The concatenation of the frames is the message; a stream transport prefixes it with
    its total length (see :func:`frame_length`).
    """
    src = _NAME_BYTES.get(msg.src)
    dst = _NAME_BYTES.get(msg.dst)
    if src is None or dst is None:
        src = msg.src.encode()
        dst = msg.dst.encode()
        if len(src) > MAX_NAME_BYTES or len(dst) > MAX_NAME_BYTES:
            raise WireError("node name longer than 255 bytes")
        if len(_NAME_BYTES) < 4096:  # (a job has few names; strangers must not grow it)
            _NAME_BYTES[msg.src] = src
            _NAME_BYTES[msg.dst] = dst
    if msg.kind == _BATCH:
        return _encode_batch(msg, src, dst)
    payloads = msg.payloads
    if not msg.meta and len(payloads) == 1:
        p = payloads[0]
        data = p.data
        if data is not None and len(p.shape) == 1:
            # the common message (a push, a pull reply): one 1-D array, no meta
            head = _HEADER.pack(MAGIC, WIRE_VERSION, msg.kind, msg.channel, 1, 0, len(src),
                                len(dst), 0, msg.key, msg.part, msg.version, msg.request_id,
                                msg.priority) + src + dst + _DESC_1D.pack(
                                    _DTYPE_CODES[p.dtype], 1, 0, p.shape[0])
            return [head, memoryview(data).cast("B")] if p.nbytes else [head]
    meta = json.dumps(msg.meta, separators=(",", ":"), sort_keys=True,
                      default=_json_default).encode() if msg.meta else b""
    if len(msg.payloads) > MAX_PAYLOADS:
        raise WireError(f"too many payloads ({len(msg.payloads)} > {MAX_PAYLOADS})")
    parts: list[bytes] = [
        _HEADER.pack(MAGIC, WIRE_VERSION, int(msg.kind), msg.channel, len(msg.payloads), 0,
                     len(src), len(dst), len(meta), msg.key, msg.part, msg.version,
                     msg.request_id, msg.priority),
        src, dst, meta,
    ]
    buffers: list[memoryview] = []
    for p in msg.payloads:
        if len(p.shape) > MAX_NDIM:
            raise WireError(f"payload has {len(p.shape)} dims > {MAX_NDIM}")
        parts.append(_DESC.pack(_DTYPE_CODES[p.dtype], len(p.shape), 1 if p.data is None else 0))
        parts.append(_DIMS[len(p.shape)].pack(*p.shape))
        if p.data is not None and p.nbytes:
            buffers.append(memoryview(p.data).cast("B"))
    return [b"".join(parts), *buffers]


def _encode_batch(msg: Message, src: bytes, dst: bytes) -> list[bytes | memoryview]:
    """A BATCH: the header (``key`` = how many), the names, then each message as its
    8-byte length and its own encoding (array data stays zero-copy views)."""
    subs = msg.batch or []
    if not 0 < len(subs) <= MAX_BATCH:
        raise WireError(f"a batch carries 1..{MAX_BATCH} messages, got {len(subs)}")
    head = [_HEADER.pack(MAGIC, WIRE_VERSION, int(Kind.BATCH), msg.channel, 0, 0, len(src),
                         len(dst), 0, len(subs), 0, 0, 0, msg.priority), src, dst]
    out: list[bytes | memoryview] = []
    for m in subs:
        if m.kind == Kind.BATCH or m.src != msg.src or m.dst != msg.dst:
            raise WireError("a batch carries non-batch messages between its own src and dst")
        frames = encode(m)
        head.append(_LEN.pack(frame_length(frames)))
        head.append(frames[0])
        if len(frames) > 1:
            out.append(b"".join(head))
            head = []
            out.extend(frames[1:])
    if head:
        out.append(b"".join(head))
    return out


def frame_length(frames: list[bytes | memoryview]) -> int:
    """Total byte length of encoded frames (a loop, not ``sum`` over a generator: it runs
    for every message, and for every message of a batch)."""
    n = 0
    for f in frames:
        n += len(f) if isinstance(f, bytes) else f.nbytes
    return n


def encode_bytes(msg: Message) -> bytes:
    """Encode to one contiguous ``bytes`` (copies; for datagrams and tests)."""
    return b"".join(bytes(f) if isinstance(f, memoryview) else f for f in encode(msg))


def peek_single_payload(buf: bytes | bytearray | memoryview) -> tuple[int, int, int, str,
                                                                      int] | None:
    """``(kind, request_id, data_offset, dtype, nbytes)`` of a message that carries exactly
    one real payload, its data last, and no meta; None for any other message or when
    ``buf`` (the first bytes of an encoded message) ends before the payload's data starts.

    A transport uses it to receive such a payload straight into a buffer the receiver
    named in advance (a pull into the caller's ``out``); :func:`decode` with
    ``external`` then checks everything as usual."""
    mv = memoryview(buf).cast("B")
    if mv.nbytes < _HEADER.size:
        return None
    (magic, version, kind, _channel, n_payloads, _flags, src_len, dst_len, meta_len,
     _key, _part, _ver, request_id, _priority) = _HEADER.unpack_from(mv, 0)
    if magic != MAGIC or version != WIRE_VERSION or n_payloads != 1 or meta_len \
            or kind == Kind.BATCH:
        return None
    off = _HEADER.size + src_len + dst_len
    if off + _DESC.size > mv.nbytes:
        return None
    code, ndim, phantom = _DESC.unpack_from(mv, off)
    off += _DESC.size
    if code not in _CODE_DTYPES or phantom or ndim > MAX_NDIM or off + 8 * ndim > mv.nbytes:
        return None
    shape = struct.unpack_from(f"<{ndim}q", mv, off)
    if any(d < 0 for d in shape):
        return None
    dt = _CODE_DTYPES[code]
    return kind, request_id, off + 8 * ndim, dt, _ITEMSIZE[dt] * math.prod(shape)


def decode(buf: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_FRAME_BYTES,
           copy: bool = False, owned: bool = False,
           external: np.ndarray | None = None) -> Message:
    """Decode one message; raise :class:`WireError` naming what is wrong.

    With ``copy=False`` payload arrays are views into ``buf`` (zero copy); the caller
    must keep ``buf`` alive and not mutate it. ``copy=True`` gives owned, writable
    arrays. ``owned=True`` says ``buf`` is a writable buffer handed over for good (a
    transport's fresh receive buffer): its views are marked :attr:`Payload.owned`, so
    a server may keep one as its value without a copy. ``external``: the message's last
    payload was received straight into this array (see :func:`peek_single_payload`);
    ``buf`` holds the rest, and the payload is a view of ``external`` (owned: the
    receiver named that buffer for this message).

    The frame is read in the order of its layout: header, names, meta, then either a
    batch's messages, the one 1-D payload of the common message, or the payload
    descriptors followed by the payloads' bytes.
    """
    mv = memoryview(buf).cast("B")
    n = mv.nbytes
    if external is not None and n + external.nbytes > max_bytes:
        raise WireError(f"frame of {n + external.nbytes} bytes exceeds the limit of {max_bytes}")
    if n > max_bytes:
        raise WireError(f"frame of {n} bytes exceeds the limit of {max_bytes}")
    if n < _HEADER.size:
        raise WireError(f"truncated frame: {n} bytes, header needs {_HEADER.size}")
    (magic, version, kind, channel, n_payloads, _flags, src_len, dst_len, meta_len,
     key, part, ver, request_id, priority) = _HEADER.unpack_from(mv, 0)
    kind_ = _checked_kind(magic, version, kind, n_payloads, meta_len)
    off = _HEADER.size
    end = off + src_len + dst_len + meta_len
    if end > n:
        raise WireError("truncated frame: names/meta run past the end")
    src, dst = _decode_names(mv[off:off + src_len + dst_len].tobytes(), src_len)
    meta: dict[str, Any] = _decode_meta(mv[off + src_len + dst_len:end]) if meta_len else {}
    off = end
    if kind_ is _BATCH:
        return _decode_batch(mv, off, key, src, dst, channel, priority, meta_len, n_payloads,
                             max_bytes, copy, owned)
    if n_payloads == 1 and external is None and off + _DESC_1D.size <= n:
        single = _decode_single_1d(mv, off, copy, owned)
        if single is not None:
            return Message(kind_, src, dst, key, part, ver, request_id, priority, channel,
                           meta, [single])
    descs, off = _decode_descriptors(mv, off, n_payloads)
    payloads = _decode_payloads(mv, off, descs, copy, owned, external)
    return Message(kind_, src, dst, key, part, ver, request_id, priority, channel, meta,
                   payloads)


def _checked_kind(magic: bytes, version: int, kind: int, n_payloads: int,
                  meta_len: int) -> Kind:
    """The header's message kind, once its magic, version and counts are valid."""
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}")
    if version != WIRE_VERSION:
        raise WireError(f"unsupported wire version {version} (this node speaks {WIRE_VERSION})")
    kind_ = _KIND_OF.get(kind)
    if kind_ is None:
        raise WireError(f"unknown message kind {kind}")
    if n_payloads > MAX_PAYLOADS:
        raise WireError(f"too many payloads: {n_payloads}")
    if meta_len > MAX_META_BYTES:
        raise WireError(f"meta of {meta_len} bytes exceeds {MAX_META_BYTES}")
    return kind_


def _decode_names(names: bytes, src_len: int) -> tuple[str, str]:
    """``(src, dst)`` from the names' bytes, remembered for the next frame of the pair."""
    known = _NAMES_OF.get(names)
    if known is not None and known[0] == src_len:
        return known[1], known[2]
    try:
        src = str(names[:src_len], "utf-8")
        dst = str(names[src_len:], "utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"node name is not UTF-8: {e}") from None
    if len(_NAMES_OF) < 4096 and len(names) <= 128:
        # (a job has few name pairs, all short; strangers must not grow it: ~1 MB at most)
        _NAMES_OF[names] = (src_len, src, dst)
    return src, dst


def _decode_meta(raw: memoryview) -> dict[str, Any]:
    try:
        meta = json.loads(bytes(raw))
    except (ValueError, RecursionError) as e:
        raise WireError(f"meta is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise WireError("meta must be a JSON object")
    return meta


def _decode_single_1d(mv: memoryview, off: int, copy: bool, owned: bool) -> Payload | None:
    """The common message's payload (a push, a pull reply: one 1-D array), read with one
    unpack; None when the one payload is of another form (the general path reads it)."""
    n = mv.nbytes
    code, ndim, phantom, dim = _DESC_1D.unpack_from(mv, off)
    dt = _CODE_DTYPES.get(code)
    if ndim != 1 or dt is None or dim < 0 or phantom:
        return None
    off += _DESC_1D.size
    size = _ITEMSIZE[dt] * dim
    if size > n - off:
        raise WireError(f"truncated frame: payload 0 needs {size} bytes, {n - off} left")
    if size < n - off:
        raise WireError(f"{n - off - size} trailing bytes after the last payload")
    arr = np.frombuffer(mv[off:], dtype=dt)
    if copy:
        arr = arr.copy()
    return _checked_payload(dt, (dim,), arr, size, copy or (owned and not mv.readonly))


def _decode_descriptors(mv: memoryview, off: int, n_payloads: int
                        ) -> tuple[list[tuple[str, tuple[int, ...], bool]], int]:
    """Every payload's ``(dtype, shape, phantom)``, and the offset of the first's bytes."""
    n = mv.nbytes
    descs: list[tuple[str, tuple[int, ...], bool]] = []
    for i in range(n_payloads):
        if off + _DESC.size > n:
            raise WireError(f"truncated frame: payload descriptor {i}")
        code, ndim, phantom = _DESC.unpack_from(mv, off)
        off += _DESC.size
        if code not in _CODE_DTYPES:
            raise WireError(f"payload {i}: unknown dtype code {code}")
        if ndim > MAX_NDIM:
            raise WireError(f"payload {i}: {ndim} dims > {MAX_NDIM}")
        if phantom not in (0, 1):
            raise WireError(f"payload {i}: bad phantom flag {phantom}")
        if off + 8 * ndim > n:
            raise WireError(f"truncated frame: payload {i} shape")
        shape = _DIMS[ndim].unpack_from(mv, off)
        off += 8 * ndim
        if shape and min(shape) < 0:
            raise WireError(f"payload {i}: negative dimension in {shape}")
        descs.append((_CODE_DTYPES[code], shape, bool(phantom)))
    return descs, off


def _decode_payloads(mv: memoryview, off: int,
                     descs: list[tuple[str, tuple[int, ...], bool]], copy: bool, owned: bool,
                     external: np.ndarray | None) -> list[Payload]:
    """The payloads ``descs`` describe, from their bytes at ``off`` on (the last one from
    ``external`` when it was received there); the frame must end with them."""
    n = mv.nbytes
    payloads: list[Payload] = []
    # arrays over ``buf`` are writable exactly when it is (asked once, not per array)
    keep = (copy or owned) and not mv.readonly
    for i, (dt, shape, phantom) in enumerate(descs):
        if phantom:
            payloads.append(Payload(dt, shape, None))
            continue
        size = _ITEMSIZE[dt] * math.prod(shape)
        if external is not None and i == len(descs) - 1 and off == n:
            if size != external.nbytes:
                raise WireError(f"payload {i} has {size} bytes, its buffer {external.nbytes}")
            arr = np.frombuffer(memoryview(external).cast("B"), dtype=dt).reshape(shape)
            # the receiver's own buffer, named for this reply: its to keep
            payloads.append(Payload(dt, shape, arr.copy() if copy else arr,
                                    owned=arr.flags.writeable))
            external = None
            continue
        if size > n - off:
            raise WireError(f"truncated frame: payload {i} needs {size} bytes, {n - off} left")
        arr = np.frombuffer(mv[off:off + size], dtype=dt)
        if len(shape) != 1:
            arr = arr.reshape(shape)
        if copy:
            arr = arr.copy()
        payloads.append(_checked_payload(dt, shape, arr, size, copy or keep))
        off += size
    if off != n:
        raise WireError(f"{n - off} trailing bytes after the last payload")
    if external is not None:
        raise WireError("the message has no payload for its separately received data")
    return payloads


def _decode_batch(mv: memoryview, off: int, count: int, src: str, dst: str, channel: int,
                  priority: int, meta_len: int, n_payloads: int, max_bytes: int,
                  copy: bool, owned: bool) -> Message:
    n = mv.nbytes
    if meta_len or n_payloads:
        raise WireError("a batch has no meta and no payloads of its own")
    if not 0 < count <= MAX_BATCH:
        raise WireError(f"a batch carries 1..{MAX_BATCH} messages, got {count}")
    subs: list[Message] = []
    for i in range(count):
        if off + _LEN.size > n:
            raise WireError(f"truncated batch: length of message {i}")
        (length,) = _LEN.unpack_from(mv, off)
        off += _LEN.size
        if length > n - off:
            raise WireError(f"truncated batch: message {i} needs {length} bytes, {n - off} left")
        try:
            m = decode(mv[off:off + length], max_bytes=max_bytes, copy=copy, owned=owned)
        except WireError as e:
            raise WireError(f"batch message {i}: {e}") from None
        if m.kind == Kind.BATCH or m.src != src or m.dst != dst:
            raise WireError(f"batch message {i}: a nested batch or another src/dst")
        subs.append(m)
        off += length
    if off != n:
        raise WireError(f"{n - off} trailing bytes after the last batch message")
    return Message(Kind.BATCH, src, dst, channel=channel, priority=priority, batch=subs)
