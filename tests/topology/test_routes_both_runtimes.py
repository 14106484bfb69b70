"""Both runtimes route alike: the emulator's network, the real runtime's per-peer shapes
and the kernel mode's namespace routes take their WAN routes and path loss from
:mod:`geomx.topology.routes`, and agree on random meshes (seeded networkx graphs with
random latencies drawn from a few values, so equal-weight routes are common)."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from geomx.runtime import kernel_wan
from geomx.runtime.wan_shapes import dc_routes
from geomx.scenario import parse_scenario
from geomx.sim.network import Network
from geomx.topology.routes import WanGraph, path_loss, route_weight

LATENCIES_MS = (0, 5, 5, 10)  # repeated values: ties between routes of equal hops
LOSSES = (0.0, 0.0, 0.01, 0.05)


def random_mesh(seed: int) -> dict:
    """A connected random mesh of 4-9 DCs as a scenario dict."""
    rng = random.Random(seed)
    n = rng.randint(4, 9)
    while True:
        g = nx.gnm_random_graph(n, rng.randint(n - 1, n * (n - 1) // 2), seed=rng.randrange(2**31))
        if nx.is_connected(g):
            break
    names = [f"d{i}" for i in range(n)]
    dcs = [{"name": names[0], "central": True}] + [{"name": d, "workers": 1} for d in names[1:]]
    wans = []
    for u, v in g.edges:
        a, b = (names[u], names[v]) if rng.random() < 0.5 else (names[v], names[u])
        wans.append({"a": a, "b": b, "bandwidth": f"{rng.choice((10, 50, 100))}Mbps",
                     "latency": f"{rng.choice(LATENCIES_MS)}ms", "loss": rng.choice(LOSSES)})
    return {"run": {"iterations": 1, "progress": False}, "dc": dcs, "wan": wans}


def emulated_network(s) -> Network:
    """The emulator's network for scenario ``s``, one host ``h:<dc>`` per DC (as
    ``geomx.experiment.build_network`` adds DCs and WAN links: in file order)."""
    net = Network(seed=s.run.seed)
    for d in s.dcs:
        net.add_dc(d.name, lan_delay_s=d.lan_latency_s)
        net.add_host(f"h:{d.name}", d.name, nic_bandwidth_bps=d.lan_bandwidth_bps)
    for w in s.wans:
        net.add_wan(w.a, w.b, bandwidth_bps=w.bandwidth_bps, delay_s=w.latency_s, loss=w.loss,
                    jitter_s=w.jitter_s, bandwidth_ba_bps=w.bandwidth_ba_bps)
    return net


def emulated_dc_route(net: Network, a: str, b: str) -> list[str]:
    wan = [name for name in net.route(f"h:{a}", f"h:{b}") if not name.startswith(("h:", "sw:"))]
    return [a] + [name.split("->")[1] for name in wan]


def random_avoid(s, rng: random.Random) -> frozenset[frozenset[str]]:
    edges = [frozenset((w.a, w.b)) for w in s.wans]
    return frozenset(rng.sample(edges, rng.randint(1, max(1, len(edges) // 3))))


@pytest.mark.parametrize("seed", range(25))
def test_the_emulator_and_the_shaper_take_the_same_routes_and_path_loss(seed):
    s = parse_scenario(random_mesh(seed))
    net = emulated_network(s)
    rng = random.Random(seed)
    for avoid in (frozenset(), random_avoid(s, rng)):
        if avoid:  # routing has converged around these failed links
            net.set_link_state(avoid, avoid)
        shaped = dc_routes(s, avoid)
        names = [d.name for d in s.dcs]
        assert set(shaped) == {(a, b) for a in names for b in names if a != b}
        for (a, b), r in shaped.items():
            assert emulated_dc_route(net, a, b) == r["route"], (a, b, avoid)
            assert net.path_loss(f"h:{a}", f"h:{b}") == r["loss"], (a, b, avoid)


def test_ties_in_hops_and_delay_break_alike_and_a_hop_outweighs_any_delay():
    # a square: d0-d1-d3 and d0-d2-d3 have two hops and equal delays; d0-d3 direct is one
    # hop with a far larger delay and still wins
    raw = {"run": {"iterations": 1, "progress": False},
           "dc": [{"name": "d0", "central": True}] + [{"name": f"d{i}", "workers": 1}
                                                      for i in (1, 2, 3)],
           "wan": [{"a": "d0", "b": "d1", "bandwidth": "10Mbps", "latency": "5ms"},
                   {"a": "d0", "b": "d2", "bandwidth": "10Mbps", "latency": "5ms"},
                   {"a": "d1", "b": "d3", "bandwidth": "10Mbps", "latency": "5ms"},
                   {"a": "d2", "b": "d3", "bandwidth": "10Mbps", "latency": "5ms"},
                   {"a": "d0", "b": "d3", "bandwidth": "10Mbps", "latency": "900ms"}]}
    s = parse_scenario(raw)
    net = emulated_network(s)
    assert dc_routes(s)[("d0", "d3")]["route"] == emulated_dc_route(net, "d0", "d3") == ["d0", "d3"]
    cut = frozenset({frozenset(("d0", "d3"))})
    net.set_link_state(cut, cut)
    tie = dc_routes(s, cut)[("d0", "d3")]["route"]
    assert tie == emulated_dc_route(net, "d0", "d3") and tie[1] in ("d1", "d2")
    assert route_weight(0.9) > route_weight(0.0) and 2 * route_weight(0.0) > route_weight(1e3)


def test_path_loss_multiplies_what_each_link_keeps():
    assert path_loss([]) == 0.0
    assert path_loss([0.1, 0.0, 0.5]) == pytest.approx(1 - 0.9 * 0.5)
    g = WanGraph()
    for dc in "abc":
        g.add_dc(dc)
    g.add_link("a", "b", 0.0)
    assert g.route("a", "b") == ["a", "b"]
    assert g.route("a", "c") is None and g.route("a", "nowhere") is None


@pytest.mark.parametrize("seed", range(0, 25, 3))
def test_the_kernel_modes_namespace_routes_follow_the_emulators(seed, monkeypatch):
    """KernelWan's ``ip route`` commands (recorded, not run): from every DC's namespace,
    the next hop towards each other DC is the first hop of the emulator's route."""
    s = parse_scenario(random_mesh(seed))
    net = emulated_network(s)
    monkeypatch.setattr(kernel_wan, "kernel_mode_problem", lambda s: None)
    monkeypatch.setattr(kernel_wan, "run_command", lambda *cmd, check=True: None)
    kw = kernel_wan.KernelWan(s, tag="t", net=100, use_netem=False)
    with kw:
        pass
    ns_dc = {kw.namespace(d.name): d.name for d in s.dcs}
    addr_dc = {kw.address(d.name): d.name for d in s.dcs}
    toward = {}  # veth device -> the DC at its other end
    for k, w in enumerate(s.wans):
        toward[f"gxtl{k}a"], toward[f"gxtl{k}b"] = w.b, w.a
    routes = [c for c in kw.commands if c[:2] == ["ip", "-n"] and c[3:5] == ["route", "add"]]
    assert len(routes) == len(s.dcs) * (len(s.dcs) - 1)
    for cmd in routes:
        a, b = ns_dc[cmd[2]], addr_dc[cmd[5].split("/")[0]]
        dev = cmd[cmd.index("dev") + 1]
        assert toward[dev] == emulated_dc_route(net, a, b)[1], (a, b)
