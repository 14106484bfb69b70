"""Noticing a TCP connection that died silently: keepalive probes and a user timeout.

A connection can die without a FIN or an RST: a NAT or a stateful firewall on the WAN
path forgets the flow, a middlebox drops it, the far host loses power. Nothing tells
either end. Without help, Linux notices only when its retransmissions give up
(``tcp_retries2`` = 15: about 15 minutes with data outstanding) or never (an idle
connection), and geomx's resumable streams (:mod:`geomx.runtime.tcp_resume`) cannot
dial again and resend what the dead connection swallowed until the socket says it is
dead. A geo-distributed job then stalls for a quarter of an hour, or for ever.

Two socket options bound that, per connection, to about ``dead_after_s``:

* ``TCP_USER_TIMEOUT`` (RFC 5482; Linux ``tcp(7)``): data written but not acknowledged
  by the peer's TCP for ``dead_after_s`` closes the connection with ``ETIMEDOUT``. This
  catches a dead path while a sender has something to say, which is when it matters.
  It counts from the oldest unacknowledged segment, so a slow link is no false alarm
  as long as the peer's TCP keeps acknowledging (it acknowledges what it *received*;
  the application reading slowly shrinks the window, which is not a timeout).
* ``SO_KEEPALIVE`` with ``TCP_KEEPIDLE`` / ``TCP_KEEPINTVL`` / ``TCP_KEEPCNT``: an idle
  connection sends an empty probe after ``dead_after_s / 2`` of silence and gives up
  after a few unanswered ones, so the receiving end of a one-way stream (geomx's
  connections carry messages one way and acknowledgements back) and an idle sender
  drop their dead connection too, instead of holding it for ever.

The sender's side then does what it does for any broken connection: it dials again
and writes the unacknowledged messages again, in order; the receiver drops duplicates
(:mod:`geomx.runtime.tcp_resume`). gRPC's keepalive (``GRPC_ARG_KEEPALIVE_TIME_MS``)
and ZeroMQ's ``ZMQ_HEARTBEAT_*`` solve the same problem with application pings; the
kernel's probes cost no Python and also work while the event loop is busy, and a peer
whose *process* hangs while its kernel still acknowledges is a membership question
(the scheduler's heartbeats), not a connection one.
"""

from __future__ import annotations

import socket

#: Default bound on how long a silently dead connection goes unnoticed (seconds).
DEFAULT_DEAD_AFTER_S = 20.0
#: Unanswered keepalive probes before the kernel gives up on an idle connection.
KEEPALIVE_PROBES = 3


def keepalive_schedule(dead_after_s: float) -> tuple[int, int, int]:
    """``(idle_s, interval_s, probes)`` so that an idle dead connection is dropped after
    about ``dead_after_s``: half of it silent, then ``KEEPALIVE_PROBES`` probes over the
    other half (the kernel counts whole seconds, at least one)."""
    idle_s = max(1, int(dead_after_s / 2))
    interval_s = max(1, int((dead_after_s - idle_s) / KEEPALIVE_PROBES))
    return idle_s, interval_s, KEEPALIVE_PROBES


def apply_dead_after(sock: socket.socket, dead_after_s: float) -> bool:
    """Make ``sock`` notice a dead peer within about ``dead_after_s`` (0: leave the
    kernel's defaults). False where the platform lacks the options (then nothing is set
    but what it has)."""
    if not dead_after_s > 0:
        return False
    ok = True
    idle_s, interval_s, probes = keepalive_schedule(dead_after_s)
    for level, name, value in (
            (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
            (socket.IPPROTO_TCP, "TCP_KEEPIDLE", idle_s),
            (socket.IPPROTO_TCP, "TCP_KEEPINTVL", interval_s),
            (socket.IPPROTO_TCP, "TCP_KEEPCNT", probes),
            (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", max(1, int(dead_after_s * 1000)))):
        opt = getattr(socket, name, None)
        if opt is None:
            ok = False
            continue
        try:
            sock.setsockopt(level, opt, value)
        except OSError:
            ok = False
    return ok
