"""The [sync] section, the per-algorithm scenarios, and how a job is planned for each."""

import pytest

from geomx.cluster import STATE_SERVER, plan_job
from geomx.scenario import ScenarioError
from geomx.sync.esync import ESyncWorker
from geomx.sync.fsa import ForwardEveryRound, FullySync, GradientSync
from geomx.sync.hfa import HFAWorker, HierarchicalAveraging
from geomx.sync.mixed import AsyncAcrossDCs

SCENARIOS = {"quickstart.toml": "fsa", "mixed.toml": "mixed", "mixed_dcasgd.toml": "mixed",
             "hfa.toml": "hfa", "esync.toml": "esync", "heterogeneous.toml": "fsa"}


@pytest.mark.parametrize("name,algorithm", sorted(SCENARIOS.items()))
def test_scenarios_load(scenario_of, name, algorithm):
    s = scenario_of(name)
    assert s.sync.resolved_algorithm == algorithm
    plan = plan_job(s)
    assert (STATE_SERVER in plan.nodes) == (algorithm == "esync")


def test_heterogeneous_scenario_shape(scenario_of):
    s = scenario_of("heterogeneous.toml")
    plan = plan_job(s)
    assert plan.compute_s == pytest.approx({"w:party-a:0": 0.04, "w:party-a:1": 0.04,
                                            "w:party-b:0": 0.01, "w:party-b:1": 0.1})


def test_mixed_dcasgd_scenario_ships_lambda(scenario_of):
    plan = plan_job(scenario_of("mixed_dcasgd.toml", "sync.dcasgd_lambda=0.2"))
    assert plan.train.global_optimizer["name"] == "dcasgd"
    assert plan.train.global_optimizer["lamda"] == pytest.approx(0.2)


@pytest.mark.parametrize("algorithm,gs_policy,ls_policy", [
    ("fsa", FullySync, ForwardEveryRound),
    ("mixed", AsyncAcrossDCs, ForwardEveryRound),
    ("hfa", FullySync, HierarchicalAveraging),
    ("esync", FullySync, ForwardEveryRound),
])
def test_policies_per_algorithm(scenario_of, algorithm, gs_policy, ls_policy):
    job = plan_job(scenario_of("quickstart.toml", f"sync.algorithm={algorithm}")).job
    assert job.sync_algorithm.name == algorithm
    gs, ls = job.sync_algorithm.global_side(job), job.sync_algorithm.local_side(job)
    assert isinstance(gs, gs_policy) and isinstance(ls, ls_policy)
    # HFA and ESync sum model deltas at the global tier: no optimizer there
    assert gs.uses_optimizer == (algorithm in ("fsa", "mixed"))


def test_local_step_algorithms_install_no_global_optimizer(scenario_of):
    for algorithm in ("hfa", "esync"):
        plan = plan_job(scenario_of("quickstart.toml", f"sync.algorithm={algorithm}"))
        assert plan.train.global_optimizer is None
    assert plan_job(scenario_of("quickstart.toml")).train.global_optimizer["name"] == "adam"


def test_esync_state_server_is_in_the_central_dc_and_known_to_workers(scenario_of):
    plan = plan_job(scenario_of("esync.toml"))
    job = plan.job
    assert job.state_server == STATE_SERVER and plan.roles[STATE_SERVER] == "state_server"
    assert job.dc_of[STATE_SERVER] == job.central_dc
    members = job.scheduler_members(job.global_scheduler)
    assert STATE_SERVER in members
    # workers register with the global scheduler too, to learn the state server's address
    assert all(w in members for w in job.all_workers)
    assert job.schedulers_of("w:party-a:0") == ["gh", "lh:party-a"]
    # and without ESync nothing changes
    job = plan_job(scenario_of("quickstart.toml")).job
    assert not job.state_server
    assert job.schedulers_of("w:party-a:0") == ["lh:party-a"]


def test_worker_sides(scenario_of):
    from geomx.node.sync_contexts import WorkerSyncContext
    from geomx.node.spec import sync_algorithm

    class KV:
        num_workers = 2
        num_all_workers = 4

    class Node:
        name = "w:party-a:0"
        job = plan_job(scenario_of("esync.toml")).job

        @staticmethod
        def now():
            return 0.0

    import numpy as np

    from geomx.optim import create_optimizer

    params = [np.zeros(3, np.float32)]
    ctx = WorkerSyncContext(Node, kv=KV, params=params, pull_weights=True,
                            local_optimizer=lambda: create_optimizer("sgd"))
    make = lambda algo: sync_algorithm({"algorithm": algo, "k1": 2, "k2": 3}).worker_side(ctx)
    assert isinstance(make("fsa"), GradientSync)
    assert isinstance(make("mixed"), GradientSync)
    assert isinstance(make("hfa"), HFAWorker)
    assert isinstance(make("esync"), ESyncWorker)
    hfa = make("hfa")
    assert (hfa.k1, hfa.k2) == (2, 3)


def test_hfa_without_local_optimizer_is_an_error(scenario_of):
    with pytest.raises(ScenarioError, match="training.worker_optimizer.*local steps"):
        scenario_of("hfa.toml", "training.worker_optimizer=none")
    with pytest.raises(ScenarioError, match="training.worker_optimizer"):
        scenario_of("esync.toml", "training.worker_optimizer=none")


def test_unknown_algorithm_names_the_allowed_ones(scenario_of):
    with pytest.raises(ScenarioError, match="sync.algorithm.*'fsa', 'mixed', 'hfa', 'esync'"):
        scenario_of("quickstart.toml", "sync.algorithm=hfa2")


def test_local_step_algorithms_need_local_servers(scenario_of):
    with pytest.raises(ScenarioError, match="topology.kind = 'flat'"):
        scenario_of("hfa.toml", "topology.kind=flat")


def test_esync_epsilon_may_be_zero(scenario_of):
    assert scenario_of("esync.toml", "sync.esync_epsilon=0s").sync.esync_epsilon_s == 0.0
    assert scenario_of("esync.toml", "sync.esync_epsilon=5ms").sync.esync_epsilon_s == 0.005
