"""Bad requests get an ERROR reply naming the problem; stored values never change."""

import asyncio

import numpy as np

from geomx.cluster import plan_job
from geomx.experiment import EmuServices, build_network
from geomx.node.global_server import GlobalServer
from geomx.sim.loop import run_virtual
from geomx.sim.transport import SimFabric
from geomx.wire import Kind, Message, Payload


def _setup(scenario_of):
    s = scenario_of("quickstart.toml")
    plan = plan_job(s)
    net = build_network(s, plan)
    fabric = SimFabric(net)
    services = EmuServices(0, None, None, plan.job.dc_of)
    gs = GlobalServer("gs:0", "central", fabric.transport("gs:0"), services, plan.job)
    return gs, fabric


def test_global_server_rejects_bad_pushes_and_keeps_serving(scenario_of):
    gs, fabric = _setup(scenario_of)
    mw = fabric.transport("mw")
    ls = fabric.transport("ls:party-a")
    outsider = fabric.transport("w:party-b:0")
    init = np.arange(10, dtype=np.float32)

    async def call(t, msg):
        await t.send(msg)
        return await asyncio.wait_for(t.recv(), 60)

    async def scenario():
        server = asyncio.ensure_future(gs.run())
        await asyncio.sleep(0)
        ack = await call(mw, Message(Kind.INIT, "mw", "gs:0", key=0, request_id=1,
                                     payloads=[Payload.of(init)]))
        assert ack.kind == Kind.INIT_ACK
        bad = [
            Message(Kind.PUSH, "ls:party-a", "gs:0", key=7, request_id=2,
                    payloads=[Payload.of(np.ones(10, np.float32))]),            # unknown key
            Message(Kind.PUSH, "ls:party-a", "gs:0", key=0, request_id=3,
                    payloads=[Payload.of(np.ones(11, np.float32))]),            # wrong size
            Message(Kind.PUSH, "ls:party-a", "gs:0", key=0, request_id=4),      # no payload
            Message(Kind.COMMAND, "ls:party-a", "gs:0", request_id=5,
                    meta={"cmd": "format_disk"}),                                # unknown command
        ]
        for m in bad:
            r = await call(ls, m)
            assert r.kind == Kind.ERROR and r.request_id == m.request_id, r
            assert r.meta["reason"]
        r = await call(outsider, Message(Kind.PUSH, "w:party-b:0", "gs:0", key=0, request_id=6,
                                         payloads=[Payload.of(np.ones(10, np.float32))]))
        assert r.kind == Kind.ERROR and "may not push" in r.meta["reason"]
        # the store is untouched and the server still answers a good pull
        r = await call(ls, Message(Kind.PULL, "ls:party-a", "gs:0", key=0, request_id=7))
        assert r.kind == Kind.PULL_REPLY
        np.testing.assert_array_equal(r.payloads[0].data, init)
        gs.stop()
        await server

    run_virtual(scenario())


def test_kvstore_misuse_is_explained():
    import pytest

    import geomx.kv

    with pytest.raises(geomx.kv.KVStoreError, match="must be called from code run by a geomx worker"):
        geomx.kv.create("dist_sync")
    with pytest.raises(geomx.kv.KVStoreError, match="allowed"):
        geomx.kv.create("dist_sink")


def test_only_the_master_worker_configures_and_strangers_cannot_pull(scenario_of):
    gs, fabric = _setup(scenario_of)
    ls = fabric.transport("ls:party-a")
    worker = fabric.transport("w:party-a:0")

    async def call(t, msg):
        await t.send(msg)
        return await asyncio.wait_for(t.recv(), 60)

    async def scenario():
        server = asyncio.ensure_future(gs.run())
        await asyncio.sleep(0)
        r = await call(ls, Message(Kind.COMMAND, "ls:party-a", "gs:0", request_id=1,
                                   meta={"cmd": "set_optimizer", "config": {"name": "sgd"}}))
        assert r.kind == Kind.ERROR and "master worker" in r.meta["reason"]
        r = await call(ls, Message(Kind.INIT, "ls:party-a", "gs:0", key=0, request_id=2,
                                   payloads=[Payload.of(np.zeros(3, np.float32))]))
        assert r.kind == Kind.ERROR
        r = await call(worker, Message(Kind.PULL, "w:party-a:0", "gs:0", key=5, request_id=3))
        assert r.kind == Kind.ERROR and "may not pull" in r.meta["reason"]
        assert gs.optimizer is None and not gs.slots
        gs.stop()
        await server

    run_virtual(scenario())


def test_scheduler_barriers_check_membership_and_size(scenario_of):
    from geomx.node.scheduler import Scheduler

    s = scenario_of("quickstart.toml")
    plan = plan_job(s)
    fabric = SimFabric(build_network(s, plan))
    services = EmuServices(0, None, None, plan.job.dc_of)
    lh = Scheduler("lh:party-a", "party-a", fabric.transport("lh:party-a"), services,
                   plan.job.scheduler_members("lh:party-a"))
    w0, w1 = fabric.transport("w:party-a:0"), fabric.transport("w:party-a:1")
    outsider = fabric.transport("w:party-b:0")

    async def scenario():
        sched = asyncio.ensure_future(lh.run())
        await asyncio.sleep(0)
        await w0.send(Message(Kind.BARRIER, "w:party-a:0", "lh:party-a", request_id=1,
                              meta={"group": "g", "size": 2}))
        await w1.send(Message(Kind.BARRIER, "w:party-a:1", "lh:party-a", request_id=2,
                              meta={"group": "g", "size": 1}))   # tries to release early
        r = await asyncio.wait_for(w1.recv(), 10)
        assert r.kind == Kind.ERROR and "has size 2" in r.meta["reason"]
        await outsider.send(Message(Kind.BARRIER, "w:party-b:0", "lh:party-a", request_id=3,
                                    meta={"group": "g", "size": 2}))
        r = await asyncio.wait_for(outsider.recv(), 10)
        assert r.kind == Kind.ERROR and "not a member" in r.meta["reason"]
        await w1.send(Message(Kind.BARRIER, "w:party-a:1", "lh:party-a", request_id=4,
                              meta={"group": "g", "size": 2}))
        r0 = await asyncio.wait_for(w0.recv(), 10)
        r1 = await asyncio.wait_for(w1.recv(), 10)
        assert r0.kind == r1.kind == Kind.BARRIER_RELEASE
        lh.stop()
        await sched

    run_virtual(scenario())


def test_a_stray_reply_is_dropped_not_answered(scenario_of):
    gs, fabric = _setup(scenario_of)
    ls = fabric.transport("ls:party-a")

    async def scenario():
        server = asyncio.ensure_future(gs.run())
        await asyncio.sleep(0)
        await ls.send(Message(Kind.PULL_REPLY, "ls:party-a", "gs:0", key=0, request_id=12345))
        await asyncio.sleep(1.0)
        assert ls.pending() == 0  # nothing came back: no ERROR ping-pong
        gs.stop()
        await server

    run_virtual(scenario())
