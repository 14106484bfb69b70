"""HiPS with FSA in the emulator: the round's invariants, HiPS vs flat PS, determinism."""

import json

import numpy as np
import pytest

from geomx.experiment import run_scenario


def _workers(nodes):
    return [n for n in nodes if getattr(n, "role", "") == "worker" and not n.is_master]


def test_fsa_every_worker_ends_with_identical_values(scenario_of):
    s = scenario_of("quickstart.toml", "run.iterations=6", "run.target_accuracy=0")
    seen = {}
    result = run_scenario(s, inspect=lambda nodes: seen.setdefault("nodes", nodes))
    workers = _workers(seen["nodes"])
    assert len(workers) == 4
    for w in workers[1:]:
        for a, b in zip(workers[0].params, w.params):
            np.testing.assert_array_equal(a, b)
    assert result.summary.iterations == 6
    # the model moved away from its initial value
    from geomx.node.trainer import build_model
    from geomx.cluster import plan_job

    init = build_model(plan_job(s).train).params
    assert any(not np.array_equal(a, b) for a, b in zip(init, workers[0].params))


def _per_iteration(scenario_of, name):
    """Steady-state WAN bytes and emulated seconds per iteration (difference of two runs,
    so that start-up traffic such as the initial pulls cancels out)."""
    out = []
    for iters in (5, 15):
        s = run_scenario(scenario_of(name, f"run.iterations={iters}", "run.target_accuracy=0",
                                     "metrics.plot=false", "metrics.trace=false")).summary
        assert s.iterations == iters
        out.append(s)
    return ((out[1].bytes_wan - out[0].bytes_wan) / 10,
            (out[1].emulated_seconds - out[0].emulated_seconds) / 10)


def test_hips_sends_fewer_wan_bytes_and_is_faster_than_flat_ps(scenario_of):
    hips_bytes, hips_s = _per_iteration(scenario_of, "quickstart.toml")
    flat_bytes, flat_s = _per_iteration(scenario_of, "vanilla_ps.toml")
    # two workers per DC: the flat PS sends every worker's tensor, HiPS one sum per DC
    assert flat_bytes / hips_bytes == pytest.approx(2.0, rel=1e-3)
    assert hips_s < flat_s


@pytest.mark.slow
def test_quickstart_reaches_target_accuracy(scenario_of):
    s = scenario_of("quickstart.toml", "metrics.plot=false")
    summary = run_scenario(s).summary
    assert summary.final_accuracy >= 0.90
    assert summary.time_to_target_s is not None


def test_same_scenario_and_seed_give_identical_event_logs(scenario_of, tmp_path):
    logs = []
    for i in range(2):
        s = scenario_of("quickstart.toml", "run.iterations=8", "run.target_accuracy=0",
                        f"run.out_dir={tmp_path / str(i)}", "metrics.plot=false")
        r = run_scenario(s)
        logs.append((r.run_dir / "events.jsonl").read_bytes())
    assert len(logs[0]) > 10_000
    assert logs[0] == logs[1]


@pytest.mark.slow
def test_run_folder_schema(scenario_of):
    r = run_scenario(scenario_of("quickstart.toml", "run.iterations=20", "run.target_accuracy=0"))
    for f in ("scenario.toml", "events.jsonl", "progress.csv", "summary.json", "trace.json",
              "accuracy.png"):
        assert (r.run_dir / f).exists(), f
    summary = json.loads((r.run_dir / "summary.json").read_text())
    for k in ("final_accuracy", "iterations", "emulated_seconds", "wall_seconds", "bytes_wan",
              "bytes_lan", "bytes_per_link"):
        assert k in summary
    trace = json.loads((r.run_dir / "trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


def test_single_phantom_transfer_matches_arithmetic(scenario_of):
    """One 100 MB tensor, no compute, one worker: the WAN push is 8 s + 50 ms exactly."""
    s = scenario_of("quickstart.toml", "training.model=phantom",
                    "training.phantom_layers=[25000000]", "run.iterations=1",
                    "run.target_accuracy=0", "run.eval_every=0",
                    "dc.party-a.workers=1", "dc.party-a.compute_per_iter=0s",
                    "dc.party-b.workers=1", "dc.party-b.compute_per_iter=0s",
                    "wan.0.latency=50ms", "wan.1.latency=50ms", "wan.1.bandwidth=100Mbps",
                    "dc.central.lan_latency=0s", "dc.party-a.lan_latency=0s",
                    "dc.party-b.lan_latency=0s", "metrics.plot=false")
    r = run_scenario(s)
    pushes = [json.loads(line) for line in (r.run_dir / "events.jsonl").read_text().splitlines()
              if '"xfer"' in line and '"PUSH"' in line]
    pushes = [ev for ev in pushes if ev["src"].startswith("ls:")]
    assert len(pushes) == 2
    wire_bytes = 4 * 25_000_000 + 64 + 16
    for ev in pushes:
        assert ev["bytes"] == wire_bytes
        # both DCs push at once, but over different WAN links into a 10 Gbps NIC
        assert ev["dur"] == pytest.approx(wire_bytes * 8 / 100e6 + 0.05, rel=1e-9)


def test_several_global_servers_split_big_tensors_and_train_identically(scenario_of):
    """MultiGPS: tensors above bigarray_bound are split across the global servers, small
    ones placed by (k * 9973) mod S; the maths is the same as with one server."""
    common = ("run.iterations=8", "run.target_accuracy=0", "metrics.plot=false")
    finals = {}
    for name, extra in (("one", ()), ("two", ("dc.central.global_servers=2",
                                              "sched.bigarray_bound=1000"))):
        seen = {}
        r = run_scenario(scenario_of("quickstart.toml", *common, *extra),
                         inspect=lambda nodes, seen=seen: seen.setdefault("nodes", nodes))
        finals[name] = (r, seen["nodes"])
    r2, nodes2 = finals["two"]
    gs = {n.name: n for n in nodes2 if n.role == "global_server"}
    assert set(gs) == {"gs:0", "gs:1"}
    # key 0 (64x64 = 4096 elements) is split in two halves, one per server
    assert (0, 0) in gs["gs:0"].slots and (0, 1) in gs["gs:1"].slots
    # key 1 (64 biases) is whole on server (1 * 9973) % 2 = 1
    assert (1, 0) in gs["gs:1"].slots and (1, 0) not in gs["gs:0"].slots
    w1 = next(n for n in finals["one"][1] if n.name == "w:party-a:0")
    w2 = next(n for n in nodes2 if n.name == "w:party-a:0")
    for a, b in zip(w1.params, w2.params):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_kvstore_identity_matches_geomx(scenario_of):
    from geomx.kv import KVStore

    seen = {}
    run_scenario(scenario_of("quickstart.toml", "run.iterations=2", "run.target_accuracy=0",
                             "metrics.plot=false"),
                 inspect=lambda nodes: seen.setdefault("nodes", nodes))
    by_name = {n.name: n for n in seen["nodes"]}
    kv = KVStore(by_name["w:party-b:1"], "dist_sync")
    assert (kv.rank, kv.num_workers, kv.num_all_workers, kv.is_master_worker) == (1, 2, 4, False)
    mw = KVStore(by_name["mw"], "dist_sync")
    assert (mw.num_workers, mw.num_all_workers, mw.is_master_worker) == (1, 4, True)
    assert kv.type == "dist_sync"
