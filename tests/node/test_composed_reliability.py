"""Reliability features composed with the features they used to be refused with.

Each test runs both features and checks, from the nodes' counters and the event log,
that both were active and that the job trained (docs/scenario.md, "Combinations";
docs/reliability.md):

* checkpoints with the per-layer compute model: stopped and resumed, the model is the
  uninterrupted run's, bit for bit (a worker saves once the round's pulls have landed);
* worker loss (and a worker's restart) and local-server takeover with the per-layer
  model: every round of every key applied once;
* a worker's restart under ESync: the state server takes it back and sizes its budgets
  again (``StateService.on_worker_rejoined``);
* a global server's restart under MixedSync: the successor counts each DC's pushes from
  the handover that came with the newest value pulled (``GlobalSide.handover``), so no
  push is lost or applied twice;
* TSEngine with ESync (the same bits as without it) and its intra-DC overlay with
  MixedSync.

The real-socket tests (marked slow) kill a process of a ``geomx launch`` job on loopback
and start its command again with ``--rejoin``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from geomx.experiment import resume_scenario, run_scenario
from geomx.scenario import ScenarioError, load_scenario

from tests.helpers.events import run_events
from tests.helpers.paths import ROOT
from tests.helpers.procs import launch_and_kill, launch_kill_rejoin
from tests.node.test_checkpoint import _bitwise_equal, _final_state
from tests.node.test_server_takeover import _kill_and_take_over

QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
QUIET = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
         "metrics.trace=false"]
LAYERED = ['training.layer_compute="flops"']
#: faults found by heartbeats in the emulator too
LOSS = ["membership.in_emulator=true", "membership.heartbeat_timeout=3s"]


def _run(tmp_path: Path, sets: list[str]):
    nodes = {}
    r = run_scenario(load_scenario(QUICKSTART, [*QUIET, *sets]), out_dir=tmp_path,
                     inspect=lambda ns: nodes.update({n.name: n for n in ns}))
    return r, nodes, run_events(r.run_dir)


def _params(into: dict[str, list[np.ndarray]]):
    def grab(nodes):
        for n in nodes:
            if n.name.startswith("w:") and getattr(n, "params", None) is not None:
                into[n.name] = [np.array(p) for p in n.params]
    return grab


# --------------------------------------------------------------------------- per-layer
@pytest.mark.slow
def test_layered_checkpoint_resume_is_bit_exact(tmp_path: Path) -> None:
    """Per-layer pushes and pulls overlap the next forward pass; a worker's file is the
    state after the round (saved once its pulls landed), so a run stopped at 10 and
    resumed to 20 ends with the uninterrupted run's model, every server and worker."""
    sets = [*QUIET, *LAYERED, "checkpoint.every=5"]
    clean: dict[str, list[np.ndarray]] = {}
    resumed: dict[str, list[np.ndarray]] = {}
    run_scenario(load_scenario(QUICKSTART, [*sets, "run.iterations=20"]), out_dir=tmp_path,
                 inspect=_final_state(clean))
    first = run_scenario(load_scenario(QUICKSTART, [*sets, "run.iterations=10"]),
                         out_dir=tmp_path)
    second = run_scenario(resume_scenario(first.run_dir, ["run.iterations=20"]),
                          out_dir=tmp_path, inspect=_final_state(resumed))
    assert second.summary.iterations == 20
    assert clean.keys() == resumed.keys() and _bitwise_equal(clean, resumed)
    events = run_events(first.run_dir)
    assert any(e["ev"] == "forward" for e in events)
    saved = [e for e in events if e["ev"] == "checkpoint" and e["node"] == "w:party-a:0"]
    # rounds 5 and 10, each saved as the state after the iteration that ended it
    assert [(e["round"], e["iteration"]) for e in saved] == [(5, 5), (10, 10)]
    assert any(e["ev"] == "restore" for e in run_events(second.run_dir))


def test_layered_local_server_takeover_applies_every_round_once(tmp_path: Path) -> None:
    """``ls:party-a`` dies at 2 s and is back at 3 s: its workers' per-layer pushes of the
    round it left unanswered are resent and told apart by round, key by key."""
    r, nodes, events = _run(tmp_path, [
        *LAYERED, *LOSS, "run.iterations=40", "membership.on_server_loss=wait",
        "fault.0.node=ls:party-a", "fault.0.at=2s", "fault.0.duration=1s"])
    gs, ls = nodes["gs:0"], nodes["ls:party-a"]
    keys = len(gs.slots)
    assert ls.taking_over and any(e["ev"] == "forward" for e in events)
    (start,) = {e["round"] for e in events if e["ev"] == "takeover_init"}
    assert gs.applied == {"ls:party-a": keys * 40, "ls:party-b": keys * 40}
    assert all(s.version == 40 for s in gs.slots.values())
    assert ls.applied == {w: keys * (40 - start) for w in ls.workers}
    assert sum(ls.deduped.values()) > 0
    assert r.summary.final_accuracy > 0.9


def test_layered_worker_loss_and_restart(tmp_path: Path) -> None:
    r, nodes, events = _run(tmp_path, [
        *LAYERED, *LOSS, "run.iterations=60", "membership.on_worker_loss=continue",
        "fault.0.node=w:party-a:1", "fault.0.at=3s", "fault.0.duration=5s"])
    keys = len(nodes["gs:0"].slots)
    ls_a = nodes["ls:party-a"]
    (back,) = [e["round"] for e in events
               if e["ev"] == "worker_rejoined" and e["node"] == "ls:party-a"]
    assert nodes["w:party-a:1"].rejoining and ls_a.live == ["w:party-a:0", "w:party-a:1"]
    assert any(e["ev"] == "forward" for e in events)
    # the lost worker's pushes until it died, then every one from the round after it
    # came back; the rounds without it were reweighted, one per key
    before = ls_a.applied["w:party-a:1"] - keys * (60 - back)
    reweights = sum(e["ev"] == "reweight" for e in events)
    assert 0 < before < keys * back and before + reweights == keys * back
    assert all(s.version == 60 for s in nodes["gs:0"].slots.values())
    assert r.summary.iterations == 60 and r.summary.final_accuracy > 0.9


# --------------------------------------------------------------------------- checkpoints
def test_checkpoints_with_a_lost_worker_complete_and_resume(tmp_path: Path) -> None:
    """``w:party-a:1`` dies at 1 s and its DC goes on: the checkpoints after that are
    complete without its file (the local server's file names the live workers), and a
    run resumed from round 30 brings the worker back, as a rejoined one, from the
    checkpoint's model; the resumed run is the same bits twice."""
    sets = [*QUIET, *LOSS, "checkpoint.every=5", "membership.on_worker_loss=continue",
            "fault.0.node=w:party-a:1", "fault.0.at=1s"]
    first = run_scenario(load_scenario(QUICKSTART, [*sets, "run.iterations=30"]),
                         out_dir=tmp_path)
    lost_at = [e["t"] for e in run_events(first.run_dir) if e["ev"] == "worker_lost"]
    assert lost_at and lost_at[0] < 5.0  # well before round 30
    from geomx.node import checkpoint as ckpt

    assert ckpt.complete_rounds(first.run_dir / "checkpoints") == [25, 30]
    manifest = ckpt.read_manifest(ckpt.latest_checkpoint(first.run_dir))
    assert manifest["lost"] == ["w:party-a:1"] and "w:party-a:1" not in manifest["nodes"]
    finals = []
    for _ in range(2):
        params: dict[str, list[np.ndarray]] = {}
        nodes: dict = {}

        def grab(ns, params=params, nodes=nodes):
            _params(params)(ns)
            nodes.update({n.name: n for n in ns})

        second = run_scenario(resume_scenario(first.run_dir, ["run.iterations=60"]),
                              out_dir=tmp_path, inspect=grab)
        finals.append(params)
    events = run_events(second.run_dir)
    restored = {e["node"] for e in events if e["ev"] == "restore"}
    assert restored == {"gs:0", "ls:party-a", "ls:party-b", "w:party-a:0", "w:party-b:0",
                        "w:party-b:1"}
    (back,) = [e for e in events if e["ev"] == "rejoined"]
    assert back["node"] == "w:party-a:1" and back["iteration"] == 30
    keys = len(nodes["gs:0"].slots)
    # the returning worker's push is in every round after the checkpoint's
    assert nodes["ls:party-a"].applied == {"w:party-a:0": keys * 30, "w:party-a:1": keys * 30}
    assert all(s.version == 60 for s in nodes["gs:0"].slots.values())
    assert second.summary.iterations == 60 and second.summary.final_accuracy > 0.9
    assert _bitwise_equal(*finals)


# --------------------------------------------------------------------------- HFA
HFA = ["sync.algorithm=hfa", "sync.k1=2", "sync.k2=3", "training.worker_optimizer=adam",
       "run.iterations=120"]


def _global_syncs(events: list[dict]) -> dict[tuple[int, int], set[str]]:
    """(key, global sync) -> the digests of the model each DC's local server holds."""
    out: dict[tuple[int, int], set[str]] = {}
    for e in events:
        if e["ev"] == "global_sync":
            out.setdefault((e["key"], e["sync"]), set()).add(e["digest"])
    return out


@pytest.mark.parametrize("at", ["1.7s", "2.2s", "2.5s"])
def test_hfa_local_server_takeover_keeps_the_dc_model(tmp_path: Path, at: str) -> None:
    """``ls:party-a`` dies at ``at`` (between global syncs, local syncs into the period,
    or with a global sync's answers in flight) and is back 1 s later: the successor
    takes the milestone from the global tier and counts the DC's local syncs from the
    workers' pushes, so every DC holds the same model after each of the 20 global syncs,
    and the workers end with the uninterrupted run's model, bit for bit."""
    clean: dict[str, list[np.ndarray]] = {}
    run_scenario(load_scenario(QUICKSTART, [*QUIET, *HFA]), out_dir=tmp_path,
                 inspect=_params(clean))
    params: dict[str, list[np.ndarray]] = {}
    nodes: dict = {}

    def grab(ns):
        _params(params)(ns)
        nodes.update({n.name: n for n in ns})

    r = run_scenario(load_scenario(QUICKSTART, [
        *QUIET, *HFA, *LOSS, "membership.on_server_loss=wait", "fault.0.node=ls:party-a",
        f"fault.0.at={at}", "fault.0.duration=1s"]), out_dir=tmp_path, inspect=grab)
    events = run_events(r.run_dir)
    ls, gs = nodes["ls:party-a"], nodes["gs:0"]
    keys = len(gs.slots)
    assert ls.taking_over
    starts = {e["round"] for e in events if e["ev"] == "takeover_init"}
    # the successor starts at a global sync's local round (k2 = 3)
    assert len(starts) == 1 and 0 < min(starts) < 60 and min(starts) % 3 == 0
    # the successor ran the local syncs after the last one its predecessor answered,
    # which lies in the global period it started at
    ran = {w: n / keys for w, n in ls.applied.items()}
    assert len(set(ran.values())) == 1 and 60 - min(starts) - 3 < ran["w:party-a:0"] \
        <= 60 - min(starts)
    syncs = _global_syncs(events)
    assert len(syncs) == keys * 20 and all(len(d) == 1 for d in syncs.values())
    assert all(s.version == 20 for s in gs.slots.values())
    assert _bitwise_equal(clean, params) and r.summary.final_accuracy > 0.9


def test_hfa_takeover_after_a_resume_keeps_the_model(tmp_path: Path) -> None:
    """HFA with checkpoints and ``on_server_loss = "wait"``: stopped at 60 iterations,
    resumed to 120 with ``ls:party-a`` crashed 0.5 s into the resumed run and back 1 s
    later. The global side's kept model comes back from its checkpoint, so the successor
    gets the milestone and the run ends with the uninterrupted run's model, bit for
    bit, on every worker and in the global side; no global sync was pushed twice."""
    sets = [*QUIET, *HFA[:-1], *LOSS, "membership.on_server_loss=wait", "checkpoint.every=5"]
    clean: dict[str, list[np.ndarray]] = {}
    resumed: dict[str, list[np.ndarray]] = {}
    kept: list[dict] = []

    def grab(into):
        def inspect(nodes):
            _params(into)(nodes)
            kept.extend(n.policy.models for n in nodes if n.name == "gs:0")
        return inspect

    run_scenario(load_scenario(QUICKSTART, [*sets, "run.iterations=120"]), out_dir=tmp_path,
                 inspect=grab(clean))
    first = run_scenario(load_scenario(QUICKSTART, [*sets, "run.iterations=60"]),
                         out_dir=tmp_path)
    restored_at = max(e["t"] for e in run_events(first.run_dir))
    second = run_scenario(resume_scenario(first.run_dir, [
        "run.iterations=120", "fault.0.node=ls:party-a",
        f"fault.0.at={restored_at + 0.5:.3f}s", "fault.0.duration=1s"]),
        out_dir=tmp_path, inspect=grab(resumed))
    events = run_events(second.run_dir)
    assert any(e["ev"] == "restore" for e in events)
    assert any(e["ev"] == "takeover_init" for e in events)
    assert not any(e["ev"] == "repush" for e in events)
    assert _bitwise_equal(clean, resumed)
    assert kept[0].keys() == kept[1].keys()
    assert all(np.array_equal(kept[0][k], kept[1][k]) for k in kept[0])
    assert second.summary.iterations == 120 and second.summary.final_accuracy > 0.9


def test_hfa_takeover_refuses_a_lossy_codec() -> None:
    with pytest.raises(ScenarioError, match="milestone") as e:
        load_scenario(QUICKSTART, [*HFA, *LOSS, "membership.on_server_loss=wait",
                                   "codec.type=fp16"])
    assert e.value.path == "codec.type"


@pytest.mark.slow
def test_real_hfa_local_server_killed_and_taken_over(tmp_path: Path) -> None:
    """Over real sockets: ``ls:party-a`` SIGKILLed under HFA and started again with
    ``--rejoin``; every DC holds the same model after each global sync."""
    _, events, _ = _kill_and_take_over(tmp_path, "ls:party-a", [
        "sync.algorithm=hfa", "sync.k1=2", "sync.k2=2", "training.worker_optimizer=adam"],
        accuracy_within=0.03)
    assert any(e["ev"] == "takeover_init" for e in events)
    syncs = _global_syncs(events)
    keys = len({e["key"] for e in events if e["ev"] == "takeover_init"})
    assert len(syncs) == keys * 10 and all(len(d) == 1 for d in syncs.values())


# --------------------------------------------------------------------------- ESync
ESYNC = ["sync.algorithm=esync", "training.worker_optimizer=adam",
         "dc.party-b.compute_per_iter=30ms"]


def test_esync_worker_restart_is_taken_back_by_the_state_server(tmp_path: Path) -> None:
    r, nodes, events = _run(tmp_path, [
        *ESYNC, *LOSS, "run.iterations=120", "membership.on_worker_loss=continue",
        "fault.0.node=w:party-a:1", "fault.0.at=1s", "fault.0.duration=4s"])
    keys = len(nodes["gs:0"].slots)
    ls_a = nodes["ls:party-a"]
    ss = [e for e in events if e["node"] == "ss"]
    assert [e["worker"] for e in ss if e["ev"] == "state_worker_lost"] == ["w:party-a:1"]
    assert [e["worker"] for e in ss if e["ev"] == "state_worker_rejoined"] == ["w:party-a:1"]
    (back,) = [e["round"] for e in events
               if e["ev"] == "worker_rejoined" and e["node"] == "ls:party-a"]
    rounds = [e for e in ss if e["ev"] == "esync_round"]
    without = [e["round"] for e in rounds if "w:party-a:1" not in e["budgets"]]
    # budgets were sized without it while it was away, and for it again once it asked
    assert without and max(without) <= back + 2
    assert all("w:party-a:1" in e["budgets"] for e in rounds if e["round"] > back + 2)
    assert max(e["budgets"]["w:party-a:1"] for e in rounds if e["round"] > back + 2) > 1
    # every round of the DC from the one after it came back has its push, once
    final = nodes["gs:0"].slots[(0, 0)].version
    assert ls_a.applied["w:party-a:0"] == keys * final
    assert keys * (final - back) < ls_a.applied["w:party-a:1"] < keys * final
    assert nodes["w:party-a:1"].rejoining and ls_a.live == ["w:party-a:0", "w:party-a:1"]
    assert r.summary.final_accuracy > 0.9


def test_state_board_counts_a_returning_worker_from_its_first_query() -> None:
    """The board's rule for a worker taken back: rounds before its first query do not
    wait for it; a query for a round already answered is answered alone, and the worker
    counts from the next round."""
    from geomx.sync.esync import StateBoard

    board = StateBoard(["a", "b", "c"])
    ask = lambda w, r: board.report(w, round_=r, step_s=0.01, end_s=0.0, steps=1)  # noqa: E731
    assert ask("a", 2) is None and board.drop("c") == {} and ask("b", 2) == {"a": 1, "b": 1}
    board.take_back("c")
    # round 3: a and b ask before c; c asks for round 4 first, so round 3 does not wait
    assert ask("a", 3) is None and ask("b", 3) is not None
    assert ask("c", 4) is None and ask("a", 4) is None
    assert set(ask("b", 4)) == {"a", "b", "c"}  # c's budget is sized again
    # late: c is lost and back again, and asks for a round the others finished
    board.drop("c")
    assert ask("a", 5) is None and ask("b", 5) is not None
    board.take_back("c")
    assert set(ask("c", 5)) == {"a", "b", "c"}  # answered alone, at once
    assert ask("a", 6) is None and ask("b", 6) is None and ask("c", 6) is not None
    with pytest.raises(ValueError, match="not a training worker"):
        board.take_back("d")


def test_tsengine_with_esync_gives_esync_bits(tmp_path: Path) -> None:
    """ESync's global rounds are synchronous delta sums: the inter-DC overlay merges
    them in the same order for two party DCs, so the model is the same bits."""
    plain: dict[str, list[np.ndarray]] = {}
    merged: dict[str, list[np.ndarray]] = {}
    sets = [*QUIET, *ESYNC, "run.iterations=30"]
    run_scenario(load_scenario(QUICKSTART, sets), out_dir=tmp_path, inspect=_params(plain))
    r = run_scenario(load_scenario(QUICKSTART, [*sets, "sched.tsengine_inter=true"]),
                     out_dir=tmp_path, inspect=_params(merged))
    events = run_events(r.run_dir)
    assert any(e["ev"] == "ts_xfer" for e in events)
    assert any(e["ev"] == "esync_round" for e in events)
    assert _bitwise_equal(plain, merged) and r.summary.final_accuracy > 0.8


@pytest.mark.parametrize("duration", ["0s", "5s"])
def test_tsengine_inter_with_worker_loss_and_restart(tmp_path: Path, duration: str) -> None:
    """The inter-DC overlay's members are the local servers: ``w:party-a:1`` lost at 1 s
    (and back 5 s later, or never) leaves its DC's local server in the merge trees, which
    pushes the DC's reweighted sum through them; every key gets its 60 global rounds."""
    r, nodes, events = _run(tmp_path, [
        *LOSS, "sched.tsengine_inter=true", "run.iterations=60",
        "membership.on_worker_loss=continue", "fault.0.node=w:party-a:1", "fault.0.at=1s",
        f"fault.0.duration={duration}"])
    keys = len(nodes["gs:0"].slots)
    ls_a = nodes["ls:party-a"]
    assert [e["lost"] for e in events if e["ev"] == "worker_lost"] == ["w:party-a:1"]
    merged = [e for e in events if e["ev"] == "ts_xfer" and e["msg"] == "merge"]
    assert any(e["t"] > 4.0 and e["node"] == "ls:party-a" for e in merged)
    assert all(s.version == 60 for s in nodes["gs:0"].slots.values())
    assert ls_a.applied["w:party-a:0"] == keys * 60
    reweights = sum(e["ev"] == "reweight" for e in events)
    assert ls_a.applied["w:party-a:1"] + reweights == keys * 60
    if duration == "0s":
        assert ls_a.live == ["w:party-a:0"] and reweights > keys * 50
    else:
        assert ls_a.live == ["w:party-a:0", "w:party-a:1"] and reweights < keys * 10
    assert r.summary.iterations == 60 and r.summary.final_accuracy > 0.9


def test_tsengine_intra_dc_with_mixed_trains(tmp_path: Path) -> None:
    r, nodes, events = _run(tmp_path, ["sync.algorithm=mixed", "sched.tsengine_intra=true",
                                       "dc.party-b.compute_per_iter=30ms",
                                       "run.iterations=20"])
    assert any(e["ev"] == "ts_xfer" for e in events)
    # each DC's push a global step of its own: two updates per key and round
    assert all(s.version == 40 for s in nodes["gs:0"].slots.values())
    assert r.summary.final_accuracy > 0.9
    with pytest.raises(ScenarioError, match="makes the DCs synchronous") as e:
        load_scenario(QUICKSTART, ["sync.algorithm=mixed", "sched.tsengine_inter=true"])
    assert e.value.path == "sched.tsengine_inter"


# ------------------------------------------------------------- TSEngine + server takeover
TS_WAIT = [*LOSS, "sched.tsengine_inter=true", "membership.on_server_loss=wait",
           "fault.0.node=ls:party-a"]


def test_tsengine_inter_local_server_takeover_trains_as_clean(tmp_path: Path) -> None:
    """``ls:party-a`` dies at 3 s while the global server relays it round 10's model and
    is taken over 2 s later: the coordinator puts the round's broadcast back to it (and
    whoever it was to relay to), the global server gives up its relay to the dead process
    and starts the loop again, and the overlay carries every later round; the two DCs'
    sums add in either order to the same bits, so the model is the clean run's."""
    sets = ["run.iterations=60"]
    clean, _, _ = _run(tmp_path / "clean", ["sched.tsengine_inter=true", *sets])
    crash = [*TS_WAIT, *sets, "fault.0.at=3s", "fault.0.duration=2s"]
    r, nodes, events = _run(tmp_path / "crash", crash)
    (takeover,) = [e["t"] for e in events if e["ev"] == "server_takeover"
                   and e["node"] == "gh"]
    keys = len(nodes["gs:0"].slots)
    replaced = [e for e in events if e["ev"] == "ts_replaced"]
    assert len(replaced) == keys and all(e["member"] == "ls:party-a" for e in replaced)
    assert all("ls:party-a" in e["rebroadcast"] for e in replaced)
    assert [e["dst"] for e in events if e["ev"] == "ts_abandon"] == ["ls:party-a"] * keys
    after = [e for e in events if e["ev"] == "ts_xfer" and e["t"] > takeover]
    assert {(e["node"], e["msg"]) for e in after} >= {("ls:party-a", "merge"),
                                                       ("gs:0", "relay")}
    assert all(s.version == 60 for s in nodes["gs:0"].slots.values())
    assert r.summary.iterations == 60
    assert r.summary.final_accuracy == clean.summary.final_accuracy
    lost_s = r.summary.emulated_seconds - clean.summary.emulated_seconds
    assert 1.0 <= lost_s < 2.3, lost_s  # down 2 s, less the round it had in hand
    again, _, _ = _run(tmp_path / "again", crash)
    assert (again.run_dir / "events.jsonl").read_bytes() == \
        (r.run_dir / "events.jsonl").read_bytes()
    print(f"clean {clean.summary.emulated_seconds:.2f} s acc {clean.summary.final_accuracy:.4f}; "
          f"taken over {r.summary.emulated_seconds:.2f} s acc {r.summary.final_accuracy:.4f}")


def test_tsengine_inter_takeover_takes_a_resent_round_once(tmp_path: Path) -> None:
    """party-b is slow: party-a's round sum waits at the global server when its local
    server dies; the successor restarts from the round before and sends that sum again
    through the overlay, which the root acknowledges without adding it twice."""
    slow = ["run.iterations=12", "dc.2.compute_per_iter=1s"]
    clean, _, _ = _run(tmp_path / "clean", ["sched.tsengine_inter=true", *slow])
    r, nodes, events = _run(tmp_path / "crash", [*TS_WAIT, *slow, "fault.0.at=3.1s",
                                                 "fault.0.duration=0.3s"])
    keys = len(nodes["gs:0"].slots)
    dedupe = [e for e in events if e["ev"] == "ts_dedupe"]
    assert len(dedupe) == keys and {e["src"] for e in dedupe} == {"ls:party-a"}
    assert all(s.version == 12 for s in nodes["gs:0"].slots.values())
    assert r.summary.final_accuracy == clean.summary.final_accuracy


def test_tsengine_coordinator_replans_around_a_replaced_member() -> None:
    """The coordinator's bookkeeping alone: a root left waiting for the lost process's
    merge is queued again, the round's broadcast goes again to the lost process and to
    whom it was to relay, and a lost process holding another member's sum is an error."""
    from geomx.sched.tsengine import Coordinator, TsEngineError, TsSettings

    class Draws:
        def random(self) -> float:
            return 0.99  # always explore

        def integers(self, low: int, high: int) -> int:
            return low

    c = Coordinator(TsSettings(mode="inter"), ["a", "b"], Draws())
    assert c.ask_push(0, 0, "g", root=True, round_=1) == []
    (p,) = c.ask_push(0, 0, "a", round_=1)
    assert (p.sender, p.receiver) == ("a", "g")
    (r,) = c.replace("a")  # died before its merge arrived: the root waits for nobody
    assert r.requeued == ("g",) and r.pairings == () and r.rebroadcast == ()
    (p,) = c.ask_push(0, 0, "a", round_=1)  # the successor sends the DC's sum again
    assert (p.sender, p.receiver) == ("a", "g")
    assert c.ask_pull(0, 0, "g", 1).receiver == "a"
    assert c.ask_push(0, 0, "g", root=True, round_=1) == []  # the root took the merge
    assert c.ask_pull(0, 0, "a", 1).receiver == "b"  # the broadcast is complete now
    (r,) = c.replace("a")  # ... but "a" died before relaying to "b"
    assert r.rebroadcast == ("a", "b") and r.requeued == ()
    assert c.ask_pull(0, 0, "g", 1).receiver == "a"
    assert c.ask_pull(0, 0, "b", 1).receiver is None  # "b" had it from "a" after all
    assert c.ask_pull(0, 0, "g", 0).receiver is None  # an older round is over

    c = Coordinator(TsSettings(mode="inter"), ["a", "b", "c"], Draws())
    (p,) = [*c.ask_push(1, 0, "a"), *c.ask_push(1, 0, "b")]
    assert (p.sender, p.receiver) == ("b", "a")
    with pytest.raises(TsEngineError, match="holding the merged sums of"):
        c.replace("a")


@pytest.mark.parametrize("sets, path", [
    (["sched.tsengine_intra=true"], "sched.tsengine_intra"),
    (["sched.tsengine_inter=true", "checkpoint.every=10"], "sched.tsengine_inter")])
def test_tsengine_server_loss_refusals(sets: list[str], path: str) -> None:
    with pytest.raises(ScenarioError, match="on_server_loss = 'wait'") as e:
        load_scenario(QUICKSTART, [*LOSS, "membership.on_server_loss=wait", *sets])
    assert e.value.path == path


@pytest.mark.slow
def test_real_tsengine_inter_local_server_killed_and_taken_over(tmp_path: Path) -> None:
    _, events, _ = _kill_and_take_over(tmp_path, "ls:party-a", ["sched.tsengine_inter=true"])
    assert any(e["ev"] == "takeover_init" for e in events)
    (takeover,) = [e["t"] for e in events if e["ev"] == "server_takeover"
                   and e["node"] == "gh"]
    assert any(e["ev"] == "ts_replaced" for e in events)
    assert any(e["ev"] == "ts_xfer" and e["node"] == "ls:party-a" and e["t"] > takeover
               for e in events)


# --------------------------------------------------------------------------- MixedSync
MIXED_GS = [*LOSS, "run.iterations=30", "sync.algorithm=mixed", "checkpoint.every=5",
            "dc.party-b.compute_per_iter=35ms", "membership.on_server_loss=wait",
            "fault.0.node=gs:0", "fault.0.duration=1s"]


@pytest.mark.parametrize("at, resent", [("2.33s", "dedupe"), ("2.71s", "repush")])
def test_mixed_global_server_restart_applies_every_push_once(tmp_path: Path, at: str,
                                                            resent: str) -> None:
    """``gs:0`` dies with pushes in flight: at 2.33 s party-a's push is in the newest
    value party-b pulled, so its resent push is answered, not applied (a dedupe); at
    2.71 s a push applied after every pull is lost with the process, and its DC,
    finding its round missing from the successor's reply, pushes it again (a repush).
    Either way each DC's 30 pushes of every key are in the model once: 60 versions."""
    r, nodes, events = _run(tmp_path, [*MIXED_GS, f"fault.0.at={at}"])
    gs = nodes["gs:0"]
    keys = len(gs.slots)
    assert gs.taking_over
    (restore,) = [e for e in events if e["ev"] == "takeover_restore"]
    start = restore["versions"]
    assert len(start) == 1 and 0 < start[0] < 60
    assert all(s.version == 60 for s in gs.slots.values())
    assert sum(gs.applied.values()) == keys * (60 - start[0])
    if resent == "dedupe":
        assert gs.deduped["ls:party-a"] == keys and gs.deduped["ls:party-b"] == 0
    else:
        assert sum(e["ev"] == "repush" for e in events) == keys
    assert r.summary.iterations == 30 and r.summary.final_accuracy > 0.9


# --------------------------------------------------------------------------- real sockets
@pytest.mark.slow
def test_real_mixed_global_server_killed_and_taken_over(tmp_path: Path) -> None:
    """Over real sockets: ``gs:0`` SIGKILLed under MixedSync and started again with
    ``--rejoin``: every DC's push of every key in the model once (2 x 40 versions)."""
    _, events, _ = _kill_and_take_over(tmp_path, "gs:0", ["sync.algorithm=mixed",
                                                          "checkpoint.every=5"],
                                       accuracy_within=0.03)
    assert len([e for e in events if e["ev"] == "takeover_restore"]) == 1
    done = [e for e in events if e["ev"] == "server_done" and e["node"] == "gs:0"][-1]
    keys = len({e["key"] for e in events if e["ev"] == "init" and e["node"] == "ls:party-a"})
    assert done["versions"] == 2 * keys * 40


@pytest.mark.slow
def test_real_layered_local_server_killed_and_taken_over(tmp_path: Path) -> None:
    _, events, _ = _kill_and_take_over(tmp_path, "ls:party-a", LAYERED)
    assert any(e["ev"] == "takeover_init" for e in events)
    assert any(e["ev"] == "forward" for e in events)
    done = [e for e in events if e["ev"] == "server_done" and e["node"] == "gs:0"][0]
    keys = len({e["key"] for e in events if e["ev"] == "takeover_init"})
    assert done["applied"] == {"ls:party-a": keys * 40, "ls:party-b": keys * 40}


@pytest.mark.slow
def test_real_checkpoints_with_a_killed_worker_resume(tmp_path: Path) -> None:
    """Over real sockets: ``w:party-a:1`` SIGKILLed after 5 steps and never restarted,
    the job goes on and its later checkpoints complete without the worker's file;
    ``geomx launch --resume`` to 60 iterations starts every process again, the lost
    worker rejoining from the checkpoint's model."""
    import os
    import subprocess
    import sys

    from geomx.node import checkpoint as ckpt

    sets = ["run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false",
            "run.iterations=40", "checkpoint.every=5", "membership.on_worker_loss=continue",
            "membership.heartbeat_timeout=3s", "wan.0.latency=5ms", "wan.1.latency=5ms",
            "dc.1.compute_per_iter=40ms", "dc.2.compute_per_iter=40ms"]
    run_dir, _ = launch_and_kill(tmp_path, QUICKSTART, sets, "w:party-a:1",
                                 watch="w_party-a_1", steps=5)
    latest = ckpt.latest_checkpoint(run_dir)
    assert latest is not None and int(latest.name) == 40
    assert ckpt.read_manifest(latest)["lost"] == ["w:party-a:1"]
    r = subprocess.run([sys.executable, "-m", "geomx", "launch", "--resume", str(run_dir),
                        "--set", "run.iterations=60", "--quiet"],
                       env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    new_dir = Path(r.stdout.split("run folder: ", 1)[1].split("\n", 1)[0])
    summary = json.loads((new_dir / "summary.json").read_text())
    back = json.loads((new_dir / "nodes" / "w_party-a_1.result.json").read_text())
    rejoined = [json.loads(line) for line in
                (new_dir / "nodes" / "w_party-a_1.events.jsonl").open()]
    assert [e["iteration"] for e in rejoined if e["ev"] == "rejoined"] == [40]
    assert summary["iterations"] == 60 and back["iterations"] == 60
    assert summary["final_accuracy"] > 0.85
    print(f"resumed from round 40 without w:party-a:1's file; it trained 40 -> 60, "
          f"accuracy {summary['final_accuracy']:.4f}")


@pytest.mark.slow
def test_real_esync_worker_killed_and_rejoined(tmp_path: Path) -> None:
    """Over real sockets: an ESync worker SIGKILLed and started again with ``--rejoin``;
    the state server takes it back and the job trains to the end with it."""
    sets = ["run.target_accuracy=0", "metrics.plot=false", "metrics.trace=false",
            "run.iterations=80", "membership.on_worker_loss=continue",
            "membership.heartbeat_timeout=3s", "wan.0.latency=5ms", "wan.1.latency=5ms",
            "sync.algorithm=esync", "training.worker_optimizer=adam",
            "dc.1.compute_per_iter=40ms", "dc.2.compute_per_iter=40ms"]
    run_dir, log = launch_kill_rejoin(tmp_path, QUICKSTART, sets, "w:party-a:1",
                                      watch="w_party-a_1", steps=5, rejoin_log="rejoin.log")
    assert "w:party-a:1 died" in log.read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] > 0.8
    ss = [json.loads(line) for line in (run_dir / "nodes" / "ss.events.jsonl").open()]
    assert [e["worker"] for e in ss if e["ev"] == "state_worker_rejoined"] == ["w:party-a:1"]
    rounds = [e for e in ss if e["ev"] == "esync_round"]
    assert any("w:party-a:1" not in e["budgets"] for e in rounds)
    assert "w:party-a:1" in rounds[-1]["budgets"]
    ls = [json.loads(line) for f in sorted((run_dir / "nodes").glob("ls_party-a.*"))
          if f.name.endswith(".events.jsonl") for line in f.open()]
    assert [e for e in ls if e["ev"] == "server_done"][0]["lost"] == []
    rejoined = json.loads((run_dir / "nodes" / "w_party-a_1.result.json").read_text())
    assert rejoined["iterations"] > 5
    print(f"accuracy {summary['final_accuracy']:.4f}, {len(rounds)} ESync rounds, the "
          f"rejoined worker ended at iteration {rejoined['iterations']}")
