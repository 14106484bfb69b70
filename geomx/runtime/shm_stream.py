"""Asking for a shared-memory ring, and writing a large message as a stream whose pieces
pass through it.

A connection's ring is asked for (:func:`ask_for_ring`) when its writer first has a
message of :data:`~geomx.runtime.shm_ring.RING_MIN_MESSAGE_BYTES` or more, not when it
opens: a connection that only carries small messages then never holds one (no memory,
no mapping, no file descriptor on either side).

The receiving side is :class:`geomx.runtime.framing.FrameDecoder` (SHM_PIECE frames,
module docstring "Same-host pieces"); the ring is :mod:`geomx.runtime.shm_ring`'s; the
caller is the writer of :class:`geomx.runtime.tcp_outgoing.Outgoing`, which streams a
message this way instead of as STREAM_PIECE frames when its connection has a ring. The
message's bytes are copied once, from the sender's arrays into the ring; only the
STREAM_HEAD (the wire header) and a 24-byte frame per piece cross the socket.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from geomx.runtime.framing import shm_piece_frame, stream_head
from geomx.runtime.shm_ring import SendRing


#: Seconds the writer waits for the peer's answer to a ring offer before writing the
#: message through the socket (the answer normally comes within one round trip; a
#: later one still attaches the ring, for the messages that follow).
ANSWER_WAIT_S = 2.0


async def ask_for_ring(conn: Any, new_ring: Callable[[], SendRing | None]) -> SendRing | None:
    """Offer the peer of ``conn`` (an open outgoing
    :class:`~geomx.runtime.tcp_conn.Conn` that has not asked yet) a ring made by
    ``new_ring`` and wait for its answer: the ring if it mapped it, None if it declined,
    did not answer in time, or this host makes no rings (the message takes the socket)."""
    ring = new_ring()
    if ring is None:
        conn.forgo_ring()
        return None
    answer = conn.offer_ring(ring)
    try:
        await asyncio.wait_for(asyncio.shield(answer), ANSWER_WAIT_S)
    except TimeoutError:
        return None
    return conn.shm


async def write_ring_stream(conn: Any, ring: SendRing, frames: list, stream_id: int,
                            piece_bytes: int) -> int:
    """Write the frame ``frames`` (as :func:`geomx.runtime.framing.stream_head` takes it)
    on ``conn`` (a :class:`~geomx.runtime.tcp_conn.Conn`) as a stream through ``ring``:
    a head of at most ``piece_bytes`` (the connection's piece size, which the peer's
    frame limit allows), then pieces of ``ring.piece_bytes``, waiting for room in the
    ring as needed; return the bytes the stream stands for (its frames and the pieces'
    data). ConnectionError if the connection closes meanwhile (the ring is closed)."""
    head, views, left = stream_head(frames, stream_id, piece_bytes)
    conn.write(head)
    total = len(head)
    piece = ring.piece_bytes
    data = ring.data
    size = ring.size
    vi, voff = 0, 0
    while left:
        n = min(piece, left)
        pos = ring.alloc(n)
        if pos is None:
            pos = await ring.reserve(n)
        at = pos % size
        # gather the piece's bytes from the message's views into the ring
        need = n
        while need:
            v = views[vi]
            take = min(need, v.nbytes - voff)
            data[at:at + take] = v[voff:voff + take]
            at += take
            need -= take
            voff += take
            if voff == v.nbytes:
                vi, voff = vi + 1, 0
        frame = shm_piece_frame(stream_id, pos, n)
        conn.write(frame)
        total += len(frame) + n
        left -= n
    return total
