"""Under each sync algorithm ``DistributedOptimizer`` sends what the built-in trainer
sends: the same PUSH messages per round from the workers and from the local servers to
the global tier (the event log's ``xfer`` events), for the same number of parameter
arrays (the test program's MLP and the scenario's have four), and it trains."""

from __future__ import annotations

import pytest

from geomx.experiment import JobFailed

from tests.helpers.events import run_events
from tests.helpers.paths import ROOT
from tests.torch.helpers import pushes, run

#: a sync policy of a user's (bounded staleness across DCs), named by its file
SSP = [f"sync.algorithm={ROOT / 'examples' / 'policies' / 'ssp.py'}:BoundedStaleness",
       "sync.options.staleness=1"]

CASES = {
    # algorithm: (scenario settings, program arguments, settings of the built-in run)
    "fsa": ([], [], ["training.optimizer=none"]),
    "hfa": (["sync.algorithm=hfa", "sync.k1=2", "sync.k2=2"], [], []),
    "esync": (["sync.algorithm=esync"], [], []),
    "mixed": (["sync.algorithm=mixed"], ["--sgd", "--server"], ["training.optimizer=momentum"]),
    # the servers run the optimizer (uses_global_optimizer): gradients up, weights down
    "ssp": (SSP, ["--sgd", "--server"], ["training.optimizer=momentum"]),
}


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_pushes_per_round_match_the_builtin_trainer(tmp_path, algorithm):
    sets, args, builtin = CASES[algorithm]
    ours = run(tmp_path, sets, args=args)
    theirs = run(tmp_path, [*sets, *builtin], program=False)
    assert pushes(ours.run_dir) == pushes(theirs.run_dir)
    assert pushes(ours.run_dir)["w"] > 0
    if algorithm == "esync":
        assert len(run_events(ours.run_dir, "esync_round")) == \
            len(run_events(theirs.run_dir, "esync_round"))
    done = run_events(ours.run_dir, "worker_done")
    assert [e["iterations"] for e in done] == [12] * 4
    assert ours.summary.final_accuracy > 0.3  # chance is 0.1 on the ten digits


@pytest.mark.parametrize("runtime", ["emu", "real"])
def test_a_user_sync_policy_runs_with_a_server_optimizer(tmp_path, runtime):
    r = run(tmp_path, SSP, args=["--sgd", "--server"], runtime=runtime)
    assert [e["iterations"] for e in run_events(r.run_dir, "worker_done")] == [12] * 4
    assert r.summary.final_accuracy > 0.3


def test_a_user_sync_policy_without_a_server_optimizer_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(JobFailed, match=r"runs the optimizer on the global servers "
                                        r"\(BoundedStaleness.uses_global_optimizer\).*"
                                        r"server_optimizer=True"):
        run(tmp_path, SSP, args=["--sgd"])
