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
"""

from __future__ import annotations

import sys
from typing import Hashable

import numpy as np

from geomx.node.values import freeze

#: Values below this size get a fresh copy each push (reuse saves little on them).
MIN_REUSED_BYTES = 1 << 20

# references to an unused snapshot seen by sys.getrefcount in take(): the dict, the
# local name, and getrefcount's argument
_FREE_REFS = 3


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
            np.copyto(buf, value)
            self.reused += 1
            return freeze(buf)
        snap = np.array(value, copy=True, order="C")
        if snap.nbytes >= MIN_REUSED_BYTES:
            self._bufs[key] = snap
        elif buf is not None:
            del self._bufs[key]
        return freeze(snap)

    def forget(self, key: Hashable) -> None:
        self._bufs.pop(key, None)
