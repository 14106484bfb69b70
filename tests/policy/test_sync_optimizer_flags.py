"""Who runs the optimizer: ``SyncAlgorithm.uses_global_optimizer`` (the workers pull
weights) and ``GlobalSide.uses_optimizer`` (the server keeps the model, not a plain
sum) must agree where the workers rely on it. A user's global side that sums while its
algorithm still says "the servers step" would have the workers take the gradient sum
for their weights and train nothing, silently; the job is refused at its first INIT,
naming both classes, in the emulator and over sockets. The consistent sum mode (both
False) trains, the workers stepping with ``training.worker_optimizer``."""

from __future__ import annotations

import pytest

from geomx.experiment import JobFailed
from geomx.testing import run_policy

SUMMING = '''
from geomx.policy.sync import SyncAlgorithm
from geomx.sync.fsa import ForwardEveryRound, FullySync, GradientSync


class SummingSync(SyncAlgorithm):
    name = "test-summing"
    uses_global_optimizer = {flag}

    def global_side(self, job):
        return FullySync(uses_optimizer=False)

    def local_side(self, job):
        return ForwardEveryRound()

    def worker_side(self, ctx):
        return GradientSync(ctx)
'''


def _policy(tmp_path, flag: bool) -> str:
    path = tmp_path / f"summing_{flag}.py"
    path.write_text(SUMMING.format(flag=flag))
    return f"{path}:SummingSync"


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_summing_global_side_under_an_algorithm_that_says_weights_is_refused(tmp_path,
                                                                                 runtime):
    with pytest.raises(JobFailed) as info:
        run_policy(_policy(tmp_path, True), kind="sync", iterations=4, runtime=runtime)
    message = str(info.value)
    assert "refused INIT" in message
    assert "global side FullySync keeps a plain sum (uses_optimizer = False)" in message
    assert "SummingSync.uses_global_optimizer is True" in message


def test_the_consistent_sum_mode_trains_as_fsa_with_the_same_optimizer(tmp_path):
    """Each worker stepping Adam on the pulled sum / num_all_workers is the global
    server's Adam step on the mean: the same model, so the same accuracy and loss."""
    summing = run_policy(_policy(tmp_path, False), kind="sync", iterations=40,
                         overrides=["training.worker_optimizer=adam", "training.worker_lr=0.01"])
    fsa = run_policy("fsa", kind="sync", iterations=40,
                     overrides=["training.optimizer=adam", "training.lr=0.01"])
    assert summing.summary.final_accuracy > 0.8
    assert summing.summary.final_accuracy == pytest.approx(fsa.summary.final_accuracy)
    assert summing.summary.final_loss == pytest.approx(fsa.summary.final_loss, rel=1e-5)
