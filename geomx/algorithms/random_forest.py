"""Random forest through the parameter server: Poisson bootstrap, random feature subsets,
histogram trees grown together.

Breiman (2001), "Random Forests", distributed the way streaming and federated forests
do it: the bootstrap is Poisson(1) row weights drawn by each worker for its own rows
(Oza & Russell 2001, "Online Bagging and Boosting" -- a with-replacement resample of the
whole training set in the limit, without moving a row), and every (tree, node) draws
its ``--max-features`` candidate features from the run's seed, the same on every
worker, so only those features' class histograms travel. All ``[run] iterations`` trees
grow at once, one PS round per level (``trees.py``); leaves keep class distributions
and the forest averages them, as scikit-learn's ``RandomForestClassifier`` does.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

import numpy as np

from geomx.algorithms import trees
from geomx.algorithms.job import AlgorithmError, AlgorithmJob

DEFAULT_ITERATIONS = 20


def add_options(p: argparse.ArgumentParser, *, depth: int = 6, features: bool = True) -> None:
    p.add_argument("--depth", type=int, default=depth, help="tree depth")
    p.add_argument("--max-bins", type=int, default=32, help="histogram bins per feature")
    if features:
        p.add_argument("--max-features", type=int, default=0,
                       help="candidate features per node; 0 = sqrt(features)")


def check_options(opts: argparse.Namespace) -> None:
    trees.check_tree_options(opts)
    if getattr(opts, "max_features", 0) < 0:
        raise AlgorithmError(f"--max-features {opts.max_features}: allowed: an integer >= 0")


def candidates(opts: argparse.Namespace, num_features: int) -> int:
    m = getattr(opts, "max_features", None)
    if m is None:
        return num_features                    # bagging: every feature
    return min(num_features, m or max(1, int(math.sqrt(num_features))))


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * DEFAULT_ITERATIONS * 2 ** (opts.depth - 1) * candidates(opts, table.num_features) \
        * opts.max_bins * (table.num_classes + 1)


def feature_draws(job: AlgorithmJob, count: int, m: int, tag: str) -> Callable[[int, int], np.ndarray]:
    f = job.table.num_features

    def draw(level: int, width: int) -> np.ndarray:
        if m == f:
            return np.broadcast_to(np.arange(f), (count, width, f))
        keys = job.shared_rng(f"{tag}-features-{level}").random((count, width, f))
        return np.argsort(keys, axis=2)[:, :, :m]
    return draw


async def train_forest(job: AlgorithmJob, tag: str, default_trees: int) -> dict[str, Any]:
    """Bootstrap ``[run] iterations`` trees and grow them together; the forest's score."""
    o, c, f = job.opts, job.table.num_classes, job.table.num_features
    count, m = job.planned_iterations(default_trees), candidates(job.opts, f)
    await job.declare(**trees.bin_keys(job),
                      **trees.level_keys("hist", count, o.depth, m, o.max_bins, c + 1,
                                         sampled=m < f))
    if job.is_master:
        return {}
    edges = await trees.compute_bins(job, o.max_bins)
    xb, xb_test = trees.binned(job.x, edges), trees.binned(job.table.x_test, edges)
    weights = job.local_rng(f"{tag}-bootstrap").poisson(1.0, size=(count, len(job.y)))
    stats = np.zeros((count, len(job.y), c + 1))
    stats[:, np.arange(len(job.y)), job.y] = weights
    stats[..., c] = weights
    forest = await trees.grow(job, "hist", xb, stats, depth=o.depth, bins=o.max_bins,
                              gain=trees.gini_gain, value=trees.class_values, min_leaf=1.0,
                              feature_sets=feature_draws(job, count, m, tag) if m < f else None,
                              before_round=job.compute)
    proba = forest.predict(xb_test).mean(axis=0)
    out: dict[str, Any] = {}
    its = list(job.iterations(count))
    if its and job.due(its[-1], True):
        out = job.report(its[-1], {**job.score(lambda _: np.argmax(proba, axis=1)),
                                   "trees": count})
    return out


async def run(job: AlgorithmJob) -> dict[str, Any]:
    return await train_forest(job, "rf", DEFAULT_ITERATIONS)
