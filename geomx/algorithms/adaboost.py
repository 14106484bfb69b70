"""AdaBoost (SAMME; Zhu, Zou, Rosset & Hastie 2009, "Multi-class AdaBoost") over shallow
histogram trees grown through the PS.

Every boosting round grows one tree (``--depth``, default a stump) on the current row
weights: the workers push per-node class-weight histograms and pull their sums
(``trees.py``). The leaves keep their summed class weights, so every worker knows the
tree's weighted training error without another round -- the weight outside each leaf's
majority class over the total -- and from it the tree's vote
``alpha = lr (log((1 - err) / err) + log(K - 1))``. Each worker then multiplies its
misclassified rows' weights by ``exp(alpha)`` and divides all of them by the new global
total (also known from the leaves), as scikit-learn's ``AdaBoostClassifier`` does.
Boosting stops early on a perfect tree or one no better than chance.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from geomx.algorithms import trees
from geomx.algorithms.job import AlgorithmError, AlgorithmJob

DEFAULT_ITERATIONS = 50


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--depth", type=int, default=1, help="depth of each tree (1 = stumps)")
    p.add_argument("--learning-rate", type=float, default=1.0, help="shrinkage of every vote")
    p.add_argument("--max-bins", type=int, default=32, help="histogram bins per feature")


def check_options(opts: argparse.Namespace) -> None:
    trees.check_tree_options(opts)
    if not opts.learning_rate > 0:
        raise AlgorithmError(f"--learning-rate {opts.learning_rate}: allowed: a number > 0")


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * 2 ** (opts.depth - 1) * table.num_features * opts.max_bins * (table.num_classes + 1)


def raw_sums(stats: np.ndarray) -> np.ndarray:
    return stats[..., :-1]


async def run(job: AlgorithmJob) -> dict[str, Any]:
    o, c, f = job.opts, job.table.num_classes, job.table.num_features
    await job.declare(**trees.bin_keys(job),
                      **trees.level_keys("hist", 1, o.depth, f, o.max_bins, c + 1))
    if job.is_master:
        return {}
    edges = await trees.compute_bins(job, o.max_bins)
    xb, xb_test = trees.binned(job.x, edges), trees.binned(job.table.x_test, edges)
    n = len(job.y)
    w = np.ones(n)
    votes = np.zeros((len(job.table.y_test), c))
    out: dict[str, Any] = {}
    for it in job.iterations(DEFAULT_ITERATIONS):
        stats = np.zeros((1, n, c + 1))
        stats[0, np.arange(n), job.y] = w
        stats[0, :, c] = 1.0                     # min_leaf counts rows
        tree = await trees.grow(job, "hist", xb, stats, depth=o.depth, bins=o.max_bins,
                                gain=trees.gini_gain, value=raw_sums, before_round=job.compute)
        leaf = tree.feature[0] < 0
        sums = tree.value[0][leaf]
        total = float(tree.value[0, 0].sum())
        wrong = float((sums.sum(axis=1) - sums.max(axis=1)).sum())
        err = wrong / total
        if err >= 1.0 - 1.0 / c:
            break                                # no better than chance: stop, keep the rest
        alpha = o.learning_rate * (math.log((1 - err) / max(err, 1e-300)) + math.log(c - 1))
        votes[np.arange(len(votes)), np.argmax(tree.predict(xb_test)[0], axis=1)] += alpha
        if job.due(it, job.last(it) or err <= 0):
            out = job.report(it, job.score(lambda _: np.argmax(votes, axis=1)), loss=err)
        if err <= 0:
            break                                # a perfect tree: its vote decides
        miss = np.argmax(tree.predict(xb)[0], axis=1) != job.y
        w *= np.exp(alpha * miss)
        w /= (total - wrong) + wrong * math.exp(alpha)
    return out
