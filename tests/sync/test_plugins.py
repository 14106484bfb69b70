"""The built-in sync algorithms are plug-ins of geomx.policy.sync like a user's: found by
name in the registry, with typed options built once from the [sync] fields."""

import numpy as np
import pytest

from geomx.cluster import plan_job
from geomx.node.kvstore import check_kvstore_type
from geomx.node.kv_state import KVStoreError
from geomx.policy.registry import BUILTIN, policy_class
from geomx.node.spec import sync_algorithm
from geomx.policy.sync import LocalSide, SyncAlgorithm
from geomx.sync.hfa import HFAOptions, HierarchicalAveraging


@pytest.mark.parametrize("name", sorted(BUILTIN["sync"]))
def test_each_builtin_resolves_to_an_algorithm_of_its_name(name):
    cls = policy_class("sync", name)
    assert issubclass(cls, SyncAlgorithm) and cls.name == name


def test_options_come_from_the_sync_fields():
    hfa = sync_algorithm({"algorithm": "hfa", "k1": 4, "k2": 5})
    assert hfa.options == HFAOptions(k1=4, k2=5)
    assert hfa.exchange_iterations() == 20
    assert sync_algorithm({"algorithm": "mixed", "staleness": 3}).options.staleness == 3
    esync = sync_algorithm({"algorithm": "esync", "esync_epsilon_s": 0.5,
                            "esync_max_local_steps": 7})
    assert (esync.options.epsilon_s, esync.options.max_local_steps) == (0.5, 7)


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match=r"sync\.k1 = 0"):
        sync_algorithm({"algorithm": "hfa", "k1": 0, "k2": 1})
    with pytest.raises(ValueError, match=r"sync\.staleness = -1"):
        sync_algorithm({"algorithm": "mixed", "staleness": -1})
    with pytest.raises(ValueError, match="unknown sync policy 'ssp'"):
        sync_algorithm({"algorithm": "ssp"})


def test_job_holds_the_algorithm_and_a_new_sync_table_rebuilds_it(scenario_of):
    import dataclasses

    job = plan_job(scenario_of("hfa.toml", "sync.k1=3", "sync.k2=2")).job
    assert job.sync_algorithm.name == "hfa" and job.sync_algorithm.options.k1 == 3
    assert not job.sync_algorithm.uses_global_optimizer
    switched = dataclasses.replace(job, sync={**job.sync, "algorithm": "mixed"})
    assert switched.sync_algorithm.name == "mixed"
    assert switched.sync_algorithm.kvstore_type == "dist_async"


def test_kvstore_type_against_the_algorithm(scenario_of):
    fsa = plan_job(scenario_of("quickstart.toml", "sync.algorithm=fsa")).job
    auto = plan_job(scenario_of("quickstart.toml")).job
    mixed = plan_job(scenario_of("mixed.toml")).job
    assert check_kvstore_type("dist_async", auto) is True  # switch the job
    assert check_kvstore_type("dist_sync", fsa) is False
    assert check_kvstore_type("dist_async", mixed) is False
    with pytest.raises(KVStoreError, match=r"algorithm = 'fsa'; set \[sync\] algorithm = \"mixed\""):
        check_kvstore_type("dist_async", fsa)
    with pytest.raises(KVStoreError, match="conflicts"):
        check_kvstore_type("dist_sync", mixed)


def test_hfa_local_side_keeps_its_checkpoint_state_through_the_declared_api():
    side: LocalSide = HierarchicalAveraging(k2=2, num_dcs=2)

    class Slot:
        key, round, store = 0, 0, np.arange(3, dtype=np.float32)

    side.on_initialized(None, 0, Slot)  # type: ignore[arg-type]
    side.local_syncs[0] = 4
    state = side.key_state(0)
    fresh = HierarchicalAveraging(k2=2, num_dcs=2)
    fresh.load_key_state(0, state)
    assert fresh.local_syncs[0] == 4
    np.testing.assert_array_equal(fresh.milestone[0], Slot.store)
    # a side without state keeps nothing
    assert LocalSide.key_state(fresh, 0) is None


def test_an_algorithm_that_needs_local_servers_refuses_a_flat_job(scenario_of):
    import dataclasses

    job = plan_job(scenario_of("quickstart.toml", "topology.kind=flat")).job
    assert job.mode == "flat_ps"
    with pytest.raises(ValueError, match="sync algorithm 'hfa' needs a local server per DC"):
        dataclasses.replace(job, sync={"algorithm": "hfa", "k1": 1, "k2": 1})
