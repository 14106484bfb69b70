"""Checkpoints with a training program: ``ctx.state``, ``ctx.batches`` and
``ctx.iterations`` come back on ``--resume``, so a stopped and resumed program job ends
with the model of an uninterrupted one, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from geomx.experiment import resume_scenario, run_scenario
from geomx.node import checkpoint as ckpt
from geomx.scenario import load_scenario

from tests.helpers.paths import ROOT

CNN = ROOT / "examples" / "cnn.toml"
QUIET = ["run.target_accuracy=0", "run.progress=false", "metrics.plot=false",
         "metrics.trace=false", "metrics.events=false"]

#: A program whose next steps read state geomx does not hold: a generator of its own
#: (noise added to the gradients) and a running count, both kept in ``ctx.state``.
STATEFUL = '''
import numpy as np

async def main(kv, ctx):
    model = ctx.build_model()
    params = model.params
    if kv.is_master_worker:
        import geomx.kv
        kv.set_optimizer(geomx.kv.optimizer.SGD(learning_rate=0.05))
    for k, p in enumerate(params):
        kv.init(k, p)
        if not kv.is_master_worker:
            kv.pull(k, out=p)
    await kv.waitall()
    if kv.is_master_worker:
        return
    data = ctx.dataset()
    batches = ctx.batches()
    state = ctx.state
    rng = np.random.default_rng(ctx.worker_index)
    if "rng" in state:
        rng.bit_generator.state = state["rng"]
    state.setdefault("steps", 0)
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        await ctx.compute("per_iter")
        for k, g in enumerate(grads):
            kv.push(k, g + 1e-3 * rng.standard_normal(g.shape).astype(g.dtype), priority=-k)
            kv.pull(k, out=params[k], priority=-k)
        await kv.waitall()
        state["steps"] += 1
        state["rng"] = rng.bit_generator.state
    ctx.report(loss=float(loss), accuracy=model.accuracy(data.x_test, data.y_test),
               steps=state["steps"])
'''


def _server_model(into: dict[str, list[np.ndarray]]):
    def grab(nodes):
        for n in nodes:
            if n.name.startswith("gs:"):
                into[n.name] = [np.array(s.store) for _, s in sorted(n.slots.items())]
    return grab


def _stop_and_resume(scenario: Path, sets: list[str], *, stop: int, end: int, out: Path):
    clean: dict[str, list[np.ndarray]] = {}
    run_scenario(load_scenario(scenario, [*QUIET, *sets, f"run.iterations={end}"]),
                 out_dir=out, inspect=_server_model(clean))
    first = run_scenario(load_scenario(scenario, [*QUIET, *sets, f"run.iterations={stop}"]),
                         out_dir=out)
    resumed: dict[str, list[np.ndarray]] = {}
    second = run_scenario(resume_scenario(first.run_dir, [f"run.iterations={end}"]),
                          out_dir=out, inspect=_server_model(resumed))
    assert clean.keys() == resumed.keys() and clean
    return clean, resumed, first, second


@pytest.mark.slow
def test_example_cnn_program_resumes_bit_exact(tmp_path: Path) -> None:
    """GeoMX's examples/cnn.py (Adam on the global server; data from ctx.batches)."""
    clean, resumed, first, second = _stop_and_resume(
        CNN, ["checkpoint.every=10"], stop=30, end=50, out=tmp_path / "runs")
    for name in clean:
        for a, b in zip(clean[name], resumed[name]):
            assert np.array_equal(a, b)
    assert ckpt.complete_rounds(first.run_dir / "checkpoints") == [20, 30]
    assert second.summary.iterations == 50


@pytest.mark.slow
def test_program_state_comes_back(tmp_path: Path) -> None:
    """ctx.state: a program's own generator and counter survive the restart; without
    them the noise would repeat and the models would differ."""
    program = tmp_path / "noisy.py"
    program.write_text(STATEFUL)
    scenario = tmp_path / "noisy.toml"
    scenario.write_text(CNN.read_text().replace('program = "cnn.py"',
                                                f'program = "{program}"'))
    clean, resumed, first, second = _stop_and_resume(
        scenario, ["checkpoint.every=5"], stop=15, end=25, out=tmp_path / "runs")
    for name in clean:
        for a, b in zip(clean[name], resumed[name]):
            assert np.array_equal(a, b)
    summary = json.loads((second.run_dir / "summary.json").read_text())
    assert summary["iterations"] == 25
    events = [json.loads(line) for line in (second.run_dir / "events.jsonl").read_text()
              .splitlines()] if (second.run_dir / "events.jsonl").exists() else []
    steps = [e.get("steps") for e in events if e.get("event") == "eval" and "steps" in e]
    assert not events or steps == [25]
