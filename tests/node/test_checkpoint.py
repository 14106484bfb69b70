"""Checkpoint and resume (``[checkpoint]``, ``geomx run/launch --resume``).

The emulator tests stop a job at round 50 (``run.iterations``), resume it from its
latest complete checkpoint to round 100, and require the global server's arrays to be
bit-for-bit those of an uninterrupted 100-round run: any state the checkpoint missed
(optimizer moments, Bi-Sparse error feedback, a worker's data stream or local model)
changes the result. The real-socket test SIGKILLs every process of a job once a
checkpoint exists and resumes it with ``geomx launch --resume``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from geomx.experiment import resume_scenario, run_scenario
from geomx.node import checkpoint as ckpt
from geomx.scenario import ScenarioError, load_scenario, override_scenario, parse_scenario

from tests.helpers.paths import ROOT
from tests.helpers.procs import descendants

QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
QUIET = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
         "metrics.trace=false", "metrics.events=false"]


def _final_state(into: dict[str, list[np.ndarray]]):
    """``inspect`` hook: the global server's arrays, and every worker's parameters."""
    def grab(nodes):
        for n in nodes:
            if n.name.startswith("gs:"):
                into[n.name] = [np.array(s.store) for _, s in sorted(n.slots.items())]
            elif getattr(n, "params", None) is not None and n.name.startswith("w:"):
                into[n.name] = [np.array(p) for p in n.params]
    return grab


def _stop_and_resume(tmp_path: Path, sets: list[str], *, stop: int, end: int):
    """(uninterrupted run's state, resumed run's state, first run's folder)."""
    out = tmp_path / "runs"
    clean: dict[str, list[np.ndarray]] = {}
    run_scenario(load_scenario(QUICKSTART, [*QUIET, *sets, f"run.iterations={end}"]),
                 out_dir=out, inspect=_final_state(clean))
    first = run_scenario(load_scenario(QUICKSTART, [*QUIET, *sets, f"run.iterations={stop}"]),
                         out_dir=out)
    resumed: dict[str, list[np.ndarray]] = {}
    s = resume_scenario(first.run_dir, [f"run.iterations={end}"])
    second = run_scenario(s, out_dir=out, inspect=_final_state(resumed))
    assert second.summary.iterations == end
    link = json.loads((second.run_dir / "summary.json").read_text())["extra"]["resumed_from"]
    assert link["run_dir"] == str(first.run_dir.resolve())
    return clean, resumed, first.run_dir


def _max_difference(a: dict[str, list[np.ndarray]], b: dict[str, list[np.ndarray]]) -> float:
    assert a.keys() == b.keys() and a
    diff = 0.0
    for name in a:
        assert len(a[name]) == len(b[name])
        for x, y in zip(a[name], b[name]):
            assert x.dtype == y.dtype and x.shape == y.shape
            diff = max(diff, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return diff


def _bitwise_equal(a, b) -> bool:
    return all(np.array_equal(x, y) for n in a for x, y in zip(a[n], b[n]))


# --------------------------------------------------------------------------- emulator
@pytest.mark.slow
def test_fsa_bsc_adam_resume_is_bit_exact(tmp_path: Path) -> None:
    """FSA, Adam on the global server (moments and step count), Bi-Sparse on the WAN
    (momentum and residual buffers at the local servers, sample seed by encode round)."""
    clean, resumed, first = _stop_and_resume(
        tmp_path, ["checkpoint.every=10", "codec.type=bsc", "codec.size_lower_bound=1000"],
        stop=50, end=100)
    assert _max_difference(clean, resumed) == 0.0
    assert _bitwise_equal(clean, resumed)
    # keep = 2: only the newest two complete checkpoints remain
    assert ckpt.complete_rounds(first / "checkpoints") == [40, 50]
    manifest = json.loads((first / "checkpoints" / "50" / ckpt.MANIFEST).read_text())
    assert manifest["nodes"] == ["gs:0", "ls:party-a", "ls:party-b", "w:party-a:0",
                                 "w:party-a:1", "w:party-b:0", "w:party-b:1"]


@pytest.mark.slow
def test_hfa_resume_is_bit_exact(tmp_path: Path) -> None:
    """HFA: rounds are global syncs (k1 x k2 = 10 iterations); the local servers' milestones
    and the workers' local Adam states and data streams come back."""
    clean, resumed, first = _stop_and_resume(
        tmp_path, ["sync.algorithm=hfa", "sync.k1=2", "sync.k2=5", "checkpoint.every=1",
                   "training.worker_optimizer=adam"], stop=50, end=100)
    assert _max_difference(clean, resumed) == 0.0
    assert ckpt.complete_rounds(first / "checkpoints") == [4, 5]


#: MixedSync on the quickstart with party-b's workers 3.5x slower: party-a's pushes run
#: ahead (unbounded, or by at most 2 with DC-ASGD), so a checkpoint round is a barrier
MIXED = ["sync.algorithm=mixed", "checkpoint.every=5", "dc.party-b.compute_per_iter=35ms"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["training.optimizer=dcasgd", "training.lr=0.05",
                                        "sync.staleness=2"]], ids=["adam", "dcasgd_ssp2"])
def test_mixed_resume_is_bit_exact(tmp_path: Path, extra: list[str]) -> None:
    """MixedSync: a checkpoint round is a barrier at the global server (a DC's push of it
    is answered once every DC has pushed it), so its files are a cut: the global store
    holds exactly that many pushes of every DC for every key, and nothing of the next
    round anywhere. The global side saves each DC's push count (``state_dict``): the
    rounds its next pushes are. The resumed run applies the DCs' pushes in the order the
    uninterrupted run did (party-a's arrive first; a tie between DCs whose pushes arrive
    at the same instant is broken by the restart's own timing), so it is bit for bit."""
    clean, resumed, first = _stop_and_resume(tmp_path, [*MIXED, *extra], stop=30, end=60)
    assert _bitwise_equal(clean, resumed)
    meta, arrays = ckpt.read_node_file(first / "checkpoints" / "30" / ckpt.file_name("gs:0"))
    state = ckpt.unpack(meta["state"], arrays)
    counts = state["sync"]["applied"]
    assert len(counts) == 4 and all(c == {"ls:party-a": 30, "ls:party-b": 30}
                                    for c in counts.values())
    assert {version for _, _, _, version, _ in state["slots"]} == {60}


#: ESync on the quickstart with party-b's workers 3.5x slower: party-a's workers take
#: several local steps per round (budgets from the state server), so a resumed run must
#: bring back each worker's budget and the model its next delta is taken against
ESYNC = ["sync.algorithm=esync", "training.worker_optimizer=adam", "checkpoint.every=3",
         "dc.party-b.compute_per_iter=35ms"]


def test_esync_resume_is_bit_exact(tmp_path: Path, monkeypatch) -> None:
    """ESync: its delta average is a synchronous round, so a checkpoint round is a cut;
    the worker side saves its round, step budget and previous model (``state_dict``), and
    the state server needs nothing (the next round's queries replace every record before
    it computes budgets). Without the worker side's state the resumed model differs."""
    from geomx.sync.esync import ESyncWorker

    clean, resumed, first = _stop_and_resume(tmp_path, ESYNC, stop=40, end=80)
    assert _bitwise_equal(clean, resumed)
    last = ckpt.complete_rounds(first / "checkpoints")[-1]
    meta, arrays = ckpt.read_node_file(first / "checkpoints" / str(last)
                                       / ckpt.file_name("w:party-a:0"))
    side = ckpt.unpack(meta["state"], arrays)["sync_side"]
    assert side["round"] == last + 1 and side["budget"] > 1  # local steps were taken
    monkeypatch.setattr(ESyncWorker, "load_state_dict", lambda self, state: None)
    forgetful: dict[str, list[np.ndarray]] = {}
    run_scenario(resume_scenario(first, ["run.iterations=80"]), out_dir=tmp_path / "runs",
                 inspect=_final_state(forgetful))
    assert _max_difference(clean, forgetful) > 0


@pytest.mark.slow
@pytest.mark.parametrize("sched", [["sched.p3=true", "sched.p3_slice_elements=200"],
                                   ["sched.tsengine_intra=true"], ["sched.tsengine_inter=true"],
                                   ["sched.dgt=tcp"], ["sched.dgt=udp"], ["sched.dgt=quant"]],
                         ids=["p3", "tsengine_intra", "tsengine_inter", "dgt_tcp", "dgt_udp",
                              "dgt_quant"])
def test_scheduled_transfers_resume_bit_exact(tmp_path: Path, sched: list[str]) -> None:
    """P3 (sliced keys, fused push replies) and TSEngine inside the DCs or across two
    (merged pushes, relayed model whose broadcast carries the checkpoint round) finish
    every transfer of a round before the next starts, so their checkpoints are consistent
    cuts too. DGT's band blocks trail their round's end block (they join the next round
    at the global server): the checkpoint saves the contribution EWMAs, adaptive K's
    loss_0, 4-bit residuals and the receiver's buffers, and the resumed local servers send
    the checkpoint round's trailing blocks again (on the quickstart's loss-free WAN, UDP
    bands arrive like TCP ones)."""
    clean, resumed, _ = _stop_and_resume(tmp_path, ["checkpoint.every=10", *sched],
                                         stop=30, end=50)
    assert _max_difference(clean, resumed) == 0.0


@pytest.mark.slow
def test_flat_ps_momentum_resume_is_bit_exact(tmp_path: Path) -> None:
    """The flat PS (workers push to the global server) with momentum SGD."""
    clean, resumed, _ = _stop_and_resume(
        tmp_path, ["topology.kind=flat", "checkpoint.every=25", "training.optimizer=momentum",
                   "training.momentum=0.9", "training.lr=0.05"], stop=50, end=100)
    assert _max_difference(clean, resumed) == 0.0


@pytest.mark.slow
def test_crash_then_resume_is_bit_exact(tmp_path: Path) -> None:
    """The emulated job is killed by a crash of the global server (it then deadlocks and
    fails by name); --resume continues from the last checkpoint before the crash and does
    not inject that crash again."""
    from geomx.experiment import JobFailed

    sets = [*QUIET, "checkpoint.every=10", "run.iterations=60"]
    clean: dict[str, list[np.ndarray]] = {}
    run_scenario(load_scenario(QUICKSTART, sets), out_dir=tmp_path / "clean",
                 inspect=_final_state(clean))
    crashing = load_scenario(QUICKSTART, [*sets, "fault.0.node=gs:0", "fault.0.at=5s"])
    with pytest.raises(JobFailed, match="gs:0"):
        run_scenario(crashing, out_dir=tmp_path / "runs")
    first = next((tmp_path / "runs").iterdir())
    assert ckpt.injected_crashes(first) == {("gs:0", 5.0)}
    rounds = ckpt.complete_rounds(first / "checkpoints")
    assert rounds and rounds[-1] < 60
    s = resume_scenario(first)
    assert s.faults == ()  # the crash is history
    resumed: dict[str, list[np.ndarray]] = {}
    r = run_scenario(s, out_dir=tmp_path / "runs", inspect=_final_state(resumed))
    assert r.summary.iterations == 60
    assert _max_difference(clean, resumed) == 0.0


def test_a_lost_state_would_show(tmp_path: Path) -> None:
    """The comparison can fail: resuming with the workers' data streams reset (the state a
    naive restart loses) gives a different model."""
    clean, resumed, first = _stop_and_resume(tmp_path, ["checkpoint.every=10"], stop=20, end=30)
    assert _bitwise_equal(clean, resumed)
    path = first / "checkpoints" / "20" / ckpt.file_name("w:party-a:0")
    meta, arrays = ckpt.read_node_file(path)
    order = meta["state"]["__dict__"]
    stream = next(v for k, v in order if k == "stream")
    key = next(v for k, v in stream["__dict__"] if k == "order")["__nd__"]
    arrays[key] = arrays[key][::-1].copy()
    ckpt.write_node_file(path, arrays, meta)
    tampered: dict[str, list[np.ndarray]] = {}
    run_scenario(resume_scenario(first, ["run.iterations=30"]), out_dir=tmp_path / "runs",
                 inspect=_final_state(tampered))
    assert _max_difference(clean, tampered) > 0


def test_checkpoint_every_duration(tmp_path: Path) -> None:
    """``every = "1s"``: the first round ending a second (emulated) after the previous."""
    r = run_scenario(load_scenario(QUICKSTART, [*QUIET, "run.iterations=40",
                                                "checkpoint.every=1s", "checkpoint.keep=50"]),
                     out_dir=tmp_path)
    rounds = ckpt.complete_rounds(r.run_dir / "checkpoints")
    times = [json.loads((r.run_dir / "checkpoints" / str(n) / ckpt.MANIFEST).read_text())["t"]
             for n in rounds]
    assert len(rounds) >= 3
    assert all(b - a >= 1.0 for a, b in zip(times, times[1:]))
    assert rounds != list(range(rounds[0], rounds[0] + len(rounds)))  # not every round


# --------------------------------------------------------------------------- atomicity
def _settings(tmp_path: Path, **kw) -> object:
    class Job:
        mode = "hips"
        global_servers = ["gs:0"]
        local_server_of = {"a": "ls:a"}
        party_dcs = ["a"]
        all_workers = ["w:a:0"]
        checkpoint = {"every_rounds": 1, "keep": 2, "dir": str(tmp_path / "checkpoints"), **kw}
    return Job()


def _write_round(job, round_: int, value: float) -> None:
    for node in ckpt.expected_nodes(job):
        ckpt.NodeCheckpoints(job, node).save(round_, {"w": np.full(3, value, np.float32)},
                                             {"t": float(round_)})


def test_crash_mid_write_leaves_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    job = _settings(tmp_path)
    _write_round(job, 10, 1.0)
    assert ckpt.latest_checkpoint(tmp_path).name == "10"

    # round 20: the first node's file is half written when the process "dies"
    real_savez = np.savez

    def dying_savez(f, **arrays):
        real_savez(f, **arrays)
        f.truncate(f.tell() // 2)
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(np, "savez", dying_savez)
    with pytest.raises(KeyboardInterrupt):
        ckpt.NodeCheckpoints(job, "gs:0").save(20, {"w": np.zeros(3, np.float32)}, {})
    monkeypatch.setattr(np, "savez", real_savez)
    d20 = tmp_path / "checkpoints" / "20"
    assert not (d20 / ckpt.file_name("gs:0")).exists()
    assert not any(p.name.endswith(".tmp") for p in d20.iterdir())
    # the others write theirs: still no manifest, so round 20 is not complete
    for node in ("ls:a", "w:a:0"):
        ckpt.NodeCheckpoints(job, node).save(20, {"w": np.zeros(3, np.float32)}, {})
    assert not (d20 / ckpt.MANIFEST).exists()
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.name == "10"
    resume = _settings(tmp_path, resume_from=str(latest))
    tree, meta, arrays = ckpt.NodeCheckpoints(resume, "gs:0").load()
    assert meta["round"] == 10
    np.testing.assert_array_equal(ckpt.unpack(tree, arrays)["w"], np.full(3, 1.0, np.float32))
    # a node file that vanished after the manifest makes the round incomplete again
    _write_round(job, 30, 3.0)
    assert ckpt.latest_checkpoint(tmp_path).name == "30"
    (tmp_path / "checkpoints" / "30" / ckpt.file_name("ls:a")).unlink()
    assert ckpt.latest_checkpoint(tmp_path).name == "10"


def test_keep_prunes_old_and_incomplete_rounds(tmp_path: Path) -> None:
    job = _settings(tmp_path)
    ckpt.NodeCheckpoints(job, "gs:0").save(5, {"w": np.zeros(1)}, {})  # never completed
    for r in (10, 20, 30):
        _write_round(job, r, float(r))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["20", "30"]


def test_state_trees_round_trip_without_pickle(tmp_path: Path) -> None:
    import dataclasses

    from geomx.policy.codec import CodecState
    from geomx.optim import create_optimizer

    @dataclasses.dataclass
    class Moments:  # a dataclass state (codec states are), filled back into a fresh one
        mean: np.ndarray
        var: np.ndarray
        t: int = 0

    adam_state = create_optimizer("adam").create_state(0, np.ones(2, np.float32))
    adam_state["t"] = 5
    state = {"none": None, "nd": np.arange(4, dtype=np.float16), "tuple": (np.ones(2), 3),
             "dict": {1: {"sender": np.zeros(2)}, ("wan", 2, 0): [1.5, float("inf")]},
             "scalar": np.float32(0.25), "adam": Moments(np.ones(2, np.float32),
                                                         np.zeros(2, np.float32), t=7),
             "adam_dict": adam_state}
    arrays: dict[str, np.ndarray] = {}
    tree = ckpt.pack(state, arrays, "s")
    ckpt.write_node_file(tmp_path / "n.npz", arrays, {"state": tree})
    meta, loaded = ckpt.read_node_file(tmp_path / "n.npz")
    out = ckpt.unpack(meta["state"], loaded)
    np.testing.assert_array_equal(out["nd"], state["nd"])
    assert out["nd"].dtype == np.float16 and out["none"] is None
    assert isinstance(out["tuple"], tuple) and out["tuple"][1] == 3
    assert out["dict"][("wan", 2, 0)] == [1.5, float("inf")]
    assert out["scalar"] == np.float32(0.25) and out["scalar"].dtype == np.float32
    adam = ckpt.restore_into(out["adam"], Moments(np.zeros(2, np.float32),
                                                  np.zeros(2, np.float32)))
    assert adam.t == 7 and adam.mean.tolist() == [1.0, 1.0]
    assert out["adam_dict"]["t"] == 5 and set(out["adam_dict"]) == set(adam_state)
    with pytest.raises(ckpt.CheckpointError, match="cannot checkpoint a object"):
        ckpt.pack({"x": object()}, {}, "s")
    assert CodecState  # codec states are saved field by field (restore_codec_states)


# --------------------------------------------------------------------------- scenario / cli
@pytest.mark.parametrize("every, problem", [
    (-1, "out of range"), ("1e999s", "not a finite number"), (True, "expected rounds"),
    ("0s", "out of range"), ("soon", "invalid duration"), (10**10, "out of range")])
def test_bad_every_is_refused(every, problem) -> None:
    with pytest.raises(ScenarioError, match=problem) as e:
        parse_scenario({"checkpoint": {"every": every}})
    assert "checkpoint.every" in str(e.value)


#: three party DCs: TSEngine's overlay across them sums in the order they become ready
THREE_PARTIES = {
    "dc": [{"name": "central", "central": True, "global_servers": 1, "workers": 0},
           *({"name": f"p{i}", "workers": 1} for i in range(3))],
    "wan": [{"a": f"p{i}", "b": "central", "bandwidth": "100Mbps", "latency": "30ms"}
            for i in range(3)]}


@pytest.mark.parametrize("extra, field", [
    ({"sched": {"tsengine_inter": True}, **THREE_PARTIES}, "sched.tsengine_inter"),
    ({"training": {"model": "phantom"}}, "training.model"),
    ({"topology": {"kind": "netstorm"}}, "topology.kind")])
def test_checkpoint_refuses_what_it_cannot_save(extra, field) -> None:
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        parse_scenario({"checkpoint": {"every": 10}, **extra})


def test_tsengine_across_two_dcs_takes_checkpoints() -> None:
    """Two party DCs: whichever way the overlay merges them, the root adds the same two
    values (a + b == b + a), so a resumed run sums exactly as the original did."""
    s = parse_scenario({"checkpoint": {"every": 10}, "sched": {"tsengine_inter": True}})
    assert s.checkpoint.enabled and len(s.party_dcs) == 2


def test_dgt_receiver_takes_a_resent_block_once() -> None:
    """A resumed DGT sender sends its checkpoint round's trailing blocks again; the
    receiver restored from the checkpoint drops those it had received before it, so the
    next assembly equals an uninterrupted receiver's (the emulator's bands always arrive
    after the snapshot, so only this test sees a block that came before it)."""
    from geomx.sched.dgt import (DGT_META, RESENT_META, ROUND_META, SENT_META, DgtReceiver,
                                 DgtSettings)
    from geomx.wire import Kind, Message, Payload

    class Ctx:
        def record(self, event: str, **fields) -> None:
            pass

    settings = DgtSettings(mode="tcp", block_bytes=8)  # 2 float32 values per block
    like = np.zeros(8, dtype=np.float32)

    def block(round_: int, seq: int, channel: int = 1, **meta) -> Message:
        values = np.arange(2, dtype=np.float32) + 10 * round_ + seq
        return Message(Kind.PUSH, "ls:a", "gs:0", key=0, version=round_, channel=channel,
                       request_id=100 * round_ + seq if seq == 3 else 0,
                       meta={DGT_META: [seq, 4, 2], ROUND_META: round_, **meta},
                       payloads=[Payload.of(values)])

    def end(round_: int) -> Message:
        return block(round_, 3, channel=0, **{SENT_META: [2, 2, 0, 0]})

    ctx = Ctx()
    clean, first = DgtReceiver(settings), DgtReceiver(settings)
    for rx in (clean, first):
        rx.receive(ctx, block(1, 0, channel=0), like)
        assert rx.receive(ctx, end(1), like) is not None
        rx.receive(ctx, block(1, 1), like)  # late: joins round 2
    # the checkpoint of round 1 is taken here; block 2 of round 1 is still on its way
    arrays: dict[str, np.ndarray] = {}
    tree = ckpt.pack(first.state_dict(), arrays, "s")
    resumed = DgtReceiver(settings)
    resumed.load_state_dict(ckpt.unpack(json.loads(json.dumps(tree)), arrays))
    clean.receive(ctx, block(1, 2), like)
    for seq in (1, 2):  # the resumed sender's trailing blocks of round 1
        assert resumed.receive(ctx, block(1, seq, **{RESENT_META: 1}), like) is None
    for rx in (clean, resumed):
        rx.receive(ctx, block(2, 0, channel=0), like)
    want, got = clean.receive(ctx, end(2), like), resumed.receive(ctx, end(2), like)
    assert got is not None and np.array_equal(got, want)
    assert want[2:6].tolist() == [11, 12, 12, 13]  # round 1's blocks 1 and 2, once each


def test_every_forms_round_trip() -> None:
    s = parse_scenario({"checkpoint": {"every": "30s", "keep": 3}})
    assert s.checkpoint.every.seconds == 30.0 and s.checkpoint.keep == 3
    assert override_scenario(s, ["checkpoint.every=7"]).checkpoint.every.rounds == 7
    assert not parse_scenario({}).checkpoint.enabled


def test_resume_without_checkpoint_is_one_line(tmp_path: Path, capsys) -> None:
    from geomx.cli import main

    run = tmp_path / "old"
    run.mkdir()
    (run / "scenario.toml").write_text(QUICKSTART.read_text())
    assert main(["run", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "no complete checkpoint" in err
    assert main(["run", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert main(["launch", str(QUICKSTART), "--resume", str(run)]) == 2
    assert "not both" in capsys.readouterr().err


# --------------------------------------------------------------------------- real sockets


@pytest.mark.slow
def test_real_job_killed_and_resumed(tmp_path: Path) -> None:
    """SIGKILL every process of a real job once a checkpoint exists; ``geomx launch
    --resume`` finishes it, at the clean run's accuracy (+-0.01; here the same model: FSA
    over two DCs sums in any order to the same bits). The clean run is the emulator's,
    which computes the same model as the real runtime."""
    sets = [*QUIET, "run.iterations=40", "checkpoint.every=10",
            "wan.0.latency=5ms", "wan.1.latency=5ms"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "real"
    args = [a for s in sets for a in ("--set", s)]
    log = (tmp_path / "launch.log").open("w")
    p = subprocess.Popen([sys.executable, "-m", "geomx", "launch", str(QUICKSTART), "--quiet",
                          "--out", str(out), *args], env=env, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        run_dir = None
        while time.monotonic() < deadline and p.poll() is None:
            found = list(out.glob("*/checkpoints"))
            if found and ckpt.complete_rounds(found[0]) and ckpt.complete_rounds(found[0])[-1] >= 10:
                run_dir = found[0].parent
                break
            time.sleep(0.05)
        assert run_dir is not None, (tmp_path / "launch.log").read_text()[-3000:]
        victims = [*descendants(p.pid), p.pid]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        log.close()
    time.sleep(0.5)
    assert all(not Path(f"/proc/{v}").exists() or
               Path(f"/proc/{v}/stat").read_text().split(") ")[1][0] == "Z" for v in victims)
    assert not (run_dir / "summary.json").exists()  # it really died mid-run
    killed_at = ckpt.complete_rounds(run_dir / "checkpoints")[-1]
    assert killed_at < 40
    r = subprocess.run([sys.executable, "-m", "geomx", "launch", "--resume", str(run_dir),
                        "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resumed from checkpoint" in r.stdout
    new_dir = Path(r.stdout.split("run folder: ", 1)[1].split("\n", 1)[0])
    summary = json.loads((new_dir / "summary.json").read_text())
    assert summary["iterations"] == 40
    assert summary["extra"]["resumed_from"]["run_dir"] == str(run_dir.resolve())
    clean = run_scenario(load_scenario(QUICKSTART, sets), out_dir=tmp_path / "emu")
    print(f"killed after checkpoint {killed_at}; resumed accuracy {summary['final_accuracy']:.4f}, "
          f"clean {clean.summary.final_accuracy:.4f}")
    assert abs(summary["final_accuracy"] - clean.summary.final_accuracy) <= 0.01
