"""Shared-memory rings: how a large value crosses between two nodes on one host without
going through the kernel's TCP stack.

Why: on loopback a TCP transfer copies every byte twice (sender -> kernel -> receiver)
and pays the stack's per-segment work on top; on the 2 shared cores this project is
measured on, 100 MB cost about 36 ms that way against 8-10 ms for one ``memcpy``
(docs/torch.md, "Same-host transfers"). A parameter server moves each value through one
process twice per round (push in, pull out), so its loopback traffic is CPU-bound and
twice a ring allreduce's. A ring halves the copies' cost: the sender copies a piece of
the value into shared memory, the receiver copies it out into the buffer the TCP stream
would have filled, and only a 24-byte reference crosses the socket.

What a ring is: one ``memfd`` per outgoing TCP connection that carries large messages,
created and owned by the *sending* node (:class:`SendRing`): a 4 KiB header (magic, a
random token, the data size) and ``ring_bytes`` of data, sealed against shrinking or
growing. It is made when the connection's writer first has a message of
:data:`RING_MIN_MESSAGE_BYTES` or more (:func:`geomx.runtime.shm_stream.ask_for_ring`),
never when the connection opens, so a connection that only carries small messages (a
scheduler's, a heartbeat's) costs neither side a ring. A SHM_OFFER frame on the open,
authenticated connection offers it (:meth:`SendRing.offer`: this host's identity, the
sender's pid and fd, the size, the token); the receiving node opens it read-only
through ``/proc/<pid>/fd/<fd>`` (:class:`RecvRing`), checks the seals, the size and
the token, maps it, closes the fd it opened and says yes in a SHM_ANSWER frame; the
sender then closes its own fd (:meth:`SendRing.attached`), which it kept only for the
receiver to open the ring by. Nothing
is ever named in ``/dev/shm``: the memory is freed by the kernel when the sender's
mapping and the receiver's are both gone, whichever way the processes end, ``kill -9``
included.

How it is used (the framing is :mod:`geomx.runtime.framing`'s, the writing
:mod:`geomx.runtime.shm_stream`'s): a large message still travels as a stream (a
STREAM_HEAD frame with its wire header), but each piece is copied into the ring and
announced by a SHM_PIECE frame (stream id, ring position, length); the receiver copies
it into its place in the stream's destination buffer and answers SHM_FREED (the
position up to which the ring may be written again). Positions count bytes from the
ring's start, never wrapping; a piece never straddles the ring's end (the sender skips
to the start). A ring is full when the unfreed bytes would exceed its size; the sender
then waits for a SHM_FREED.

When a ring is not used: the peer is on another host, in another network or pid
namespace (the kernel-shaped mode puts each DC's nodes in their own network namespace,
and their traffic must cross the shaped link), runs as another user, or cannot open
the sender's fd; the sender's traffic to the peer is shaped in userspace; the receiver's
budget of mapped ring bytes (:class:`RingBudget`) is spent; ``[real] shm = false``. Then
the connection carries its messages as before.

What a stranger can make a node hold: a receiver maps rings only for authenticated
(or, without a secret, handshaken) connections, one per connection at most, at most
``max_mapped_bytes`` and :func:`default_max_rings` rings over all of them
(:class:`RingBudget`), and each ring is the sender's memory; the bytes a piece is
copied into are the same receive buffer, within the same budget, as a TCP stream's.
File descriptors: from Python 3.13 a mapped ring holds none (``mmap(trackfd=False)``);
before, ``mmap`` keeps a duplicate of the fd it mapped, so a ring holds one on each
side -- and the count bound keeps the receiver's within a quarter of its fd limit.
"""

from __future__ import annotations

import asyncio
import fcntl
import mmap
import os
import resource
import secrets
import struct
import sys
from typing import Any

__all__ = ["SendRing", "RecvRing", "RingBudget", "RingRefused", "host_identity",
           "DEFAULT_RING_BYTES", "DEFAULT_MAX_MAPPED_BYTES", "MIN_RING_BYTES",
           "RING_MIN_MESSAGE_BYTES", "default_max_rings"]

#: Data bytes of one ring: eight 4 MiB pieces in flight, enough for the copy into the
#: ring and the copy out of it to overlap on two cores.
DEFAULT_RING_BYTES = 32 << 20
#: The smallest ring a transport makes or maps (a piece of 64 KiB at least).
MIN_RING_BYTES = 64 << 10
#: Ring bytes a receiver maps over all its incoming connections at once: 512 default
#: rings. Only connections that carry large messages offer one; this counts address
#: space, not memory: a page of a ring is the sender's, and only the pages a value
#: passed through are ever touched.
DEFAULT_MAX_MAPPED_BYTES = 16 << 30
#: Messages shorter than this take the socket even where a ring is open: below it the
#: two extra frames cost about what the kernel's copies do.
RING_MIN_MESSAGE_BYTES = 1 << 20
#: The largest piece a ring carries (:attr:`SendRing.piece_bytes`).
PIECE_BYTES = 4 << 20
#: The header in front of a ring's data (one page, so the data is page aligned).
HEADER_BYTES = 4096
_MAGIC = b"GXSHMR01"
_TOKEN_BYTES = 16
#: magic, token, data bytes
_HEADER = struct.Struct(f"<8s{_TOKEN_BYTES}sQ")
#: the seals a ring carries (Linux only: elsewhere no ring is made or mapped)
_SEALS = (getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0)
          | getattr(fcntl, "F_SEAL_SEAL", 0))
#: mmap keeps no duplicate of the fd it maps (Python 3.13 on; the rings never resize)
_MMAP_NO_FD = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def default_max_rings() -> int:
    """Rings a receiver maps at once unless told otherwise: a quarter of its soft limit
    on open files (each ring may hold one, module docstring), at least 1, at most 4096."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        soft = 1024
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 14
    return max(1, min(4096, soft // 4))


class RingRefused(Exception):
    """A ring offer this node does not take (the reason is logged, the peer told no)."""


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def host_identity() -> str:
    """What two processes must share to use a ring: the boot (so the host), the network
    namespace (so their TCP traffic would not cross a shaped veth link), the pid
    namespace (so a pid means the same process) and the user."""
    parts = [_read("/proc/sys/kernel/random/boot_id")]
    for ns in ("net", "pid"):
        try:
            parts.append(str(os.stat(f"/proc/self/ns/{ns}").st_ino))
        except OSError:
            parts.append("?")
    parts.append(str(os.getuid()))
    return "/".join(parts)


class SendRing:
    """The sending side's ring (module docstring): ``alloc``/``reserve`` a piece's
    place, write it through ``data``, and ``freed`` when the receiver says so."""

    __slots__ = ("size", "piece_bytes", "data", "token", "_fd", "_map", "_head", "_tail",
                 "_waiter", "_closed", "pieces", "bytes")

    def __init__(self, ring_bytes: int = DEFAULT_RING_BYTES):
        if ring_bytes < MIN_RING_BYTES:
            raise ValueError(f"ring_bytes must be >= {MIN_RING_BYTES}, got {ring_bytes}")
        if not _SEALS or not hasattr(os, "memfd_create"):
            raise OSError("this system has no sealed memfd (Linux only)")
        self.size = int(ring_bytes)
        #: the pieces a stream is cut into: an eighth of the ring (so the copies in and
        #: out overlap), at most 4 MiB (a piece in flight costs a wake-up, not a copy)
        self.piece_bytes = min(PIECE_BYTES, self.size // 8)
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        fd = os.memfd_create("geomx-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, HEADER_BYTES + self.size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            self._map = mmap.mmap(fd, HEADER_BYTES + self.size, **_MMAP_NO_FD)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _HEADER.pack_into(self._map, 0, _MAGIC, self.token, self.size)
        self.data = memoryview(self._map)[HEADER_BYTES:]
        self._head = 0  # bytes handed out so far (positions never wrap)
        self._tail = 0  # bytes the receiver has freed
        self._waiter: asyncio.Future | None = None
        self._closed: BaseException | None = None
        self.pieces = 0
        self.bytes = 0

    def offer(self) -> dict[str, Any]:
        """The SHM_OFFER frame's word on this ring: where the receiver finds it and how
        it knows it."""
        return {"host": host_identity(), "pid": os.getpid(), "fd": self._fd,
                "bytes": self.size, "token": self.token.hex()}

    def attached(self) -> None:
        """Close the fd the receiver opens the ring by, once the receiver has mapped it
        (the two mappings keep the memory)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def alloc(self, nbytes: int) -> int | None:
        """The position of ``nbytes`` contiguous free bytes (taken), or None if full."""
        if self._closed is not None:
            raise ConnectionError(f"shared-memory ring closed: {self._closed}")
        if not 0 < nbytes <= self.size:
            raise ValueError(f"a ring piece is 1..{self.size} bytes, got {nbytes}")
        pos = self._head
        off = pos % self.size
        if off + nbytes > self.size:
            pos += self.size - off  # never straddle the end: skip to the start
        if pos + nbytes - self._tail > self.size:
            return None
        self._head = pos + nbytes
        self.pieces += 1
        self.bytes += nbytes
        return pos

    async def reserve(self, nbytes: int) -> int:
        """:meth:`alloc`, waiting for the receiver to free room (ConnectionError if the
        connection closes meanwhile)."""
        while True:
            pos = self.alloc(nbytes)
            if pos is not None:
                return pos
            fut = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await fut
            finally:
                self._waiter = None

    def freed(self, pos: int) -> None:
        """The receiver has copied everything before ``pos`` out (a SHM_FREED frame);
        ValueError if ``pos`` is not a position the ring has handed out."""
        if not self._tail <= pos <= self._head:
            raise ValueError(f"shared-memory ring freed up to {pos}, outside "
                             f"{self._tail}..{self._head}")
        self._tail = pos
        fut = self._waiter
        if fut is not None and not fut.done():
            fut.set_result(None)

    def close(self, why: BaseException | None = None) -> None:
        """Unmap (a receiver's mapping keeps the memory until it unmaps too)."""
        if self._closed is not None:
            return
        self._closed = why or ConnectionError("connection closed")
        fut = self._waiter
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionError(f"shared-memory ring closed: {self._closed}"))
        self.attached()
        _unmap(self.data, self._map)


class RingBudget:
    """Ring bytes and rings a receiver has mapped, over its incoming connections (module
    docstring): at most ``limit_bytes`` and ``limit_rings`` (default
    :func:`default_max_rings`)."""

    __slots__ = ("limit_bytes", "used_bytes", "limit_rings", "rings")

    def __init__(self, limit_bytes: int = DEFAULT_MAX_MAPPED_BYTES,
                 limit_rings: int | None = None):
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.limit_rings = default_max_rings() if limit_rings is None else limit_rings
        self.rings = 0

    def take(self, nbytes: int) -> bool:
        if self.used_bytes + nbytes > self.limit_bytes or self.rings >= self.limit_rings:
            return False
        self.used_bytes += nbytes
        self.rings += 1
        return True

    def give(self, nbytes: int) -> None:
        self.used_bytes -= nbytes
        self.rings -= 1


class RecvRing:
    """The receiving side's read-only mapping of a peer's ring.

    ``RecvRing(offer, budget)`` opens and checks it, or raises :class:`RingRefused`;
    ``piece(pos, n)`` is the ring's bytes of a SHM_PIECE frame, checked to be within the
    ring and past the bytes already freed; ``consumed(pos)`` records that they were
    copied out, and ``take_unreported()`` the position to answer in a SHM_FREED frame.
    """

    __slots__ = ("size", "data", "_map", "_budget", "_consumed", "_reported", "pieces")

    def __init__(self, offer: Any, budget: RingBudget):
        if not isinstance(offer, dict):
            raise RingRefused("the ring offer is not an object")
        host, pid, fd, size, token = (offer.get(k) for k in
                                      ("host", "pid", "fd", "bytes", "token"))
        if host != host_identity():
            raise RingRefused("the peer is on another host, or in another namespace or "
                              "user")
        for label, v in (("pid", pid), ("fd", fd), ("bytes", size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise RingRefused(f"bad ring field {label}={v!r}")
        if size < MIN_RING_BYTES:
            raise RingRefused(f"a ring of {size} bytes (the least is {MIN_RING_BYTES})")
        try:
            token_b = bytes.fromhex(token) if isinstance(token, str) else b""
        except ValueError:
            token_b = b""
        if len(token_b) != _TOKEN_BYTES:
            raise RingRefused("bad ring token")
        if not budget.take(size):
            raise RingRefused(f"{budget.rings} rings of {budget.used_bytes} bytes mapped "
                              f"already (limits {budget.limit_rings} rings, "
                              f"{budget.limit_bytes} bytes)")
        try:
            self._map = _open_ring(pid, fd, size, token_b)
        except BaseException:
            budget.give(size)
            raise
        self.size = size
        self._budget = budget
        self.data = memoryview(self._map)[HEADER_BYTES:]
        self._consumed = 0
        self._reported = 0
        self.pieces = 0

    def piece(self, pos: int, nbytes: int) -> memoryview:
        """The ``nbytes`` at ring position ``pos`` (ValueError if the sender's frame
        points outside the ring or back before what was freed)."""
        off = pos % self.size
        if nbytes <= 0 or off + nbytes > self.size or pos < self._consumed:
            raise ValueError(f"shared-memory piece of {nbytes} bytes at position {pos} "
                             f"(ring of {self.size} bytes, freed up to {self._consumed})")
        return self.data[off:off + nbytes]

    def consumed(self, end: int) -> None:
        self._consumed = end
        self.pieces += 1

    def take_unreported(self) -> int | None:
        """The position to report in a SHM_FREED frame, if it moved since the last."""
        if self._consumed == self._reported:
            return None
        self._reported = self._consumed
        return self._consumed

    def close(self) -> None:
        if self._budget is None:
            return
        self._budget.give(self.size)
        self._budget = None  # type: ignore[assignment]
        _unmap(self.data, self._map)


def _unmap(data: memoryview, m: mmap.mmap) -> None:
    """Unmap now, or -- while a view of the ring is still alive somewhere (a frame being
    handled when the connection closed) -- when the last one is dropped."""
    data.release()
    try:
        m.close()
    except BufferError:
        pass  # the mmap object unmaps when it is collected


def _open_ring(pid: int, fd: int, size: int, token: bytes) -> mmap.mmap:
    """Map the peer's ring read-only, after checking it is one (RingRefused otherwise)."""
    if not _SEALS:
        raise RingRefused("this system has no sealed memfd (Linux only)")
    try:
        ours = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise RingRefused(f"cannot open the peer's ring ({e.strerror})") from None
    try:
        try:
            seals = fcntl.fcntl(ours, fcntl.F_GET_SEALS)
        except OSError:
            raise RingRefused("the peer's fd is not a sealed memfd") from None
        if seals & _SEALS != _SEALS:
            raise RingRefused("the peer's ring is not sealed against resizing")
        if os.fstat(ours).st_size != HEADER_BYTES + size:
            raise RingRefused("the peer's ring is not of the announced size")
        m = mmap.mmap(ours, HEADER_BYTES + size, prot=mmap.PROT_READ, **_MMAP_NO_FD)
    finally:
        os.close(ours)
    magic, tok, n = _HEADER.unpack_from(m, 0)
    if magic != _MAGIC or tok != token or n != size:
        m.close()
        raise RingRefused("the peer's fd is not the ring it announced")
    return m
