"""``[checkpoint]`` with a ``geomx.torch`` program: a worker's checkpoint carries its own
model (weights and buffers) and its torch optimizer's state, which the servers do not
hold under BytePS's semantics (they keep gradient sums), and ``--resume`` continues the
job bit for bit (geomx/torch/resume.py)."""

from __future__ import annotations

import pytest

from geomx.experiment import resume_scenario, run_scenario

from tests.helpers.events import run_events
from tests.torch.helpers import run

ARGS = ("--bn", "--report-early")  # BatchNorm buffers; the model's digest every iteration
# an async program's set-up (data, model, torch's first operations) runs on its node's
# event loop, which sends no heartbeat meanwhile: on a loaded host that can pass the
# default 10 s, as in the other real-runtime tests of tests/torch (docs/torch.md)
SETS = ["checkpoint.every=3", "membership.heartbeat_timeout=60s"]


def _digests(run_dir) -> dict[tuple[str, int], float]:
    return {(e["node"], e["iteration"]): e["digest"]
            for e in run_events(run_dir, "eval") if "digest" in e}


def _stop_and_resume(tmp_path, runtime: str, sets=(), args=()):
    sets, args = [*SETS, *sets], (*ARGS, *args)
    clean = run(tmp_path / "clean", sets, args=args, iterations=12, runtime=runtime)
    first = run(tmp_path / "first", sets, args=args, iterations=6, runtime=runtime)
    resumed = run_scenario(resume_scenario(first.run_dir, ["run.iterations=12"]),
                           runtime=runtime, progress=False)
    return _digests(clean.run_dir), _digests(resumed.run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("runtime, sets, args", [
    ("emu", [], ()), ("real", [], ()),
    # HFA's checkpoint rounds are its global syncs: every 2 iterations here, so round 3
    # is iteration 6; ESync's rounds, P3's slices
    ("emu", ["sync.algorithm=hfa", "sync.k1=2", "sync.k2=1"], ()),
    ("emu", ["sync.algorithm=esync"], ()),
    ("emu", ["sched.p3=true", "sched.p3_slice_elements=2000"], ()),
    # Compression.fp16: the master's set_gradient_compression races the resumed
    # servers' first fp16 replies to a local server that has not been told the codec
    ("emu", [], ("--fp16",)), ("real", [], ("--fp16",))],
    ids=["fsa-emu", "fsa-real", "hfa", "esync", "p3", "fp16-emu", "fp16-real"])
def test_a_resumed_torch_program_continues_bit_for_bit(tmp_path, runtime, sets, args):
    clean, resumed = _stop_and_resume(tmp_path, runtime, sets, args)
    later = {k: v for k, v in resumed.items() if k[1] > 6}
    workers = {node for node, _ in later}
    assert len(workers) == 4 and len(later) == 4 * 6  # quickstart's workers, iterations 7..12
    assert later == {k: clean[k] for k in later}


@pytest.mark.slow
def test_without_the_workers_model_a_resumed_run_differs(tmp_path, monkeypatch):
    """The comparison above can fail: restoring nothing (the servers' gradient sums as
    weights, a fresh Adam) gives another model."""
    import geomx.torch.broadcast as broadcast
    import geomx.torch.optimizer as optimizer

    monkeypatch.setattr(broadcast, "restore_tensors", lambda s, named: None)
    monkeypatch.setattr(optimizer, "restore_optimizer", lambda s, opt, params: None)
    clean, resumed = _stop_and_resume(tmp_path, "emu")
    later = [k for k in resumed if k[1] > 6]
    assert later and all(resumed[k] != clean[k] for k in later)
