"""The quickstart job over real sockets: one process per node on 127.0.0.1."""

import json
from pathlib import Path

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


@pytest.mark.slow
def test_killed_node_is_reported_by_name_and_every_process_exits_nonzero(scenario_of):
    from geomx.experiment import JobFailed
    from geomx.scenario import parse_scenario, scenario_to_dict

    s = scenario_of("quickstart.toml", "run.target_accuracy=0", "run.iterations=100000",
                    "membership.heartbeat_interval=0.5s", "membership.heartbeat_timeout=4s",
                    "metrics.plot=false")
    raw = scenario_to_dict(s)
    raw["fault"] = [{"node": "w:party-a:1", "at": "6s"}]
    s = parse_scenario(raw)
    with pytest.raises(JobFailed) as info:
        run_scenario(s, runtime="real")
    text = str(info.value)
    assert "node w:party-a:1 was killed by signal 9" in text
    codes = dict(item.split("=") for item in
                 text.split("exit codes: ")[1].splitlines()[0].split(", "))
    assert "killed after the grace period" not in text, text  # nobody hung
    # the master worker finishes its job (init) early and exits 0; every other exits non-zero
    for node, code in codes.items():
        if node != "mw":
            assert code != "0", (node, text)
    # survivors name the dead node in their logs
    run_dir = max((p for p in (s.run.out_dir and __import__("pathlib").Path(s.run.out_dir)).iterdir()),
                  key=lambda p: p.stat().st_mtime)
    logs = {p.name: p.read_text() for p in (run_dir / "logs").glob("*.log")}
    assert "w:party-a:1" in logs["lh_party-a.log"]  # its scheduler names it
    assert sum("w:party-a:1" in text for text in logs.values()) >= 3


@pytest.mark.slow
def test_node_killed_before_it_registers_stops_the_job_in_seconds(scenario_of):
    """No scheduler can tell a node killed before it registered from a slow starter (it
    would wait membership.register_timeout, 120 s); the launcher can, and its abort line
    on every other node's stdin makes each exit by itself, non-zero, naming the node."""
    import time

    from geomx.experiment import JobFailed
    from geomx.scenario import parse_scenario, scenario_to_dict

    s = scenario_of("quickstart.toml", "run.target_accuracy=0", "run.iterations=100000",
                    "metrics.plot=false")
    raw = scenario_to_dict(s)
    raw["fault"] = [{"node": "w:party-b:0", "at": "0.05s"}]
    s = parse_scenario(raw)
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as info:
        run_scenario(s, runtime="real")
    took = time.monotonic() - t0
    text = str(info.value)
    assert "node w:party-b:0 was killed by signal 9" in text
    assert "killed after the grace period" not in text, text
    codes = dict(item.split("=") for item in
                 text.split("exit codes: ")[1].splitlines()[0].split(", "))
    assert all(code in ("0", "1") for node, code in codes.items() if node != "w:party-b:0"), codes
    assert took < s.membership.register_timeout_s / 2, took  # far from the 120 s bound
    run_dir = max(Path(s.run.out_dir).iterdir(), key=lambda p: p.stat().st_mtime)
    logs = {p.name: p.read_text() for p in (run_dir / "logs").glob("*.log")}
    assert "node w:party-b:0 was killed by signal 9 (seen by the launcher)" in logs["gs_0.log"]
