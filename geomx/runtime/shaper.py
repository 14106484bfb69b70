"""Per-peer traffic shaping done by the transport itself (no root, no ``tc``/``netem``).

To reproduce WAN conditions on one machine the sending transport shapes its own traffic
to each peer. Each direction of a link is shaped by its sender, so a scenario's link
table maps directly onto one :class:`LinkShape` per (sender, peer).

The model, per peer
-------------------
* **Bandwidth** -- a token bucket at ``bandwidth_bps`` with ``burst_bytes`` of credit,
  shared by every channel (reliable and unreliable) to that peer, because they share
  one link. It is kept as a *virtual finish time*: transmitting ``n`` bytes moves the
  link's finish time forward by ``n / rate``; an idle link earns at most ``burst_bytes``
  of credit. The sender schedules up to :data:`PACING_LEAD_S` ahead of the link and
  sleeps to absolute times, which keeps the average rate exact even when the loop's
  timers fire late or the process is briefly descheduled.
* **Delay and jitter** -- a byte whose transmission ends at ``t`` is written to the real
  socket at ``t + max(0, delay_s + jitter)`` where ``jitter`` is drawn uniformly from
  ``[-jitter_s, jitter_s]`` (the emulator's distribution; seeded; one draw per message,
  applied to all of its bytes). The
  delay does **not** serialise the link: pacing happens in the
  sender's writer, then pieces wait in a :class:`DelayLine` that writes each one when
  it is due while the writer already paces the next. Writes are kept in order per
  connection (a piece never leaves before the piece ahead of it), so jitter cannot
  reorder a stream, just as TCP would not.
* **Loss** -- on unreliable (UDP) channels each datagram is dropped with probability
  ``loss`` after it has used its share of the bandwidth (it was lost on the path, not
  at the sender). On reliable channels nothing is dropped: TCP would retransmit, and
  what a lossy path costs a TCP flow is throughput. We model that cost with the
  **Mathis et al. (1997) rate cap**, ``rate <= MSS * sqrt(3/2) / (RTT * sqrt(loss))``,
  with ``MSS = 1460`` and ``RTT = rtt_s`` (default ``2 * delay_s``, floored at 1 ms),
  applied per connection as a second token bucket. This is the same per-flow cap the
  emulator uses, so both runtimes charge a lossy link the same way.
* **Window** (optional, off by default) -- ``tcp_window_bytes`` adds the emulator's
  other per-flow cap, ``window / RTT``, to reliable connections.

What it does not model: TCP slow start, queueing delay at a shared bottleneck between
different senders, and reordering on UDP.

Clock and timers
----------------
Pacing and due times use :func:`now_s` (``time.monotonic``, sub-microsecond), not
``loop.time()``: uvloop's loop clock advances in whole milliseconds and is cached per
loop iteration, which put every shaped message up to a millisecond late (about 0.6 ms
on average per one-way trip, measured). Event-loop timers still fire on a 1 ms grid
(uvloop rounds a delay to the nearest millisecond), so the delay line writes a piece
once it is due within :data:`TIMER_SLACK_S` -- half a tick -- instead of always waiting
for the next tick: the timing error is then centred on zero rather than always late.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from geomx.runtime.link_budget import LinkBudget
from geomx.transport import derive_seed

#: Segment size used by the Mathis rate cap (Ethernet MSS).
MSS_BYTES = 1460
#: ``sqrt(3/2)``: the constant of the Mathis et al. formula for periodic loss.
MATHIS_C = math.sqrt(1.5)
#: RTT floor for the Mathis cap when the link has no configured delay.
MIN_RTT_S = 0.001
#: Default credit of an idle link: at least this many seconds of traffic ...
DEFAULT_BURST_S = 0.01
#: ... and at least this many bytes (one pacing piece).
DEFAULT_BURST_BYTES = 64 * 1024
#: How far a sender's pacing may run ahead of the link (a socket buffer's worth of
#: time). Bytes scheduled within the lead are committed: a later, higher-priority
#: message waits behind at most this much. The lead is what keeps the average rate
#: exact when the process is descheduled for a while on a busy machine.
PACING_LEAD_S = 0.05
#: Half of the event loop's 1 ms timer tick: a piece due within this is written now.
TIMER_SLACK_S = 0.0005

#: The shaper's clock (seconds, monotonic, precise; see "Clock and timers").
now_s = time.monotonic


@dataclass(frozen=True, slots=True)
class LinkShape:
    """One direction of a link as the sender sees it.

    ``bandwidth_bps`` in bits per second (``0`` or ``math.inf`` = unlimited),
    ``delay_s`` one-way propagation delay, ``jitter_s`` delay varying uniformly within
    ``+-jitter_s`` (never below 0), ``loss`` probability in ``[0, 1)`` (``1`` allowed for tests: every
    datagram lost), ``burst_bytes`` token-bucket depth (default: the larger of 64 KiB
    and 10 ms of traffic), ``rtt_s`` the round trip used by the per-connection caps
    (default ``2 * delay_s``), ``tcp_window_bytes`` an optional ``window / RTT`` cap on
    reliable connections (default: none), ``mss_bytes`` the segment size of the Mathis cap.
    """

    bandwidth_bps: float
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    burst_bytes: int | None = None
    rtt_s: float | None = None
    tcp_window_bytes: int | None = None
    mss_bytes: int = MSS_BYTES

    def __post_init__(self) -> None:
        if not (self.bandwidth_bps >= 0):
            raise ValueError(f"LinkShape.bandwidth_bps must be >= 0 (0 = unlimited), "
                             f"got {self.bandwidth_bps!r}")
        if not (self.delay_s >= 0) or math.isinf(self.delay_s):
            raise ValueError(f"LinkShape.delay_s must be a finite value >= 0, got {self.delay_s!r}")
        if not (self.jitter_s >= 0) or math.isinf(self.jitter_s):
            raise ValueError(f"LinkShape.jitter_s must be a finite value >= 0, "
                             f"got {self.jitter_s!r}")
        if not (0 <= self.loss <= 1):
            raise ValueError(f"LinkShape.loss must be within [0, 1], got {self.loss!r}")
        if self.burst_bytes is not None and self.burst_bytes <= 0:
            raise ValueError(f"LinkShape.burst_bytes must be > 0, got {self.burst_bytes!r}")
        if self.rtt_s is not None and not (0 <= self.rtt_s < math.inf):
            raise ValueError(f"LinkShape.rtt_s must be a finite value >= 0, got {self.rtt_s!r}")
        if self.tcp_window_bytes is not None and self.tcp_window_bytes <= 0:
            raise ValueError(f"LinkShape.tcp_window_bytes must be > 0, "
                             f"got {self.tcp_window_bytes!r}")
        if not self.mss_bytes > 0:
            raise ValueError(f"LinkShape.mss_bytes must be > 0, got {self.mss_bytes!r}")

    @property
    def rate_Bps(self) -> float:
        """Bytes per second; ``inf`` when unlimited."""
        if self.bandwidth_bps == 0 or math.isinf(self.bandwidth_bps):
            return math.inf
        return self.bandwidth_bps / 8.0

    @property
    def rtt(self) -> float:
        """Round trip for the per-connection caps: ``rtt_s`` or twice the delay, >= 1 ms."""
        return max(2.0 * self.delay_s if self.rtt_s is None else self.rtt_s, MIN_RTT_S)

    @property
    def reliable_rate_Bps(self) -> float:
        """Per-connection cap on a reliable channel: Mathis (if lossy), window/RTT (if set)."""
        cap = math.inf
        if self.loss >= 1:
            cap = float(self.mss_bytes)  # a fully lossy path: a trickle, never a hang
        elif self.loss > 0:
            cap = self.mss_bytes * MATHIS_C / (self.rtt * math.sqrt(self.loss))
        if self.tcp_window_bytes is not None:
            cap = min(cap, self.tcp_window_bytes / self.rtt)
        return cap

    @property
    def burst(self) -> float:
        if self.burst_bytes is not None:
            return float(self.burst_bytes)
        rate = self.rate_Bps
        if math.isinf(rate):
            return float(DEFAULT_BURST_BYTES)
        return max(float(DEFAULT_BURST_BYTES), rate * DEFAULT_BURST_S)

    def transfer_time_s(self, nbytes: int) -> float:
        """Ideal time to deliver ``nbytes`` on an idle link (pacing + delay, no burst credit)."""
        rate = min(self.rate_Bps, self.reliable_rate_Bps)
        return (0.0 if math.isinf(rate) else nbytes / rate) + self.delay_s


class TokenBucket:
    """A token bucket kept as a virtual finish time (see the module docstring)."""

    __slots__ = ("rate_Bps", "burst_s", "_finish")

    def __init__(self, rate_Bps: float, burst_bytes: float, finish_s: float = -math.inf):
        self.rate_Bps = rate_Bps
        self.burst_s = 0.0 if math.isinf(rate_Bps) else burst_bytes / rate_Bps
        #: when the bytes paced so far have left the link (``now_s`` time)
        self._finish = finish_s

    def transmit(self, nbytes: int, now: float) -> float:
        """Account ``nbytes``; return the time their last byte has left the link."""
        if math.isinf(self.rate_Bps):
            return now
        start = max(self._finish, now - self.burst_s)
        self._finish = start + nbytes / self.rate_Bps
        return max(self._finish, now)

    def reshaped(self, rate_Bps: float, burst_bytes: float) -> "TokenBucket":
        """A bucket at a new rate and depth whose bytes already paced keep their place
        (it starts from this one's finish time)."""
        return TokenBucket(rate_Bps, burst_bytes, self._finish)


#: Where a link stalls for good (a partitioned WAN), bytes are due this far ahead.
STALLED_S = 365 * 86400.0


class ShapedLink:
    """The shaping state of one peer: its bandwidth budget, seeded jitter and loss.

    Bandwidth comes from one of two places:

    * ``hops`` and ``budget`` (what :func:`geomx.runtime.node_main.build_shaper` gives):
      the scenario links on the route to the peer, ``(link index, rate_Bps)`` each; every
      piece reserves its bytes on each of them in the
      :class:`~geomx.runtime.link_budget.LinkBudget` that every sender crossing those links
      shares, and has crossed when the last reservation ends;
    * otherwise a token bucket of this peer's own at ``shape``'s bandwidth.

    ``phases`` (optional): ``(t, shape or None[, hops])`` in :func:`now_s` time, in time
    order, possibly endless (read as time goes by): from ``t`` on the link has that shape
    (a trace's rate; the route's hops and their current rates), or carries nothing
    (``None``: a failed WAN link on the route;
    :func:`geomx.runtime.wan_shapes.dc_link_phases`). Bytes paced while it is stalled
    leave when the next phase starts, at that phase's rate; bytes already paced keep their
    times (they were on the wire).
    """

    def __init__(self, peer: str, shape: LinkShape, seed: int,
                 phases: Iterable[tuple] | None = None, *,
                 hops: tuple[tuple[int, float], ...] | None = None,
                 budget: LinkBudget | None = None):
        self.peer = peer
        self.shape = shape
        self.bucket = TokenBucket(shape.rate_Bps, shape.burst)
        self.budget = budget
        self.hops = hops if budget is not None else None
        self._rng = random.Random(derive_seed(seed, f"shaper:{peer}"))
        self.datagrams_lost = 0
        self.stalled = False
        self._phases: Iterator[tuple] | None = iter(phases) if phases is not None else None
        self._next = next(self._phases, None) if self._phases is not None else None

    def _advance(self, now: float) -> None:
        """Enter every phase that has started by ``now``."""
        while self._next is not None and self._next[0] <= now:
            phase = self._next
            self._next = next(self._phases, None)  # type: ignore[arg-type]
            shape = phase[1]
            if shape is None:
                self.stalled = True
                continue
            self.stalled = False
            if len(phase) > 2 and self.budget is not None:
                self.hops = phase[2]
            if shape != self.shape:
                self.shape = shape
                self.bucket = self.bucket.reshaped(shape.rate_Bps, shape.burst)

    def flow_bucket(self) -> TokenBucket | None:
        """A per-connection bucket for a reliable channel (the Mathis cap), or None."""
        rate = self.shape.reliable_rate_Bps
        if math.isinf(rate):
            return None
        return TokenBucket(rate, max(float(self.shape.mss_bytes), rate * DEFAULT_BURST_S))

    def transmit(self, nbytes: int, now: float, flow: TokenBucket | None = None) -> float:
        """Pace ``nbytes``: the time their transmission ends on this link (>= ``now``)."""
        if self._phases is not None:
            self._advance(now)
            while self.stalled:
                if self._next is None:
                    return now + STALLED_S
                now = self._next[0]
                self._advance(now)
        hops = self.hops
        if hops is not None:
            t = now
            reserve, mss = self.budget.reserve, self.shape.mss_bytes  # type: ignore[union-attr]
            for link, rate in hops:
                # no burst credit beyond one segment: an emulated link has none
                done = reserve(link, nbytes / rate, mss / rate, now)
                if done > t:
                    t = done
        else:
            t = self.bucket.transmit(nbytes, now)
        if flow is not None:
            t = max(t, flow.transmit(nbytes, now))
        return t

    def sample_delay(self) -> float:
        """One-way delay plus a fresh jitter sample (of the shape the next bytes will have)."""
        shape = self.shape
        if self._phases is not None:
            self._advance(now_s())
            if self.stalled and self._next is not None and self._next[1] is not None:
                shape = self._next[1]
        j = shape.jitter_s
        if j <= 0:
            return shape.delay_s
        # the emulator's distribution: uniform within +-jitter of the delay, never negative
        return max(0.0, shape.delay_s + (2.0 * self._rng.random() - 1.0) * j)

    def lose(self) -> bool:
        """Draw whether an unreliable datagram is lost."""
        p = self.shape.loss
        if p <= 0:
            return False
        lost = p >= 1 or self._rng.random() < p
        if lost:
            self.datagrams_lost += 1
        return lost

    @property
    def delays(self) -> bool:
        return self.shape.delay_s > 0 or self.shape.jitter_s > 0


class Shaper:
    """Link shapes for the peers of one node: ``Shaper({"gs:0": LinkShape(50e6, 0.04)}, seed=1)``.

    Peers not in ``shapes`` get ``default`` (None = not shaped). Random draws (jitter,
    loss) come from a generator per peer seeded from ``seed`` and the peer's name, so a
    run is reproducible up to the timing noise of a real machine. A peer listed in
    ``hops`` draws its bandwidth from ``budget``, on the links of its route, shared with
    every other sender crossing them (:mod:`geomx.runtime.link_budget`).
    """

    def __init__(self, shapes: dict[str, LinkShape], seed: int = 0, *,
                 default: LinkShape | None = None,
                 phases: dict[str, Iterable[tuple]] | None = None,
                 hops: dict[str, tuple[tuple[int, float], ...]] | None = None,
                 budget: LinkBudget | None = None):
        for peer, shape in shapes.items():
            if not isinstance(shape, LinkShape):
                raise TypeError(f"Shaper: shape for {peer!r} must be a LinkShape, "
                                f"got {type(shape).__name__}")
        self.shapes = dict(shapes)
        self.seed = int(seed)
        self.default = default
        self.phases = dict(phases or {})  # peer -> ShapedLink phases (now_s() times)
        self.hops = dict(hops or {})      # peer -> the route's (link index, rate_Bps)
        self.budget = budget
        self._links: dict[str, ShapedLink] = {}

    def shape_for(self, peer: str) -> LinkShape | None:
        return self.shapes.get(peer, self.default)

    def link(self, peer: str) -> ShapedLink | None:
        """The (lazily created, then shared) shaping state for ``peer``; None if unshaped."""
        link = self._links.get(peer)
        if link is None:
            shape = self.shape_for(peer)
            if shape is None:
                return None
            hops = self.hops.get(peer)
            link = self._links[peer] = ShapedLink(
                peer, shape, self.seed, self.phases.get(peer), hops=hops,
                budget=self.budget if hops is not None else None)
        return link

    def stats(self) -> dict[str, dict[str, int]]:
        return {p: {"datagrams_lost": l.datagrams_lost} for p, l in self._links.items()}


class DelayLine:
    """Writes pieces at their due times, in the order they were put, without blocking the putter.

    ``write(piece)`` does the real write; ``drain()`` (optional) is awaited after a write
    when ``must_drain()`` says the socket's buffer is full, so a slow socket slows the
    line instead of growing memory; ``on_written(n)`` reports the bytes that left.
    Pieces hold zero-copy views, so what waits here costs no memory beyond references;
    its byte count is at most bandwidth x delay (the link's bandwidth-delay product).
    """

    def __init__(self, write: Callable[[object], None], *,
                 drain: Callable[[], Awaitable[None]] | None = None,
                 must_drain: Callable[[], bool] | None = None,
                 on_written: Callable[[int], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 name: str = "delay-line", clock: Callable[[], float] = now_s,
                 slack_s: float = TIMER_SLACK_S):
        self._clock = clock
        self._slack_s = slack_s
        self._write = write
        self._drain = drain
        self._must_drain = must_drain
        self._on_written = on_written
        self._on_error = on_error
        self._queue: deque[tuple[float, object, int]] = deque()
        self._last_due = -math.inf
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=name)
        self.pending_bytes = 0

    def put(self, due: float, piece: object, nbytes: int) -> None:
        """Queue ``piece`` for writing at ``clock()`` time ``due`` (never before earlier pieces)."""
        due = max(due, self._last_due)
        self._last_due = due
        self._queue.append((due, piece, nbytes))
        self.pending_bytes += nbytes
        self._idle.clear()
        self._wake.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def clear(self) -> int:
        """Forget pieces not yet written; return their byte count."""
        n = self.pending_bytes
        self._queue.clear()
        self.pending_bytes = 0
        self._idle.set()
        return n

    def close(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        clock, slack = self._clock, self._slack_s
        q = self._queue
        try:
            while True:
                if not q:
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                due = q[0][0]
                wait = due - clock()
                if wait > slack:
                    await asyncio.sleep(wait)
                    continue
                now = clock() + slack
                written = 0
                while q and q[0][0] <= now:
                    _, piece, n = q.popleft()
                    self._write(piece)
                    written += n
                    self.pending_bytes -= n
                    if self._must_drain is not None and self._must_drain():
                        break
                if self._on_written is not None and written:
                    self._on_written(written)
                if self._drain is not None and self._must_drain is not None and self._must_drain():
                    await self._drain()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a broken socket: report it, stop
            if self._on_error is not None:
                self._on_error(e)
            else:
                raise
