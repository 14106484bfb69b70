"""Bagging (Breiman 1996, "Bagging Predictors") of histogram decision trees through the PS.

A random forest without the feature sampling (``random_forest.py``): each tree sees a
Poisson(1) bootstrap of every worker's rows and may split on every feature, so the
variance reduction comes from the resampling alone; the trees' class distributions are
averaged, as scikit-learn's ``BaggingClassifier`` averages its trees' probabilities.
"""

from __future__ import annotations

import argparse
from typing import Any

from geomx.algorithms import random_forest
from geomx.algorithms.job import AlgorithmJob

DEFAULT_ITERATIONS = 10


def add_options(p: argparse.ArgumentParser) -> None:
    random_forest.add_options(p, depth=5, features=False)


check_options = random_forest.check_options


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * DEFAULT_ITERATIONS * 2 ** (opts.depth - 1) * table.num_features \
        * opts.max_bins * (table.num_classes + 1)


async def run(job: AlgorithmJob) -> dict[str, Any]:
    return await random_forest.train_forest(job, "bagging", DEFAULT_ITERATIONS)
