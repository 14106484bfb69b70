"""NETSTORM's auxiliary routes over idle links, chosen by expected arrival, and probes of
links no traffic measures (docs/papers.md §1 (b) Steps 4-5,
geomx/topology/netstorm_multipath.py)."""

import copy

import pytest

from geomx.experiment import run_scenario
from geomx.metrics.progress import read_progress
from geomx.scenario import parse_scenario
from geomx.policy.topology import SendQueue
from geomx.topology.netstorm_multipath import Detours, busy_links, pick_by_arrival
from geomx.topology.netstorm_plan import Link, plan_netstorm

from tests.helpers.events import run_events

#: a-b is the only tree link of b (100 Mbit/s); b-c (80 Mbit/s) is slower than b-a-c over
#: the 1 Gbit/s a-c, so no tree uses it: an idle parallel path for b's traffic to a.
TRIANGLE = {
    "run": {"name": "triangle", "iterations": 12, "seed": 0, "eval_every": 1,
            "progress": False},
    "dc": [{"name": d, "workers": 1, "compute_per_iter": "50ms"} for d in ("a", "b", "c")],
    "wan": [{"a": "a", "b": "b", "bandwidth": "100Mbps", "latency": "5ms"},
            {"a": "a", "b": "c", "bandwidth": "1Gbps", "latency": "5ms"},
            {"a": "b", "b": "c", "bandwidth": "80Mbps", "latency": "5ms"}],
    "training": {"model": "phantom", "phantom_params": "8M", "optimizer": "sgd"},
    "topology": {"kind": "netstorm"},
    "metrics": {"plot": False, "trace": False, "events": False},
    "netstorm": {"roots": 1, "chunk_elements": 250000, "report_bytes": 1000000},
}

#: the authors' static table (docs/papers.md §1 (c)): 500 Mbit/s spanning tree, 100 off it
AUTHORS = [("1", "2", 500), ("1", "3", 100), ("2", "3", 500), ("2", "5", 500), ("3", "4", 100),
           ("4", "5", 500), ("4", "6", 100), ("5", "7", 500), ("6", "7", 500), ("6", "8", 100),
           ("6", "9", 100), ("7", "8", 500), ("8", "9", 500)]


def _run(tmp_path, **netstorm):
    raw = copy.deepcopy(TRIANGLE)
    raw["run"]["out_dir"] = str(tmp_path)
    raw["netstorm"].update(netstorm)
    nodes = {}
    r = run_scenario(parse_scenario(raw), inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    rows = read_progress(r.run_dir / "progress.csv")
    half = len(rows) // 2
    return (rows[-1].t - rows[half - 1].t) / (len(rows) - half), r.summary, nodes


def test_auxiliary_routes_leave_the_busy_tree_links_after_their_first_hop():
    links = [Link(a, b, 0.005) for a, b, _ in AUTHORS]
    rates = {}
    for a, b, mbps in AUTHORS:
        rates[(a, b)] = rates[(b, a)] = mbps * 1e6
    plan = plan_netstorm([str(i) for i in range(1, 10)], links, rates)
    busy = busy_links(plan.parent, plan.perf, rates)
    assert busy == {e for e, bw in rates.items() if bw == 500e6}  # every 500 Mbit/s link
    aux = [r for routes in plan.routes.values() for r in routes[1:]]
    assert aux  # some, over the 100 Mbit/s links the trees leave idle
    later_hops = [hop for r in aux for hop in zip(r[1:], r[2:])]
    assert not set(later_hops) & busy
    assert len(later_hops) == len(set(later_hops))  # an idle link serves one pair
    assert plan.rates_bps["1>2"] == 500e6 and plan.delays_s["1>2"] == 0.005


def test_a_chunk_takes_the_route_it_is_expected_to_arrive_on_first():
    links = [Link("a", "b"), Link("a", "c"), Link("b", "c")]
    rates = {("a", "b"): 100e6, ("b", "a"): 100e6, ("a", "c"): 1e9, ("c", "a"): 1e9,
             ("b", "c"): 80e6, ("c", "b"): 80e6}
    plan = plan_netstorm(["a", "b", "c"], links, rates, roots=1)
    routes = plan.routes_of("b", "a")
    assert routes == [["b", "a"], ["b", "c", "a"]]
    chunk = 1_000_000
    idle, one = SendQueue(0, 0, 0, 2), SendQueue(0, 1, chunk, 2)
    # main: (backlog + 1 MB) at 100 Mbit/s; detour: 1 MB at 80 then at 1000 Mbit/s (0.108 s)
    assert pick_by_arrival(plan, routes, lambda dc: idle, chunk, 0.0) == 0
    assert pick_by_arrival(plan, routes, lambda dc: idle if dc == "c" else one, chunk, 0.0) == 1
    assert pick_by_arrival(plan, routes, lambda dc: one, chunk, 0.0) == 0  # both queued
    # a detour's later hops are this sender's alone: its own chunks queue there
    down = plan.routes_of("a", "b")
    assert down == [["a", "b"], ["a", "c", "b"]]
    detours = Detours(plan.plan_id)
    busy = SendQueue(2, 2, 4 * chunk, 2)  # main: 4 MB ahead, arrives at 0.40 s
    picks = [pick_by_arrival(plan, down, lambda dc: idle if dc == "c" else busy, chunk,
                             0.0, detours) for _ in range(4)]
    assert picks == [1, 1, 1, 0]  # c -> b (80 Mbit/s) delivers at 0.108, 0.208, 0.308 s
    # tiny messages: a window of one waits a round trip per message ahead, not its bytes
    far = [Link("a", "b", 0.05), Link("a", "c"), Link("b", "c")]
    plan = plan_netstorm(["a", "b", "c"], far, rates, roots=1)
    tiny = 300
    ahead = SendQueue(4, 1, 5 * tiny, 1)
    assert pick_by_arrival(plan, routes, lambda dc: idle if dc == "c" else ahead, tiny, 0.0) == 1


def test_multipath_moves_chunks_onto_the_idle_path_and_rounds_get_faster(tmp_path):
    on_s, on, nodes = _run(tmp_path / "on")
    off_s, off, _ = _run(tmp_path / "off", multipath=False)
    assert nodes["ns:b"].aux_sends > 0
    # without multipath b-c carries only the random first plan and the probes
    assert on.bytes_per_link["b->c"] > 3 * off.bytes_per_link["b->c"]
    # 100 + 80 Mbit/s out of b and into it instead of 100: the paper's +65% regime
    # (measured 1.713 against 2.743 s/iteration, +60%)
    assert off_s / on_s - 1 > 0.5


#: a-c (300 Mbit/s) is in the trees; when it fails the network reroutes a-c traffic over
#: d (fewest hops, then the lowest delay: 2 ms), whose 50 Mbit/s links make it look slow,
#: so the plans go around it over b (200 Mbit/s each way) until it is measured again.
SQUARE = {
    "run": {"name": "square", "iterations": 20, "seed": 0, "eval_every": 1000,
            "progress": False},
    "dc": [{"name": d, "workers": 1, "compute_per_iter": "50ms"} for d in "abcd"],
    "wan": [{"a": "a", "b": "c", "bandwidth": "300Mbps", "latency": "5ms"},
            {"a": "a", "b": "b", "bandwidth": "200Mbps", "latency": "20ms"},
            {"a": "b", "b": "c", "bandwidth": "200Mbps", "latency": "20ms"},
            {"a": "a", "b": "d", "bandwidth": "50Mbps", "latency": "1ms"},
            {"a": "d", "b": "c", "bandwidth": "50Mbps", "latency": "1ms"}],
    "training": {"model": "phantom", "phantom_params": "1M", "optimizer": "sgd"},
    "topology": {"kind": "netstorm"},
    "metrics": {"plot": False, "trace": False, "events": True},
    "netstorm": {"chunk_elements": 100000, "report_bytes": 400000, "report_samples": 2,
                 "check_period": "500ms"},
    "fault": [{"kind": "link_down", "link": ["a", "c"], "at": "3s", "duration": "5s",
               "converge": "200ms"}],
}


@pytest.mark.parametrize("probe_after_s", [2.0, 0.0])
def test_a_link_that_comes_back_after_a_fault_is_measured_and_used_again(tmp_path,
                                                                         probe_after_s):
    raw = copy.deepcopy(SQUARE)
    raw["run"]["out_dir"] = str(tmp_path)
    # no auxiliary routes, whose chunks could also measure a-c once it is back
    raw["netstorm"].update(probe_after=probe_after_s, multipath=False)
    nodes = {}
    r = run_scenario(parse_scenario(raw), inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    events = run_events(r.run_dir)
    switched = {e["plan"]: e["t"] for e in events if e["ev"] == "plan_switch"}

    def uses_ac(plan):
        return any(t.get("a") == "c" or t.get("c") == "a" for t in plan.parent.values())

    def about_ac(kind, after_s):
        return [e for e in events if e["ev"] == kind and e["t"] > after_s
                and sorted(e["link"]) == ["a", "c"]]

    plans = nodes["gh"].plans
    assert uses_ac(plans[1])  # measured, a-c is in the trees ...
    during = [p for p in plans if 3.5 < switched.get(p.plan_id, 0) < 8.0]
    assert during and not any(uses_ac(p) for p in during)  # ... and planned around when down
    if probe_after_s:  # nothing crossed it since: the controller had it probed, and uses it
        assert about_ac("probe", 4.0) and about_ac("speed_report", 8.0)
        assert uses_ac(nodes["gh"].plan)
    else:  # passive awareness alone never measures it again
        assert not about_ac("speed_report", 8.0) and not uses_ac(nodes["gh"].plan)
