"""MapReduce-style algorithms (k-means, naive Bayes) through the parameter server, in the
emulator on the quickstart shape, against scikit-learn's centralised fits."""

import pytest

from tests.algorithms.cases import CASES, run_case


@pytest.mark.parametrize("name", ["kmeans", "naive_bayes"])
def test_matches_scikit_learn(tmp_path, name):
    row = run_case(CASES[name], tmp_path)
    assert row["ok"], row


def test_kmeans_moves_its_sums_over_the_wan(tmp_path):
    """One push per Lloyd iteration per worker: WAN bytes grow with the iterations, and
    every node ends with the same centres (the evaluator's are returned)."""
    row = run_case(CASES["kmeans"], tmp_path)
    s = row["summary"]
    iters = row["final"]["lloyd_iterations"]
    k, d = 6, 8
    # each party's local server pushes and pulls k x (d + 2) float64 per iteration
    assert s.bytes_wan >= iters * 2 * 2 * k * (d + 2) * 8
    assert s.emulated_seconds > iters * 2 * 0.03


def test_naive_bayes_predictions_equal_scikit_learns(tmp_path):
    from sklearn.naive_bayes import GaussianNB

    from tests.algorithms.cases import load_case, table_of_scenario

    row = run_case(CASES["naive_bayes"], tmp_path)
    table, _ = table_of_scenario(load_case(CASES["naive_bayes"], tmp_path))
    ref = GaussianNB().fit(table.x_train, table.y_train).score(table.x_test, table.y_test)
    assert row["geomx"] == pytest.approx(ref, abs=1e-12)


@pytest.mark.slow
def test_kmeans_over_real_sockets_equals_the_emulator(tmp_path):
    """The same program over TCP, one process per node (the wire path): the same centres
    as in the emulator, up to the order in which a server adds its pushes."""
    import numpy as np

    emu = run_case(CASES["kmeans"], tmp_path / "emu", "run.iterations=10")
    real = run_case(CASES["kmeans"], tmp_path / "real", "run.iterations=10", runtime="real")
    assert real["summary"].runtime == "real"
    assert real["final"]["lloyd_iterations"] == emu["final"]["lloyd_iterations"]
    np.testing.assert_allclose(real["final"]["centres"], emu["final"]["centres"], rtol=1e-9)
    assert real["ok"], real
    assert real["summary"].bytes_wan == pytest.approx(emu["summary"].bytes_wan, rel=0.05)


def test_scenario_refuses_an_algorithm_beside_a_model_or_bad_options(tmp_path):
    from geomx.scenario import ScenarioError

    from tests.algorithms.cases import load_case

    case = CASES["kmeans"]
    with pytest.raises(ScenarioError, match=r"training.model: set either training.algorithm"):
        load_case(case, tmp_path, "training.model=cnn")
    with pytest.raises(ScenarioError, match=r"training.program: set either"):
        load_case(case, tmp_path, "training.program=train.py")
    with pytest.raises(ScenarioError, match=r"program_args: .*unknown option.*allowed options: "
                                            r"--clusters, --oversample, --tol"):
        load_case(case, tmp_path, 'training.program_args=["--k", "3"]')
    with pytest.raises(ScenarioError, match=r"--clusters 0: allowed: an integer >= 1"):
        load_case(case, tmp_path, 'training.program_args=["--clusters", "0"]')
    with pytest.raises(ScenarioError, match=r"training.dataset: dataset 'blobs' is a table for "
                                            r"the algorithms"):
        load_case(case, tmp_path, "training.algorithm=")
    with pytest.raises(ScenarioError, match=r"run.epochs is for models"):
        load_case(case, tmp_path, "run.epochs=2")


def test_same_seed_same_event_log(tmp_path):
    from geomx.metrics.recorder import iter_events

    def events(tag):
        row = run_case(CASES["kmeans"], tmp_path / tag)
        return [{k: v for k, v in e.items() if not k.startswith("wall")}
                for e in iter_events(row["run_dir"] / "events.jsonl")]

    assert events("a") == events("b")
