"""Codecs on the links GeoMX applies them to, end to end in the emulator."""

import json

import pytest

from geomx.experiment import run_scenario

# every test here runs whole emulated jobs, most of them to a target accuracy
pytestmark = pytest.mark.slow


def _ls_push_bytes_per_iteration(run_dir, keys=None):
    """WAN bytes of local-server -> global-server pushes per round, per key."""
    per_key: dict[int, list[int]] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["ev"] == "xfer" and ev["msg"] == "PUSH" and ev["src"].startswith("ls:"):
            per_key.setdefault(ev["key"], []).append(ev["bytes"])
    return {k: sum(v) / len(v) for k, v in per_key.items() if keys is None or k in keys}


def test_bisparse_quickstart_learns_and_cuts_wan_push_bytes(scenario_of):
    common = ("run.iterations=40", "run.target_accuracy=0", "metrics.plot=false")
    dense = run_scenario(scenario_of("quickstart_bsc.toml", "codec.type=none", *common))
    bsc = run_scenario(scenario_of("quickstart_bsc.toml", *common))
    d = _ls_push_bytes_per_iteration(dense.run_dir)
    b = _ls_push_bytes_per_iteration(bsc.run_dir)
    # keys 0 (64x256 weights) and 2 (256x10 weights) are >= 1000 elements: sparsified
    # to 1% as (value, index) pairs, i.e. about 1/(2 x 0.01) = 50x fewer payload bytes
    big = 0
    assert d[big] / b[big] == pytest.approx(50, rel=0.1)
    # biases are below the size bound and travel dense, byte for byte
    assert d[1] == b[1] and d[3] == b[3]
    assert bsc.summary.bytes_wan < dense.summary.bytes_wan / 10


def test_bisparse_quickstart_reaches_accuracy(scenario_of):
    s = run_scenario(scenario_of("quickstart_bsc.toml", "metrics.plot=false")).summary
    assert s.final_accuracy >= 0.85


def test_fp16_halves_the_bytes_on_both_tiers(scenario_of):
    common = ("run.iterations=20", "run.target_accuracy=0", "metrics.plot=false")
    dense = run_scenario(scenario_of("quickstart.toml", *common)).summary
    half = run_scenario(scenario_of("quickstart.toml", "codec.type=fp16", *common)).summary
    assert half.bytes_wan / dense.bytes_wan == pytest.approx(0.5, abs=0.03)
    assert half.bytes_lan / dense.bytes_lan == pytest.approx(0.5, abs=0.05)
    assert half.final_accuracy > 0.8


def test_phantom_payloads_get_the_compressed_size_without_data(scenario_of):
    common = ("metrics.plot=false", "metrics.events=false",
              "dc.dc1.workers=1", "dc.dc2.workers=1", "dc.dc3.workers=1", "dc.dc4.workers=1",
              "training.optimizer=none")

    def per_iteration(*extra):
        runs = [run_scenario(scenario_of("resnet50_phantom.toml", f"run.iterations={i}",
                                         *common, *extra)).summary for i in (1, 3)]
        return ((runs[1].bytes_wan - runs[0].bytes_wan) / 2,
                (runs[1].emulated_seconds - runs[0].emulated_seconds) / 2)

    dense_bytes, dense_s = per_iteration()
    bsc_bytes, bsc_s = per_iteration("codec.type=bsc", "codec.threshold=0.01",
                                     "codec.size_lower_bound=1000")
    # push: 1% as (value, index) pairs = 2% of the bytes; pull: capacity N*r*D pairs
    # with D = 4 DCs = 8%: about (0.02 + 0.08) / 2 = 5% of the dense traffic
    assert bsc_bytes / dense_bytes == pytest.approx(0.05, abs=0.01)
    assert bsc_s < dense_s / 5


@pytest.mark.parametrize("scenario", ["quickstart_bsc.toml", "vanilla_ps.toml"])
def test_sparse_codec_with_several_global_servers_never_splits_its_tensors(scenario_of, scenario):
    """Bi-Sparse tensors go whole to one global server (GeoMX §4.7) on every path, so the
    master worker, the workers and the local servers agree on where a key lives."""
    s = scenario_of(scenario, "codec.type=bsc", "codec.size_lower_bound=1000",
                    "dc.central.global_servers=3", "sched.bigarray_bound=1000",
                    "run.iterations=5", "run.target_accuracy=0", "metrics.plot=false")
    summary = run_scenario(s).summary
    assert summary.iterations == 5
