"""The emulator charging a host profile (geomx/sim/cpu.py): exactly the profile's costs, on
the node that pays them; a node's messages queue for its one thread; `[host] cores`
makes nodes share cores; and a profile that costs nothing changes nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from geomx.host_profile import CodecCost, HostProfile, profile_to_toml
from geomx.sim.cpu import ChargedFabric, NodeCpus
from geomx.sim.loop import run_virtual
from geomx.sim.network import Network
from geomx.sim.transport import SimFabric
from geomx.wire import Kind, Message, Payload

import numpy as np

SEND_S, RECV_S, LATE_S, WAKE_S, SHAPED_S = 0.001, 0.002, 0.0005, 0.0003, 0.0007
FLAT = HostProfile(size_bytes=(0,), send_s=(SEND_S,), recv_s=(RECV_S,))


def _network() -> Network:
    net = Network()
    net.add_dc("dc", lan_delay_s=0.0)
    for h in ("a", "b", "c", "d", "e"):
        net.add_host(h, "dc", nic_bandwidth_bps=1e12)
    return net


def _ping_pong(profile: HostProfile | None, rounds: int,
               dc_of: dict[str, str] | None = None) -> float:
    """``a`` sends ``rounds`` requests to ``b``, one at a time; ``b`` answers each. The
    emulated seconds it takes."""
    async def main() -> float:
        loop = asyncio.get_running_loop()
        net = _network()
        fabric = (SimFabric(net) if profile is None else
                  ChargedFabric(net, NodeCpus(profile, {}, dc_of=dc_of), loop.time,
                                loop.call_at_plain))
        a, b = fabric.transport("a"), fabric.transport("b")

        async def echo() -> None:
            while True:
                m = await b.recv()
                await b.send(m.reply(Kind.PUSH_ACK, meta={}))

        task = asyncio.ensure_future(echo())
        for i in range(rounds):
            await a.send(Message(Kind.PUSH, "a", "b", key=i))
            assert (await a.recv()).key == i
        task.cancel()
        return loop.time()

    return run_virtual(main())


def test_a_two_node_exchange_grows_by_exactly_the_profiles_costs():
    plain = _ping_pong(None, 10)
    charged = _ping_pong(FLAT, 10)
    # each round: two messages, each paying its sender's and its receiver's CPU
    assert charged - plain == pytest.approx(10 * 2 * (SEND_S + RECV_S), abs=1e-12)
    delays = HostProfile(size_bytes=(0,), send_s=(SEND_S,), recv_s=(RECV_S,),
                         wakeup_s=WAKE_S, shaped_send_s=SHAPED_S, shaped_late_s=LATE_S,
                         cpu_stretch=2.0)
    # ... with the delays: inside a DC each message finds its receiver asleep; CPU takes
    # twice its time (stretch 2)
    assert _ping_pong(delays, 10) - plain == pytest.approx(
        10 * 2 * (2 * (SEND_S + RECV_S) + WAKE_S), abs=1e-12)
    # ... between DCs each pays the shaper's CPU and is handled late (no wake-up on top)
    assert _ping_pong(delays, 10, dc_of={"a": "x", "b": "y"}) - plain == pytest.approx(
        10 * 2 * (2 * (SEND_S + RECV_S + SHAPED_S) + LATE_S), abs=1e-12)


def test_a_nodes_messages_queue_for_its_one_thread():
    cpus = NodeCpus(FLAT, {})
    ends = [cpus.occupy("a", 0.0, 0.01) for _ in range(3)]
    assert ends == pytest.approx([0.01, 0.02, 0.03])
    assert cpus.occupy("b", 0.0, 0.01) == pytest.approx(0.01)  # another node: its own thread
    assert cpus.occupy("a", 0.5, 0.01) == pytest.approx(0.51)  # idle again later
    assert cpus.occupy("a", 0.5, 0.0) == pytest.approx(0.51)   # free work still waits its turn
    assert cpus.busy_s == pytest.approx({"a": 0.04, "b": 0.01})


def _fan_in_times(cores: int) -> list[float]:
    """Four nodes each receive one message at the same instant: when each is handled."""
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        net = _network()
        fabric = ChargedFabric(net, NodeCpus(HostProfile(recv_s=(0.01,)), {}, cores=cores),
                               loop.time, loop.call_at_plain)
        src = fabric.transport("a")
        sinks = [fabric.transport(n) for n in ("b", "c", "d", "e")]
        for t in sinks:
            await src.send(Message(Kind.PUSH, "a", t.name))
        times = []
        for t in sinks:
            await t.recv()
            times.append(loop.time())
        return times

    return run_virtual(main())


def test_host_cores_make_nodes_on_one_core_serialize_their_cpu_work():
    alone = _fan_in_times(0)
    assert max(alone) - min(alone) == pytest.approx(0.0)  # a core each: all at once
    one = _fan_in_times(1)
    steps = [b - a for a, b in zip(sorted(one), sorted(one)[1:])]
    assert steps == pytest.approx([0.01, 0.01, 0.01])  # one core: one after another
    two = sorted(_fan_in_times(2))
    assert two[1] - two[0] == pytest.approx(0.0) and two[2] - two[0] == pytest.approx(0.01)


def test_codec_kvstore_and_server_costs_fall_on_the_node_that_pays_them():
    p = HostProfile(codecs={"fp16": CodecCost(1e-9, 2e-9)}, kvstore_call_s=1e-4,
                    kvstore_call_s_per_byte=1e-10, server_push_s=2e-4,
                    server_push_s_per_byte=3e-10, server_pull_s=5e-5,
                    server_pull_s_per_byte=4e-10)
    cpus = NodeCpus(p, {"w:a:0": "worker", "gs:0": "global_server", "ls:a": "local_server"})
    coded = Message(Kind.PUSH, "w:a:0", "gs:0", payloads=[Payload.of(np.zeros(500, np.uint16))],
                    meta={"codec": "fp16", "n": 1000, "dtype": "<f4"})
    # the worker encodes 4,000 dense bytes and makes a kvstore call; the server decodes
    # them and takes in a push of 4,000 bytes
    assert cpus.send_cost_s(coded) == pytest.approx(4000e-9 + 1e-4 + 4000e-10)
    assert cpus.recv_cost_s(coded) == pytest.approx(8000e-9 + 2e-4 + 4000 * 3e-10)
    pull = Message(Kind.PULL, "w:a:0", "gs:0")
    assert cpus.send_cost_s(pull) == pytest.approx(1e-4)
    assert cpus.recv_cost_s(pull) == pytest.approx(5e-5)
    reply = Message(Kind.PULL_REPLY, "gs:0", "w:a:0",
                    payloads=[Payload.of(np.zeros(100, np.float32))])
    assert cpus.send_cost_s(reply) == pytest.approx(400 * 4e-10)
    assert cpus.recv_cost_s(reply) == pytest.approx(400 * 1e-10)
    # a local server's own push to the global tier is not a kvstore call
    assert cpus.send_cost_s(Message(Kind.PUSH, "ls:a", "gs:0")) == 0.0
    batch = Message(Kind.BATCH, "w:a:0", "gs:0", batch=[pull, pull])
    assert cpus.send_cost_s(batch) == pytest.approx(2e-4)


def _run(scenario_of, tmp_path, name, *sets):
    from geomx.experiment import run_scenario

    s = scenario_of("quickstart.toml", "run.iterations=6", "run.target_accuracy=0",
                    "metrics.trace=false", "metrics.plot=false",
                    f"run.out_dir={tmp_path / name}", *sets)
    r = run_scenario(s, runtime="emu")
    return r, (r.run_dir / "events.jsonl").read_bytes(), json.loads(
        (r.run_dir / "summary.json").read_text())


def test_a_profile_of_zero_costs_changes_no_event_and_a_real_one_slows_the_job(
        scenario_of, tmp_path):
    zero = tmp_path / "zero.toml"
    zero.write_text(profile_to_toml(HostProfile()))
    slow = tmp_path / "slow.toml"
    slow.write_text(profile_to_toml(HostProfile(send_s=(1e-3,), recv_s=(1e-3,))))
    _, plain, plain_summary = _run(scenario_of, tmp_path, "plain")
    _, same, same_summary = _run(scenario_of, tmp_path, "zero", f"host.profile={zero}")
    assert same == plain
    assert plain_summary["provenance"]["host_profile"] is None
    assert same_summary["provenance"]["host_profile"] == str(zero)
    _, _, slow_summary = _run(scenario_of, tmp_path, "slow", f"host.profile={slow}",
                              "host.cores=1")
    assert slow_summary["emulated_seconds"] > plain_summary["emulated_seconds"]
    busy = slow_summary["extra"]["host_cpu_busy_s"]
    assert set(busy) >= {"gs:0", "ls:party-a", "w:party-a:0"}
    assert busy["gs:0"] > busy["w:party-a:0"]  # the server sends and receives the most
