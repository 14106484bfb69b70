"""Online algorithms (FTRL-proximal, passive-aggressive): one pass over a stream
partitioned across the DCs, against scikit-learn, and FTRL against a centralised replay."""

import argparse
import math

import numpy as np
import pytest

from tests.algorithms.cases import CASES, load_case, run_case, table_of_scenario


@pytest.mark.parametrize("name", ["ftrl", "passive_aggressive"])
def test_matches_scikit_learn(tmp_path, name):
    row = run_case(CASES[name], tmp_path)
    assert row["ok"], row


def test_distributed_ftrl_equals_a_centralised_pass(tmp_path):
    """Each round's mean gradient over all workers' batches is the gradient of the
    concatenated batch, so the distributed pass is a centralised FTRL pass whose batch is
    the round's rows of every worker: the same weights up to summation order."""
    from geomx.algorithms.ftrl import Ftrl, loss_grad_sum
    from geomx.algorithms.linear import with_bias
    from geomx.ml.partition import partition

    case = CASES["ftrl"]
    row = run_case(case, tmp_path)
    s = load_case(case, tmp_path)
    table, _ = table_of_scenario(s)
    parts = partition(table.y_train, 4, "iid", seed=s.run.seed)
    batch = 8
    opts = argparse.Namespace(alpha=0.5, beta=1.0, l1=1e-3, l2=1e-3)
    model = Ftrl((table.num_features + 1, 1), opts)
    x = with_bias(table.x_train)
    for r in range(math.ceil(max(map(len, parts)) / batch)):
        rows = np.concatenate([p[r * batch:(r + 1) * batch] for p in parts])
        _, g = loss_grad_sum(model.weights(), x[rows], table.y_train[rows])
        model.update(g / len(rows))
    assert row["final"]["rows_seen"] == len(table.y_train)
    np.testing.assert_allclose(np.array(row["final"]["weights"]), model.weights(),
                               rtol=1e-9, atol=1e-12)
