"""NETSTORM and MLNET over a mesh in the emulator (docs/papers.md §1 Steps 3-6, §6.6):
tree synchronisation, consistent plan switches, multipath, passive awareness, the
[netstorm] section and malformed relays."""

import copy
import json

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.scenario import ScenarioError, parse_scenario

from tests.helpers.events import run_events

MESH = {
    "run": {"name": "mesh4", "iterations": 4, "seed": 3, "eval_every": 4, "progress": False},
    "dc": [{"name": "a", "workers": 2}, {"name": "b", "workers": 1},
           {"name": "c", "workers": 1}, {"name": "d", "workers": 1}],
    "wan": [{"a": "a", "b": "b", "bandwidth": "100Mbps", "latency": "10ms"},
            {"a": "b", "b": "c", "bandwidth": "50Mbps", "latency": "10ms"},
            {"a": "c", "b": "d", "bandwidth": "100Mbps", "latency": "10ms"},
            {"a": "d", "b": "a", "bandwidth": "20Mbps", "latency": "10ms"},
            {"a": "a", "b": "c", "bandwidth": "80Mbps", "latency": "10ms"}],
    "training": {"model": "mlp", "hidden": [16], "optimizer": "adam"},
    "topology": {"kind": "netstorm"},
    "metrics": {"plot": False, "trace": False},
    "netstorm": {"chunk_elements": 300, "report_bytes": 1000, "report_samples": 2,
                 "check_period": "0s"},
}


def scenario(tmp_path, **sections):
    raw = copy.deepcopy(MESH)
    raw["run"]["out_dir"] = str(tmp_path)
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return parse_scenario(raw)


def run(s):
    nodes = {}
    result = run_scenario(s, inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    return result, nodes


def worker_params(nodes):
    return {n: nodes[n].params for n in nodes if n.startswith("w:")}


def test_every_worker_ends_with_the_single_tree_reference_while_plans_switch(tmp_path):
    # every link direction redrawn every 0.1 s: the controller replans at every boundary
    wan = [{**w, "trace": "uniform", "trace_low": "20Mbps", "trace_high": "155Mbps",
            "trace_period": "100ms"} for w in MESH["wan"]]
    _, ns = run(scenario(tmp_path, wan=wan))
    _, ref = run(scenario(tmp_path, wan=wan, topology={"kind": "mlnet"}))
    plans = ns["gh"].plans
    assert len(plans) == 4  # the first plan and a switch at each later boundary
    assert len({json.dumps(p.shares(), sort_keys=True) for p in plans}) > 1
    params = worker_params(ns)
    first = next(iter(params.values()))
    for p in params.values():  # identical on every worker, bit for bit
        assert all(np.array_equal(x, y) for x, y in zip(first, p))
    for x, y in zip(first, ref["w:a:0"].params):  # = one tree's sum (float order aside)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert all(ns[s].rounds_done == 4 for s in ("ns:a", "ns:b", "ns:c", "ns:d"))


def test_mxnet_baseline_gives_the_same_model(tmp_path):
    _, ref = run(scenario(tmp_path, topology={"kind": "mlnet"}))
    _, mx = run(scenario(tmp_path, topology={"kind": "mxnet"}))
    assert {n for n in mx if n.startswith("gs:")} == {"gs:0", "gs:1", "gs:2", "gs:3"}
    for x, y in zip(mx["w:c:0"].params, ref["w:c:0"].params):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_same_seed_same_event_log(tmp_path):
    a, _ = run(scenario(tmp_path / "1"))
    b, _ = run(scenario(tmp_path / "2"))
    assert (a.run_dir / "events.jsonl").read_bytes() == (b.run_dir / "events.jsonl").read_bytes()
    evs = run_events(a.run_dir)
    assert any(e["ev"] == "plan" for e in evs) and any(e["ev"] == "speed_report" for e in evs)


def test_multipath_offloads_to_auxiliary_routes_only_when_enabled(tmp_path):
    # big chunks queue up behind the 20 Mbit/s link: auxiliary routes take some of them
    big = {"chunk_elements": 50, "awareness": False, "send_window": 1}
    _, on = run(scenario(tmp_path, netstorm=big))
    _, off = run(scenario(tmp_path, netstorm={**big, "multipath": False}))
    aux_on = sum(on[s].aux_sends for s in on if s.startswith("ns:"))
    assert aux_on > 0 and sum(on[s].relayed for s in on if s.startswith("ns:")) > 0
    assert sum(off[s].aux_sends for s in off if s.startswith("ns:")) == 0
    for x, y in zip(on["w:a:0"].params, off["w:a:0"].params):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_passive_estimates_approach_the_true_link_rates(tmp_path):
    s = scenario(tmp_path, training={"model": "phantom", "phantom_params": "8M"},
                 netstorm={"chunk_elements": 1000000, "report_bytes": 4000000,
                           "report_samples": 2, "multipath": False})
    _, ns = run(s)
    true = {}
    for w in MESH["wan"]:
        bps = float(w["bandwidth"].removesuffix("Mbps")) * 1e6
        true[(w["a"], w["b"])] = true[(w["b"], w["a"])] = bps
    measured = {}
    for name, node in ns.items():
        if name.startswith("ns:"):
            for link, st in node.meter.links.items():
                if st.estimates:
                    measured[link] = st.estimates[-1]
    assert len(measured) >= 4
    for link, est in measured.items():
        assert abs(est - true[link]) / true[link] < 0.15, (link, est)
    # the controller holds the last reported estimate of each measured link
    for link, est in measured.items():
        assert ns["gh"].rates[link] == pytest.approx(est)


def test_awareness_off_keeps_the_random_first_plan(tmp_path):
    _, ns = run(scenario(tmp_path, netstorm={"awareness": False}))
    assert len(ns["gh"].plans) == 1
    assert not any(ns[s].meter.links for s in ns if s.startswith("ns:"))


@pytest.mark.parametrize("field, value, allowed", [
    ("roots", 9, "0 (all) .. 4"), ("chunk_elements", 0, ">= 1"), ("report_samples", 0, "in [1, 1000]"),
    ("cost", "hops", "'bandwidth', 'latency'"), ("send_window", 0, "in [1, 64]")])
def test_netstorm_settings_are_validated_by_name(tmp_path, field, value, allowed):
    with pytest.raises(ScenarioError) as info:
        scenario(tmp_path, netstorm={field: value})
    key = "netstorm." + field
    assert info.value.path == key and allowed in str(info.value)


def test_mesh_refuses_codecs_and_other_sync_algorithms(tmp_path):
    with pytest.raises(ScenarioError) as info:
        scenario(tmp_path, codec={"type": "fp16"})
    assert info.value.path == "codec.type"
    with pytest.raises(ScenarioError) as info:
        scenario(tmp_path, sync={"algorithm": "hfa"})
    assert info.value.path == "sync.algorithm"


def test_malformed_relays_are_rejected_and_counted():
    from geomx.cluster import plan_job
    from geomx.node.mesh_server import MeshServer
    from geomx.transport import TransportDefaults
    from geomx.wire import Kind, Message, Payload

    plan = plan_job(parse_scenario(MESH))

    class Transport(TransportDefaults):
        def local_address(self):
            return ""

    srv = MeshServer("ns:b", "b", Transport(), None, plan.job)
    srv.store[0] = np.zeros(4, np.float32)
    good = {"d": "u", "r": "a", "route": ["c", "b", "a"], "hop": 1}
    pay = [Payload.of(np.zeros(4, np.float32))]
    assert srv._relay_problem(Message(Kind.RELAY, "ns:c", "ns:b", key=0, meta=good,
                                      payloads=pay)) == ""
    bad = [({**good, "hop": 2}, "ns:c"), ({**good, "route": ["c", "x", "a"]}, "ns:c"),
           ({**good, "d": "sideways"}, "ns:c"), (good, "w:a:0"), (good, "ns:d"),
           ({k: v for k, v in good.items() if k != "route"}, "ns:c")]
    for meta, src in bad:
        assert srv._relay_problem(Message(Kind.RELAY, src, "ns:b", key=0, meta=meta,
                                          payloads=pay))


def test_the_9dc_scenarios_are_the_papers_mesh(scenario_of):
    static = scenario_of("netstorm_9dc.toml")
    dynamic = scenario_of("netstorm_9dc_dynamic.toml")
    table = {frozenset((w.a, w.b)): w.bandwidth_bps / 1e6 for w in static.wans}
    assert len(table) == 13 and sorted(table.values()).count(100.0) == 5
    assert table[frozenset(("dc6", "dc9"))] == 100.0 and table[frozenset(("dc8", "dc9"))] == 500.0
    assert all((w.trace, w.trace_low_bps, w.trace_high_bps, w.trace_period_s)
               == ("uniform", 20e6, 155e6, 180.0) for w in dynamic.wans)
    from geomx.cluster import plan_job

    plan = plan_job(static)
    assert len(plan.job.global_servers) == 9 and plan.job.num_all_workers == 9
    assert plan.job.mesh["topology"] == "netstorm" and plan.job.mesh["chunk_elements"] == 1_000_000
    assert plan.job.mesh["topology_options"]["roots"] == 0


@pytest.mark.slow
def test_run_folder_has_the_trees_the_estimates_and_plan_markers(scenario_of):
    r = run_scenario(scenario_of("netstorm_4dc.toml", "run.iterations=12", "run.eval_every=12"))
    assert (r.run_dir / "topology.png").stat().st_size > 0
    assert (r.run_dir / "link_estimates.png").stat().st_size > 0
    trace = json.loads((r.run_dir / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    marks = [e for e in events if e.get("ph") == "i" and e.get("name", "").startswith("plan")]
    assert marks
