"""A crashed node is detected by heartbeats and named; the job stops instead of hanging."""

import pytest

from geomx.experiment import JobFailed, run_scenario
from geomx.scenario import parse_scenario, scenario_to_dict


def with_faults(s, *faults):
    raw = scenario_to_dict(s)
    raw["fault"] = [dict(f) for f in faults]
    return parse_scenario(raw)


def test_emulated_crash_is_detected_by_heartbeats_and_named(scenario_of):
    s = scenario_of("quickstart.toml", "run.target_accuracy=0", "run.iterations=1000",
                    "membership.in_emulator=true", "membership.heartbeat_interval=1s",
                    "membership.heartbeat_timeout=5s", "metrics.plot=false")
    s = with_faults(s, {"node": "w:party-a:1", "at": "3s"})
    with pytest.raises(JobFailed, match=r"w:party-a:1.*no heartbeat"):
        run_scenario(s)


def test_without_heartbeats_the_emulator_reports_a_deadlock_not_a_hang(scenario_of):
    s = scenario_of("quickstart.toml", "run.target_accuracy=0", "run.iterations=1000",
                    "metrics.plot=false")
    s = with_faults(s, {"node": "ls:party-b", "at": "2s"})
    with pytest.raises(JobFailed, match=r"deadlocked.*ls:party-b"):
        run_scenario(s)


def test_fault_names_must_be_nodes(scenario_of):
    from geomx.scenario import ScenarioError

    s = scenario_of("quickstart.toml")
    with pytest.raises(ScenarioError, match=r"fault\[0\]\.node.*w:party-a:0"):
        with_faults(s, {"node": "w:party-a:9", "at": "3s"})
