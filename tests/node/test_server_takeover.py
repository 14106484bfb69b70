"""Server loss and takeover (``[membership] on_server_loss = "wait"``).

A local server that dies is waited for (bounded by ``server_loss_timeout``); a new
process under its name re-pulls its keys and their rounds from the global tier, its
workers send again every request it left unanswered, and pushes carry their FSA round so
that nothing is applied twice: counters of applied pushes at the global server show each
round of each DC exactly once, and the model is the clean run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geomx.experiment import JobFailed, run_scenario
from geomx.scenario import ScenarioError, load_scenario

from tests.helpers.paths import ROOT
from tests.helpers.procs import launch_kill_rejoin
from tests.helpers.events import run_events

QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
BASE = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
        "metrics.trace=false", "run.iterations=60", "membership.in_emulator=true",
        "membership.heartbeat_timeout=3s"]
WAIT = ["membership.on_server_loss=wait", "fault.0.node=ls:party-a"]


def _run(tmp_path: Path, sets: list[str]):
    nodes = {}
    r = run_scenario(load_scenario(QUICKSTART, [*BASE, *sets]), out_dir=tmp_path,
                     inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    events = run_events(r.run_dir)
    return r, nodes, events


@pytest.mark.slow
def test_local_server_restart_applies_every_round_once(tmp_path: Path) -> None:
    clean, _, _ = _run(tmp_path / "clean", [])
    # dies at 3 s after its DC's round was applied globally but before its workers heard
    r, nodes, events = _run(tmp_path / "crash", [*WAIT, "fault.0.at=3s", "fault.0.duration=2s"])
    gs, ls = nodes["gs:0"], nodes["ls:party-a"]
    keys = len(gs.slots)
    assert ls.taking_over and r.summary.iterations == 60
    # one global step per round and key, each DC's push taken once per round
    assert all(s.version == 60 for s in gs.slots.values())
    assert gs.applied == {"ls:party-a": keys * 60, "ls:party-b": keys * 60}
    (start,) = {e["round"] for e in events if e["ev"] == "takeover_init"}
    assert 0 < start < 60
    # the resent pushes of the round its predecessor had pushed: answered, not applied
    assert ls.deduped == {"w:party-a:0": keys, "w:party-a:1": keys}
    assert ls.applied == {w: keys * (60 - start) for w in ls.workers}
    assert all(s.round == 60 for s in ls.slots.values())
    replaced = [e for e in events if e["ev"] == "server_replaced" and e["node"].startswith("w:")]
    assert sorted((e["node"], e["resent"]) for e in replaced) == [
        ("w:party-a:0", keys), ("w:party-a:1", keys)]
    # FSA with two workers per DC sums in any order to the same bits: the clean model
    assert r.summary.final_accuracy == clean.summary.final_accuracy
    lost_s = r.summary.emulated_seconds - clean.summary.emulated_seconds
    assert 2.0 <= lost_s < 2.3  # the 2 s it was down, plus re-registering and re-pulling
    print(f"clean {clean.summary.emulated_seconds:.2f} s acc {clean.summary.final_accuracy:.4f}; "
          f"restarted {r.summary.emulated_seconds:.2f} s acc {r.summary.final_accuracy:.4f}")


def test_push_parked_at_the_global_server_is_taken_over(tmp_path: Path) -> None:
    """party-b is slow: party-a's DC sum waits at the global server when its local server
    dies; the successor's push of the same round replaces it there (not added twice)."""
    slow = ["run.iterations=12", "dc.2.compute_per_iter=1s"]
    clean, _, _ = _run(tmp_path / "clean", slow)
    r, nodes, events = _run(tmp_path / "crash", [*slow, *WAIT, "fault.0.at=2.4s",
                                                 "fault.0.duration=0.3s"])
    gs = nodes["gs:0"]
    keys = len(gs.slots)
    parked = [e for e in events if e["ev"] == "dedupe" and e["node"] == "gs:0"]
    assert len(parked) == keys and {e["why"] for e in parked} == {"parked"}
    assert gs.applied == {"ls:party-a": keys * 12, "ls:party-b": keys * 12}
    assert gs.deduped == {"ls:party-a": keys, "ls:party-b": 0}
    assert all(s.version == 12 for s in gs.slots.values())
    assert r.summary.final_accuracy == clean.summary.final_accuracy


@pytest.mark.slow
def test_global_server_restart_from_its_snapshot(tmp_path: Path) -> None:
    """``gs:0`` dies after taking round 12 and answering the pushes, before the local
    servers' pulls: its successor reads its snapshot of round 11 (optimizer config and
    Adam state), the local servers hand in their last pulled values, find the pull of
    round 12 answered with round 11 and push the round's sum again."""
    sets = ["run.iterations=20", "checkpoint.every=1"]
    clean, _, _ = _run(tmp_path / "clean", sets)
    r, nodes, events = _run(tmp_path / "crash", [*sets, "membership.on_server_loss=wait",
                                                 "fault.0.node=gs:0", "fault.0.at=1.63s",
                                                 "fault.0.duration=1s"])
    gs = nodes["gs:0"]
    keys = len(gs.slots)
    assert gs.taking_over and r.summary.iterations == 20
    (restore,) = [e for e in events if e["ev"] == "takeover_restore"]
    assert restore["snapshot"] == 11 and restore["versions"] == [11]
    assert restore["optimizer"] == "adam" and restore["stale_steps"] == {}
    assert [e for e in events if e["ev"] == "repush"]
    # the successor applied rounds 12..20 once per DC and key, nothing more
    assert gs.applied == {"ls:party-a": keys * 9, "ls:party-b": keys * 9}
    assert all(s.version == 20 for s in gs.slots.values())
    assert r.summary.final_accuracy == clean.summary.final_accuracy
    lost_s = r.summary.emulated_seconds - clean.summary.emulated_seconds
    assert 1.0 <= lost_s < 1.3
    print(f"clean {clean.summary.emulated_seconds:.2f} s, restarted "
          f"{r.summary.emulated_seconds:.2f} s, accuracy {r.summary.final_accuracy:.4f}")


@pytest.mark.slow
def test_global_server_restart_under_esync(tmp_path: Path) -> None:
    """ESync's global tier only sums the round's deltas: a successor takes the newest sum a
    local server pulled (no optimizer to restore), every round is applied once per DC, and
    the model is the clean run's."""
    sets = ["run.iterations=20", "checkpoint.every=1", "sync.algorithm=esync",
            "training.worker_optimizer=adam"]
    clean, _, _ = _run(tmp_path / "clean", sets)
    r, nodes, events = _run(tmp_path / "crash", [*sets, "membership.on_server_loss=wait",
                                                 "fault.0.node=gs:0", "fault.0.at=1.63s",
                                                 "fault.0.duration=1s"])
    gs = nodes["gs:0"]
    keys = len(gs.slots)
    (restore,) = [e for e in events if e["ev"] == "takeover_restore"]
    assert gs.taking_over and 0 < restore["snapshot"] < 20 and restore["optimizer"] is None
    after = 20 - restore["snapshot"]
    assert gs.applied == {"ls:party-a": keys * after, "ls:party-b": keys * after}
    assert all(s.version == 20 for s in gs.slots.values())
    assert r.summary.final_accuracy == clean.summary.final_accuracy
    print(f"clean {clean.summary.emulated_seconds:.2f} s, restarted "
          f"{r.summary.emulated_seconds:.2f} s, accuracy {r.summary.final_accuracy:.4f}")


@pytest.mark.parametrize("node,schedulers", [("ls:party-a", {"gh", "lh:party-a"}),
                                             ("gs:0", {"gh"})])
def test_server_that_never_returns_fails_by_name(tmp_path: Path, node, schedulers) -> None:
    with pytest.raises(JobFailed, match=rf"{node}.*server_loss_timeout = 5 s"):
        _run(tmp_path, ["membership.on_server_loss=wait", f"fault.0.node={node}",
                        "fault.0.at=3s", "membership.server_loss_timeout=5s",
                        "checkpoint.every=10"])
    events = [json.loads(line) for f in tmp_path.glob("*/events.jsonl") for line in f.open()]
    lost = [e for e in events if e["ev"] == "server_lost"]
    failed = [e for e in events if e["ev"] == "node_failed" and e.get("failed") == node]
    assert {e["node"] for e in lost} == schedulers
    # found by heartbeats (3 s), then waited for exactly server_loss_timeout (emulated)
    assert all(3.0 < e["t"] <= 3.0 + 3.0 + 1.0 for e in lost)
    assert {round(e["t"] - lost[0]["t"], 6) for e in failed} == {5.0}


def test_a_crash_at_zero_seconds_is_injected_too(tmp_path: Path) -> None:
    """``fault.at = 0s`` is a crash as the job starts, not a fault to drop (only a
    resumed run leaves out the crashes at or before its checkpoint): restarted 3 s later
    the server is waited for and the job finishes, 3 s later than a clean run."""
    clean, _, _ = _run(tmp_path / "clean", ["run.iterations=20"])
    r, _, events = _run(tmp_path / "crash", [*WAIT, "run.iterations=20", "fault.0.at=0s",
                                              "fault.0.duration=3s"])
    assert [e["t"] for e in events if e["ev"] == "crash"] == [0.0]
    assert r.summary.iterations == 20
    assert r.summary.emulated_seconds > clean.summary.emulated_seconds + 2.5


def test_fail_stays_the_default(tmp_path: Path) -> None:
    with pytest.raises(JobFailed, match=r"ls:party-a"):
        _run(tmp_path, ["fault.0.node=ls:party-a", "fault.0.at=3s"])


def test_takeover_is_deterministic(tmp_path: Path) -> None:
    sets = [*WAIT, "run.iterations=30", "fault.0.at=2.13s", "fault.0.duration=1s"]
    runs = [_run(tmp_path / str(i), sets)[2] for i in range(2)]
    assert runs[0] == runs[1]
    assert any(e["ev"] == "server_takeover" for e in runs[0])


@pytest.mark.slow
@pytest.mark.parametrize("sets", [["codec.type=fp16"],
                                  ["codec.type=bsc", "codec.size_lower_bound=1000"],
                                  ["sched.p3=true", "sched.p3_slice_elements=200"],
                                  ["sched.dgt=udp"]],
                         ids=["fp16", "bsc", "p3", "dgt"])
def test_takeover_with_a_codec_or_p3(tmp_path: Path, sets: list[str]) -> None:
    """A codec (stateless, or with error feedback whose residuals at the lost server are
    dropped once), P3's slices and fused replies and DGT's block channels (a successor
    starts with fresh contribution estimates) survive a local server's takeover:
    every round is applied once per key and the job trains to the end."""
    r, nodes, events = _run(tmp_path, [*WAIT, "fault.0.at=3s", "fault.0.duration=2s", *sets])
    gs = nodes["gs:0"]
    assert nodes["ls:party-a"].taking_over and r.summary.iterations == 60
    assert any(e["ev"] == "takeover_init" for e in events)
    assert all(s.version == 60 for s in gs.slots.values())
    assert r.summary.final_accuracy > 0.85


@pytest.mark.parametrize("sets,field", [
    (["sync.algorithm=hfa", "codec.type=fp16"], "codec.type"),
    (["membership.heartbeat_interval=0s"], "membership.heartbeat_interval"),
    (["sched.tsengine_intra=true"], "sched.tsengine_intra"),
])
def test_wait_refuses_what_it_cannot_rebuild(sets, field) -> None:
    with pytest.raises(ScenarioError) as e:
        load_scenario(QUICKSTART, ["membership.on_server_loss=wait", *sets])
    assert e.value.path == field


@pytest.mark.parametrize("sets", [
    ["fault.0.node=ls:party-a", "fault.0.duration=2s"],          # nobody waits for it
    [*WAIT[:1], "fault.0.node=gs:0", "fault.0.duration=2s"],      # no snapshot to restart from
])
def test_restart_needs_a_server_the_job_waits_for(sets) -> None:
    with pytest.raises(ScenarioError, match="fault\\[0\\].duration|allowed"):
        load_scenario(QUICKSTART, sets)


def _kill_and_take_over(tmp_path: Path, node: str, extra: list[str], *,
                        accuracy_within: float = 0.01) -> tuple[Path, list, float]:
    """Launch the quickstart over real sockets, SIGKILL ``node``'s process once training
    runs, start its command again with ``--rejoin``; the run folder, its events and the
    emulated clean run's accuracy."""
    sets = ["run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false",
            "run.iterations=40", "membership.on_server_loss=wait",
            "membership.heartbeat_timeout=3s", "wan.0.latency=5ms", "wan.1.latency=5ms",
            "dc.1.compute_per_iter=40ms", "dc.2.compute_per_iter=40ms", *extra]
    clean = run_scenario(load_scenario(QUICKSTART, [*sets, "run.progress=false"]),
                         out_dir=tmp_path / "emu")
    run_dir, log = launch_kill_rejoin(tmp_path, QUICKSTART, sets, node, watch="w_party-a_0",
                                      steps=8, rejoin_log="takeover.log")
    assert f"{node} died" in log.read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 40
    assert abs(summary["final_accuracy"] - clean.summary.final_accuracy) <= accuracy_within
    events = [json.loads(line) for f in sorted((run_dir / "nodes").glob("*.events.jsonl"))
              for line in f.open()]
    print(f"{node} taken over; accuracy {summary['final_accuracy']:.4f} vs "
          f"{clean.summary.final_accuracy:.4f} (emulated clean run)")
    return run_dir, events, clean.summary.final_accuracy


@pytest.mark.slow
def test_real_local_server_killed_and_taken_over(tmp_path: Path) -> None:
    """Over real sockets: SIGKILL ``ls:party-a``'s process once training runs, start its
    command again with ``--rejoin``: the job finishes at the clean run's accuracy."""
    _, events, _ = _kill_and_take_over(tmp_path, "ls:party-a", [])
    start = {e["round"] for e in events if e["ev"] == "takeover_init"}
    # keys can be a round apart: killed between pushing one key's round sum and the next
    # one's, the global tier holds the first at the new round and the second at the old
    assert 0 < min(start) and max(start) - min(start) <= 1 and max(start) < 40, \
        sorted((e["key"], e["round"]) for e in events if e["ev"] == "takeover_init")
    gs_done = [e for e in events if e["ev"] == "server_done" and e["node"] == "gs:0"][0]
    keys = len({e["key"] for e in events if e["ev"] == "takeover_init"})
    assert gs_done["applied"] == {"ls:party-a": keys * 40, "ls:party-b": keys * 40}


@pytest.mark.slow
@pytest.mark.parametrize("sync", [["sync.algorithm=esync", "training.worker_optimizer=adam"],
                                  ["sync.algorithm=mixed"]], ids=["esync", "mixed"])
def test_real_local_server_takeover_under_esync_and_mixed(tmp_path: Path,
                                                          sync: list[str]) -> None:
    """Over real sockets, ESync and MixedSync: ``ls:party-a``'s process SIGKILLed once
    training runs and started again with ``--rejoin``; the global server applies each
    DC's push of every round once. The real clock orders MixedSync's updates and sizes
    ESync's step budgets (a measured step time can give a worker two local steps in a
    round, so ESync's rounds can be fewer than its 40 iterations), so the accuracy is held
    to 0.03 of the emulated clean run's."""
    _, events, _ = _kill_and_take_over(tmp_path, "ls:party-a", sync, accuracy_within=0.03)
    assert any(e["ev"] == "takeover_init" for e in events)
    gs_done = [e for e in events if e["ev"] == "server_done" and e["node"] == "gs:0"][0]
    keys = len({e["key"] for e in events if e["ev"] == "takeover_init"})
    applied = gs_done["applied"]
    if "sync.algorithm=mixed" in sync:
        # each DC's own 40 rounds, each applied once: 40 global steps per DC and key
        assert applied == {"ls:party-a": keys * 40, "ls:party-b": keys * 40}
        assert gs_done["versions"] == 2 * keys * 40
    else:
        # synchronous rounds: both DCs' pushes of every round applied once, one update each
        rounds = gs_done["versions"] // keys
        assert 20 <= rounds <= 40 and gs_done["versions"] == keys * rounds
        assert applied == {"ls:party-a": keys * rounds, "ls:party-b": keys * rounds}


@pytest.mark.slow
def test_real_global_server_killed_and_taken_over_from_its_snapshot(tmp_path: Path) -> None:
    """The same for ``gs:0``, with a checkpoint every round: the successor restores its
    snapshot and the local servers' newest values; every key ends at the clean version."""
    _, events, _ = _kill_and_take_over(tmp_path, "gs:0", ["checkpoint.every=1"])
    restored = [e for e in events if e["ev"] == "takeover_restore"]
    assert len(restored) == 1 and 0 < restored[0]["snapshot"] < 40, restored
    done = [e for e in events if e["ev"] == "server_done" and e["node"] == "gs:0"]
    clean = run_events(next((tmp_path / "emu").glob("*/events.jsonl")).parent)
    clean_done = [e for e in clean if e["ev"] == "server_done" and e["node"] == "gs:0"]
    # the successor ends with every (key, part) at the clean run's version: none behind
    assert done[-1]["versions"] == clean_done[-1]["versions"] > 0, (done, clean_done)


@pytest.mark.slow
@pytest.mark.parametrize("at", ["0s", "6s"])
def test_real_server_that_never_returns_fails_in_one_line_per_node(tmp_path: Path,
                                                                   at: str) -> None:
    """Over real sockets a server that is never taken over fails the job by name, after
    the bound, in plain lines: an expected failure prints no traceback. Killed at once
    (before it registered: only the launcher knows it died, and tells the schedulers) the
    bound counts from then, not from the 120 s registration timeout; killed at 6 s it
    usually ran already, and heartbeats find it."""
    sets = ["run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false",
            "run.iterations=100000", "membership.on_server_loss=wait",
            "membership.heartbeat_timeout=2s", "membership.server_loss_timeout=2s",
            "fault.0.node=ls:party-a", f"fault.0.at={at}", "fault.0.duration=0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "geomx", "launch", str(QUICKSTART), "--quiet",
                        "--out", str(tmp_path), *[a for s in sets for a in ("--set", s)]],
                       env=env, capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "ls:party-a" in out and "not taken over within membership.server_loss_timeout" in out
    assert "Traceback" not in out, out[-3000:]
    # (not the registration timeout's 120 s; a generous bound for a loaded machine)
    assert time.monotonic() - t0 < 100, out[-3000:]
    if at == "0s":
        gh = next(tmp_path.glob("*/logs/gh.log")).read_text()
        assert "killed by signal 9 (seen by the launcher) before the job started" in gh, gh


@pytest.mark.slow
def test_real_server_killed_while_starting_and_restarted_lets_the_job_run(
        tmp_path: Path) -> None:
    """A server killed before it registered and started again 3 s later (the fault's
    duration; the launcher runs its command with ``--rejoin``) joins as if it had been
    slow to start: the job runs to the end."""
    sets = ["run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false",
            "run.iterations=20", "membership.on_server_loss=wait",
            "membership.heartbeat_timeout=3s", "membership.server_loss_timeout=30s",
            "fault.0.node=ls:party-a", "fault.0.at=0s", "fault.0.duration=3s"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "geomx", "launch", str(QUICKSTART), "--quiet",
                        "--out", str(tmp_path), *[a for s in sets for a in ("--set", s)]],
                       env=env, capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "ls:party-a restarted" in out, out[-3000:]
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["iterations"] == 20


@pytest.mark.slow
@pytest.mark.parametrize("sync", [["sync.algorithm=esync", "training.worker_optimizer=adam"],
                                  ["sync.algorithm=mixed"]], ids=["esync", "mixed"])
def test_local_server_takeover_under_esync_and_mixed(tmp_path: Path, sync: list[str]) -> None:
    """ESync's global side is FSA's summing server, so its resent pushes are told apart by
    round and its local servers' state (the round's sum) comes back from the global tier;
    its state server is not involved. MixedSync's global side counts each DC's pushes:
    its successor starts from its own DC's round (``meta.round`` of the global replies),
    and a resent push up to that count is answered, not applied again. Both: every round
    of every DC is applied once per key, and the job trains to the end."""
    clean, _, _ = _run(tmp_path / "clean", sync)
    r, nodes, events = _run(tmp_path / "crash", [*sync, *WAIT, "fault.0.at=3s",
                                                 "fault.0.duration=2s"])
    gs, ls = nodes["gs:0"], nodes["ls:party-a"]
    keys = len(gs.slots)
    assert ls.taking_over and r.summary.iterations == 60
    (start,) = {e["round"] for e in events if e["ev"] == "takeover_init"}
    assert 0 < start < 60
    assert gs.applied == {"ls:party-a": keys * 60, "ls:party-b": keys * 60}
    assert all(s.round == 60 for s in ls.slots.values())
    assert sum(ls.deduped.values()) > 0  # the round its predecessor had pushed
    assert ls.applied == {w: keys * (60 - start) for w in ls.workers}
    if "sync.algorithm=esync" in sync:
        # synchronous rounds, budgets from step times that exclude the wait: the clean bits
        assert all(s.version == 60 for s in gs.slots.values())
        assert r.summary.final_accuracy == clean.summary.final_accuracy
    else:
        # party-b ran ahead while party-a's server was down: another order of updates
        assert all(s.version == 120 for s in gs.slots.values())
        assert abs(r.summary.final_accuracy - clean.summary.final_accuracy) <= 0.02
    print(f"clean {clean.summary.emulated_seconds:.2f} s acc {clean.summary.final_accuracy:.4f};"
          f" taken over {r.summary.emulated_seconds:.2f} s acc {r.summary.final_accuracy:.4f}"
          f" (from round {start})")


def test_mixed_push_held_at_the_global_server_is_taken_over(tmp_path: Path) -> None:
    """MixedSync with a staleness bound of 1 and a slow party-b: party-a's push is applied
    and its acknowledgement held when its local server dies; the successor's push of the
    same round takes the held one's place (not applied twice) and gets the answer."""
    slow = ["run.iterations=12", "dc.2.compute_per_iter=1s", "sync.algorithm=mixed",
            "sync.staleness=1"]
    r, nodes, events = _run(tmp_path, [*slow, *WAIT, "fault.0.at=2.4s",
                                       "fault.0.duration=0.3s"])
    gs = nodes["gs:0"]
    keys = len(gs.slots)
    held = [e for e in events if e["ev"] == "dedupe" and e["node"] == "gs:0"]
    assert held and {e["why"] for e in held} == {"parked"}
    assert gs.applied == {"ls:party-a": keys * 12, "ls:party-b": keys * 12}
    assert all(s.version == 24 for s in gs.slots.values())
    assert r.summary.iterations == 12


def test_a_dist_async_store_under_wait_switches_where_a_global_server_restarts_too() -> None:
    """``kv.create("dist_async")`` under ``algorithm = "auto"`` switches the job to
    MixedSync, also where a global server may restart (checkpoints on): its successor
    takes each DC's applied pushes from the replies' handover (``GlobalSide.handover``)."""
    from types import SimpleNamespace

    from geomx.cluster import plan_job
    from geomx.node.global_server import switch_sync

    def node(sets):
        job = plan_job(load_scenario(QUICKSTART, ["membership.on_server_loss=wait", *sets]),
                       "emu").job
        return SimpleNamespace(job=job, slots={}, name="gs:0")

    for sets in ([], ["checkpoint.every=5"]):
        n = node(sets)
        assert switch_sync(n, "mixed") == "" and n.job.sync_algorithm.name == "mixed"
