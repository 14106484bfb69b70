"""The snapshot a push sends, in a buffer reused from the key's previous push.

``kv.push(key, value)`` reads ``value`` now (MXNet's engine orders a later write after
the push has read it), so the worker sends a copy -- the one copy of a push. A fresh
100 MB copy pays a page fault per 4 KiB page it touches (more than the copy itself on
the shared machine, see :mod:`geomx.runtime.recv_pool`); once the previous push of the
key has been sent and acknowledged nothing references its snapshot any more, and the
new one is copied into it.

"Nothing references it" is CPython's reference count: a queued frame, the resend
window of :mod:`geomx.runtime.tcp_resume` and an emulated in-flight message all hold
views or the array itself. Snapshots are handed out frozen (read-only,
:func:`geomx.node.values.freeze`), so the link codec sends them without a second copy.

The copy has to be finished when ``push`` returns (the caller may overwrite its array at
once), so nothing can be sent while it runs: it is the one step of a large push that
keeps the worker alone busy (10 ms per 100 MB here). A large copy is therefore cut into
:data:`COPY_PIECE_BYTES` pieces that the calling thread and up to
:data:`COPY_HELPERS` helper threads take in turn (numpy releases the GIL while it
copies): on two idle cores it takes half as long, and on busy ones no longer than
alone, since the caller waits for a helper only to finish a piece it has started.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Hashable

import numpy as np

from geomx.node.values import freeze

#: Values below this size get a fresh copy each push (reuse saves little on them).
MIN_REUSED_BYTES = 1 << 20

# references to an unused snapshot seen by sys.getrefcount in take(): the dict, the
# local name, and getrefcount's argument
_FREE_REFS = 3

#: Copies of at least this many bytes are shared with helper threads ...
PARALLEL_COPY_BYTES = 16 << 20
#: ... in pieces of this size, taken in turn by the caller and the helpers.
COPY_PIECE_BYTES = 4 << 20
#: Helper threads (besides the caller): one per further core, at most 3.
COPY_HELPERS = min(3, (os.cpu_count() or 1) - 1)

_helpers: ThreadPoolExecutor | None = None


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)`` for arrays of one shape and dtype, a large C-contiguous
    one in pieces shared with helper threads (see the module docstring)."""
    global _helpers
    n = dst.nbytes
    if (n < PARALLEL_COPY_BYTES or COPY_HELPERS < 1 or not dst.flags.c_contiguous
            or not src.flags.c_contiguous):
        np.copyto(dst, src)
        return
    # (a list the caller empties at the end: a helper that starts late must not keep the
    # snapshot referenced, or the next push would find it in use)
    arrays = [dst.reshape(-1), src.reshape(-1)]
    step = max(1, COPY_PIECE_BYTES // dst.itemsize)
    count = -(-dst.size // step)
    turns = itertools.count()  # next() on it is atomic: each piece is copied once
    lock = threading.Lock()
    left = [count]
    all_done = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        for i in turns:
            if i >= count:
                return
            lo = i * step
            try:  # (every piece is taken before the caller empties ``arrays``)
                np.copyto(arrays[0][lo:lo + step], arrays[1][lo:lo + step])
            except BaseException as e:  # (re-raised by the caller)
                errors.append(e)
            with lock:
                left[0] -= 1
                if not left[0]:
                    all_done.set()

    if _helpers is None:
        _helpers = ThreadPoolExecutor(COPY_HELPERS, thread_name_prefix="geomx-copy")
    for _ in range(min(COPY_HELPERS, count - 1)):
        _helpers.submit(work)
    work()
    # only pieces a helper is copying right now are left: a helper that has not started
    # yet finds nothing to do, and nobody waits for it
    all_done.wait()
    arrays.clear()
    if errors:
        raise errors[0]


class PushSnapshots:
    """``take(key, value)``: a frozen C-contiguous copy of ``value``."""

    __slots__ = ("_bufs", "reused")

    def __init__(self) -> None:
        self._bufs: dict[Hashable, np.ndarray] = {}
        self.reused = 0

    def take(self, key: Hashable, value: np.ndarray) -> np.ndarray:
        value = np.asarray(value)
        buf = self._bufs.get(key)
        if (buf is not None and sys.getrefcount(buf) == _FREE_REFS
                and buf.shape == value.shape and buf.dtype == value.dtype):
            buf.flags.writeable = True
            copy_into(buf, value)
            self.reused += 1
            return freeze(buf)
        snap = np.empty(value.shape, dtype=value.dtype)
        copy_into(snap, value)
        if snap.nbytes >= MIN_REUSED_BYTES:
            self._bufs[key] = snap
        elif buf is not None:
            del self._bufs[key]
        return freeze(snap)

    def forget(self, key: Hashable) -> None:
        self._bufs.pop(key, None)
