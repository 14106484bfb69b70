"""Flow-level WAN/LAN model for the virtual-time emulator: flows and their completions.

The model is in three parts, the way SimGrid splits its network model from its sharing
solver: the topology (:mod:`geomx.sim.topology`: DCs, hosts, links, routes and cached
paths), the max-min sharing solver (:mod:`geomx.sim.sharing`: constraints, variables
and their solve), and this module, which turns messages into flows on the topology,
asks the solver for their rates and delivers each message when its last byte has
arrived.

*Connections, not packets.* Every reliable ``(src, dst, channel)`` triple is one
connection: one flow with a queue of messages (highest ``priority`` first, FIFO among
equals). While it has backlog the connection stays busy and the next message continues at
the current rate without any recomputation; rates are recomputed only when a connection
becomes busy or idle, or a trace step changes a capacity. This keeps the number of
concurrent flows at the number of busy connections (tens), not the number of queued
messages (thousands), which is what makes the emulator faster than emulated time.
A message of at most ``single_packet_bytes`` (default: one MSS) that finds its
connection idle is a single packet rather than a flow: it is serialised at the share it
would get and triggers no recomputation (requests, acks and control messages would
otherwise cost two recomputations each for a rate change lasting microseconds).

*Rates.* Max-min fair sharing over all directed links on each flow's path, strict
priority classes served one after the other (:class:`~geomx.sim.sharing.SharingSystem`,
one variable per busy connection, one constraint per link direction). Each reliable
flow is also capped at ``tcp_window_bytes * 8 / RTT`` (a window-limited TCP), and on a
lossy path at the Mathis et al. steady-state TCP throughput
(:func:`~geomx.sim.topology.reliable_flow_cap_bps`): reliable channels turn loss into
lower throughput and never drop. Unreliable channels (``channel >= 8``) have no cap and
drop each message with the path loss probability ``1 - prod(1 - loss_link)``
(:func:`geomx.topology.routes.path_loss`).

*Events.* Rates are constant between recomputations, so each busy connection knows
when its current message's last byte leaves. One loop timer is kept for the earliest
such instant (a heap of ``(finish_time, seq, connection)`` entries with lazy
invalidation). Remaining bytes are updated lazily (``remaining -= rate * dt / 8``)
only for connections whose rate actually changes. Rate recomputations triggered within
one virtual instant are batched into one, run by the loop's ``call_when_idle`` hook.

A message's arrival time is the time its last byte leaves plus the path's propagation
delay, plus seeded jitter that never reorders a connection. Everything random comes
from one ``random.Random(seed)``, consumed in event order, so the same program with the
same seed gives the same deliveries.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from geomx.sim.sharing import SharingSystem, Variable
from geomx.sim.topology import Link, NetworkError, Path, Topology
from geomx.traces import BandwidthTrace

__all__ = [
    "Link", "MessageLike", "Network", "NetworkError", "NetworkStats", "UNRELIABLE_BASE",
    "TransferHook", "channel_class",
]

#: Channels >= this are unreliable datagram channels (mirrors ``geomx.wire.UNRELIABLE_BASE``;
#: duplicated so that the emulator depends only on a message's attributes).
UNRELIABLE_BASE = 8

#: Completion times within this many seconds of the current instant are processed
#: together (absorbs float rounding of ``t + bytes * 8 / rate``).
_FINISH_TOLERANCE_S = 1e-9

_INF = math.inf
_running_loop = asyncio.get_running_loop


class MessageLike(Protocol):
    """The only message attributes the network reads."""

    src: str
    dst: str
    channel: int
    priority: int

    @property
    def nbytes(self) -> int: ...


#: ``on_transfer(msg, t_start, t_end, path_link_names, dropped)``: called when a message's
#: last byte leaves; ``t_start`` is when its first byte left, ``t_end`` when it arrives (or
#: would have, if dropped).
TransferHook = Callable[[Any, float, float, tuple[str, ...], bool], None]


def channel_class(channel: int) -> int:
    """Strict-priority class of a channel: lower is served first.

    Reliable channels 0..7 are classes 0..7; unreliable channel ``8 + k`` shares class
    ``k`` with reliable channel ``k`` (a datagram channel is a transport choice, not a
    priority choice).
    """
    if channel >= UNRELIABLE_BASE:
        channel -= UNRELIABLE_BASE
    return channel if channel > 0 else 0


@dataclass(frozen=True)
class NetworkStats:
    """A snapshot of traffic counters.

    Bytes are counted when a message's last byte leaves, for every transmitted message,
    including unreliable ones dropped on the way (they used the links). A link is busy
    while at least one flow (not a single-packet message) is routed over it.
    ``link_capacity_bps`` is the capacity now; for a traced link it is the value last
    read from its trace. Co-located (loopback) messages count only in
    ``messages_local``.
    """

    time_s: float
    link_bytes: dict[str, int]
    link_busy_s: dict[str, float]
    link_capacity_bps: dict[str, float]
    dc_bytes: dict[tuple[str, str], int]
    messages_sent: int
    messages_delivered: int
    messages_dropped: int
    messages_local: int
    bytes_sent: int
    bytes_dropped: int
    wan_links: frozenset[str] = field(default_factory=frozenset)

    def utilisation(self, link: str, duration_s: float | None = None) -> float:
        """Mean fraction of ``link``'s current capacity used over ``duration_s``
        (default: the whole run so far)."""
        d = self.time_s if duration_s is None else duration_s
        cap = self.link_capacity_bps[link]
        if d <= 0 or cap <= 0:
            return 0.0
        return self.link_bytes[link] * 8.0 / (cap * d)

    @property
    def wan_bytes(self) -> int:
        """Bytes that crossed a DC boundary (each message counted once)."""
        return sum(b for (a, z), b in self.dc_bytes.items() if a != z)



class _Connection:
    """One (src, dst, channel) stream: a flow while it has backlog (its ``var`` is then
    enabled in the sharing solver, which sets the rate)."""

    __slots__ = (
        "src", "dst", "channel", "cls", "reliable", "path", "links", "cap_bps", "loopback",
        "queue", "qheap", "current", "remaining", "t_ref", "rate", "finish", "gen", "packet",
        "in_flight", "last_arrival", "var",
    )

    def __init__(self, system: SharingSystem, src: str, dst: str, channel: int,
                 path: Path | None) -> None:
        self.src = src
        self.dst = dst
        self.channel = channel
        self.cls = channel_class(channel)
        self.reliable = channel < UNRELIABLE_BASE
        self.path = path
        self.links = path.links if path is not None else ()
        self.loopback = path is None
        self.cap_bps = (path.reliable_cap_bps if self.reliable else _INF) if path else _INF
        # queue entries: (-priority, seq, msg, deliver, nbytes, dropped), served in that
        # order: a deque while every queued message has one priority (FIFO is that order,
        # for O(1) instead of a heap's O(log n)), a heap (``qheap``) from a second
        # priority on until it drains
        self.queue: deque[Any] | list[Any] = deque()
        self.qheap = False
        # current message: (msg, deliver, nbytes, dropped, t_start) or None when idle
        self.current: tuple[Any, Callable[[Any], None], int, bool, float] | None = None
        self.remaining = 0.0   # bytes of the current message left at time t_ref
        self.t_ref = 0.0
        self.rate = 0.0        # bit/s
        self.finish = _INF
        self.gen = 0
        self.packet = False    # current message sent as a single packet (not a flow)
        self.in_flight: deque[tuple[Any, Callable[[Any], None]]] = deque()
        self.last_arrival = -_INF
        # its share of the links, while it is a flow (none for loopback)
        self.var: Variable | None = (None if path is None else
                                     system.new_variable(self, self.cls, self.cap_bps,
                                                         path.constraints))

    def move_to(self, path: Path) -> None:
        """Carry on over ``path`` (a reroute); the caller updates the solver."""
        self.path = path
        self.links = path.links
        self.cap_bps = path.reliable_cap_bps if self.reliable else _INF

    def __repr__(self) -> str:
        return f"Connection({self.src}->{self.dst} ch{self.channel}, {self.rate:g} bps)"


class Network:
    """The emulated network: build it, then call :meth:`transmit` from inside a running
    :class:`~geomx.sim.loop.VirtualTimeLoop` (any asyncio loop works, but only the virtual
    one batches rate recomputations per instant)."""

    def __init__(self, *, seed: int = 0, tcp_window_bytes: int = 4 * 2**20,
                 mss_bytes: int = 1460, single_packet_bytes: int | None = None) -> None:
        """``single_packet_bytes`` (default ``mss_bytes``): a message no larger than this
        that finds its connection idle is one packet, not a flow: it is serialised at
        the share it would get (the smallest ``capacity / (busy connections + 1)`` on
        its path, within the flow cap) and does not trigger a rate recomputation, nor
        slow anyone else. Requests, acks and control messages are this size; treating
        them as flows would cost two max-min recomputations each for a change of rates
        lasting microseconds. ``0`` makes every message a flow."""
        if tcp_window_bytes <= 0 or mss_bytes <= 0:
            raise NetworkError("tcp_window_bytes and mss_bytes must be > 0")
        self.seed = seed
        self.tcp_window_bytes = tcp_window_bytes
        self.mss_bytes = mss_bytes
        self.single_packet_bytes = mss_bytes if single_packet_bytes is None else single_packet_bytes
        self.on_transfer: TransferHook | None = None
        self._rng = random.Random(seed)
        self._system = SharingSystem()
        self._topo = Topology(self._system, tcp_window_bytes=tcp_window_bytes,
                              mss_bytes=mss_bytes)
        self._conns: dict[tuple[str, str, int], _Connection] = {}
        # running state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heap: list[tuple[float, int, _Connection, int]] = []
        self._seq = 0
        self._dirty = False
        self._trace_timers: dict[Link, asyncio.TimerHandle] = {}  # busy traced links
        self._down: dict[Link, float] = {}  # failed links -> their capacity before
        self._timer_when = _INF       # when the completion timer is armed for (inf: not armed)
        self._timer_gen = 0           # the armed one's number; older ones fire as no-ops
        self._schedule_idle: Callable[..., Any] | None = None
        self._call_at_plain: Callable[[float, Callable[[Any], Any], Any], Any] | None = None
        self._deliver_cb = self._deliver_next
        # counters
        self.messages_sent = 0
        self.messages_delivered = 0
        self.messages_dropped = 0
        self.messages_local = 0
        self.bytes_sent = 0
        self.bytes_dropped = 0
        self.rate_recomputations = 0

    # -- building ------------------------------------------------------------------

    def add_dc(self, name: str, *, lan_delay_s: float) -> None:
        """Add a data centre; ``lan_delay_s`` is the one-way host-to-host delay inside it."""
        self._topo.add_dc(name, lan_delay_s=lan_delay_s)
        self._check_unsent()

    def add_host(self, host: str, dc: str, *, nic_bandwidth_bps: float,
                 nic_delay_s: float | None = None) -> None:
        """Attach ``host`` (a node name) to ``dc``'s switch by an up- and a downlink of
        ``nic_bandwidth_bps`` each. ``nic_delay_s`` defaults to half the DC's LAN delay,
        so host -> switch -> host takes ``lan_delay_s``."""
        self._topo.add_host(host, dc, nic_bandwidth_bps=nic_bandwidth_bps, nic_delay_s=nic_delay_s)
        self._check_unsent()

    def add_alias(self, name: str, host: str) -> None:
        """Run node ``name`` on ``host`` too (co-located nodes talk over loopback)."""
        self._topo.add_alias(name, host)
        self._check_unsent()

    def add_wan(self, dc_a: str, dc_b: str, *, bandwidth_bps: float, delay_s: float,
                loss: float = 0.0, jitter_s: float = 0.0,
                trace_ab: BandwidthTrace | None = None, trace_ba: BandwidthTrace | None = None,
                bandwidth_ba_bps: float | None = None) -> None:
        """Join two DCs by a pair of directed WAN links ``a->b`` and ``b->a``.

        ``bandwidth_ba_bps`` gives an asymmetric reverse capacity; a trace, when given,
        replaces the constant capacity of its direction. ``loss`` (a probability per
        message on unreliable channels, the ``p`` of the Mathis cap on reliable ones) and
        ``jitter_s`` (arrival times vary uniformly within +-jitter_s) apply to both
        directions.
        """
        self._topo.add_wan(dc_a, dc_b, bandwidth_bps=bandwidth_bps, delay_s=delay_s, loss=loss,
                           jitter_s=jitter_s, trace_ab=trace_ab, trace_ba=trace_ba,
                           bandwidth_ba_bps=bandwidth_ba_bps)
        self._check_unsent()

    def _check_unsent(self) -> None:
        if self._conns:
            raise NetworkError("the topology cannot change after the first message was sent")

    # -- queries -------------------------------------------------------------------

    @property
    def links(self) -> dict[str, Link]:
        """All directed links by name (read-only use, please)."""
        return self._topo.links

    @property
    def dcs(self) -> list[str]:
        return self._topo.dcs

    def has_node(self, name: str) -> bool:
        return self._topo.has_node(name)

    def host_of(self, name: str) -> str:
        """The host a node runs on (itself unless it is an alias)."""
        return self._topo.host_of(name)

    def host_dc(self, name: str) -> str:
        return self._topo.host_dc(name)

    def route(self, src: str, dst: str) -> tuple[str, ...]:
        """Names of the directed links a message from ``src`` to ``dst`` crosses
        (empty for co-located nodes)."""
        a, b = self.host_of(src), self.host_of(dst)
        return () if a == b else self._topo.path(a, b).link_names

    def path_delay_s(self, src: str, dst: str) -> float:
        """One-way propagation delay from ``src`` to ``dst`` (no jitter, no queueing)."""
        a, b = self.host_of(src), self.host_of(dst)
        return 0.0 if a == b else self._topo.path(a, b).delay_s

    def path_loss(self, src: str, dst: str) -> float:
        """Probability that an unreliable message from ``src`` to ``dst`` is dropped."""
        a, b = self.host_of(src), self.host_of(dst)
        return 0.0 if a == b else self._topo.path(a, b).loss

    def flow_cap_bps(self, src: str, dst: str, channel: int = 0) -> float:
        """Per-flow rate cap on a channel: window/RTT and Mathis for reliable channels."""
        a, b = self.host_of(src), self.host_of(dst)
        if a == b or channel >= UNRELIABLE_BASE:
            return _INF
        return self._topo.path(a, b).reliable_cap_bps

    # -- the hot path ---------------------------------------------------------------

    def transmit(self, msg: MessageLike, deliver: Callable[[Any], None]) -> None:
        """Send ``msg`` on its ``(src, dst, channel)`` connection; ``deliver(msg)`` is
        called at its arrival time (never, if an unreliable channel drops it)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            # (asyncio.get_running_loop() makes a getpid() system call each time: ask it
            # only when the loop this network is bound to is not the one running)
            loop = _running_loop()
            if loop is not self._loop:
                self._bind(loop)
        src = msg.src
        dst = msg.dst
        if src == dst:
            self.messages_local += 1
            loop.call_soon(deliver, msg)
            return
        key = (src, dst, msg.channel)
        conn = self._conns.get(key)
        if conn is None:
            conn = self._open(key)
        if conn.loopback:
            self.messages_local += 1
            loop.call_soon(deliver, msg)
            return
        nbytes = msg.nbytes
        self.messages_sent += 1
        self.bytes_sent += nbytes
        dropped = False
        if not conn.reliable:
            loss = conn.path.loss
            if loss > 0.0 and self._rng.random() < loss:
                dropped = True
        if conn.current is not None:
            seq = self._seq = self._seq + 1
            entry = (-msg.priority, seq, msg, deliver, nbytes, dropped)
            queue = conn.queue
            if conn.qheap:
                heapq.heappush(queue, entry)
            elif not queue or queue[0][0] == entry[0]:
                queue.append(entry)
            else:
                heap = list(queue)  # one priority in seq order: a valid heap already
                heapq.heappush(heap, entry)
                conn.queue = heap
                conn.qheap = True
            return
        self._start(conn, msg, deliver, nbytes, dropped, loop.time())
        if conn.packet:
            self._arm_timer()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach to the running loop on first use (or to a new loop once idle)."""
        if self._loop is not None:
            if self._system.n_enabled or any(c.current is not None or c.in_flight
                                             for c in self._conns.values()):
                raise NetworkError("this Network still has traffic on another event loop; "
                                   "build one Network per emulated run")
        self._loop = loop
        self._schedule_idle = getattr(loop, "call_when_idle", None) or loop.call_soon
        self._call_at_plain = getattr(loop, "call_at_plain", None) or loop.call_at
        self._timer_gen += 1
        self._timer_when = _INF
        self._dirty = False
        self._heap.clear()

    def _open(self, key: tuple[str, str, int]) -> _Connection:
        src, dst, channel = key
        if channel < 0:
            raise NetworkError(f"message {src}->{dst}: channel must be >= 0, got {channel}")
        a, b = self.host_of(src), self.host_of(dst)
        conn = _Connection(self._system, src, dst, channel,
                           None if a == b else self._topo.path(a, b))
        self._conns[key] = conn
        return conn

    def _start(self, conn: _Connection, msg: Any, deliver: Callable[[Any], None],
               nbytes: int, dropped: bool, now: float) -> None:
        """Start sending ``msg`` on the idle connection ``conn`` at time ``now``: as a
        single packet if it is small enough, else by making the connection a flow."""
        conn.current = (msg, deliver, nbytes, dropped, now)
        conn.remaining = float(nbytes)
        conn.t_ref = now
        if nbytes <= self.single_packet_bytes:
            rate = conn.cap_bps
            for link in conn.links:
                c = link.constraint
                n = c.n_vars
                cap = c.capacity_bps
                if not n and link.trace is not None and link not in self._down:
                    cap = link.trace.rate_at(now)
                share = cap / (n + 1)
                if share < rate:
                    rate = share
            if rate > 0.0:
                conn.packet = True
                conn.rate = rate
                finish = conn.finish = now + nbytes * 8.0 / rate
                conn.gen += 1
                seq = self._seq = self._seq + 1
                heapq.heappush(self._heap, (finish, seq, conn, conn.gen))
                return
        conn.packet = False
        conn.rate = 0.0
        conn.finish = _INF
        self._activate(conn, now)

    def _activate(self, conn: _Connection, now: float) -> None:
        """``conn`` becomes a flow: the solver shares its links with it from now on."""
        self._system.enable(conn.var, now)
        if conn.path.traced_links:
            self._occupied(conn.path, now)
        if not self._dirty:
            self._dirty = True
            self._schedule_idle(self._recompute)

    def _deactivate(self, conn: _Connection, now: float) -> None:
        conn.rate = 0.0
        conn.finish = _INF
        conn.gen += 1
        self._system.disable(conn.var, now)
        if conn.path.traced_links:
            self._vacated(conn.path)
        if not self._dirty:
            self._dirty = True
            self._schedule_idle(self._recompute)

    def _occupied(self, path: Path, now: float) -> None:
        """A flow joined ``path``: a traced link it made busy reads its trace."""
        for link in path.traced_links:
            c = link.constraint
            if c.n_vars == 1 and link not in self._down:
                self._system.set_capacity(c, link.trace.rate_at(now))
                self._arm_trace(link, now)

    def _vacated(self, path: Path) -> None:
        """A flow left ``path``: a traced link left idle stops following its trace."""
        for link in path.traced_links:
            if not link.constraint.n_vars:
                timer = self._trace_timers.pop(link, None)
                if timer is not None:
                    timer.cancel()

    def _changed(self) -> None:
        """Rates may have changed: recompute them once this virtual instant is done."""
        if not self._dirty:
            self._dirty = True
            self._schedule_idle(self._recompute)

    # -- traces ----------------------------------------------------------------------

    def _arm_trace(self, link: Link, now: float) -> None:
        t_next = link.trace.next_change_after(now)
        if t_next < _INF:
            self._trace_timers[link] = self._loop.call_at(t_next, self._on_trace_step, link)

    def _on_trace_step(self, link: Link) -> None:
        self._trace_timers.pop(link, None)
        c = link.constraint
        if c.n_vars == 0:
            return
        now = self._loop.time()
        rate = 0.0 if link in self._down else link.trace.rate_at(now)
        if rate != c.capacity_bps:
            self._system.set_capacity(c, rate)
            self._system.mark_changed(c)
            self._changed()
        self._arm_trace(link, now)

    # -- link failures ---------------------------------------------------------------

    def set_link_state(self, down: frozenset[frozenset[str]],
                       rerouted: frozenset[frozenset[str]]) -> None:
        """Apply a routing state of :func:`geomx.topology.link_faults.link_timeline`.

        ``down`` WAN links (both directions) get capacity 0, so flows over them stall with
        their bytes kept; ``rerouted`` ones are left out of routes, and every connection
        moves to its new route, a flow in progress included (its remaining bytes continue
        there). Messages already past a failed link's serialisation arrive (they were on
        the wire); partially sent ones are counted on the route they finish on.
        """
        wan = self._topo.wan_links
        for edge in set(down) | set(rerouted):
            pair = tuple(edge)
            if len(pair) != 2 or pair not in wan:
                raise NetworkError(f"link state: {sorted(edge)} is not a WAN link")
        now = self._loop.time() if self._loop is not None else 0.0
        system = self._system
        changed = False
        for (a, b), link in wan.items():
            fail = frozenset((a, b)) in down
            if fail == (link in self._down):
                continue
            changed = True
            c = link.constraint
            if fail:
                self._down[link] = c.capacity_bps
                system.set_capacity(c, 0.0)
            else:
                up_bps = self._down.pop(link)
                system.set_capacity(c, link.trace.rate_at(now) if link.trace is not None
                                    else up_bps)
        if self._topo.reroute(rerouted):
            for conn in self._conns.values():
                if not conn.loopback:
                    self._move(conn, self._topo.path(self.host_of(conn.src),
                                                     self.host_of(conn.dst)), now)
            changed = True
        if changed and system.n_enabled and self._loop is not None:
            system.mark_all_changed()
            self._changed()

    def _move(self, conn: _Connection, path: Path, now: float) -> None:
        """Put ``conn`` on ``path`` (a reroute), keeping the links' flow counts right."""
        system = self._system
        var = conn.var
        active = system.is_enabled(var)
        if active:
            system.detach(var, now)
            self._vacated(conn.path)
        conn.move_to(path)
        system.reroute(var, path.constraints, conn.cap_bps)
        if active:
            system.attach(var, now)
            self._occupied(path, now)

    # -- rate allocation --------------------------------------------------------------

    def _recompute(self) -> None:
        """Max-min fair rates from the solver for the flows a change can affect, then
        re-time the flows whose rate changed (lazily: ``remaining -= old_rate * elapsed``)."""
        self._dirty = False
        flows = self._system.solve()
        if flows is None:
            return
        self.rate_recomputations += 1
        if not flows:
            self._arm_timer()
            return
        now = self._loop.time()
        changed = []
        for var in flows:
            new = var.value_bps
            conn = var.owner
            old = conn.rate
            if new == old:
                continue
            if old > 0.0:
                rem = conn.remaining - old * (now - conn.t_ref) / 8.0
                conn.remaining = rem if rem > 0.0 else 0.0
            conn.t_ref = now
            conn.rate = new
            conn.gen += 1
            if new > 0.0:
                conn.finish = now + conn.remaining * 8.0 / new
                changed.append(conn)
            else:
                conn.finish = _INF
        if changed:
            heap = self._heap
            seq = self._seq
            if len(heap) + len(changed) > 2 * self._system.n_enabled + 64:
                # Mostly stale entries: rebuild instead of growing the heap.
                heap = [e for e in heap if e[3] == e[2].gen]
                for conn in changed:
                    seq += 1
                    heap.append((conn.finish, seq, conn, conn.gen))
                heapq.heapify(heap)
                self._heap = heap
            else:
                for conn in changed:
                    seq += 1
                    heapq.heappush(heap, (conn.finish, seq, conn, conn.gen))
            self._seq = seq
        self._arm_timer()

    # -- completions --------------------------------------------------------------------

    def _arm_timer(self) -> None:
        heap = self._heap
        while heap and heap[0][3] != heap[0][2].gen:
            heapq.heappop(heap)
        if not heap:
            return
        when = heap[0][0]
        if when < self._timer_when:
            # A plain timer, not a cancellable handle: one armed earlier for a later time
            # fires as a no-op (its number is no longer the armed one). It runs alone at
            # an instant where nothing else happens, or among others as a no-op: the
            # order of everything else is the same as with a cancelled handle.
            self._timer_when = when
            gen = self._timer_gen = self._timer_gen + 1
            self._call_at_plain(when, self._on_timer, gen)

    def _deliver_next(self, conn: _Connection) -> None:
        """An arrival timer of ``conn`` fired: deliver its oldest message in flight.

        Arrival timers of one connection are non-decreasing, and each one delivers the
        oldest message in flight, so order holds even when timers tie."""
        msg, deliver = conn.in_flight.popleft()
        self.messages_delivered += 1
        deliver(msg)

    def _on_timer(self, gen: int) -> None:
        """Finish every message whose last byte has left by now; start the next ones."""
        if gen != self._timer_gen:
            return  # re-armed for an earlier time since
        self._timer_gen = gen + 1
        self._timer_when = _INF
        loop = self._loop
        now = loop.time()
        limit = now + _FINISH_TOLERANCE_S
        heap = self._heap
        heappop = heapq.heappop
        heappush = heapq.heappush
        hook = self.on_transfer
        call_at_plain = self._call_at_plain
        deliver_next = self._deliver_cb
        while heap and heap[0][0] <= limit:
            finish, _, conn, gen = heappop(heap)
            if gen != conn.gen:
                continue
            msg, deliver, nbytes, dropped, t_start = conn.current
            path = conn.path
            path.bytes += nbytes
            path.messages += 1
            arrival = finish + path.delay_s
            if dropped:
                self.messages_dropped += 1
                self.bytes_dropped += nbytes
            else:
                if path.jitter_s > 0.0:
                    arrival += (2.0 * self._rng.random() - 1.0) * path.jitter_s
                    if arrival < finish:
                        arrival = finish
                if arrival < conn.last_arrival:
                    arrival = conn.last_arrival
                conn.last_arrival = arrival
                conn.in_flight.append((msg, deliver))
                call_at_plain(arrival, deliver_next, conn)
            if hook is not None:
                hook(msg, t_start, arrival, path.link_names, dropped)
            queue = conn.queue
            if conn.packet:
                conn.packet = False
                conn.current = None
                if queue:
                    _, _, msg, deliver, nbytes, dropped = (
                        self._pop_heap(conn) if conn.qheap else queue.popleft())
                    self._start(conn, msg, deliver, nbytes, dropped, finish)
                    heap = self._heap
            elif queue:
                # The connection stays busy: same rate, no recomputation.
                _, _, msg, deliver, nbytes, dropped = (
                    self._pop_heap(conn) if conn.qheap else queue.popleft())
                conn.current = (msg, deliver, nbytes, dropped, finish)
                conn.remaining = float(nbytes)
                conn.t_ref = finish
                rate = conn.rate
                if rate > 0.0:
                    finish = finish + nbytes * 8.0 / rate
                    conn.finish = finish
                    self._seq += 1
                    heappush(heap, (finish, self._seq, conn, gen))
                else:
                    conn.finish = _INF
            else:
                conn.current = None
                self._deactivate(conn, now)
        self._arm_timer()

    @staticmethod
    def _pop_heap(conn: _Connection) -> tuple[Any, ...]:
        """The next queued message of a connection whose queue holds several priorities
        (back to a FIFO deque once it drains)."""
        entry = heapq.heappop(conn.queue)
        if not conn.queue:
            conn.queue = deque()
            conn.qheap = False
        return entry

    # -- reporting ------------------------------------------------------------------------

    def stats(self) -> NetworkStats:
        """Counters so far. Link bytes are summed from per-path counters here, so the
        per-message path touches no per-link state."""
        now = self._loop.time() if self._loop is not None else 0.0
        links = self._topo.links
        link_bytes = {name: 0 for name in links}
        dc_bytes: dict[tuple[str, str], int] = {}
        for path in self._topo.all_paths():
            if not path.bytes:
                continue
            for name in path.link_names:
                link_bytes[name] += path.bytes
            key = (path.src_dc, path.dst_dc)
            dc_bytes[key] = dc_bytes.get(key, 0) + path.bytes
        busy = {}
        for name, link in links.items():
            c = link.constraint
            b = c.busy_s
            if c.n_vars:
                b += max(0.0, now - c.busy_since)
            busy[name] = b
        return NetworkStats(
            time_s=now,
            link_bytes=link_bytes,
            link_busy_s=busy,
            link_capacity_bps={n: link.capacity_bps for n, link in links.items()},
            dc_bytes=dc_bytes,
            messages_sent=self.messages_sent,
            messages_delivered=self.messages_delivered,
            messages_dropped=self.messages_dropped,
            messages_local=self.messages_local,
            bytes_sent=self.bytes_sent,
            bytes_dropped=self.bytes_dropped,
            wan_links=frozenset(n for n, link in links.items() if link.is_wan),
        )

    def connection_rate_bps(self, src: str, dst: str, channel: int = 0) -> float:
        """Current rate of a connection (0 when idle); for tests and probes."""
        conn = self._conns.get((src, dst, channel))
        return conn.rate if conn is not None and conn.current is not None else 0.0
