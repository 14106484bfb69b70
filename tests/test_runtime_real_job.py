"""The quickstart job over real sockets: one process per node on 127.0.0.1."""

import json

import pytest

from geomx.experiment import run_scenario


@pytest.mark.slow
def test_quickstart_real_runtime_matches_emulator(scenario_of):
    s = scenario_of("quickstart.toml", "metrics.plot=false")
    emu = run_scenario(s, runtime="emu").summary
    real = run_scenario(s, runtime="real")
    r = real.summary
    assert r.runtime == "real" and r.emulated_seconds is None
    assert r.final_accuracy >= 0.90
    assert abs(r.final_accuracy - emu.final_accuracy) <= 0.02
    # same algorithm, same bytes: the byte counters of both runtimes agree
    assert r.bytes_wan == pytest.approx(emu.bytes_wan, rel=0.05)
    for f in ("scenario.toml", "events.jsonl", "progress.csv", "summary.json", "trace.json"):
        assert (real.run_dir / f).exists(), f
    summary = json.loads((real.run_dir / "summary.json").read_text())
    assert summary["emulated_seconds"] is None


def test_real_runtime_refuses_phantom_models(scenario_of):
    from geomx.scenario import ScenarioError

    with pytest.raises((ValueError, ScenarioError), match="phantom"):
        s = scenario_of("resnet50_phantom.toml", "run.runtime=real")
        run_scenario(s)
