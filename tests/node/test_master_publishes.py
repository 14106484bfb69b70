"""On a flat PS the master worker's INIT publishes a key, whoever INITs it first.

Each DC's rank-0 worker INITs the global servers of a flat PS (as under HiPS it INITs its
local server); the master worker INITs them after its commands (``set_optimizer``,
``set_gradient_compression``). A global server that served its workers from their own
INIT let the first round start without the master's configuration whenever the master
started last: over real sockets the workers' first pushes left dense before they learnt
the codec (seen in CI as a resumed onebit run that differed from the uninterrupted one from
its first iteration), and a push that reached the server before ``set_optimizer`` would
have been applied as the new weights. Here the master sleeps before it configures
anything, so its workers always come first. A master whose program initialises nothing
(tests/runtime/test_large_values.py) lets its workers' keys be served when it returns.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from geomx.experiment import run_scenario
from geomx.scenario import load_scenario

from tests.helpers.events import run_events
from tests.helpers.paths import ROOT

QUIET = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
         "metrics.trace=true", "run.iterations=3", "topology.kind=flat",
         "dc.party-a.workers=1", "dc.party-b.workers=1"]

#: examples/cnn.py's shape (Adam on the global server, onebit from the master worker),
#: whose master waits ``ctx.args[0]`` seconds before configuring the servers and
#: ``ctx.args[1]`` (if given) before it returns
PROGRAM = '''
import asyncio
import hashlib

import geomx.kv


async def main(kv, ctx):
    model = ctx.build_model()
    params = model.params
    if kv.is_master_worker:
        await asyncio.sleep(float(ctx.args[0]))
        kv.set_gradient_compression({"type": "onebit", "size_lower_bound": 1000})
        kv.set_optimizer(geomx.kv.optimizer.Adam(learning_rate=ctx.lr))
    for k, p in enumerate(params):
        kv.init(k, p)
        if not kv.is_master_worker:
            kv.pull(k, out=p)
    await kv.waitall()
    if kv.is_master_worker:
        await asyncio.sleep(float(ctx.args[1]) if len(ctx.args) > 1 else 0.0)
        ctx.report(0, master_returns=True)
        return
    data = ctx.dataset()
    batches = ctx.batches()
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        for k, g in enumerate(grads):
            kv.push(k, g, priority=-k)
            kv.pull(k, out=params[k], priority=-k)
        await kv.waitall()
        h = hashlib.sha256()
        for p in params:
            h.update(p.tobytes())
        ctx.report(it, digest=h.hexdigest())
'''


def _scenario(tmp_path: Path) -> Path:
    """examples/cnn.toml running :data:`PROGRAM`, written under ``tmp_path``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    program = tmp_path / "late_master.py"
    program.write_text(PROGRAM)
    scenario = tmp_path / "late_master.toml"
    scenario.write_text((ROOT / "examples" / "cnn.toml").read_text()
                        .replace('program = "cnn.py"', f'program = "{program}"'))
    return scenario


def _run(tmp_path: Path, runtime: str, delay_s: float, linger_s: float = 0.0):
    sets = [*QUIET, f"training.program_args=[\"{delay_s}\", \"{linger_s}\"]"]
    return run_scenario(load_scenario(_scenario(tmp_path), sets),
                        out_dir=tmp_path / runtime, runtime=runtime, progress=False)


def _key0_bytes(run_dir, msg: str) -> list[int]:
    """The bytes of every worker's ``msg`` of key 0, the largest tensor (onebit-encoded
    when pushed): ``xfer`` events in the emulator, ``send`` over real sockets."""
    return [e["bytes"] for e in run_events(run_dir)
            if e["ev"] in ("xfer", "send") and e["msg"] == msg and e["key"] == 0
            and e["src"].startswith("w:")]


def _digests(run_dir) -> dict[tuple[str, int], str]:
    return {(e["node"], e["iteration"]): e["digest"]
            for e in run_events(run_dir, "eval") if "digest" in e}


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_master_that_starts_last_still_configures_the_first_round(tmp_path, runtime):
    late = _run(tmp_path, runtime, 2.0)
    dense_bytes = min(_key0_bytes(late.run_dir, "INIT"))
    pushes = _key0_bytes(late.run_dir, "PUSH")
    assert len(pushes) == 2 * 3
    assert max(pushes) < dense_bytes / 16, pushes  # every push onebit, the first ones too
    commands = [e["t"] for e in run_events(late.run_dir, "command")]
    assert len(commands) == 2 and min(commands) >= 2.0  # the master did start last
    # the same rounds as a master that starts at once (two addends: exact in any order)
    prompt = _run(tmp_path / "prompt", runtime, 0.0)
    assert _digests(late.run_dir) == _digests(prompt.run_dir)
    assert len(_digests(late.run_dir)) == 2 * 3
    assert not run_events(late.run_dir, "warning")


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_master_that_returns_after_its_workers_finds_its_servers_up(tmp_path, runtime):
    """The master's SHUTDOWN reaches a global server that waits for it: sent to one that
    had stopped with its workers, it held the master's exit for the transport's 10 s
    flush bound (over real sockets) before it was dropped."""
    r = _run(tmp_path, runtime, 0.0, linger_s=3.0)
    done = run_events(r.run_dir, "server_done")
    returned = [e["t"] for e in run_events(r.run_dir, "eval") if e.get("master_returns")]
    assert len(done) == 1 and len(returned) == 1 and done[0]["t"] >= returned[0]
    workers_done = max(e["t"] for e in run_events(r.run_dir, "worker_done"))
    if runtime == "emu":
        # the case this is about (over real sockets a loaded machine may stretch the
        # workers' three iterations past the master's 3 s)
        assert returned[0] > workers_done + 1.0
    else:
        log = (r.run_dir / "logs" / "mw.log").read_text()
        assert "not flushed" not in log, log[-2000:]


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_mesh_master_that_configures_after_its_workers_finished(tmp_path, runtime):
    """NETSTORM's servers install the scenario's optimizer at start, so a late master
    changes no round; but its ``set_optimizer`` used to reach servers that had stopped
    with their workers (the emulated job deadlocked; over real sockets the master failed
    after 30 s of refused connections). The servers now wait for its goodbye too."""
    program = tmp_path / "late_mesh_master.py"
    program.write_text(PROGRAM.replace(
        '        kv.set_gradient_compression({"type": "onebit", "size_lower_bound": 1000})\n',
        ""))  # mesh topologies run without codecs
    scenario = tmp_path / "late_mesh_master.toml"
    scenario.write_text((ROOT / "scenarios" / "netstorm_4dc.toml").read_text()
                        .replace("[training]\n", f'[training]\nprogram = "{program}"\n', 1))
    r = run_scenario(load_scenario(scenario, ["run.iterations=3", "run.progress=false",
                                              "metrics.plot=false", 'training.program_args=["3"]']),
                     out_dir=tmp_path / runtime, runtime=runtime, progress=False)
    assert r.summary.iterations == 3
    commands = [e["t"] for e in run_events(r.run_dir, "command")]
    workers_done = max(e["t"] for e in run_events(r.run_dir, "worker_done"))
    assert len(commands) == 4  # one per DC's server
    if runtime == "emu":  # (a loaded machine may stretch the workers past the master's 3 s)
        assert min(commands) > workers_done
    done = run_events(r.run_dir, "server_done")
    assert len(done) == 4 and min(e["t"] for e in done) > max(commands)


def _server_harness(tmp_path: Path):
    """A flat PS's global server on an emulated fabric, and the transports of the master
    worker and of ``w:party-a:0``."""
    from geomx.cluster import plan_job
    from geomx.experiment import EmuServices, build_network
    from geomx.node.global_server import GlobalServer
    from geomx.sim.transport import SimFabric

    s = load_scenario(_scenario(tmp_path), QUIET)
    plan = plan_job(s)
    fabric = SimFabric(build_network(s, plan))
    gs = GlobalServer("gs:0", "central", fabric.transport("gs:0"),
                      EmuServices(0, None, None, plan.job.dc_of), plan.job)
    master = plan.job.master_worker
    return gs, master, fabric.transport(master), fabric.transport("w:party-a:0")


async def _silent(t) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(t.recv(), 5.0)  # 5 emulated seconds


async def _start_with_a_workers_init(gs, wt, value: np.ndarray) -> asyncio.Future:
    """Run ``gs``; ``w:party-a:0`` INITs key 0 with ``value``, which is acknowledged, and
    asks for its initial value. Returns the server's task."""
    from geomx.wire import Kind, Message, Payload

    server = asyncio.ensure_future(gs.run())
    await asyncio.sleep(0)
    await wt.send(Message(Kind.INIT, "w:party-a:0", "gs:0", key=0, request_id=1,
                          payloads=[Payload.of(value)]))
    assert (await asyncio.wait_for(wt.recv(), 5.0)).kind == Kind.INIT_ACK
    await wt.send(Message(Kind.PULL, "w:party-a:0", "gs:0", key=0, request_id=2,
                          meta={"initial": True}))
    return server


def test_requests_before_the_masters_init_wait_for_it(tmp_path):
    """At the global server: a flat-PS worker's INIT is acknowledged, its pull and push
    wait; the master's INIT publishes the master's value, and the waiting pull gets it
    with the codec the master set, and the push is then taken."""
    from geomx.sim.loop import run_virtual
    from geomx.wire import Kind, Message, Payload

    gs, master, mt, wt = _server_harness(tmp_path)
    worker = "w:party-a:0"
    mine, masters = np.ones(2000, np.float32), np.zeros(2000, np.float32)

    async def run():
        server = await _start_with_a_workers_init(gs, wt, mine)
        await wt.send(Message(Kind.PUSH, worker, "gs:0", key=0, request_id=3,
                              payloads=[Payload.of(mine)]))
        await _silent(wt)
        assert gs.applied[worker] == 0
        await mt.send(Message(Kind.COMMAND, master, "gs:0", request_id=4, meta={
            "cmd": "set_gradient_compression",
            "config": {"type": "onebit", "size_lower_bound": 1000}}))
        assert (await asyncio.wait_for(mt.recv(), 5.0)).kind == Kind.COMMAND_ACK
        await _silent(wt)
        await mt.send(Message(Kind.INIT, master, "gs:0", key=0, request_id=5,
                              payloads=[Payload.of(masters)]))
        assert (await asyncio.wait_for(mt.recv(), 5.0)).kind == Kind.INIT_ACK
        reply = await asyncio.wait_for(wt.recv(), 5.0)
        assert reply.kind == Kind.PULL_REPLY and reply.request_id == 2
        np.testing.assert_array_equal(reply.payloads[0].data.view(np.float32), masters)
        assert reply.meta["codec_config"]["type"] == "onebit"
        assert gs.applied[worker] == 1  # the push, taken once the key was published
        gs.stop()
        await server

    run_virtual(run())


def test_a_master_that_initialises_nothing_lets_its_workers_keys_be_served(tmp_path):
    """The master's SHUTDOWN (its program returned) publishes the keys only workers
    INITed, from the worker's value; a key INITed after it is served at once."""
    from geomx.sim.loop import run_virtual
    from geomx.wire import Kind, Message, Payload

    gs, master, mt, wt = _server_harness(tmp_path)
    worker = "w:party-a:0"
    mine = np.arange(2000, dtype=np.float32)

    async def run():
        server = await _start_with_a_workers_init(gs, wt, mine)
        await _silent(wt)
        await mt.send(Message(Kind.SHUTDOWN, master, "gs:0"))
        reply = await asyncio.wait_for(wt.recv(), 5.0)
        assert reply.kind == Kind.PULL_REPLY and reply.request_id == 2
        np.testing.assert_array_equal(reply.payloads[0].data.view(np.float32), mine)
        await wt.send(Message(Kind.INIT, worker, "gs:0", key=1, request_id=3,
                              payloads=[Payload.of(mine[:10])]))
        assert (await asyncio.wait_for(wt.recv(), 5.0)).kind == Kind.INIT_ACK
        await wt.send(Message(Kind.PULL, worker, "gs:0", key=1, request_id=4,
                              meta={"initial": True}))
        reply = await asyncio.wait_for(wt.recv(), 5.0)
        assert reply.kind == Kind.PULL_REPLY and reply.request_id == 4
        gs.stop()
        await server

    run_virtual(run())
