"""WAN link failures as a timeline of routing states, the same for both runtimes.

A ``[[fault]] kind = "link_down"`` takes both directions of one WAN link down at ``at``
for ``duration`` (0 = to the end of the run). What the network does then follows how IP
networks behave when a link fails (link-state routing: OSPF/IS-IS detect the failure,
flood it and recompute routes; convergence takes about a second with tuned timers, BGP
across providers takes longer):

* from ``at`` to ``at + converge`` the link carries nothing: traffic whose route crosses
  it stalls (TCP keeps its bytes and retransmits; nothing is lost, nothing arrives);
* from ``at + converge`` routes are recomputed without the link, and traffic that crossed
  it (flows in progress included) continues over the remaining WAN links, sharing them;
* when the link comes back, routes are recomputed at once to include it again.

If the remaining links do not connect two DCs, traffic between them stalls until the link
returns (a partitioned WAN): the emulator reports the job as deadlocked, the real
runtime's request timeouts name the peer that stopped answering.

The emulator (:meth:`geomx.sim.network.Network.set_link_state`) and the real runtime's
shaper (:func:`geomx.runtime.wan_shapes.dc_link_phases`) both read :func:`link_timeline`,
so a fault means the same thing in both. Nodes are not told: a NETSTORM controller learns
of the failure the way the paper's system would, from the slow or stalled transfers its
servers time (passive awareness), and plans around the link.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["LinkFault", "LinkState", "link_timeline"]

Edge = frozenset  # frozenset({dc_a, dc_b}): an undirected WAN link


@dataclass(frozen=True)
class LinkFault:
    """One WAN link down from ``at_s`` for ``duration_s`` (0 = for good)."""

    a: str
    b: str
    at_s: float
    duration_s: float = 0.0
    converge_s: float = 1.0

    @property
    def edge(self) -> frozenset[str]:
        return frozenset((self.a, self.b))

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s if self.duration_s > 0 else float("inf")


@dataclass(frozen=True)
class LinkState:
    """From ``t_s`` on: ``down`` links carry nothing; ``rerouted`` ones (a subset of
    ``down`` whose failure routing has converged on) are left out of routes."""

    t_s: float
    down: frozenset[frozenset[str]]
    rerouted: frozenset[frozenset[str]]


def link_timeline(faults: Iterable[LinkFault]) -> list[LinkState]:
    """The routing states the faults produce, one per change, in time order (empty
    without faults). Overlapping faults of one link join: it is down while any is."""
    faults = list(faults)
    times = sorted({t for f in faults for t in (f.at_s, f.at_s + f.converge_s, f.end_s)
                    if t != float("inf")})
    out: list[LinkState] = []
    prev: tuple[frozenset, frozenset] = (frozenset(), frozenset())
    for t in times:
        down = frozenset(f.edge for f in faults if f.at_s <= t < f.end_s)
        rerouted = frozenset(f.edge for f in faults if f.at_s + f.converge_s <= t < f.end_s)
        if (down, rerouted) != prev:
            out.append(LinkState(t, down, rerouted))
            prev = (down, rerouted)
    return out
