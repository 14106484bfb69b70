"""The emulated job's network: built from the scenario, watched by the run's metrics.

:func:`build_network` lays out one host per node, a switch per DC and the scenario's
WAN links on a :class:`~geomx.sim.network.Network`. The other functions connect that
network to the run folder: per-transfer ``xfer`` events, or (when events are off) byte
counters read from the network's own totals, and the ``link_down`` / ``partition``
faults' timeline applied at its emulated times (docs/architecture.md, "sim/ contract").
"""

from __future__ import annotations

from typing import Any, Callable

from geomx.cluster import JobPlan
from geomx.metrics.counters import ByteCounters
from geomx.metrics.recorder import EventRecorder
from geomx.scenario import Scenario, link_faults
from geomx.sim.network import Network
from geomx.topology.link_faults import link_timeline
from geomx.traces import wan_traces

#: ``on_transfer(msg, t_start, t_end, path, dropped)``: the network's per-message hook
TransferHook = Callable[[Any, float, float, "tuple[str, ...] | list[str]", bool], None]


def build_network(s: Scenario, plan: JobPlan) -> Network:
    """The emulated topology: one host per node, a switch per DC, the scenario's WAN."""
    net = Network(seed=s.run.seed, tcp_window_bytes=s.network.tcp_window_bytes,
                  mss_bytes=s.network.mss_bytes)
    for d in s.dcs:
        net.add_dc(d.name, lan_delay_s=d.lan_latency_s)
    by_name = {d.name: d for d in s.dcs}
    for node in plan.nodes:
        d = by_name[plan.job.dc_of[node]]
        net.add_host(node, d.name, nic_bandwidth_bps=d.lan_bandwidth_bps)
    traces = wan_traces(s.wans, s.run.seed)
    for w in s.wans:
        trace_ab, trace_ba = traces.get((w.a, w.b)), traces.get((w.b, w.a))
        net.add_wan(w.a, w.b, bandwidth_bps=w.bandwidth_bps, delay_s=w.latency_s, loss=w.loss,
                    jitter_s=w.jitter_s, trace_ab=trace_ab, trace_ba=trace_ba,
                    bandwidth_ba_bps=w.bandwidth_ba_bps)
    return net


def transfer_recorder(recorder: EventRecorder) -> TransferHook:
    """The network's transfer hook that records one ``xfer`` event per message, stamped
    with the time its first byte left."""
    def on_transfer(msg: Any, t_start: float, t_end: float, path: tuple[str, ...] | list[str],
                    dropped: bool) -> None:
        recorder.record_at(t_start, "xfer", msg.src, src=msg.src, dst=msg.dst,
                           msg=msg.kind.name, key=msg.key, part=msg.part, bytes=msg.nbytes,
                           channel=msg.channel, dur=t_end - t_start, path=list(path),
                           dropped=bool(dropped))
    return on_transfer


def counters_from_network(network: Any) -> ByteCounters:
    """Job-wide byte counters from the network's own per-link and per-DC-pair totals
    (used when per-transfer events are not recorded, which is much cheaper)."""
    st = network.stats()
    c = ByteCounters()
    for (a, b), n in sorted(st.dc_bytes.items()):
        key = f"{a}->{b}"
        c.bytes_per_dc_pair[key] = n
        if a == b:
            c.bytes_lan += n
        else:
            c.bytes_wan += n
    c.bytes_per_link = dict(sorted(st.link_bytes.items()))
    c.messages = st.messages_sent
    c.bytes_dropped = getattr(st, "bytes_dropped", 0)
    return c


def set_link_state(network: Any, recorder: EventRecorder, state: Any) -> None:
    """A step of the ``link_down`` / ``partition`` faults' timeline: links fail, routes
    converge, links return."""
    network.set_link_state(state.down, state.rerouted)
    recorder.record("link_state", "network", down=sorted("-".join(sorted(e)) for e in state.down),
                    rerouted=sorted("-".join(sorted(e)) for e in state.rerouted))


def schedule_link_faults(loop: Any, s: Scenario, network: Any, recorder: EventRecorder) -> None:
    """Put every step of the scenario's link-fault timeline on the loop at its time."""
    for state in link_timeline(link_faults(s.faults, s.wans)):
        loop.call_at(state.t_s, set_link_state, network, recorder, state)
