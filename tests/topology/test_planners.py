"""geomx.topology: the planners that name a job's nodes and place them in DCs (HiPS and a
flat parameter server), called by cluster.plan_job and by the scenario's fault check."""

import pytest

from geomx.cluster import plan_job
from geomx.scenario import ScenarioError, parse_scenario
from geomx.topology import KINDS, MESH_KINDS, DCShape, plan_nodes

PARTIES = [DCShape("a", 2), DCShape("b", 1)]


def test_hips_gives_each_party_a_local_scheduler_and_server():
    lay = plan_nodes("hips", "c", PARTIES, global_servers=2, state_server=False)
    assert lay.mode == "hips"
    assert lay.nodes == ["gh", "gs:0", "gs:1", "mw", "lh:a", "ls:a", "lh:b", "ls:b",
                         "w:a:0", "w:a:1", "w:b:0"]
    assert lay.local_scheduler_of == {"a": "lh:a", "b": "lh:b"}
    assert lay.local_server_of == {"a": "ls:a", "b": "ls:b"}
    assert lay.dc_of["ls:b"] == "b" and lay.dc_of["gs:1"] == "c" and lay.dc_of["w:a:1"] == "a"
    assert lay.roles["lh:a"] == "local_scheduler" and lay.roles["ls:a"] == "local_server"
    assert lay.roles["gh"] == "global_scheduler" and lay.roles["w:b:0"] == "worker"
    assert set(lay.roles) == set(lay.nodes) == set(lay.dc_of)


def test_flat_has_no_local_tier():
    lay = plan_nodes("flat", "c", PARTIES, global_servers=1, state_server=False)
    assert lay.mode == "flat_ps"
    assert lay.nodes == ["gh", "gs:0", "mw", "w:a:0", "w:a:1", "w:b:0"]
    assert lay.local_scheduler_of == {} and lay.local_server_of == {}
    assert "local_server" not in lay.roles.values()


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in MESH_KINDS])
def test_state_server_sits_in_the_central_dc(kind):
    lay = plan_nodes(kind, "c", PARTIES, global_servers=1, state_server=True)
    assert lay.state_server == "ss" and lay.dc_of["ss"] == "c" and lay.roles["ss"] == "state_server"
    assert lay.nodes[:4] == ["gh", "gs:0", "mw", "ss"]


def test_unknown_kind_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown topology policy 'tree'; allowed: 'hips', 'flat', 'netstorm'"):
        plan_nodes("tree", "c", PARTIES, global_servers=1, state_server=False)


@pytest.mark.parametrize("kind, mode", [("hips", "hips"), ("flat", "flat_ps")])
def test_plan_job_follows_topology_kind(kind, mode):
    plan = plan_job(parse_scenario({"topology": {"kind": kind}}))
    assert plan.job.mode == mode
    worker = plan.job.all_workers[0]
    expected = ["ls:party-a"] if kind == "hips" else ["gs:0"]
    assert plan.job.servers_of_worker(worker) == expected
    assert plan.nodes == plan_nodes(kind, "central", [DCShape("party-a", 2), DCShape("party-b", 2)],
                                    global_servers=1, state_server=False).nodes


def test_fault_node_must_be_a_node_of_the_chosen_topology():
    parse_scenario({"fault": [{"node": "ls:party-a"}]})
    with pytest.raises(ScenarioError) as info:
        parse_scenario({"topology": {"kind": "flat"}, "fault": [{"node": "ls:party-a"}]})
    err = info.value
    assert err.path == "fault[0].node" and err.value == "ls:party-a"
    assert "unknown node 'ls:party-a'" in str(err) and "'w:party-a:0'" in str(err)


MESH = {"dc": [{"name": "x", "workers": 1}, {"name": "y", "workers": 2}, {"name": "z", "workers": 1}],
        "wan": [{"a": "x", "b": "y"}, {"a": "y", "b": "z"}]}


def test_netstorm_puts_a_server_in_every_dc_and_the_controller_in_the_first():
    lay = plan_nodes("netstorm", "x", [DCShape("x", 1), DCShape("y", 2)], global_servers=1,
                     state_server=False)
    assert lay.mode == "netstorm"
    assert lay.nodes == ["gh", "ns:x", "ns:y", "mw", "w:x:0", "w:y:0", "w:y:1"]
    assert lay.local_server_of == {"x": "ns:x", "y": "ns:y"} and lay.local_scheduler_of == {}
    assert lay.dc_of["ns:y"] == "y" and lay.dc_of["gh"] == "x" and lay.dc_of["mw"] == "x"
    assert lay.roles["gh"] == "global_scheduler" and lay.roles["ns:x"] == "mesh_server"


def test_mxnet_spreads_one_global_server_per_dc():
    lay = plan_nodes("mxnet", "x", [DCShape("x", 1), DCShape("y", 2)], global_servers=1,
                     state_server=False)
    assert lay.mode == "flat_ps" and lay.global_servers == ["gs:0", "gs:1"]
    assert lay.dc_of["gs:0"] == "x" and lay.dc_of["gs:1"] == "y"


@pytest.mark.parametrize("kind", MESH_KINDS)
def test_mesh_scenarios_have_no_central_dc(kind):
    plan = plan_job(parse_scenario({**MESH, "topology": {"kind": kind}}))
    assert plan.job.dc_of["gh"] == "x"
    assert plan.job.party_dcs == ["x", "y", "z"]
    with pytest.raises(ScenarioError) as info:
        parse_scenario({"dc": [{**MESH["dc"][0], "central": True, "workers": 0}, *MESH["dc"][1:]],
                        "wan": MESH["wan"], "topology": {"kind": kind}})
    assert info.value.path == "dc[0].central"
