"""A codec a training program sets with ``kv.set_gradient_compression`` resumes with its
error feedback.

Bi-Sparse and onebit keep per-key memory (momentum, residuals, the encode round that
seeds Bi-Sparse's sampling) at the node that encodes the WAN push: the local servers
under HiPS, the workers on a flat PS. A checkpoint saves that memory; on ``--resume``
the program runs from its start again and its master worker sets the codec again, which
the servers (and, from a reply, the workers) install as a new codec. The memory must
end up in that codec, or the resumed run sends other bits from its first round on.

Each worker reports a SHA-256 of its model after every iteration; a run stopped at
iteration 10 and resumed to 20 must report the digests of an uninterrupted 20-iteration
run for iterations 11..20, in the emulator and over real sockets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from geomx.experiment import resume_scenario, run_scenario
from geomx.scenario import load_scenario

from tests.helpers.events import run_events
from tests.helpers.paths import ROOT
from tests.helpers.resume import straight_and_resumed

CNN = ROOT / "examples" / "cnn.toml"
QUIET = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
         "metrics.trace=false"]
STOP, END = 10, 20

#: examples/cnn.py (Adam on the global server) whose master worker may set a codec:
#: ``training.program_args = ["bsc"]`` / ``["onebit"]`` / ``["none"]``
PROGRAM = '''
import hashlib

import geomx.kv

CODECS = {"bsc": {"type": "bsc", "threshold": 0.01, "size_lower_bound": 1000},
          "onebit": {"type": "onebit", "size_lower_bound": 1000}}


async def main(kv, ctx):
    model = ctx.build_model()
    params = model.params
    if kv.is_master_worker:
        if ctx.args[0] in CODECS:
            kv.set_gradient_compression(CODECS[ctx.args[0]])
        kv.set_optimizer(geomx.kv.optimizer.Adam(learning_rate=ctx.lr))
    for k, p in enumerate(params):
        kv.init(k, p)
        if not kv.is_master_worker:
            kv.pull(k, out=p)
    await kv.waitall()
    if kv.is_master_worker:
        return
    data = ctx.dataset()
    batches = ctx.batches()
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        await ctx.compute("per_iter")
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
    program = tmp_path / "codec_program.py"
    program.write_text(PROGRAM)
    scenario = tmp_path / "codec_program.toml"
    scenario.write_text(CNN.read_text().replace('program = "cnn.py"', f'program = "{program}"'))
    return scenario


def _digests(run_dir) -> dict[tuple[str, int], str]:
    return {(e["node"], e["iteration"]): e["digest"]
            for e in run_events(run_dir, "eval") if "digest" in e}


def _stop_and_resume(tmp_path: Path, runtime: str, sets: list[str]):
    """(uninterrupted run's digests, resumed run's digests, resumed run's folder)."""
    clean, resumed = straight_and_resumed(_scenario(tmp_path),
                                          [*QUIET, "checkpoint.every=5", *sets],
                                          runtime=runtime, stop=STOP, end=END,
                                          out=tmp_path / "runs")
    return _digests(clean.run_dir), _digests(resumed.run_dir), resumed.run_dir


def _assert_continues_bit_for_bit(clean, resumed, workers: int) -> None:
    later = {k: v for k, v in resumed.items() if k[1] > STOP}
    assert len({node for node, _ in later}) == workers and len(later) == workers * (END - STOP)
    assert later == {k: clean[k] for k in later}


#: a flat PS over real sockets with one worker per DC: its global server sums the
#: workers' pushes in arrival order, which only two addends make exact in any order
#: (four workers' sums differ in their last bits from run to run, resumed or not)
FLAT_TWO = ["topology.kind=flat", "dc.party-a.workers=1", "dc.party-b.workers=1"]

#: (runtime, what sets the codec); the program's ``set_gradient_compression`` under
#: HiPS (local servers keep the memory) and on a flat PS (workers keep it), and the
#: scenario's ``[codec]`` with no command
CASES = [
    ("emu", ['training.program_args=["bsc"]']),
    ("emu", ['training.program_args=["onebit"]']),
    ("emu", ['training.program_args=["bsc"]', "topology.kind=flat"]),
    ("emu", ['training.program_args=["none"]', "codec.type=bsc", "codec.threshold=0.01",
             "codec.size_lower_bound=1000"]),
    ("real", ['training.program_args=["bsc"]']),
    ("real", ['training.program_args=["onebit"]', *FLAT_TWO]),
]
IDS = ["bsc-emu", "onebit-emu", "bsc-flat-emu", "scenario-bsc-emu", "bsc-real",
       "onebit-flat-real"]


@pytest.mark.slow
@pytest.mark.parametrize("runtime, sets", CASES, ids=IDS)
def test_a_resumed_program_keeps_its_codec_memory(tmp_path, runtime, sets):
    clean, resumed, run_dir = _stop_and_resume(tmp_path, runtime, sets)
    _assert_continues_bit_for_bit(clean, resumed, 2 if "dc.party-a.workers=1" in sets else 4)
    # every node that encodes pushes resumed with the memory of its checkpoint
    restored = {e["node"] for e in run_events(run_dir, "codec_restore")}
    assert restored == ({n for n, _ in resumed} if "topology.kind=flat" in sets
                        else {"ls:party-a", "ls:party-b"})
    assert not run_events(run_dir, "warning")


def test_a_resumed_global_server_answers_pulls_after_the_masters_init(tmp_path):
    """Over real sockets a resumed job's local servers could pull the restored model and
    push the next round before the master worker's commands arrived (seen in the test
    above: ``set_optimizer`` reached ``gs:0`` after both local servers' first pushes,
    applied as the new weights). A restored key's pulls wait for its INIT, as every
    pull does in an uninterrupted run, and the master sends its INITs after its
    commands. Here a pull comes first, in the emulator, and is answered only after the
    INIT."""
    import asyncio

    from geomx.cluster import plan_job
    from geomx.experiment import EmuServices, build_network
    from geomx.node.global_server import GlobalServer
    from geomx.sim.loop import run_virtual
    from geomx.sim.transport import SimFabric
    from geomx.wire import Kind, Message, Payload

    scenario = _scenario(tmp_path)
    first = run_scenario(load_scenario(scenario, [*QUIET, "checkpoint.every=5",
                                                  'training.program_args=["none"]',
                                                  "run.iterations=5"]),
                         out_dir=tmp_path / "runs", progress=False)
    s = resume_scenario(first.run_dir, ["run.iterations=10"])
    plan = plan_job(s)
    fabric = SimFabric(build_network(s, plan))
    gs = GlobalServer("gs:0", "central", fabric.transport("gs:0"),
                      EmuServices(0, None, None, plan.job.dc_of), plan.job)
    master, ls = fabric.transport(plan.job.master_worker), fabric.transport("ls:party-a")
    restored = np.array(gs.slots[(0, 0)].store)

    async def run():
        server = asyncio.ensure_future(gs.run())
        await asyncio.sleep(0)
        await ls.send(Message(Kind.PULL, "ls:party-a", "gs:0", key=0, request_id=1,
                              meta={"initial": True}))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ls.recv(), 5.0)  # 5 emulated seconds: parked
        await master.send(Message(Kind.INIT, plan.job.master_worker, "gs:0", key=0,
                                  request_id=2, payloads=[Payload.of(np.zeros_like(restored))]))
        assert (await asyncio.wait_for(master.recv(), 5.0)).kind == Kind.INIT_ACK
        reply = await asyncio.wait_for(ls.recv(), 5.0)
        assert reply.kind == Kind.PULL_REPLY and reply.request_id == 1
        # the checkpoint's value, not the INIT's
        np.testing.assert_array_equal(reply.payloads[0].data.reshape(restored.shape), restored)
        gs.stop()
        await server

    run_virtual(run())


def test_memory_of_another_codec_starts_fresh_and_says_so(tmp_path):
    """Resumed with another codec than the checkpoint's, a node does not feed Bi-Sparse's
    buffers to onebit: it starts its error feedback from zero and records why."""
    scenario, out = _scenario(tmp_path), tmp_path / "runs"
    bsc = ["codec.type=bsc", "codec.threshold=0.01", "codec.size_lower_bound=1000"]
    first = run_scenario(load_scenario(scenario, [*QUIET, "checkpoint.every=5", *bsc,
                                                  'training.program_args=["none"]',
                                                  f"run.iterations={STOP}"]),
                         out_dir=out, progress=False)
    resumed = run_scenario(resume_scenario(first.run_dir, [f"run.iterations={END}",
                                                           "codec.type=onebit"]),
                           out_dir=out, progress=False)
    assert resumed.summary.iterations == END
    assert not run_events(resumed.run_dir, "codec_restore")
    warned = {e["node"]: e["text"] for e in run_events(resumed.run_dir, "warning")}
    assert set(warned) == {"ls:party-a", "ls:party-b"}
    assert all("'type': 'bsc'" in t and "'type': 'onebit'" in t and "starts from zero" in t
               for t in warned.values())


@pytest.mark.parametrize("saved, problem", [
    ({"states": []}, "malformed codec state"),
    ({"config": {"type": "bsc"}, "states": [[["wan", 0], {"n": 4}]]}, "malformed codec state key"),
    ({"config": {"type": "bsc"}, "states": [[["wan", 0, 0], {
        "n": 4, "u": np.zeros(3, np.float32), "v": None, "residual": None, "round": 1}]]},
     "not float32 with 4 elements"),
])
def test_a_malformed_codec_memory_is_refused(saved, problem):
    from geomx.node import checkpoint as ckpt
    from geomx.node.link_codec import LinkCodec

    with pytest.raises(ckpt.CheckpointError, match=problem):
        ckpt.restore_codec_states(LinkCodec({"type": "bsc"}), saved, lambda *a, **k: None)
