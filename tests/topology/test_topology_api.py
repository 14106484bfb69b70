"""The topology API (geomx.policy.topology): built-ins are registry plug-ins, a user's
MeshTopology plans the trees a mesh job aggregates over, and bad plans or options fail
with one line naming the topology (docs/papers.md §1 (b))."""

import copy
import textwrap

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.policy import Link, MeshPlan, MeshView, Topology, route_key
from geomx.policy.registry import BUILTIN, policy_class
from geomx.scenario import ScenarioError, load_scenario, parse_scenario
from geomx.topology import DCShape, make_topology, plan_nodes
from geomx.topology.mlnet import MLNet
from geomx.topology.netstorm import NetStorm

from tests.helpers.events import run_events
from tests.helpers.paths import ROOT

LINKS = (Link("a", "b", 0.01), Link("b", "c", 0.01), Link("c", "d", 0.01),
         Link("d", "a", 0.01), Link("a", "c", 0.01))
DCS = ("a", "b", "c", "d")

MESH = {
    "run": {"name": "ring4", "iterations": 4, "seed": 3, "eval_every": 4, "progress": False},
    "dc": [{"name": "a", "workers": 2}, {"name": "b", "workers": 1},
           {"name": "c", "workers": 1}, {"name": "d", "workers": 1}],
    "wan": [{"a": l.a, "b": l.b, "bandwidth": "100Mbps", "latency": "10ms"} for l in LINKS],
    "training": {"model": "mlp", "hidden": [16], "optimizer": "adam"},
    "metrics": {"plot": False, "trace": False},
    "netstorm": {"chunk_elements": 300},
}


def view(**rates):
    r = {(l.a, l.b): 1e8 for l in LINKS} | {(l.b, l.a): 1e8 for l in LINKS}
    r.update(rates)
    return MeshView(plan_id=0, dcs=DCS, links=LINKS, rates_bps=r, chunk_bytes=1200.0)


@pytest.mark.parametrize("name", ["hips", "flat", "netstorm", "mlnet", "mxnet"])
def test_every_builtin_topology_is_a_registered_policy_class(name):
    cls = policy_class("topology", name)
    assert issubclass(cls, Topology) and cls.name == name and name in BUILTIN["topology"]


def test_plan_nodes_takes_a_topology_object_as_well_as_a_name():
    by_name = plan_nodes("mlnet", "a", [DCShape(d, 1) for d in DCS], global_servers=1,
                         state_server=False)
    by_object = plan_nodes(MLNet(), "a", [DCShape(d, 1) for d in DCS], global_servers=1,
                           state_server=False)
    assert by_name == by_object and by_object.roles["ns:c"] == "mesh_server"


def test_builtin_options_come_from_the_netstorm_section():
    s = parse_scenario({**copy.deepcopy(MESH), "topology": {"kind": "netstorm"},
                        "netstorm": {"roots": 2, "awareness": False, "cost": "latency"}})
    topo = make_topology(s.topology.kind, sections={"netstorm": s.netstorm})
    assert isinstance(topo, NetStorm) and not topo.measures_links
    assert (topo.options.roots, topo.options.cost) == (2, "latency")
    assert len(topo.plan_trees(view()).roots) == 2


def test_a_plan_is_checked_before_a_server_sees_it():
    good = NetStorm().plan_trees(view())
    assert good.problem(LINKS) == ""
    cycle = MeshPlan(0, list(DCS), {"a": 1.0}, {"a": {"b": "c", "c": "b", "d": "a"}}, {})
    assert "does not reach the root" in cycle.problem(LINKS)
    no_route = MeshPlan(0, list(DCS), {"a": 1.0}, {"a": {"b": "a", "c": "a", "d": "a"}}, {})
    assert "no route" in no_route.problem(LINKS)
    off_mesh = MeshPlan(0, ["b", "d"], {"b": 1.0}, {"b": {"d": "b"}},
                        {route_key("d", "b"): [["d", "b"]], route_key("b", "d"): [["b", "d"]]})
    assert "not a walk over the mesh's links" in off_mesh.problem(LINKS)


def test_a_dead_link_is_zero_in_the_view_and_left_out_of_live_links():
    v = view(**{})
    dead = MeshView(0, DCS, LINKS, {**v.rates_bps, ("a", "c"): 0.0}, 1200.0)
    assert Link("a", "c", 0.01) not in dead.live_links() and len(dead.live_links()) == 4
    assert dead.delay_s("c", "a") == 0.01


def _write_topology(tmp_path, body):
    (tmp_path / "lab").mkdir(exist_ok=True)
    (tmp_path / "lab" / "topo.py").write_text(textwrap.dedent(body))
    return "lab/topo.py"


def _scenario_file(tmp_path, kind, options=None):
    lines = [f'[topology]\nkind = "{kind}"\n']
    if options is not None:
        lines.append("[topology.options]\n" + "".join(f"{k} = {v}\n" for k, v in options.items()))
    text = (ROOT / "examples" / "policies" / "ring.toml").read_text()
    head = text.split("[topology]")[0]
    tail = "[netstorm]" + text.split("[netstorm]")[1]
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "s.toml"
    path.write_text(head + "".join(lines) + tail)
    return load_scenario(path, [f"run.out_dir={tmp_path / 'runs'}", "run.progress=false",
                                "run.iterations=4", "run.eval_every=4", "metrics.plot=false",
                                "metrics.trace=false"])


STAR = """
    from dataclasses import dataclass
    from geomx.policy import MeshPlan, MeshTopology, PolicyOptions, route_key

    @dataclass(frozen=True)
    class StarOptions(PolicyOptions):
        hub: str = "a"

    class Star(MeshTopology):
        '''One root, every other DC its direct child (direct links or one relay).'''
        name = "star"
        Options = StarOptions

        def plan_trees(self, view):
            hub = self.options.hub
            others = [d for d in view.dcs if d != hub]
            linked = {(l.a, l.b) for l in view.links} | {(l.b, l.a) for l in view.links}
            routes = {}
            for d in others:
                relay = [d, hub] if (d, hub) in linked else [d, "c", hub]
                routes[route_key(d, hub)] = [relay]
                routes[route_key(hub, d)] = [relay[::-1]]
            return MeshPlan(view.plan_id, list(view.dcs), {hub: 1.0},
                            {hub: {d: hub for d in others}}, routes)
"""


def test_a_user_mesh_topology_from_a_file_plans_the_trees_of_the_job(tmp_path):
    spec = _write_topology(tmp_path, STAR)
    s = _scenario_file(tmp_path, spec + ":Star", {"hub": '"b"'})
    assert s.topology.kind == str(tmp_path / "lab" / "topo.py") + ":Star"
    nodes = {}
    r = run_scenario(s, inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    plan = nodes["gh"].plans[0]
    assert plan.kind == "star" and plan.roots == ["b"] and plan.parent["b"]["d"] == "b"
    assert nodes["ns:c"].relayed > 0  # d reaches the hub b through c
    params = [nodes[n].params for n in nodes if n.startswith("w:")]
    for p in params[1:]:  # one model, bit for bit, on every worker
        assert all(np.array_equal(x, y) for x, y in zip(params[0], p))
    ref = {}
    run_scenario(_scenario_file(tmp_path / "ref", "mlnet"),
                 inspect=lambda ns: ref.update({n.name: n for n in ns}))
    for x, y in zip(params[0], ref["w:a:0"].params):  # the same sum over other trees
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert r.summary.iterations == 4


def test_a_user_topology_with_an_unknown_option_is_refused_at_load(tmp_path):
    spec = _write_topology(tmp_path, STAR)
    with pytest.raises(ScenarioError, match=r"topology\.options.*unknown option "
                                            r"topology\.options\.centre; allowed: hub"):
        _scenario_file(tmp_path, spec + ":Star", {"centre": '"b"'})


def test_a_missing_topology_class_is_refused_at_load(tmp_path):
    spec = _write_topology(tmp_path, STAR)
    with pytest.raises(ScenarioError, match=r"topology\.kind.*has no class 'Hub'"):
        _scenario_file(tmp_path, spec + ":Hub")


def test_a_plan_that_does_not_reach_the_root_fails_the_job_naming_the_topology(tmp_path):
    spec = _write_topology(tmp_path, STAR.replace("{hub: {d: hub for d in others}}",
                                                  "{hub: {d: hub for d in others[1:]}}"))
    s = _scenario_file(tmp_path, spec + ":Star")
    with pytest.raises(Exception, match=r"topology star: plan 0: in root 'a''s tree"):
        run_scenario(s)


def test_the_ring_example_runs_and_every_dc_roots_a_quarter(tmp_path):
    s = load_scenario(ROOT / "examples" / "policies" / "ring.toml",
                      [f"run.out_dir={tmp_path}", "run.progress=false", "run.iterations=4",
                       "run.eval_every=4", "metrics.plot=false", "metrics.trace=false"])
    nodes = {}
    run_scenario(s, inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    plan = nodes["gh"].plans[0]
    assert plan.kind == "ring" and plan.shares() == {d: 0.25 for d in DCS}
    # both arcs towards each root: no tree deeper than two hops on a ring of four
    assert plan.parent["a"] == {"b": "a", "c": "b", "d": "a"}
    assert not nodes["ns:a"].awareness  # the ring does not measure links


@pytest.mark.slow
def test_the_ring_example_over_sockets_ends_with_the_emulators_model(tmp_path):
    # the file topology is loaded by every node process from the resolved scenario
    short = [f"run.out_dir={tmp_path}", "run.progress=false", "run.iterations=6",
             "run.eval_every=6", "metrics.plot=false", "metrics.trace=false"]
    path = ROOT / "examples" / "policies" / "ring.toml"
    real = run_scenario(load_scenario(path, [*short, "real.shape=true"]), runtime="real")
    emu = run_scenario(load_scenario(path, short), runtime="emu")
    assert real.summary.runtime == "real" and real.summary.iterations == 6
    fr, fe = real.summary.extra["final_eval"], emu.summary.extra["final_eval"]
    assert fr["accuracy"] == fe["accuracy"]
    assert fr["loss"] == pytest.approx(fe["loss"], rel=1e-4)
    plans = [e for e in run_events(real.run_dir) if e["ev"] == "plan"]
    assert [p["kind"] for p in plans] == ["ring"]


MEASURED_STAR = STAR + """
    class MeasuredStar(Star):
        '''The star, replanned from the links its servers measure.'''
        name = "measured_star"

        @property
        def measures_links(self):
            return True
"""


def test_a_user_topology_that_measures_links_gets_measurements_by_default(tmp_path):
    """``[netstorm] report_bytes = "auto"`` times every full chunk, whatever the chunk size
    (ring.toml's 2,000 elements: 8 kB messages, under a fixed 4 MB threshold)."""
    spec = _write_topology(tmp_path, MEASURED_STAR)
    _scenario_file(tmp_path, spec + ":MeasuredStar")
    s = load_scenario(tmp_path / "s.toml", [f"run.out_dir={tmp_path / 'runs'}", "run.progress=false",
                                      "run.iterations=30", "run.eval_every=30",
                                      "metrics.plot=false", "metrics.trace=false",
                                      "netstorm.check_period=500ms"])
    assert s.netstorm.report_bytes is None
    r = run_scenario(s)
    reports = [e for e in run_events(r.run_dir) if e["ev"] == "speed_report"]
    assert {tuple(e["link"]) for e in reports} >= {("b", "a"), ("c", "a"), ("d", "a")}
    assert [e for e in run_events(r.run_dir) if e["ev"] == "plan_switch"]


def test_a_report_size_no_chunk_reaches_is_refused_for_a_topology_that_measures(tmp_path):
    spec = _write_topology(tmp_path, MEASURED_STAR)
    _scenario_file(tmp_path, spec + ":MeasuredStar")
    too_big = load_scenario(tmp_path / "s.toml", [f"run.out_dir={tmp_path / 'runs'}",
                                            "netstorm.report_bytes=1MB"])
    with pytest.raises(ScenarioError, match=r"netstorm\.report_bytes: 1000000 B is more than "
                                            r"a full chunk \(2000 elements = 8000 B\), so "
                                            r"topology 'measured_star'.*allowed: at most 8000 B"):
        run_scenario(too_big)
    # a topology that measures nothing does not care
    star = load_scenario(tmp_path / "s.toml", [f"run.out_dir={tmp_path / 'runs'}", "run.progress=false",
                                         "run.iterations=2", "netstorm.report_bytes=1MB",
                                         f"topology.kind={spec}:Star"])
    assert run_scenario(star).summary.iterations == 2
