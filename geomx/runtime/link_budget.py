"""One bandwidth budget per scenario link, drawn on by every sender whose traffic crosses it.

Why: the emulator (``geomx/sim/network.py``) shares each directed link max-min between
the flows crossing it. A shaper that keeps one token bucket per (sending process, peer)
gives every such flow the whole link: two workers of a DC pushing at once, a local
server sending a split tensor's halves to two global servers, a DC whose traffic reaches
the centre through another DC's link -- each runs 35-44% faster over sockets than in
the emulator under such a shaper. Here every directed link of the scenario (a WAN direction, or a
node's NIC up- or downlink where the DC's ``lan_bandwidth`` is low enough to matter)
has one *virtual finish time*, the same arithmetic as :class:`geomx.runtime.shaper.TokenBucket`:
sending ``n`` bytes over a route reserves ``n / rate`` seconds on each of its links, from
``max(link's finish, now - burst)``; the bytes have crossed when the last of those
reservations ends.

Why reservations approximate max-min: senders pace at most
:data:`~geomx.runtime.shaper.PACING_LEAD_S` ahead of the links, so flows crossing one link
take turns on it in pieces of at most 64 KiB; a flow held back elsewhere (a slower link
further on, a Mathis cap) reserves the shared link only at its own pace and leaves the
rest to the others -- what max-min fair sharing gives it. What is not reproduced: within
one pacing lead (50 ms) the order is first come, first served.

Why a shared file and not a relay process per link (the other way to share a link): a
relay adds a hop, a copy of every byte and a process per link to a 2-core machine; a
reservation is two ``fcntl`` byte-range lock calls and a 16-byte read-modify-write in a
memory-mapped file, a few microseconds per 64 KiB piece. Processes on one host share
``CLOCK_MONOTONIC``, which the shaper's clock (``time.monotonic``) reads, so finish times
written by one process are meaningful to the others. Across hosts a file cannot be
shared: each host then has its own budget (docs/real-runtime.md), and exact sharing
needs the kernel-shaped mode or the real WAN.

:class:`LinkBudget` keeps the finish times in the process (one process's own flows
share links exactly; ``[real] shared_links = false`` or nodes started by hand);
:class:`SharedLinkBudget` keeps them in a file every node of a local launch opens.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import struct
from pathlib import Path

__all__ = ["LinkBudget", "SharedLinkBudget", "create_budget_file", "BudgetError"]

_MAGIC = b"GXLB0001"
_HEADER = struct.Struct("<8sQ")      # magic, number of links
_SLOT = struct.Struct("<d")           # a link's finish time (time.monotonic seconds)


class BudgetError(RuntimeError):
    """A link budget file that is missing, foreign, or laid out for another job."""


class LinkBudget:
    """Finish times of ``n_links`` directed links, kept in this process."""

    def __init__(self, n_links: int):
        if n_links < 0:
            raise ValueError(f"LinkBudget: n_links must be >= 0, got {n_links!r}")
        self.n_links = int(n_links)
        self._finish = [-math.inf] * self.n_links

    def reserve(self, link: int, cost_s: float, burst_s: float, now: float) -> float:
        """Take ``cost_s`` seconds of ``link``; return when they end.

        They start at the link's finish time, or at ``now - burst_s`` if the link has been
        idle (an idle link earns at most ``burst_s`` of credit)."""
        start = max(self._finish[link], now - burst_s)
        finish = start + cost_s
        self._finish[link] = finish
        return finish

    def finish(self, link: int) -> float:
        return self._finish[link]

    def close(self) -> None:
        pass


def create_budget_file(path: str | os.PathLike, n_links: int) -> Path:
    """Write a fresh budget file for ``n_links`` links (every link idle), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(_HEADER.pack(_MAGIC, n_links))
        fh.write(_SLOT.pack(-math.inf) * n_links)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


class SharedLinkBudget(LinkBudget):
    """Finish times in a memory-mapped file shared by every process of a job on this host.

    Each slot is guarded by an ``fcntl`` byte-range lock on its own 8 bytes, so senders
    on different links never wait for each other; the read-modify-write of one slot is
    atomic across processes. Locks held by a process that dies are released by the
    kernel, so a crashed node cannot wedge the others.
    """

    def __init__(self, path: str | os.PathLike, n_links: int):
        self.path = Path(path)
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError as e:
            raise BudgetError(f"link budget {self.path}: cannot open ({e.strerror})") from None
        try:
            size = os.fstat(fd).st_size
            want = _HEADER.size + _SLOT.size * n_links
            if size != want:
                raise BudgetError(f"link budget {self.path}: {size} bytes, expected {want} for "
                                  f"{n_links} links (a file of another job or scenario?)")
            self._map = mmap.mmap(fd, size)
            magic, n = _HEADER.unpack_from(self._map, 0)
            if magic != _MAGIC or n != n_links:
                self._map.close()
                raise BudgetError(f"link budget {self.path}: not a geomx link budget for "
                                  f"{n_links} links (header {magic!r}, {n})")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.n_links = int(n_links)

    def reserve(self, link: int, cost_s: float, burst_s: float, now: float) -> float:
        off = _HEADER.size + _SLOT.size * link
        fcntl.lockf(self._fd, fcntl.LOCK_EX, _SLOT.size, off)
        try:
            (current,) = _SLOT.unpack_from(self._map, off)
            finish = max(current, now - burst_s) + cost_s
            _SLOT.pack_into(self._map, off, finish)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, _SLOT.size, off)
        return finish

    def finish(self, link: int) -> float:
        return _SLOT.unpack_from(self._map, _HEADER.size + _SLOT.size * link)[0]

    def close(self) -> None:
        if self._fd >= 0:
            self._map.close()
            os.close(self._fd)
            self._fd = -1
