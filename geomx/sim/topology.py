"""The emulated network's topology: DCs, hosts, directed links and the paths between hosts.

Each data centre (DC) has one non-blocking switch. A host hangs off its DC switch by two
directed NIC links (uplink ``host->sw:dc`` and downlink ``sw:dc->host``), each with the
NIC capacity, so in-cast at a parameter server's NIC shows up as it does in GeoMX. DC
switches are joined by directed WAN links (``a->b`` and ``b->a``) with their own
capacity, propagation delay, loss, jitter and optional bandwidth trace.

Routes between DCs are :class:`geomx.topology.routes.WanGraph`'s, the rule the real
runtime's shaper follows too (fewest hops, ties broken by lower delay; around failed
links once routing has converged). A :class:`Path` between two hosts is computed once
and cached with everything the per-message code needs (its links, delay, jitter, loss
and the per-flow cap of a reliable connection); networkx is never called per message.

Each link's capacity is its :class:`~geomx.sim.sharing.Constraint`'s, the record the
sharing solver divides among the flows crossing it (SimGrid's network links hold an
``lmm`` constraint the same way); the link itself holds what does not change.
"""

from __future__ import annotations

import math

from geomx.sim.sharing import Constraint, SharingSystem
from geomx.topology.routes import Avoid, WanGraph, path_loss
from geomx.traces import BandwidthTrace

__all__ = ["Host", "Link", "NetworkError", "Path", "Topology", "reliable_flow_cap_bps"]

_INF = math.inf


class NetworkError(ValueError):
    """A topology or addressing mistake; the message names the offending item."""


class Link:
    """One direction of a NIC or WAN link.

    ``capacity_bps`` is the current capacity (it follows ``trace`` while the link
    carries traffic, and is 0 while the link is down); ``n_active`` the number of flows
    on it, ``busy_s`` the time it carried at least one flow before the current spell.
    The bytes it carried are not stored here: :meth:`Network.stats` sums them from
    per-path counters, to keep the per-message path free of per-link work.
    """

    __slots__ = ("name", "src", "dst", "delay_s", "loss", "jitter_s", "is_wan", "trace",
                 "constraint")

    def __init__(self, name: str, src: str, dst: str, *, constraint: Constraint, delay_s: float,
                 loss: float = 0.0, jitter_s: float = 0.0, is_wan: bool = False,
                 trace: BandwidthTrace | None = None) -> None:
        self.name = name
        self.src = src
        self.dst = dst
        self.delay_s = float(delay_s)
        self.loss = float(loss)
        self.jitter_s = float(jitter_s)
        self.is_wan = is_wan
        self.trace = trace
        self.constraint = constraint

    @property
    def capacity_bps(self) -> float:
        return self.constraint.capacity_bps

    @property
    def n_active(self) -> int:
        return self.constraint.n_vars

    @property
    def busy_s(self) -> float:
        return self.constraint.busy_s

    def __repr__(self) -> str:
        return (f"Link({self.name!r}, {self.capacity_bps:g} bps, {self.delay_s:g} s"
                f"{', loss=%g' % self.loss if self.loss else ''}{', WAN' if self.is_wan else ''})")


def reliable_flow_cap_bps(rtt_s: float, loss: float, *, tcp_window_bytes: int,
                          mss_bytes: int) -> float:
    """The rate cap of one reliable (TCP-like) flow: ``window / RTT``, and on a lossy
    path the Mathis et al. steady-state throughput ``(MSS / RTT) * 1.22 / sqrt(p)``
    ("The macroscopic behavior of the TCP congestion avoidance algorithm", CCR 1997;
    ``1.22 ~ sqrt(3/2)``). Unlimited when the RTT is 0."""
    cap = _INF
    if rtt_s > 0:
        cap = tcp_window_bytes * 8.0 / rtt_s
        if loss > 0:
            cap = min(cap, (mss_bytes * 8.0 / rtt_s) * 1.22 / math.sqrt(loss))
    return cap


class Path:
    """A cached route between two hosts, with everything the hot path needs; ``bytes``
    and ``messages`` count what was sent over it (the network's counters)."""

    __slots__ = ("links", "link_names", "traced_links", "delay_s", "jitter_s", "loss", "rtt_s",
                 "reliable_cap_bps", "src_dc", "dst_dc", "bytes", "messages")

    def __init__(self, links: tuple[Link, ...], src_dc: str, dst_dc: str, rtt_s: float,
                 loss: float, reliable_cap_bps: float) -> None:
        self.links = links
        self.link_names = tuple(link.name for link in links)
        self.traced_links = tuple(link for link in links if link.trace is not None)
        self.delay_s = sum(link.delay_s for link in links)
        self.jitter_s = sum(link.jitter_s for link in links)
        self.loss = loss
        self.rtt_s = rtt_s
        self.reliable_cap_bps = reliable_cap_bps
        self.src_dc = src_dc
        self.dst_dc = dst_dc
        self.bytes = 0
        self.messages = 0

    @property
    def constraints(self) -> tuple[Constraint, ...]:
        return tuple(link.constraint for link in self.links)


class Host:
    __slots__ = ("name", "dc", "uplink", "downlink")

    def __init__(self, name: str, dc: str, uplink: Link, downlink: Link) -> None:
        self.name = name
        self.dc = dc
        self.uplink = uplink
        self.downlink = downlink


class Topology:
    """DCs, hosts (and co-located aliases), links and the cached host-to-host paths.

    Each new link gets a constraint of ``system``. ``tcp_window_bytes`` and
    ``mss_bytes`` set the per-flow cap of reliable connections on each path.
    """

    def __init__(self, system: SharingSystem, *, tcp_window_bytes: int, mss_bytes: int) -> None:
        self._system = system
        self._tcp_window_bytes = tcp_window_bytes
        self._mss_bytes = mss_bytes
        self._dc_lan_delay_s: dict[str, float] = {}
        self._wan_graph = WanGraph()
        self._hosts: dict[str, Host] = {}
        self._alias: dict[str, str] = {}
        self._links: dict[str, Link] = {}
        self._wan: dict[tuple[str, str], Link] = {}
        self._paths: dict[tuple[str, str], Path] = {}
        self._retired_paths: list[Path] = []  # replaced by rerouting; their bytes still count
        self._rerouted: Avoid = frozenset()   # WAN links routes avoid

    # -- building ------------------------------------------------------------------

    def add_dc(self, name: str, *, lan_delay_s: float) -> None:
        """Add a data centre; ``lan_delay_s`` is the one-way host-to-host delay inside it."""
        if name in self._dc_lan_delay_s:
            raise NetworkError(f"DC {name!r} already exists")
        _check_nonneg(lan_delay_s, f"DC {name!r}: lan_delay_s")
        self._dc_lan_delay_s[name] = float(lan_delay_s)
        self._wan_graph.add_dc(name)
        self._paths.clear()

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
        up = self._new_link(f"{host}->{sw}", host, sw, nic_bandwidth_bps, delay_s=delay_s)
        down = self._new_link(f"{sw}->{host}", sw, host, nic_bandwidth_bps, delay_s=delay_s)
        self._hosts[host] = Host(host, dc, up, down)
        self._paths.clear()

    def add_alias(self, name: str, host: str) -> None:
        """Run node ``name`` on ``host`` too (co-located nodes talk over loopback)."""
        if host not in self._hosts:
            raise NetworkError(f"alias {name!r}: unknown host {host!r}")
        if name in self._hosts or name in self._alias:
            raise NetworkError(f"node {name!r} already exists")
        self._alias[name] = host
        self._paths.clear()

    def add_wan(self, dc_a: str, dc_b: str, *, bandwidth_bps: float, delay_s: float,
                loss: float = 0.0, jitter_s: float = 0.0,
                trace_ab: BandwidthTrace | None = None, trace_ba: BandwidthTrace | None = None,
                bandwidth_ba_bps: float | None = None) -> None:
        """Join two DCs by a pair of directed WAN links ``a->b`` and ``b->a``
        (see :meth:`geomx.sim.network.Network.add_wan`)."""
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
            link = self._new_link(f"{a}->{b}", a, b, cap, delay_s=delay_s, loss=loss,
                                  jitter_s=jitter_s, is_wan=True, trace=trace)
            self._wan[(a, b)] = link
            self._wan_graph.add_link(a, b, delay_s)
        self._paths.clear()

    def _new_link(self, name: str, src: str, dst: str, capacity_bps: float, **kw) -> Link:
        if name in self._links:
            raise NetworkError(f"link {name!r} already exists")
        link = Link(name, src, dst, constraint=self._system.new_constraint(capacity_bps), **kw)
        self._links[name] = link
        return link

    # -- queries -------------------------------------------------------------------

    @property
    def links(self) -> dict[str, Link]:
        """All directed links by name (read-only use, please)."""
        return self._links

    @property
    def wan_links(self) -> dict[tuple[str, str], Link]:
        """The directed WAN links by (src DC, dst DC)."""
        return self._wan

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

    def all_paths(self) -> tuple[Path, ...]:
        """Every path used so far, those replaced by rerouting included."""
        return (*self._paths.values(), *self._retired_paths)

    # -- routes --------------------------------------------------------------------

    def dc_route(self, dc_a: str, dc_b: str) -> list[str]:
        """The DCs a message from ``dc_a`` to ``dc_b`` crosses (both included)."""
        route = self._wan_graph.route(dc_a, dc_b, self._rerouted)
        if route is None:
            raise NetworkError(f"no WAN route from DC {dc_a!r} to DC {dc_b!r}")
        return route

    def _links_between(self, a: str, b: str) -> tuple[Link, ...]:
        ha, hb = self._hosts[a], self._hosts[b]
        links = [ha.uplink]
        if ha.dc != hb.dc:
            route = self.dc_route(ha.dc, hb.dc)
            links.extend(self._wan[(x, y)] for x, y in zip(route, route[1:]))
        links.append(hb.downlink)
        return tuple(links)

    def path(self, a: str, b: str) -> Path:
        """The path from host ``a`` to host ``b`` (two different hosts)."""
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
        loss = path_loss(link.loss for link in links)
        cap = reliable_flow_cap_bps(rtt_s, loss, tcp_window_bytes=self._tcp_window_bytes,
                                    mss_bytes=self._mss_bytes)
        path = Path(links, self._hosts[a].dc, self._hosts[b].dc, rtt_s, loss, cap)
        self._paths[key] = path
        return path

    def reroute(self, rerouted: Avoid) -> bool:
        """Leave the ``rerouted`` WAN links out of routes from now on; True when that
        changed the routing (every cached path is then retired: ask :meth:`path` again)."""
        rerouted = frozenset(rerouted)
        if rerouted == self._rerouted:
            return False
        self._rerouted = rerouted
        self._retired_paths.extend(self._paths.values())
        self._paths.clear()
        return True


def _check_positive(value: float, what: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise NetworkError(f"{what} must be a finite number > 0, got {value!r}")


def _check_nonneg(value: float, what: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise NetworkError(f"{what} must be a finite number >= 0, got {value!r}")
