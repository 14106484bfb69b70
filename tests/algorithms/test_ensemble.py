"""Ensemble algorithms through the parameter server (GBDT with histogram aggregation,
federated averaging, random forest, bagging, AdaBoost, voting, stacking), against
scikit-learn's centralised ensembles on the same split."""

import pytest

from tests.algorithms.cases import CASES, run_case


ENSEMBLES = [c.algorithm for c in CASES.values() if c.scenario == "algo_ensemble.toml"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ENSEMBLES)
def test_matches_scikit_learn(tmp_path, name):
    row = run_case(CASES[name], tmp_path)
    assert row["ok"], row


def test_gbdt_pushes_one_histogram_per_tree_level(tmp_path):
    """Bins (2 rounds), the class prior (1), then `depth` histogram rounds per boosting
    round: the global server sees exactly that many rounds per key group."""
    from geomx.metrics.recorder import iter_events

    row = run_case(CASES["gbdt"], tmp_path, "run.iterations=4", "run.eval_every=0")
    pushes = [e for e in iter_events(row["run_dir"] / "events.jsonl")
              if e["ev"] == "xfer" and e["msg"] == "PUSH" and e["dst"].startswith("gs")]
    depth, local_servers = 3, 2
    assert len(pushes) == local_servers * (2 + 1 + 4 * depth)


def test_histogram_subtraction_grows_the_same_trees():
    """Pushing only left children's histograms (a right child's is its parent's minus its
    sibling's) grows the same trees as pushing every node's."""
    import asyncio

    import numpy as np

    from geomx.algorithms import trees

    class OneWorker:  # a job whose all-reduce is the identity (one worker)
        async def allreduce(self, name, local):
            return np.array(local, dtype=np.float64)

    rng = np.random.default_rng(0)
    xb = rng.integers(0, 16, size=(400, 6))
    y = (xb[:, 0] + xb[:, 3] > 15).astype(np.int64)
    stats = np.zeros((3, 400, 3))
    stats[:, np.arange(400), y] = rng.poisson(1.0, size=(3, 400))
    stats[..., 2] = stats[..., :2].sum(axis=2)

    def grow(feature_sets):
        return asyncio.run(trees.grow(OneWorker(), "h", xb, stats, depth=4, bins=16,
                                      gain=trees.gini_gain, value=trees.class_values,
                                      feature_sets=feature_sets))

    halved = grow(None)
    every = grow(lambda lvl, width: np.broadcast_to(np.arange(6), (3, width, 6)))
    np.testing.assert_array_equal(halved.feature, every.feature)
    np.testing.assert_array_equal(halved.threshold, every.threshold)
    np.testing.assert_allclose(halved.value, every.value, atol=1e-12)
    assert (halved.feature >= 0).sum() > 10  # the trees did split
