"""Receive buffers for large frames, reused once nobody holds them any more.

Why: a 100 MB frame read into a freshly allocated buffer pays a page fault for every
4 KiB page the socket writes into (and the kernel zero-fills each page first). On the
shared 2-core machine this sandbox runs on that costs more than the copy itself (about
0.3-0.6 s per 100 MB, against 15 ms for copying into memory already mapped); ps-lite
avoids it the same way, by reusing its receive buffers. A server that stores what it is
pushed keeps the received buffer as its value (``wire.decode(owned=True)``) and drops
it when the next push replaces it, so a parameter round needs two buffers per key that
alternate, not a new one each time.

A buffer is *free* when the pool's own reference is the only one left: every numpy view
of a decoded payload, every ``memoryview`` the transport or a reply holds, keeps a
reference to it (numpy views through their ``base``, memoryviews through the exporter),
so CPython's reference count says exactly whether anything can still read or write it.

Frames of one key differ by a few bytes (an INIT and a PUSH carry different headers, a
PUSH's meta grows with its round number), so buffers are allocated in whole
:data:`GRANULE_BYTES` and a frame takes a free buffer of its rounded-up size, as a view
of exactly its length: the view keeps the buffer referenced, so it is not free while the
view or anything decoded from it lives.

The pool holds at most ``max_bytes`` of buffers (those in use included: it forgets a
buffer rather than go over, and the buffer is freed as usual when its last user lets go),
so an idle node keeps at most that much memory beyond what it uses.
"""

from __future__ import annotations

import sys

import numpy as np

#: Buffers below this size are not pooled (their page faults are few; a fresh one is cheap).
MIN_POOLED_BYTES = 1 << 20
#: Default bound on the bytes of buffers the pool keeps.
DEFAULT_POOL_BYTES = 512 << 20
#: Pooled buffers are allocated in multiples of this (frames of one key share them).
GRANULE_BYTES = 64 << 10

# references to a free pooled buffer seen by sys.getrefcount inside take(): the pool's
# list, the loop variable, and getrefcount's own argument
_FREE_REFS = 3


class RecvBufferPool:
    """``take(nbytes)``: an uninitialised ``uint8`` buffer of exactly ``nbytes``, (a view
    of) a free pooled one when there is one of that size rounded up to
    ``granule_bytes`` (see the module docstring)."""

    __slots__ = ("max_bytes", "min_bytes", "granule_bytes", "_bufs", "_held", "reused",
                 "allocated")

    def __init__(self, max_bytes: int = DEFAULT_POOL_BYTES,
                 min_bytes: int = MIN_POOLED_BYTES, granule_bytes: int = GRANULE_BYTES):
        if max_bytes < 0 or min_bytes < 1 or granule_bytes < 1:
            raise ValueError(f"max_bytes must be >= 0, min_bytes and granule_bytes >= 1, got "
                             f"{max_bytes}, {min_bytes}, {granule_bytes}")
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self.granule_bytes = granule_bytes
        self._bufs: list[np.ndarray] = []
        self._held = 0
        self.reused = 0
        self.allocated = 0

    @property
    def held_bytes(self) -> int:
        return self._held

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes < self.min_bytes:
            return np.empty(nbytes, dtype=np.uint8)
        size = -(-nbytes // self.granule_bytes) * self.granule_bytes
        spare = -1
        bufs = self._bufs
        for i in range(len(bufs)):
            b = bufs[i]  # (no enumerate: its tuple would hold one more reference)
            if sys.getrefcount(b) == _FREE_REFS:
                if b.nbytes == size:
                    self.reused += 1
                    return b if size == nbytes else b[:nbytes]
                spare = i
        if spare >= 0 and self._held + size > self.max_bytes:
            # make room by forgetting a free buffer of another size
            self._held -= self._bufs.pop(spare).nbytes
        self.allocated += 1
        if self._held + size > self.max_bytes:
            return np.empty(nbytes, dtype=np.uint8)  # not kept: no rounding up
        buf = np.empty(size, dtype=np.uint8)
        self._bufs.append(buf)
        self._held += size
        return buf if size == nbytes else buf[:nbytes]

    def clear(self) -> None:
        """Forget every buffer (those still in use stay alive with their users)."""
        self._bufs.clear()
        self._held = 0
