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


def _lone_scheduler(scenario_of, **kw):
    from geomx.cluster import plan_job
    from geomx.experiment import EmuServices, build_network
    from geomx.node.scheduler import Scheduler
    from geomx.sim.transport import SimFabric

    s = scenario_of("quickstart.toml")
    plan = plan_job(s)
    fabric = SimFabric(build_network(s, plan))
    members = plan.job.scheduler_members("lh:party-a")
    lh = Scheduler("lh:party-a", "party-a", fabric.transport("lh:party-a"),
                   EmuServices(0, None, None, plan.job.dc_of), members,
                   heartbeat_timeout_s=5.0, register_timeout_s=120.0, **kw)
    return lh, members, {m: fabric.transport(m) for m in members}


def test_a_slow_starter_does_not_get_early_registrants_declared_dead(scenario_of):
    """A node that starts 30 s late is not a failure: the members that registered early
    heartbeat while they wait (as geomx.node.scheduler.register makes them), and the
    heartbeat clocks restart when every member has the address book."""
    import asyncio

    from geomx.sim.loop import run_virtual
    from geomx.wire import Kind, Message

    lh, members, ends = _lone_scheduler(scenario_of)
    booked = asyncio.Event()

    async def heartbeat(m: str) -> None:
        while not booked.is_set():
            await asyncio.sleep(1.0)
            await ends[m].send(Message(Kind.HEARTBEAT, m, "lh:party-a"))

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        beats = []
        for i, m in enumerate(members):
            if i == len(members) - 1:
                await asyncio.sleep(30.0)  # the last one starts late
            await ends[m].send(Message(Kind.REGISTER, m, "lh:party-a", request_id=1,
                                       meta={"address": ""}))
            beats.append(asyncio.ensure_future(heartbeat(m)))
        replies = [await asyncio.wait_for(ends[m].recv(), 5) for m in members]
        booked.set()
        assert all(r.kind == Kind.REGISTER_ACK for r in replies), replies
        assert lh.dead is None
        for m in members:
            await ends[m].send(Message(Kind.SHUTDOWN, m, "lh:party-a"))
        await asyncio.gather(*beats)
        await sched

    run_virtual(scenario())


def test_a_registrant_that_dies_before_the_book_is_found_in_one_heartbeat_timeout(scenario_of):
    """A member that registered and then went silent while the others were still starting
    is declared dead one heartbeat timeout later, not after the registration timeout, and
    the members that did register are told by name."""
    import asyncio

    from geomx.sim.loop import run_virtual
    from geomx.wire import Kind, Message

    lh, members, ends = _lone_scheduler(scenario_of)
    first, others = members[0], members[1:-1]  # the last member never starts

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for m in [first, *others]:
            await ends[m].send(Message(Kind.REGISTER, m, "lh:party-a", request_id=1,
                                       meta={"address": ""}))

        async def beat_forever(m: str) -> None:
            while True:
                await asyncio.sleep(1.0)
                await ends[m].send(Message(Kind.HEARTBEAT, m, "lh:party-a"))

        beats = [asyncio.ensure_future(beat_forever(m)) for m in others]  # `first` is silent
        with pytest.raises(Exception, match=f"node {first} failed: no heartbeat"):
            await sched
        assert lh.dead == first
        assert 5.0 < loop.time() - t0 < 7.0  # timeout 5 s, checked every 1.25 s
        for m in others:
            msg = await asyncio.wait_for(ends[m].recv(), 1)
            assert msg.kind == Kind.NODE_FAILED and msg.meta["node"] == first
        for b in beats:
            b.cancel()

    run_virtual(scenario())


def test_a_member_that_fails_tells_its_scheduler_which_stops_everyone(scenario_of):
    """A node stopping on a failure sends NODE_FAILED (naming the node that failed first)
    to its scheduler, which stops every member at once instead of a heartbeat timeout
    later; ``reported by`` names the messenger."""
    import asyncio

    from geomx.sim.loop import run_virtual
    from geomx.wire import Kind, Message

    lh, members, ends = _lone_scheduler(scenario_of)

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        loop = asyncio.get_running_loop()
        for m in members:
            await ends[m].send(Message(Kind.REGISTER, m, "lh:party-a", request_id=1,
                                       meta={"address": ""}))
        for m in members:
            assert (await asyncio.wait_for(ends[m].recv(), 5)).kind == Kind.REGISTER_ACK
        t0 = loop.time()
        await ends[members[0]].send(Message(Kind.NODE_FAILED, members[0], "lh:party-a",
                                            meta={"node": "gs:0", "reason": "disk on fire"}))
        with pytest.raises(Exception, match="node gs:0 failed: disk on fire"):
            await sched
        assert loop.time() - t0 < 0.5
        for m in members[1:]:
            msg = await asyncio.wait_for(ends[m].recv(), 1)
            assert msg.kind == Kind.NODE_FAILED and msg.meta["node"] == "gs:0"
            assert f"reported by {members[0]}" in msg.meta["reason"]

    run_virtual(scenario())


def test_a_failure_set_before_the_node_runs_stops_it_at_once(scenario_of):
    """The launcher's abort line can arrive before the node has started (it is still
    claiming its rank): run() honours the earlier stop() and raises the failure."""
    import asyncio

    from geomx.node.base import NodeFailure
    from geomx.sim.loop import run_virtual

    lh, _, _ = _lone_scheduler(scenario_of)
    lh.failure = NodeFailure("node w:party-a:1 was killed by signal 9 (seen by the launcher)")
    lh.stop()

    async def scenario():
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(NodeFailure, match="seen by the launcher"):
            await lh.run()
        assert asyncio.get_running_loop().time() - t0 < 1.0

    run_virtual(scenario())


def _register(ends, members, sched="lh:party-a"):
    from geomx.wire import Kind, Message

    async def go():
        for m in members:
            await ends[m].send(Message(Kind.REGISTER, m, sched, request_id=1,
                                       meta={"address": ""}))
    return go()


def test_a_server_the_job_waits_for_that_dies_before_the_book_may_be_replaced(scenario_of):
    """The launcher saw a server's process die before every member registered (a crash
    while the job was still starting): its ``server_loss_timeout`` starts then, and a
    process that registers under its name in time lets the job start as usual. Its first
    registration does not count: the book waits for the successor."""
    import asyncio

    from geomx.sim.loop import run_virtual
    from geomx.wire import Kind, Message

    lh, members, ends = _lone_scheduler(scenario_of, replaceable={"ls:party-a"},
                                        replace_timeout_s=10.0)
    assert "ls:party-a" in members
    rest = [m for m in members if m != "ls:party-a"]

    async def beat(m: str) -> None:
        while True:
            await asyncio.sleep(1.0)
            await ends[m].send(Message(Kind.HEARTBEAT, m, "lh:party-a"))

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        await _register(ends, ["ls:party-a"])
        await asyncio.sleep(1.0)
        lh.member_died("ls:party-a", "was killed by signal 9 (seen by the launcher)")
        assert "ls:party-a" in lh.down
        await _register(ends, rest)
        beats = [asyncio.ensure_future(beat(m)) for m in rest]
        await asyncio.sleep(5.0)
        assert not lh.registered and lh.dead is None  # the dead one's request is void
        await _register(ends, ["ls:party-a"])  # its successor, within the 10 s
        beats.append(asyncio.ensure_future(beat("ls:party-a")))
        replies = [await asyncio.wait_for(ends[m].recv(), 5) for m in members]
        assert all(r.kind == Kind.REGISTER_ACK for r in replies), replies
        assert lh.registered and not lh.down
        await asyncio.sleep(20.0)  # well past the old deadline: nothing fires
        assert lh.dead is None
        for b in beats:
            b.cancel()
        for m in members:
            await ends[m].send(Message(Kind.SHUTDOWN, m, "lh:party-a"))
        await sched

    run_virtual(scenario())


def test_a_server_that_dies_before_the_book_and_is_not_replaced_fails_by_name(scenario_of):
    """... and one that nobody replaces fails the job ``server_loss_timeout`` after the
    launcher saw it die, naming it and the bound, not after the registration timeout."""
    import asyncio

    from geomx.sim.loop import run_virtual

    lh, members, ends = _lone_scheduler(scenario_of, replaceable={"ls:party-a"},
                                        replace_timeout_s=3.0)
    rest = [m for m in members if m != "ls:party-a"]

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        loop = asyncio.get_running_loop()
        await _register(ends, rest)
        t0 = loop.time()
        lh.member_died("ls:party-a", "was killed by signal 9 (seen by the launcher)")
        with pytest.raises(Exception, match="node ls:party-a failed: lost at .* not taken "
                                            "over within membership.server_loss_timeout"):
            await sched
        assert 3.0 <= loop.time() - t0 < 3.5

    run_virtual(scenario())


def test_any_other_member_that_dies_before_the_book_fails_the_job_at_once(scenario_of):
    """A worker (even one the job could lose later) that dies before the job started fails
    it at once, by name: the job never ran with it, so there is nothing to continue."""
    import asyncio

    from geomx.sim.loop import run_virtual

    lh, members, ends = _lone_scheduler(scenario_of, losable={"w:party-a:1"})

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        loop = asyncio.get_running_loop()
        await _register(ends, members[:1])
        t0 = loop.time()
        lh.member_died("w:party-a:1", "exited with code 1 (seen by the launcher)")
        with pytest.raises(Exception, match="node w:party-a:1 failed: its process exited "
                                            "with code 1 .*before the job started"):
            await sched
        assert loop.time() - t0 < 0.1

    run_virtual(scenario())


def test_after_the_book_a_died_line_leaves_the_verdict_to_heartbeats(scenario_of):
    """Once the job runs, the launcher's word changes nothing: heartbeats decide, as on
    any host (where no launcher sees the processes)."""
    import asyncio

    from geomx.sim.loop import run_virtual

    lh, members, ends = _lone_scheduler(scenario_of, replaceable={"ls:party-a"},
                                        replace_timeout_s=3.0)

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        await _register(ends, members)
        for m in members:
            await asyncio.wait_for(ends[m].recv(), 5)
        lh.member_died("ls:party-a", "was killed by signal 9 (seen by the launcher)")
        assert not lh.down and lh.dead is None
        sched.cancel()

    run_virtual(scenario())


def test_the_parent_link_delivers_died_lines_to_the_node_and_bounds_what_waits():
    """node_main's stdin watcher: a died line reaches ``member_died`` of the node (once it
    exists), an abort line fails it; lines for a node not yet started wait, at most
    MAX_PENDING of them; junk is ignored."""
    import asyncio
    import json

    from geomx.runtime.node_main import _ParentLink

    class Target:
        failure = None
        failed_node = failed_reason = None

        def __init__(self):
            self.died = []
            self.stopped = False

        def member_died(self, node, reason):
            self.died.append((node, reason))

        def stop(self):
            self.stopped = True

    link = _ParentLink()
    buf = bytearray()
    lines = [json.dumps({"died": f"w:a:{i}", "how": "was killed by signal 9"})
             for i in range(link.MAX_PENDING + 10)]
    link.feed(("\n".join(lines) + "\nnot json\n[1]\n").encode(), buf)
    assert len(link._pending) == link.MAX_PENDING
    loop = asyncio.new_event_loop()
    try:
        node = Target()
        link.attach(loop, node)
        link.feed(json.dumps({"abort": "gs:0", "how": "exited with code 1"}).encode()
                  + b"\n", buf)
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    assert len(node.died) == link.MAX_PENDING
    assert node.died[0] == ("w:a:0", "was killed by signal 9 (seen by the launcher)")
    assert node.stopped and "gs:0 exited with code 1" in str(node.failure)
