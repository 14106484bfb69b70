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


def test_a_slow_starter_does_not_get_early_registrants_declared_dead(scenario_of):
    """Heartbeat clocks start when every member has the address book, not at each
    member's own registration (a node that starts 30 s late is not a failure)."""
    import asyncio

    from geomx.cluster import plan_job
    from geomx.experiment import EmuServices, build_network
    from geomx.node.scheduler import Scheduler
    from geomx.sim.loop import run_virtual
    from geomx.sim.transport import SimFabric
    from geomx.wire import Kind, Message

    s = scenario_of("quickstart.toml")
    plan = plan_job(s)
    fabric = SimFabric(build_network(s, plan))
    members = plan.job.scheduler_members("lh:party-a")
    lh = Scheduler("lh:party-a", "party-a", fabric.transport("lh:party-a"),
                   EmuServices(0, None, None, plan.job.dc_of), members,
                   heartbeat_timeout_s=5.0, register_timeout_s=120.0)
    ends = {m: fabric.transport(m) for m in members}

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        for i, m in enumerate(members):
            if i == len(members) - 1:
                await asyncio.sleep(30.0)  # the last one starts late
            await ends[m].send(Message(Kind.REGISTER, m, "lh:party-a", request_id=1,
                                       meta={"address": ""}))
        replies = [await asyncio.wait_for(ends[m].recv(), 5) for m in members]
        assert all(r.kind == Kind.REGISTER_ACK for r in replies), replies
        assert lh.dead is None
        for m in members:
            await ends[m].send(Message(Kind.SHUTDOWN, m, "lh:party-a"))
        await sched

    run_virtual(scenario())
