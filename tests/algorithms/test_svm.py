"""Support-vector algorithms (linear SVM, SVR, RBF kernel SVM via random Fourier
features) trained by distributed SGD through the parameter server, against scikit-learn."""

import pytest

from tests.algorithms.cases import CASES, run_case


@pytest.mark.parametrize("name", ["linear_svm", "svr", "kernel_svm"])
def test_matches_scikit_learn(tmp_path, name):
    row = run_case(CASES[name], tmp_path)
    assert row["ok"], row


def test_linear_svm_under_mixed_sync_and_with_local_steps(tmp_path):
    """The same SVM with MixedSync (each DC's push is a global step of its own) and with
    no global optimizer (workers pull the gradient sum and step locally): both learn."""
    case = CASES["linear_svm"]
    mixed = run_case(case, tmp_path, "sync.algorithm=mixed", "run.iterations=150")
    local = run_case(case, tmp_path, "training.optimizer=none", "training.worker_optimizer=adam",
                     "training.worker_lr=0.01", "run.iterations=150")
    for row in (mixed, local):
        assert row["geomx"] >= row["sklearn"] - 0.03, row


def test_sgd_algorithms_refuse_sync_algorithms_they_cannot_run(tmp_path):
    from geomx.scenario import ScenarioError

    from tests.algorithms.cases import load_case

    with pytest.raises(ScenarioError, match="sync.algorithm.*'fsa', 'mixed'"):
        load_case(CASES["linear_svm"], tmp_path, "sync.algorithm=hfa")
    with pytest.raises(ScenarioError, match="training.dataset: algorithm 'svr' needs a regression"):
        load_case(CASES["svr"], tmp_path, "training.dataset=iris")


def test_target_accuracy_stops_an_algorithm_on_every_worker(tmp_path):
    """The evaluator's report reaching [run] target_accuracy stops the job after the same
    round on every worker (FSA's rounds stay aligned, nobody waits for a missing push)."""
    from geomx.metrics.recorder import iter_events

    row = run_case(CASES["linear_svm"], tmp_path, "run.target_accuracy=0.9", "run.eval_every=10")
    assert row["summary"].iterations < 300
    assert row["final"]["stop_reason"].startswith("stop requested")
    done = [e["iterations"] for e in iter_events(row["run_dir"] / "events.jsonl")
            if e["ev"] == "worker_done"]
    assert len(done) == 4 and len(set(done)) == 1
