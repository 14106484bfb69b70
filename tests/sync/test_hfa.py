"""HFA: local syncs stay in the DC, global syncs every K1*K2 steps, identical models after."""

from collections import defaultdict

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.sync.hfa import HierarchicalAveraging

from tests.helpers.events import run_events

FAST = ("run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false")


def _workers(nodes):
    return [n for n in nodes if getattr(n, "role", "") == "worker" and not n.is_master]


def test_hfa_sends_about_one_two_hundredth_of_fsa_wan_bytes_per_iteration(scenario_of):
    """(K1, K2) = (20, 10): one WAN exchange per 200 iterations instead of one per iteration.
    Differences of two run lengths cancel the set-up traffic (registration, init pulls)."""
    def wan(name, iterations):
        return run_scenario(scenario_of(name, f"run.iterations={iterations}", *FAST,
                                        "metrics.events=false")).summary.bytes_wan

    fsa_per_iter = (wan("quickstart.toml", 30) - wan("quickstart.toml", 10)) / 20
    hfa_per_iter = (wan("hfa.toml", 600) - wan("hfa.toml", 200)) / 400
    assert fsa_per_iter / hfa_per_iter == pytest.approx(200, rel=0.02)


def test_local_syncs_send_no_wan_bytes(scenario_of):
    common = ("sync.k1=5", "sync.k2=1000", *FAST, "metrics.events=false")
    short = run_scenario(scenario_of("hfa.toml", "run.iterations=10", *common)).summary
    long = run_scenario(scenario_of("hfa.toml", "run.iterations=40", *common)).summary
    assert long.bytes_lan > short.bytes_lan          # 8 local syncs instead of 2 ...
    assert long.bytes_wan == short.bytes_wan         # ... and not one more WAN byte


def test_every_dc_holds_the_same_model_after_each_global_sync(scenario_of):
    seen = {}
    r = run_scenario(scenario_of("hfa.toml", "run.iterations=400", *FAST),
                     inspect=lambda nodes: seen.setdefault("nodes", nodes))
    digests = defaultdict(dict)
    for e in run_events(r.run_dir, "global_sync"):
        digests[(e["key"], e["sync"])][e["node"]] = e["digest"]
    assert sorted({s for _, s in digests}) == [1, 2]          # at iterations 200 and 400
    for where, by_ls in digests.items():
        assert set(by_ls) == {"ls:party-a", "ls:party-b"}, where
        assert len(set(by_ls.values())) == 1, where
    workers = _workers(seen["nodes"])                          # the run ends on a global sync
    for w in workers[1:]:
        for a, b in zip(workers[0].params, w.params):
            np.testing.assert_array_equal(a, b)


def test_every_dc_starts_from_the_global_initial_model(scenario_of, monkeypatch):
    """GeoMX keeps each DC's own rank-0 init as the milestone (bug); we use the global one.
    Give party-b's workers a different initial model: after a global sync, all DCs must
    still agree (with GeoMX's rule they would differ by party-b's offset forever)."""
    import geomx.kv
    import geomx.node.trainer as trainer

    real_build = trainer.build_model

    def build_with_offset(spec):
        model = real_build(spec)
        node = geomx.kv.current_node.get(None)
        if node is not None and node.name.startswith("w:party-b"):
            for p in model.params:
                p += 0.5
        return model

    monkeypatch.setattr(trainer, "build_model", build_with_offset)
    seen = {}
    run_scenario(scenario_of("hfa.toml", "run.iterations=40", "sync.k1=10", "sync.k2=2",
                             *FAST, "metrics.events=false"),
                 inspect=lambda nodes: seen.setdefault("nodes", nodes))
    nodes = {n.name: n for n in seen["nodes"]}
    master_init = real_build(trainer.TrainSpec(model="mlp", model_kwargs={"hidden": [64]},
                                               seed=42)).params
    for ls in ("ls:party-a", "ls:party-b"):
        policy = nodes[ls].policy
        assert isinstance(policy, HierarchicalAveraging)
        assert policy.local_syncs[0] == 4
    workers = _workers(seen["nodes"])
    for w in workers[1:]:
        for a, b in zip(workers[0].params, w.params):
            np.testing.assert_array_equal(a, b)
    # and they trained from the master's model, not from party-b's shifted one
    drift = max(float(np.abs(a - b).max()) for a, b in zip(workers[0].params, master_init))
    assert drift < 0.5


def test_hfa_reaches_target_accuracy(scenario_of):
    summary = run_scenario(scenario_of("hfa.toml", "metrics.plot=false")).summary
    assert summary.time_to_target_s is not None
    assert summary.final_accuracy >= 0.93
