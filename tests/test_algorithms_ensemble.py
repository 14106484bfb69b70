"""Ensemble algorithms through the parameter server (GBDT with histogram aggregation,
federated averaging, random forest, bagging, AdaBoost, voting, stacking), against
scikit-learn's centralised ensembles on the same split."""

import pytest

from algorithm_cases import CASES, run_case

ENSEMBLES = [c.algorithm for c in CASES.values() if c.scenario == "algo_ensemble.toml"]


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
