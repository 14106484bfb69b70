"""Flow-level WAN/LAN model for the virtual-time emulator.

The model, and why it has this shape
------------------------------------

*Topology.* Each data centre (DC) has one non-blocking switch. A host hangs off its DC
switch by two directed NIC links (uplink ``host->sw:dc`` and downlink ``sw:dc->host``),
each with the NIC capacity, so in-cast at a parameter server's NIC shows up as it does in
GeoMX. DC switches are joined by directed WAN links (``a->b`` and ``b->a``) with their own
capacity, propagation delay, loss, jitter and optional bandwidth trace. Routes between DCs
are the fewest-hop paths (ties broken by lower delay) in a networkx graph, computed once
per host pair and cached; networkx is never called per message.

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

*Rates.* Max-min fair sharing computed by progressive filling (water-filling) over all
directed links on each flow's path (Bertsekas & Gallager, *Data Networks*, §6.5.2).
Strict priority classes are served one after the other: the class of channel 0 is
filled first, lower classes share what remains. Each reliable flow is also capped at
``tcp_window_bytes * 8 / RTT`` (a window-limited TCP), and on a lossy path at the Mathis
et al. steady-state TCP throughput ``(MSS * 8 / RTT) * 1.22 / sqrt(p)`` ("The macroscopic
behavior of the TCP congestion avoidance algorithm", CCR 1997): reliable channels turn
loss into lower throughput and never drop. Unreliable channels (``channel >= 8``) have no
cap and drop each message with the path loss probability ``1 - prod(1 - loss_link)``.

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

import networkx as nx

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


class NetworkError(ValueError):
    """A topology or addressing mistake; the message names the offending item."""


def channel_class(channel: int) -> int:
    """Strict-priority class of a channel: lower is served first.

    Reliable channels 0..7 are classes 0..7; unreliable channel ``8 + k`` shares class
    ``k`` with reliable channel ``k`` (a datagram channel is a transport choice, not a
    priority choice).
    """
    if channel >= UNRELIABLE_BASE:
        channel -= UNRELIABLE_BASE
    return channel if channel > 0 else 0


class Link:
    """One direction of a NIC or WAN link.

    ``capacity_bps`` is the current capacity (it follows ``trace`` while the link
    carries traffic). ``bytes`` is not stored here: it is derived from per-path counters
    in :meth:`Network.stats` to keep the per-message path free of per-link work.
    """

    __slots__ = (
        "name", "src", "dst", "capacity_bps", "delay_s", "loss", "jitter_s", "is_wan",
        "trace", "n_active", "busy_s", "_busy_since", "_trace_timer",
        "_rmark", "_cmark", "_resid", "_n", "down", "_up_bps", "_flows", "_bseq", "_vmark",
    )

    def __init__(self, name: str, src: str, dst: str, *, capacity_bps: float, delay_s: float,
                 loss: float = 0.0, jitter_s: float = 0.0, is_wan: bool = False,
                 trace: BandwidthTrace | None = None) -> None:
        self.name = name
        self.src = src
        self.dst = dst
        self.capacity_bps = float(capacity_bps)
        self.delay_s = float(delay_s)
        self.loss = float(loss)
        self.jitter_s = float(jitter_s)
        self.is_wan = is_wan
        self.trace = trace
        self.n_active = 0
        self.busy_s = 0.0
        self._busy_since = 0.0
        self._trace_timer: asyncio.TimerHandle | None = None
        self._rmark = -1
        self._cmark = -1
        self._resid = 0.0
        self._n = 0
        self.down = False      # a failed link: capacity 0 until it comes back
        self._up_bps = self.capacity_bps
        self._flows: dict[_Connection, None] = {}  # the flows on it now
        self._bseq = 0         # when it last became busy (orders busy links)
        self._vmark = -1

    def __repr__(self) -> str:
        return (f"Link({self.name!r}, {self.capacity_bps:g} bps, {self.delay_s:g} s"
                f"{', loss=%g' % self.loss if self.loss else ''}{', WAN' if self.is_wan else ''})")


class _Path:
    """A cached route between two hosts, with everything the hot path needs."""

    __slots__ = ("links", "link_names", "delay_s", "jitter_s", "loss", "rtt_s",
                 "reliable_cap_bps", "src_dc", "dst_dc", "bytes", "messages")

    def __init__(self, links: tuple[Link, ...], src_dc: str, dst_dc: str, rtt_s: float,
                 reliable_cap_bps: float) -> None:
        self.links = links
        self.link_names = tuple(link.name for link in links)
        self.delay_s = sum(link.delay_s for link in links)
        self.jitter_s = sum(link.jitter_s for link in links)
        keep = 1.0
        for link in links:
            keep *= 1.0 - link.loss
        self.loss = 1.0 - keep
        self.rtt_s = rtt_s
        self.reliable_cap_bps = reliable_cap_bps
        self.src_dc = src_dc
        self.dst_dc = dst_dc
        self.bytes = 0
        self.messages = 0


def _deliver_next(conn: _Connection) -> None:
    """An arrival timer of ``conn`` fired: deliver its oldest message in flight.

    Arrival timers of one connection are non-decreasing, and each one delivers the
    oldest message in flight, so order holds even when timers tie."""
    msg, deliver = conn.in_flight.popleft()
    conn._network.messages_delivered += 1
    deliver(msg)


class _Connection:
    """One (src, dst, channel) stream: a flow while it has backlog."""

    __slots__ = (
        "src", "dst", "channel", "cls", "reliable", "path", "links", "cap_bps", "loopback",
        "queue", "qheap", "current", "remaining", "t_ref", "rate", "finish", "gen", "packet",
        "in_flight", "last_arrival", "_new", "_fz", "_network", "_aseq", "_vmark",
    )

    def __init__(self, network: Network, src: str, dst: str, channel: int, path: _Path | None) -> None:
        self._network = network
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
        self._new = 0.0
        self._fz = -1
        self._aseq = 0         # when it last became a flow (orders the active flows)
        self._vmark = -1

    def __repr__(self) -> str:
        return f"Connection({self.src}->{self.dst} ch{self.channel}, {self.rate:g} bps)"


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


class _Host:
    __slots__ = ("name", "dc", "uplink", "downlink")

    def __init__(self, name: str, dc: str, uplink: Link, downlink: Link) -> None:
        self.name = name
        self.dc = dc
        self.uplink = uplink
        self.downlink = downlink


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
        self._graph = nx.DiGraph()
        self._dc_lan_delay_s: dict[str, float] = {}
        self._hosts: dict[str, _Host] = {}
        self._alias: dict[str, str] = {}
        self._links: dict[str, Link] = {}
        self._wan: dict[tuple[str, str], Link] = {}
        self._paths: dict[tuple[str, str], _Path] = {}
        self._retired_paths: list[_Path] = []  # replaced by rerouting; their bytes still count
        self._rerouted: frozenset[frozenset[str]] = frozenset()  # links routes avoid
        self._dc_routes: dict[tuple[str, str], list[str]] = {}
        self._conns: dict[tuple[str, str, int], _Connection] = {}
        # running state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active: dict[_Connection, None] = {}
        self._active_by_class: dict[int, dict[_Connection, None]] = {}
        self._busy_links: dict[Link, None] = {}
        self._heap: list[tuple[float, int, _Connection, int]] = []
        self._seq = 0
        self._epoch = 0
        self._dirty = False
        self._seeds: list[Link] = []  # links whose flows or capacity changed since the last recompute
        self._full = False            # recompute every flow (after a reroute)
        self._order = 0               # activation / busy-link order stamps
        self._timer_when = _INF       # when the completion timer is armed for (inf: not armed)
        self._timer_gen = 0           # the armed one's number; older ones fire as no-ops
        self._schedule_idle: Callable[..., Any] | None = None
        self._call_at_plain: Callable[[float, Callable[[Any], Any], Any], Any] | None = None
        # on a VirtualTimeLoop: its timer heap and sequence counter, pushed to directly
        self._loop_timers: list[Any] | None = None
        self._loop_seq: Any = None
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
        if name in self._dc_lan_delay_s:
            raise NetworkError(f"DC {name!r} already exists")
        _check_nonneg(lan_delay_s, f"DC {name!r}: lan_delay_s")
        self._dc_lan_delay_s[name] = float(lan_delay_s)
        self._graph.add_node(name)
        self._invalidate()

    def add_host(self, host: str, dc: str, *, nic_bandwidth_bps: float,
                 nic_delay_s: float | None = None) -> None:
        """Attach ``host`` (a node name) to ``dc``'s switch by an up- and a downlink of
        ``nic_bandwidth_bps`` each. ``nic_delay_s`` defaults to half the DC's LAN delay,
        so host -> switch -> host takes ``lan_delay_s``."""
        if dc not in self._dc_lan_delay_s:
            raise NetworkError(f"host {host!r}: unknown DC {dc!r}; known: {sorted(self._dc_lan_delay_s)}")
        if host in self._hosts or host in self._alias:
            raise NetworkError(f"host {host!r} already exists")
        _check_positive(nic_bandwidth_bps, f"host {host!r}: nic_bandwidth_bps")
        delay_s = self._dc_lan_delay_s[dc] / 2 if nic_delay_s is None else nic_delay_s
        _check_nonneg(delay_s, f"host {host!r}: nic_delay_s")
        sw = f"sw:{dc}"
        up = self._new_link(Link(f"{host}->{sw}", host, sw, capacity_bps=nic_bandwidth_bps,
                                 delay_s=delay_s))
        down = self._new_link(Link(f"{sw}->{host}", sw, host, capacity_bps=nic_bandwidth_bps,
                                   delay_s=delay_s))
        self._hosts[host] = _Host(host, dc, up, down)
        self._invalidate()

    def add_alias(self, name: str, host: str) -> None:
        """Run node ``name`` on ``host`` too (co-located nodes talk over loopback)."""
        if host not in self._hosts:
            raise NetworkError(f"alias {name!r}: unknown host {host!r}")
        if name in self._hosts or name in self._alias:
            raise NetworkError(f"node {name!r} already exists")
        self._alias[name] = host
        self._invalidate()

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
        for dc in (dc_a, dc_b):
            if dc not in self._dc_lan_delay_s:
                raise NetworkError(f"WAN {dc_a}<->{dc_b}: unknown DC {dc!r}; "
                                   f"known: {sorted(self._dc_lan_delay_s)}")
        if dc_a == dc_b:
            raise NetworkError(f"WAN {dc_a}<->{dc_b}: a WAN link joins two different DCs")
        if (dc_a, dc_b) in self._wan or (dc_b, dc_a) in self._wan:
            raise NetworkError(f"WAN {dc_a}<->{dc_b} already exists")
        where = f"WAN {dc_a}<->{dc_b}"
        _check_positive(bandwidth_bps, f"{where}: bandwidth_bps")
        ba_bps = bandwidth_bps if bandwidth_ba_bps is None else bandwidth_ba_bps
        _check_positive(ba_bps, f"{where}: bandwidth_ba_bps")
        _check_nonneg(delay_s, f"{where}: delay_s")
        _check_nonneg(jitter_s, f"{where}: jitter_s")
        if not (0.0 <= loss < 1.0):
            raise NetworkError(f"{where}: loss must be in [0, 1), got {loss!r}")
        for a, b, bps, trace in ((dc_a, dc_b, bandwidth_bps, trace_ab),
                                 (dc_b, dc_a, ba_bps, trace_ba)):
            cap = bps if trace is None else trace.rate_at(0.0)
            link = self._new_link(Link(f"{a}->{b}", a, b, capacity_bps=cap, delay_s=delay_s,
                                       loss=loss, jitter_s=jitter_s, is_wan=True, trace=trace))
            self._wan[(a, b)] = link
            # Fewest hops first, then lowest delay (delays are far below 1e6 s).
            self._graph.add_edge(a, b, route_weight=1.0 + float(delay_s) * 1e-6)
        self._invalidate()

    def _new_link(self, link: Link) -> Link:
        if link.name in self._links:
            raise NetworkError(f"link {link.name!r} already exists")
        self._links[link.name] = link
        return link

    def _invalidate(self) -> None:
        if self._conns:
            raise NetworkError("the topology cannot change after the first message was sent")
        self._paths.clear()
        self._dc_routes.clear()

    # -- queries -------------------------------------------------------------------

    @property
    def links(self) -> dict[str, Link]:
        """All directed links by name (read-only use, please)."""
        return self._links

    @property
    def dcs(self) -> list[str]:
        return list(self._dc_lan_delay_s)

    def has_node(self, name: str) -> bool:
        return name in self._hosts or name in self._alias

    def host_of(self, name: str) -> str:
        """The host a node runs on (itself unless it is an alias)."""
        if name in self._hosts:
            return name
        try:
            return self._alias[name]
        except KeyError:
            raise NetworkError(f"unknown node {name!r}: add it with add_host or add_alias") from None

    def host_dc(self, name: str) -> str:
        return self._hosts[self.host_of(name)].dc

    def route(self, src: str, dst: str) -> tuple[str, ...]:
        """Names of the directed links a message from ``src`` to ``dst`` crosses
        (empty for co-located nodes)."""
        a, b = self.host_of(src), self.host_of(dst)
        return () if a == b else self._path(a, b).link_names

    def path_delay_s(self, src: str, dst: str) -> float:
        """One-way propagation delay from ``src`` to ``dst`` (no jitter, no queueing)."""
        a, b = self.host_of(src), self.host_of(dst)
        return 0.0 if a == b else self._path(a, b).delay_s

    def flow_cap_bps(self, src: str, dst: str, channel: int = 0) -> float:
        """Per-flow rate cap on a channel: window/RTT and Mathis for reliable channels."""
        a, b = self.host_of(src), self.host_of(dst)
        if a == b or channel >= UNRELIABLE_BASE:
            return _INF
        return self._path(a, b).reliable_cap_bps

    def _dc_route(self, dc_a: str, dc_b: str) -> list[str]:
        key = (dc_a, dc_b)
        route = self._dc_routes.get(key)
        if route is None:
            route = None
            if self._rerouted:
                # after a link failure: around the failed links if the rest still
                # connects the DCs, else over them (the traffic stalls until they return)
                avoid = self._rerouted
                live = nx.subgraph_view(self._graph,
                                        filter_edge=lambda u, v: frozenset((u, v)) not in avoid)
                try:
                    route = nx.shortest_path(live, dc_a, dc_b, weight="route_weight")
                except nx.NetworkXNoPath:
                    pass
            if route is None:
                try:
                    route = nx.shortest_path(self._graph, dc_a, dc_b, weight="route_weight")
                except nx.NetworkXNoPath:
                    raise NetworkError(f"no WAN route from DC {dc_a!r} to DC {dc_b!r}") from None
            self._dc_routes[key] = route
        return route

    def _links_between(self, a: str, b: str) -> tuple[Link, ...]:
        ha, hb = self._hosts[a], self._hosts[b]
        links = [ha.uplink]
        if ha.dc != hb.dc:
            route = self._dc_route(ha.dc, hb.dc)
            links.extend(self._wan[(x, y)] for x, y in zip(route, route[1:]))
        links.append(hb.downlink)
        return tuple(links)

    def _path(self, a: str, b: str) -> _Path:
        key = (a, b)
        path = self._paths.get(key)
        if path is not None:
            return path
        links = self._links_between(a, b)
        fwd_delay = sum(link.delay_s for link in links)
        try:
            rev_delay = sum(link.delay_s for link in self._links_between(b, a))
        except NetworkError:
            rev_delay = fwd_delay  # no reverse route: assume a symmetric one
        rtt_s = fwd_delay + rev_delay
        keep = 1.0
        for link in links:
            keep *= 1.0 - link.loss
        loss = 1.0 - keep
        cap = _INF
        if rtt_s > 0:
            cap = self.tcp_window_bytes * 8.0 / rtt_s
            if loss > 0:
                # Mathis et al. 1997: BW = (MSS / RTT) * C / sqrt(p), C = sqrt(3/2) ~ 1.22.
                cap = min(cap, (self.mss_bytes * 8.0 / rtt_s) * 1.22 / math.sqrt(loss))
        path = _Path(links, self._hosts[a].dc, self._hosts[b].dc, rtt_s, cap)
        self._paths[key] = path
        return path

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
            if self._active or any(c.current is not None or c.in_flight
                                   for c in self._conns.values()):
                raise NetworkError("this Network still has traffic on another event loop; "
                                   "build one Network per emulated run")
        self._loop = loop
        self._schedule_idle = getattr(loop, "call_when_idle", None) or loop.call_soon
        self._call_at_plain = getattr(loop, "call_at_plain", None) or loop.call_at
        heap_of = getattr(loop, "plain_timer_heap", None)
        self._loop_timers, self._loop_seq = heap_of() if heap_of is not None else (None, None)
        self._timer_gen += 1
        self._timer_when = _INF
        self._dirty = False
        self._heap.clear()

    def _open(self, key: tuple[str, str, int]) -> _Connection:
        src, dst, channel = key
        if channel < 0:
            raise NetworkError(f"message {src}->{dst}: channel must be >= 0, got {channel}")
        a, b = self.host_of(src), self.host_of(dst)
        conn = _Connection(self, src, dst, channel, None if a == b else self._path(a, b))
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
                n = link.n_active
                cap = link.capacity_bps
                if not n and link.trace is not None and not link.down:
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
        self._active[conn] = None
        self._order += 1
        conn._aseq = self._order
        group = self._active_by_class.get(conn.cls)
        if group is None:
            self._active_by_class[conn.cls] = {conn: None}
        else:
            group[conn] = None
        self._occupy(conn, now)
        self._seeds.extend(conn.links)
        if not self._dirty:
            self._dirty = True
            self._schedule_idle(self._recompute)

    def _occupy(self, conn: _Connection, now: float) -> None:
        """``conn`` becomes a flow on its links: an idle link becomes busy (and reads its trace)."""
        for link in conn.links:
            if link.n_active == 0:
                self._busy_links[link] = None
                self._order += 1
                link._bseq = self._order
                link._busy_since = now
                trace = link.trace
                if trace is not None and not link.down:
                    link.capacity_bps = trace.rate_at(now)
                    self._arm_trace(link, now)
            link.n_active += 1
            link._flows[conn] = None

    def _vacate(self, conn: _Connection, now: float) -> None:
        """``conn`` leaves its links: a link left idle books its busy time."""
        for link in conn.links:
            link.n_active -= 1
            del link._flows[conn]
            if link.n_active == 0:
                del self._busy_links[link]
                link.busy_s += now - link._busy_since
                if link._trace_timer is not None:
                    link._trace_timer.cancel()
                    link._trace_timer = None

    def _deactivate(self, conn: _Connection, now: float) -> None:
        del self._active[conn]
        group = self._active_by_class[conn.cls]
        del group[conn]
        if not group:
            del self._active_by_class[conn.cls]
        conn.rate = 0.0
        conn.finish = _INF
        conn.gen += 1
        self._vacate(conn, now)
        self._seeds.extend(conn.links)
        if not self._dirty:
            self._dirty = True
            self._schedule_idle(self._recompute)

    # -- traces ----------------------------------------------------------------------

    def _arm_trace(self, link: Link, now: float) -> None:
        t_next = link.trace.next_change_after(now)
        if t_next < _INF:
            link._trace_timer = self._loop.call_at(t_next, self._on_trace_step, link)

    def _on_trace_step(self, link: Link) -> None:
        link._trace_timer = None
        if link.n_active == 0:
            return
        now = self._loop.time()
        rate = 0.0 if link.down else link.trace.rate_at(now)
        if rate != link.capacity_bps:
            link.capacity_bps = rate
            self._seeds.append(link)
            if not self._dirty:
                self._dirty = True
                self._schedule_idle(self._recompute)
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
        for edge in set(down) | set(rerouted):
            pair = tuple(edge)
            if len(pair) != 2 or pair not in self._wan:
                raise NetworkError(f"link state: {sorted(edge)} is not a WAN link")
        now = self._loop.time() if self._loop is not None else 0.0
        changed = False
        for (a, b), link in self._wan.items():
            fail = frozenset((a, b)) in down
            if fail == link.down:
                continue
            changed = True
            link.down = fail
            if fail:
                link._up_bps = link.capacity_bps
                link.capacity_bps = 0.0
            else:
                link.capacity_bps = (link.trace.rate_at(now) if link.trace is not None
                                     else link._up_bps)
        if frozenset(rerouted) != self._rerouted:
            self._rerouted = frozenset(rerouted)
            self._dc_routes.clear()
            self._retired_paths.extend(self._paths.values())
            self._paths.clear()
            for conn in self._conns.values():
                if not conn.loopback:
                    self._move(conn, self._path(self.host_of(conn.src), self.host_of(conn.dst)),
                               now)
            changed = True
        if changed and self._active and self._loop is not None:
            self._full = True
            if not self._dirty:
                self._dirty = True
                self._schedule_idle(self._recompute)

    def _move(self, conn: _Connection, path: _Path, now: float) -> None:
        """Put ``conn`` on ``path`` (a reroute), keeping the links' flow counts right."""
        active = conn in self._active
        if active:
            self._vacate(conn, now)
        conn.path = path
        conn.links = path.links
        conn.cap_bps = path.reliable_cap_bps if conn.reliable else _INF
        if active:
            self._occupy(conn, now)

    # -- rate allocation --------------------------------------------------------------

    def _affected(self) -> tuple[list[_Connection], list[Link]]:
        """The flows whose rates may change, and their links: the connected components
        (flows joined by shared links) of the links changed since the last recompute.

        Max-min fair shares of one component do not depend on any other (progressive
        filling touches only the links of the flows it freezes), so the rest keep their
        rates exactly. Flows are listed in activation order and links in the order they
        became busy, the order a recompute over everything visits them in, so every
        floating-point operation, tie and heap sequence number is the same as there:
        the cost of a recompute follows the traffic that changed, not the network's size.
        """
        seeds = self._seeds
        self._seeds = []
        active = self._active
        if self._full:
            self._full = False
            return list(active), list(self._busy_links)
        self._epoch += 1
        stamp = self._epoch
        flows: list[_Connection] = []
        links: list[Link] = []
        stack = []
        for link in seeds:
            if link._vmark != stamp and link.n_active:
                link._vmark = stamp
                links.append(link)
                stack.append(link)
        while stack:
            for conn in stack.pop()._flows:
                if conn._vmark != stamp:
                    conn._vmark = stamp
                    flows.append(conn)
                    for link in conn.links:
                        if link._vmark != stamp:
                            link._vmark = stamp
                            links.append(link)
                            stack.append(link)
        if len(flows) == len(active):
            return list(active), list(self._busy_links)
        flows.sort(key=_aseq_key)
        links.sort(key=_bseq_key)
        return flows, links

    def _recompute(self) -> None:
        """Max-min fair rates with strict priority classes over the flows a change can
        affect (:meth:`_affected`), then re-time the flows whose rate changed (lazily:
        ``remaining -= old_rate * elapsed``)."""
        self._dirty = False
        active = self._active
        if not active:
            self._seeds = []
            self._full = False
            return
        self.rate_recomputations += 1
        now = self._loop.time()
        flows_all, busy = self._affected()
        if not flows_all:
            self._arm_timer()
            return
        for link in busy:
            link._resid = link.capacity_bps
        if len(self._active_by_class) == 1:
            # One class: every busy link's flow count is its n_active.
            for link in busy:
                link._n = link.n_active
            self._fill(flows_all, busy, True)
        else:
            classes: dict[int, list[_Connection]] = {}
            for conn in flows_all:
                group = classes.get(conn.cls)
                if group is None:
                    classes[conn.cls] = [conn]
                else:
                    group.append(conn)
            order = sorted(classes)
            for i, cls in enumerate(order):
                flows = classes[cls]
                self._epoch += 1
                stamp = self._epoch
                touched: list[Link] = []
                for conn in flows:
                    for link in conn.links:
                        if link._cmark != stamp:
                            link._cmark = stamp
                            link._n = 1
                            touched.append(link)
                        else:
                            link._n += 1
                self._fill(flows, touched, i == len(order) - 1)

        changed = []
        for conn in flows_all:
            new = conn._new
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
            if len(heap) + len(changed) > 2 * len(active) + 64:
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

    def _fill(self, flows: list[_Connection], touched: list[Link], last: bool) -> None:
        """Progressive filling of one priority class over the links' residual capacity
        (``link._resid``), given each link's number of flows of this class (``link._n``).

        Repeatedly find the tightest constraint: the link whose residual capacity divided
        by its number of unfrozen flows is smallest, or the smallest per-flow cap. Freeze
        the flows it binds at that rate and subtract them from every link on their
        paths. Each round freezes at least one flow; there are as many rounds as distinct
        bottleneck levels (usually one or two). Caps are sorted only when one binds, and
        the last round of the last class skips the bookkeeping nobody will read.
        """
        self._epoch += 1
        stamp = self._epoch
        mincap = _INF
        for conn in flows:
            if conn.cap_bps < mincap:
                mincap = conn.cap_bps
        capped: list[_Connection] | None = None
        ci = 0
        unfrozen = flows
        left = len(flows)
        while left:
            best = _INF
            bottleneck = None
            for link in touched:
                n = link._n
                if n:
                    share = link._resid / n
                    if share < best:
                        best = share
                        bottleneck = link
            if best < 0.0:
                best = 0.0
            if mincap <= best:
                if capped is None:
                    capped = sorted((c for c in unfrozen if c._fz != stamp and c.cap_bps < _INF),
                                    key=_cap_key)
                while ci < len(capped) and capped[ci]._fz == stamp:
                    ci += 1
                if ci < len(capped) and capped[ci].cap_bps <= best:
                    conn = capped[ci]
                    ci += 1
                    rate = conn.cap_bps
                    conn._new = rate
                    conn._fz = stamp
                    left -= 1
                    for link in conn.links:
                        link._resid -= rate
                        link._n -= 1
                    continue
                # The flow that set mincap was frozen by a link; look again next round.
                mincap = capped[ci].cap_bps if ci < len(capped) else _INF
            rest = []
            frozen = []
            for conn in unfrozen:
                if conn._fz == stamp:
                    continue
                if bottleneck in conn.links:
                    conn._new = best
                    conn._fz = stamp
                    frozen.append(conn)
                else:
                    rest.append(conn)
            left -= len(frozen)
            if left or not last:
                for conn in frozen:
                    for link in conn.links:
                        link._resid -= best
                        link._n -= 1
            unfrozen = rest

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
        timers = self._loop_timers
        tseq = self._loop_seq
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
                if timers is not None:  # (call_at_plain, inlined)
                    heappush(timers, (arrival, next(tseq), _deliver_next, conn))
                else:
                    call_at_plain(arrival, _deliver_next, conn)
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
        link_bytes = {name: 0 for name in self._links}
        dc_bytes: dict[tuple[str, str], int] = {}
        for path in (*self._paths.values(), *self._retired_paths):
            if not path.bytes:
                continue
            for name in path.link_names:
                link_bytes[name] += path.bytes
            key = (path.src_dc, path.dst_dc)
            dc_bytes[key] = dc_bytes.get(key, 0) + path.bytes
        busy = {}
        for name, link in self._links.items():
            b = link.busy_s
            if link.n_active:
                b += max(0.0, now - link._busy_since)
            busy[name] = b
        return NetworkStats(
            time_s=now,
            link_bytes=link_bytes,
            link_busy_s=busy,
            link_capacity_bps={n: link.capacity_bps for n, link in self._links.items()},
            dc_bytes=dc_bytes,
            messages_sent=self.messages_sent,
            messages_delivered=self.messages_delivered,
            messages_dropped=self.messages_dropped,
            messages_local=self.messages_local,
            bytes_sent=self.bytes_sent,
            bytes_dropped=self.bytes_dropped,
            wan_links=frozenset(n for n, link in self._links.items() if link.is_wan),
        )

    def connection_rate_bps(self, src: str, dst: str, channel: int = 0) -> float:
        """Current rate of a connection (0 when idle); for tests and probes."""
        conn = self._conns.get((src, dst, channel))
        return conn.rate if conn is not None and conn.current is not None else 0.0


def _cap_key(conn: _Connection) -> float:
    return conn.cap_bps


def _aseq_key(conn: _Connection) -> int:
    return conn._aseq


def _bseq_key(link: Link) -> int:
    return link._bseq


def _check_positive(value: float, what: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise NetworkError(f"{what} must be a finite number > 0, got {value!r}")


def _check_nonneg(value: float, what: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise NetworkError(f"{what} must be a finite number >= 0, got {value!r}")


