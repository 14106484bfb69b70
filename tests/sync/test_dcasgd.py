"""DC-ASGD at the global server: per-DC backups wired through pulls and pushes."""

import numpy as np
import pytest

from geomx.experiment import run_scenario

FAST = ("metrics.plot=false", "metrics.trace=false", "metrics.events=false")


def _run(scenario_of, name, *overrides):
    seen = {}
    r = run_scenario(scenario_of(name, *overrides, *FAST),
                     inspect=lambda nodes: seen.setdefault("nodes", nodes))
    return r.summary, {n.name: n for n in seen["nodes"]}


def test_gs_keeps_one_backup_per_dc_the_model_that_dc_pulled(scenario_of):
    _, nodes = _run(scenario_of, "mixed_dcasgd.toml", "run.iterations=15",
                    "run.target_accuracy=0", "wan.party-b:central.latency=90ms")
    opt = nodes["gs:0"].optimizer
    assert opt.config_name() == "dcasgd" and opt.per_sender
    assert opt.lamda == pytest.approx(0.04)                 # GeoMX's default
    for dc in ("party-a", "party-b"):
        ls = nodes[f"ls:{dc}"]
        for key, slot in ls.slots.items():
            # the last thing each LS pulled is exactly its backup at the GS
            np.testing.assert_array_equal(opt.pulled_weight(key, ls.name), slot.store)
    # the DCs ran at different paces, so their backups differ
    a = opt.pulled_weight(0, "ls:party-a")
    b = opt.pulled_weight(0, "ls:party-b")
    assert not np.array_equal(a, b)


def test_lambda_comes_from_the_scenario(scenario_of):
    _, nodes = _run(scenario_of, "mixed_dcasgd.toml", "run.iterations=2",
                    "run.target_accuracy=0", "sync.dcasgd_lambda=0.7")
    assert nodes["gs:0"].optimizer.lamda == pytest.approx(0.7)


def test_shared_variant_keeps_no_per_dc_backups(scenario_of):
    _, nodes = _run(scenario_of, "mixed_dcasgd.toml", "run.iterations=5",
                    "run.target_accuracy=0", "training.optimizer=dcasgd_shared")
    opt = nodes["gs:0"].optimizer
    assert opt.config_name() == "dcasgd_shared" and not opt.per_sender
    assert opt.pulled_weight(0, "ls:party-a") is None


def test_under_fsa_per_dc_backups_make_dcasgd_plain_sgd(scenario_of):
    """In a synchronous round every DC pulled the current model, so the paper's correction
    is exactly zero; MXNet's shared backup (the weight before the previous update) is not."""
    common = ("run.iterations=8", "run.target_accuracy=0", "sync.algorithm=fsa",
              "training.lr=0.5", "sync.dcasgd_lambda=50")
    finals = {}
    for opt in ("sgd", "dcasgd", "dcasgd_shared"):
        _, nodes = _run(scenario_of, "mixed_dcasgd.toml", f"training.optimizer={opt}", *common)
        finals[opt] = [s.store for _, s in sorted(nodes["gs:0"].slots.items())]
    for a, b in zip(finals["sgd"], finals["dcasgd"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert any(not np.allclose(a, b, rtol=1e-6, atol=1e-7)
               for a, b in zip(finals["sgd"], finals["dcasgd_shared"]))


# --------------------------------------------------------------- injected staleness
# DC-ASGD's correction lambda * g * g * (w - w_bak) stands in for H (w - w_bak): it is the
# Fisher approximation of the Hessian, right in expectation when the gradient noise has
# covariance proportional to the curvature (a well-specified likelihood near its
# optimum). The test trains such an objective through the whole stack -- geomx.kv, local
# servers, MixedSync at the global server, per-DC backups via note_pull -- on four DCs of
# one worker, one of them 4x farther away (120 ms): its pushes land several global
# versions late (and the other three are a couple of versions stale among themselves).
QUAD_DIM = 64
_rng = np.random.default_rng(0)
QUAD_H = np.exp(_rng.uniform(np.log(0.1), np.log(10.0), QUAD_DIM)).astype(np.float32)
QUAD_OPT = _rng.normal(size=QUAD_DIM).astype(np.float32)


def quad_loss(w):
    return float(0.5 * np.sum(QUAD_H * (w - QUAD_OPT) ** 2))


async def _quad_master(node, spec):
    import geomx.kv

    kv = geomx.kv.create("dist_async")
    await kv.set_optimizer(spec.global_optimizer)
    await kv.init(0, np.zeros(QUAD_DIM, np.float32))


async def _quad_worker(node, spec, until_s=3.0):
    import geomx.kv

    kv = geomx.kv.create("dist_async")
    w = np.zeros(QUAD_DIM, np.float32)
    await kv.init(0, w)
    await kv.pull(0, out=w)
    rng = node.services.rng(f"quad:{node.name}")
    while node.now() < until_s:      # emulated time: iteration counts do not depend on values
        node.iteration += 1
        noise = np.sqrt(QUAD_H) * rng.normal(size=QUAD_DIM)
        grad = (QUAD_H * (w - QUAD_OPT) + noise).astype(np.float32)
        await node.services.compute(node.compute_s_per_iter, 0.0)
        kv.push(0, grad)
        await kv.pull(0, out=w)
    await kv.waitall()
    return {"iterations": node.iteration}


def _delayed_dc_scenario(tmp_path, optimizer, seed):
    from geomx.scenario import parse_scenario

    dcs = [{"name": "central", "central": True, "workers": 0}]
    wans = []
    for i in range(4):
        dcs.append({"name": f"p{i}", "workers": 1, "compute_per_iter": "10ms"})
        wans.append({"a": f"p{i}", "b": "central", "latency": "120ms" if i == 3 else "30ms"})
    return parse_scenario({
        "run": {"name": "delayed-dc", "seed": seed, "iterations": 0, "target_accuracy": 0,
                "max_wall_time": "60s", "eval_every": 0, "out_dir": str(tmp_path / "runs"),
                "progress": False},
        "metrics": {"plot": False, "events": False, "trace": False},
        "dc": dcs, "wan": wans,
        "training": {"optimizer": optimizer, "lr": 0.2},
        "sync": {"algorithm": "mixed", "dcasgd_lambda": 0.3}})


def _quad_run(tmp_path, monkeypatch, optimizer, seed):
    import geomx.cluster

    monkeypatch.setattr(geomx.cluster, "master_program", _quad_master)
    monkeypatch.setattr(geomx.cluster, "train_program", _quad_worker)
    seen = {}
    run_scenario(_delayed_dc_scenario(tmp_path, optimizer, seed),
                 inspect=lambda nodes: seen.setdefault("nodes", nodes))
    nodes = {n.name: n for n in seen["nodes"]}
    its = {n: nodes[n].iteration for n in nodes if n.startswith("w:")}
    slot = nodes["gs:0"].slots[(0, 0)]
    return quad_loss(slot.store), its, slot.version


@pytest.mark.parametrize("seed", [1, 3, 5])
def test_dcasgd_ends_lower_than_asgd_with_a_delayed_dc(tmp_path, monkeypatch, seed):
    asgd, its_asgd, versions = _quad_run(tmp_path, monkeypatch, "sgd", seed)
    dcasgd, its_dc, _ = _quad_run(tmp_path, monkeypatch, "dcasgd", seed)
    assert its_asgd == its_dc                                     # equal iterations
    assert its_asgd["w:p0:0"] > 3 * its_asgd["w:p3:0"]            # p3 lags by rounds
    assert versions == sum(its_asgd.values())                     # every push a step
    assert dcasgd < asgd, (dcasgd, asgd)
