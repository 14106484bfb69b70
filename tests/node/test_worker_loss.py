"""Worker loss (``[membership] on_worker_loss``).

``fail`` (the default) stops the job naming the dead worker. ``continue``: the DC's local
scheduler declares the worker lost after ``heartbeat_timeout``, the local server
completes the round it held up with the pushes that arrived, scales the DC's sum by
workers / contributors, and the job finishes; counters of applied pushes show that every
round applied each push once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geomx.experiment import JobFailed, run_scenario
from geomx.scenario import ScenarioError, load_scenario, parse_scenario

from tests.helpers.paths import ROOT
from tests.helpers.procs import launch_and_kill, launch_kill_rejoin
from tests.helpers.events import run_events

QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
LOSS = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
        "metrics.trace=false", "run.iterations=60", "membership.in_emulator=true",
        "membership.heartbeat_timeout=3s", "fault.0.node=w:party-a:1", "fault.0.at=3s"]


def _run(tmp_path: Path, sets: list[str]):
    nodes = {}
    r = run_scenario(load_scenario(QUICKSTART, [*LOSS, *sets]), out_dir=tmp_path,
                     inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    return r, nodes


def test_continue_finishes_without_the_lost_worker(tmp_path: Path) -> None:
    r, nodes = _run(tmp_path, ["membership.on_worker_loss=continue"])
    keys = len(nodes["gs:0"].slots)
    dead = nodes["w:party-a:1"].iteration
    assert 0 < dead < 60
    assert r.summary.iterations == 60 and r.summary.final_accuracy > 0.9
    for w in ("w:party-a:0", "w:party-b:0", "w:party-b:1"):
        assert nodes[w].iteration == 60
    ls_a, ls_b = nodes["ls:party-a"], nodes["ls:party-b"]
    assert ls_a.live == ["w:party-a:0"]
    # each round applied each live worker's push once; the lost worker's until it died
    assert ls_a.applied["w:party-a:0"] == keys * 60
    assert ls_a.applied["w:party-a:1"] in (keys * (dead - 1), keys * dead)
    assert ls_b.applied == {"w:party-b:0": keys * 60, "w:party-b:1": keys * 60}
    # one global step per round and key: nothing applied twice, no round skipped
    assert all(s.version == 60 for s in nodes["gs:0"].slots.values())
    assert all(s.round == 60 for s in ls_a.slots.values())
    events = run_events(r.run_dir)
    lost = [e for e in events if e["ev"] == "worker_lost"]
    assert [(e["node"], e["lost"]) for e in lost] == [("lh:party-a", "w:party-a:1")]
    assert lost[0]["t"] - 3.0 <= 3.0 + 1.0  # declared within the heartbeat bound
    reweights = [e for e in events if e["ev"] == "reweight"]
    assert reweights and all(e["contributors"] == 1 and e["workers"] == 2 for e in reweights)
    assert len(reweights) == keys * 60 - ls_a.applied["w:party-a:1"]


def test_fail_is_the_default(tmp_path: Path) -> None:
    with pytest.raises(JobFailed, match=r"w:party-a:1"):
        _run(tmp_path, [])


def test_reweighting_keeps_the_dc_weight() -> None:
    """The DC sum of the contributors is scaled by workers / contributors."""
    import asyncio

    import numpy as np

    from geomx.cluster import plan_job
    from geomx.node.local_server import LocalServer
    from geomx.transport import TransportDefaults
    from geomx.wire import Kind, Message, Payload

    s = load_scenario(QUICKSTART, ["membership.on_worker_loss=continue"])
    job = plan_job(s, "emu").job

    class Services:
        def record(self, *a, **k): pass
        def now(self): return 0.0

    class Transport(TransportDefaults):
        name = "ls:party-a"

    rounds = []

    async def main():
        ls = LocalServer("ls:party-a", "party-a", Transport(), Services(), job)
        ls.post = lambda msg: None
        ls.record = lambda *a, **k: None

        class Policy:
            async def on_round(self, ls_, key, slot, merged, waiting, stop):
                rounds.append((merged.copy(), [m.src for m in waiting]))
        ls.policy = Policy()
        from geomx.node.local_server import LocalSlot
        slot = ls.slots[0] = LocalSlot(shape=(3,), store=np.zeros(3, np.float32),
                                       initialized=True, key=0)
        ls._on_push(Message(Kind.PUSH, "w:party-a:0", ls.name, key=0, request_id=1,
                            payloads=[Payload.of(np.array([1, 2, 3], np.float32))]))
        assert not rounds
        ls.on_member_lost("w:party-a:1")
        await asyncio.sleep(0)
        assert slot.count == 0
    asyncio.run(main())
    merged, waiting = rounds[0]
    np.testing.assert_array_equal(merged, np.array([2, 4, 6], np.float32))
    assert waiting == ["w:party-a:0"]


@pytest.mark.slow
@pytest.mark.parametrize("sets", [["sync.algorithm=mixed"], ["sched.dgt=udp"],
                                  ["sync.algorithm=hfa", "sync.k1=2", "sync.k2=2",
                                   "fault.0.at=0.3s", "run.iterations=200"]],
                         ids=["mixed", "dgt", "hfa"])
def test_continue_composes_with_sync_algorithms_and_dgt(tmp_path: Path, sets) -> None:
    """The local server re-weights whatever its DC's round sums -- gradients (MixedSync,
    DGT's blocks leave after it) or HFA's params / n_local -- by workers / contributors,
    so the DC keeps its weight without the lost worker."""
    r, nodes = _run(tmp_path, ["membership.on_worker_loss=continue", *sets])
    events = run_events(r.run_dir)
    assert [e["lost"] for e in events if e["ev"] == "worker_lost"] == ["w:party-a:1"]
    assert any(e["ev"] == "reweight" for e in events)
    assert nodes["w:party-a:0"].iteration == r.summary.iterations
    assert nodes["ls:party-a"].live == ["w:party-a:0"]
    assert r.summary.final_accuracy > (0.4 if "sync.algorithm=hfa" in sets else 0.9)


#: ESync with party-b's workers 3.5x slower: party-a's workers take several local steps
#: per round, sized by the state server for the workers it has
ESYNC = ["membership.on_worker_loss=continue", "sync.algorithm=esync",
         "training.worker_optimizer=adam", "dc.party-b.compute_per_iter=35ms"]


@pytest.mark.slow
def test_esync_state_server_drops_a_lost_worker(tmp_path: Path) -> None:
    """ESync: the global scheduler tells the state server too; it drops the worker's
    pending queries and record (``StateService.on_worker_lost``), answers the round that
    waited only for it, and sizes every later round for the three workers left. The DC's
    delta sum is re-weighted like a gradient sum, and the job finishes."""
    r, nodes = _run(tmp_path, ESYNC)
    keys = len(nodes["gs:0"].slots)
    events = run_events(r.run_dir)
    (dropped,) = [e for e in events if e["ev"] == "state_worker_lost"]
    assert dropped["node"] == "ss" and dropped["worker"] == "w:party-a:1"
    lost_t = min(e["t"] for e in events if e["ev"] == "worker_lost")
    assert dropped["t"] - lost_t < 0.01  # told by the global scheduler, in the central DC
    after = [e for e in events if e["ev"] == "esync_round" and e["t"] >= dropped["t"]]
    assert after and all(set(e["budgets"]) == {"w:party-a:0", "w:party-b:0", "w:party-b:1"}
                         for e in after)
    assert max(e["budgets"]["w:party-a:0"] for e in after) > 1
    assert nodes["w:party-a:0"].iteration == r.summary.iterations == 60
    rounds = nodes["gs:0"].slots[(0, 0)].version
    assert all(s.version == rounds for s in nodes["gs:0"].slots.values())
    ls_a = nodes["ls:party-a"]
    assert ls_a.live == ["w:party-a:0"] and ls_a.applied["w:party-a:0"] == keys * rounds
    assert any(e["ev"] == "reweight" for e in events)
    assert r.summary.final_accuracy > 0.85
    print(f"ESync, w:party-a:1 lost: {r.summary.emulated_seconds:.2f} s emulated, "
          f"{rounds} rounds, accuracy {r.summary.final_accuracy:.4f}")


@pytest.mark.slow
def test_real_esync_worker_killed_job_continues(tmp_path: Path) -> None:
    """Over real sockets, ESync: SIGKILL one worker's process once it trains; the state
    server drops it and the other three finish the job."""
    sets = ["run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false",
            "run.iterations=60", "membership.on_worker_loss=continue",
            "membership.heartbeat_timeout=3s", "wan.0.latency=5ms", "wan.1.latency=5ms",
            "sync.algorithm=esync", "training.worker_optimizer=adam",
            "dc.1.compute_per_iter=40ms", "dc.2.compute_per_iter=80ms"]
    run_dir, _ = launch_and_kill(tmp_path, QUICKSTART, sets, "w:party-a:1",
                                 watch="w_party-a_1", steps=5)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 60 and summary["final_accuracy"] > 0.8
    ss = [json.loads(line) for line in (run_dir / "nodes" / "ss.events.jsonl").open()]
    assert [e["worker"] for e in ss if e["ev"] == "state_worker_lost"] == ["w:party-a:1"]
    print(f"accuracy {summary['final_accuracy']:.4f}")


@pytest.mark.parametrize("sets, field", [
    (["membership.heartbeat_interval=0s"], "membership.heartbeat_interval"),
    (["topology.kind=flat"], "topology.kind")])
def test_continue_needs_what_it_relies_on(sets, field) -> None:
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        load_scenario(QUICKSTART, ["membership.on_worker_loss=continue", *sets])
    with pytest.raises(ScenarioError, match="on_worker_loss"):
        parse_scenario({"membership": {"on_worker_loss": "ignore"}})


@pytest.mark.slow
def test_real_worker_killed_job_continues_and_it_rejoins(tmp_path: Path) -> None:
    """Over real sockets: SIGKILL one worker's process once it is training; the launcher
    reports it and the DC goes on; the same command with ``--rejoin`` brings the worker
    back, it pulls the model at a round boundary and trains to the end with the others."""
    sets = ["run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false",
            "run.iterations=200", "membership.on_worker_loss=continue",
            "membership.heartbeat_timeout=3s", "wan.0.latency=5ms", "wan.1.latency=5ms",
            # compute is slept, not burnt: the job lasts long enough to come back to
            "dc.1.compute_per_iter=40ms", "dc.2.compute_per_iter=40ms"]
    run_dir, log = launch_kill_rejoin(tmp_path, QUICKSTART, sets, "w:party-a:1",
                                      watch="w_party-a_1", steps=5, rejoin_log="rejoin.log")
    assert "w:party-a:1 died" in log.read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 200
    events = [json.loads(line) for f in sorted((run_dir / "nodes").glob("ls_party-a.*"))
              if f.name.endswith(".events.jsonl") for line in f.open()]
    done = [e for e in events if e["ev"] == "server_done"][0]
    back_at = [e for e in events if e["ev"] == "worker_rejoined"][0]["round"]
    applied = done["applied"]
    assert done["lost"] == [] and applied["w:party-a:0"] == 4 * 200
    lost_at = [e for e in events if e["ev"] == "member_lost"][0]
    # it pushed until it died, then from the round after it rejoined to the last one
    assert back_at < 190
    assert applied["w:party-a:1"] >= 4 * (200 - back_at) + 4 * 5
    assert applied["w:party-a:1"] < 4 * 200
    rejoined = json.loads((run_dir / "nodes" / "w_party-a_1.result.json").read_text())
    assert rejoined["iterations"] == 200
    print(f"lost at t={lost_at['t']:.1f}s, back at round {back_at}, applied {applied}")


def test_emulated_crash_and_rejoin(tmp_path: Path) -> None:
    """``[[fault]] kind = "crash"`` with a duration restarts the worker as ``--rejoin``
    does: it comes back at a round boundary and pushes every round from the next one."""
    r, nodes = _run(tmp_path, ["membership.on_worker_loss=continue", "fault.0.duration=5s"])
    keys = len(nodes["gs:0"].slots)
    back = nodes["w:party-a:1"]
    assert getattr(back, "rejoining", False) and back.iteration == 60
    events = run_events(r.run_dir)
    joined = [e for e in events if e["ev"] == "worker_rejoined" and e["node"] == "ls:party-a"]
    assert len(joined) == 1
    round_ = joined[0]["round"]
    crashed_at = [e for e in events if e["ev"] == "crash"][0]
    assert crashed_at["t"] + 5.0 <= joined[0]["t"]
    ls_a = nodes["ls:party-a"]
    assert ls_a.live == ["w:party-a:0", "w:party-a:1"]
    before = ls_a.applied["w:party-a:1"] - keys * (60 - round_)
    assert 0 < before <= keys * round_  # pushed until the crash, then every round after
    assert all(s.version == 60 for s in nodes["gs:0"].slots.values())
    assert r.summary.iterations == 60


def test_restart_needs_a_lost_worker() -> None:
    with pytest.raises(ScenarioError, match=r"fault\[0\]\.duration"):
        load_scenario(QUICKSTART, [*LOSS, "fault.0.duration=5s"])
    # a local server restarts only when the job waits for it (tests/node/test_server_takeover.py)
    with pytest.raises(ScenarioError, match="on_server_loss is fail"):
        load_scenario(QUICKSTART, [*LOSS, "membership.on_worker_loss=continue",
                                   "fault.0.node=ls:party-a", "fault.0.duration=5s"])
    with pytest.raises(ScenarioError, match="is neither"):
        load_scenario(QUICKSTART, [*LOSS, "membership.on_worker_loss=continue",
                                   "fault.0.node=lh:party-a", "fault.0.duration=5s"])
