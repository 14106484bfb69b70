"""Shared-memory rings as the tests see them: two TCP transports on this host, and the
ring fds and mappings a process holds (geomx/runtime/shm_ring.py names every memfd
``geomx-ring``)."""

from __future__ import annotations

import os
from typing import Any

from geomx.runtime.tcp import TcpTransport
from tests.helpers.aio import start_pair


async def tcp_pair(**kw: Any) -> tuple[TcpTransport, TcpTransport]:
    """Transports "a" and "b" (no UDP), started and knowing each other's address."""
    a = TcpTransport("a", udp=False, **kw)
    b = TcpTransport("b", udp=False, **kw)
    await start_pair(a, b)
    return a, b


def ring_fds(pid: int | str = "self") -> int:
    """File descriptors of ``pid`` that are (or duplicate) a ring's memfd."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += "geomx-ring" in os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return n


def ring_maps(pid: int | str = "self") -> int:
    """Mappings of a ring in ``pid``'s address space."""
    with open(f"/proc/{pid}/maps") as fh:
        return sum("geomx-ring" in line for line in fh)
