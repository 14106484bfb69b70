"""A training program under each sync algorithm: ``ctx.worker_sync`` gives it the same
per-step policy as the built-in trainer, so it trains under HFA and ESync too; under ESync
a program never leaves the state server waiting; and a program that installs a global
optimizer under an algorithm that runs none (HFA, ESync) fails at once, saying why,
instead of training to chance."""

from __future__ import annotations

import pytest

from geomx.experiment import JobFailed, run_scenario
from geomx.scenario import load_scenario

from tests.helpers.events import run_events
from tests.helpers.paths import EXAMPLES, QUICKSTART, ROOT

SHORT = ["run.iterations=30", "run.eval_every=10", "run.target_accuracy=0",
         "run.progress=false", "metrics.plot=false", "metrics.trace=false"]
PAIR_PROGRAM = f"training.program={ROOT / 'tools' / 'pair_program.py'}"
#: local steps with Adam: SGD at the quickstart's lr 0.005 learns little in 30 iterations
LOCAL_ADAM = "training.worker_optimizer=adam"


def _run(tmp_path, path, sets):
    return run_scenario(load_scenario(path, [f"run.out_dir={tmp_path}", *SHORT, *sets]),
                        runtime="emu", progress=False)


def test_esync_with_a_program_runs_budgeted_rounds_and_trains(tmp_path):
    r = _run(tmp_path, QUICKSTART, ["sync.algorithm=esync", LOCAL_ADAM, PAIR_PROGRAM])
    rounds = run_events(r.run_dir, "esync_round")
    assert len(rounds) >= 29  # one per synchronisation, all four workers' budgets
    assert all(len(e["budgets"]) == 4 for e in rounds)
    # chance on the ten digits is about 0.1; the built-in trainer reaches 0.91 here
    assert r.summary.final_accuracy > 0.8


BY_HAND = """
from geomx.optim import create_optimizer

async def main(kv, ctx):
    model = ctx.build_model()
    params = model.params
    kv.init(list(range(len(params))), params)
    if kv.is_master_worker:
        return
    for k, p in enumerate(params):
        kv.pull(k, out=p)
    await kv.waitall()
    prev = [p.copy() for p in params]
    opt = create_optimizer("adam", lr=ctx.lr)
    states = [opt.create_state(k, p) for k, p in enumerate(params)]
    data, batches = ctx.dataset(), ctx.batches()
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        await ctx.compute()
        for k, g in enumerate(grads):
            opt.update(k, params[k], g, states[k])
        for k, p in enumerate(params):  # one local step, then the mean of the deltas
            kv.push(k, p - prev[k])
            kv.pull(k, out=p)
        await kv.waitall()
        for k, p in enumerate(params):
            p *= 1.0 / kv.num_all_workers
            p += prev[k]
            prev[k][...] = p
        if ctx.is_evaluator and it % ctx.eval_every == 0:
            ctx.report(it, loss=loss, accuracy=model.accuracy(data.x_test, data.y_test))
"""


def test_esync_program_that_pushes_by_hand_does_not_deadlock(tmp_path):
    """A program that averages model deltas by hand never asks the state server for step
    budgets: the job still ends (it deadlocked before), because each worker says goodbye
    to the state server when its program returns."""
    program = tmp_path / "by_hand.py"
    program.write_text(BY_HAND)
    r = _run(tmp_path, QUICKSTART, ["sync.algorithm=esync", f"training.program={program}"])
    assert len(run_events(r.run_dir, "worker_done")) == 4
    assert not run_events(r.run_dir, "esync_round")
    assert r.summary.final_accuracy > 0.8


@pytest.mark.parametrize("algorithm", ["hfa", "esync"])
def test_global_optimizer_under_local_step_algorithm_is_refused(tmp_path, algorithm):
    """examples/cnn.py pushes gradients for Adam on the global servers; HFA and ESync
    only average models there, so it trained to 0.097 before: now it stops at once."""
    with pytest.raises(JobFailed) as exc:
        _run(tmp_path, EXAMPLES / "cnn.toml", [f"sync.algorithm={algorithm}"])
    line = str(exc.value).splitlines()[0]
    assert f"sync.algorithm = {algorithm!r} runs no global optimizer" in line
    assert "kv.set_optimizer" in line and "cnn_hfa.py" in line


def test_hfa_with_a_program_trains(tmp_path):
    r = _run(tmp_path, QUICKSTART, ["sync.algorithm=hfa", "sync.k1=2", "sync.k2=2",
                                    LOCAL_ADAM, PAIR_PROGRAM])
    assert run_events(r.run_dir, "global_sync")
    assert r.summary.final_accuracy > 0.8
