"""Gradient-boosted decision trees with histogram aggregation through the PS.

Friedman's gradient boosting with second-order (Newton) leaves, as XGBoost and
scikit-learn's ``HistGradientBoostingClassifier`` do: the loss is the log loss (one tree
per round for two classes, one per class with the softmax for more), every round starts
from the gradients ``g`` and hessians ``h`` of the current scores, the per-DC gradient
histograms are pushed and summed by the parameter servers, and every worker derives the
same splits and leaf values ``-G / (H + l2)`` from the pulled totals (``trees.py``).
Scores start at the log prior of each class (one small all-reduce of the class counts).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import linear, trees
from geomx.algorithms.job import AlgorithmError, AlgorithmJob

DEFAULT_ITERATIONS = 50


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--depth", type=int, default=3, help="tree depth (2^depth leaves at most)")
    p.add_argument("--learning-rate", type=float, default=0.1, help="shrinkage of every tree")
    p.add_argument("--max-bins", type=int, default=32, help="histogram bins per feature")
    p.add_argument("--l2", type=float, default=1.0, help="L2 regularisation of leaf values")
    p.add_argument("--min-leaf", type=int, default=20, help="fewest training rows in a leaf")


def check_options(opts: argparse.Namespace) -> None:
    trees.check_tree_options(opts)
    if not opts.learning_rate > 0:
        raise AlgorithmError(f"--learning-rate {opts.learning_rate}: allowed: a number > 0")
    if not opts.l2 >= 0:
        raise AlgorithmError(f"--l2 {opts.l2}: allowed: a number >= 0")


def outputs(num_classes: int) -> int:
    return 1 if num_classes == 2 else num_classes


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * outputs(table.num_classes) * 2 ** (opts.depth - 1) * table.num_features \
        * opts.max_bins * 3


def gradients(scores: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log-loss gradient and hessian per (output, row)."""
    if scores.shape[0] == 1:
        p = 1.0 / (1.0 + np.exp(-scores[0]))
        return (p - y)[None], (p * (1 - p))[None]
    p = linear.softmax(scores.T).T
    onehot = np.zeros_like(p)
    onehot[y, np.arange(len(y))] = 1.0
    return p - onehot, p * (1 - p)


def predict(scores: np.ndarray) -> np.ndarray:
    return (scores[0] > 0).astype(np.int64) if scores.shape[0] == 1 else np.argmax(scores, axis=0)


async def run(job: AlgorithmJob) -> dict[str, Any]:
    o, c = job.opts, job.table.num_classes
    k, f = outputs(c), job.table.num_features
    await job.declare(**trees.bin_keys(job), prior=np.zeros(c),
                      **trees.level_keys("hist", k, o.depth, f, o.max_bins, 3))
    if job.is_master:
        return {}
    edges = await trees.compute_bins(job, o.max_bins)
    xb = trees.binned(job.x, edges)
    xb_test = trees.binned(job.table.x_test, edges)
    counts = await job.allreduce("prior", np.bincount(job.y, minlength=c).astype(np.float64))
    prior = np.log(np.maximum(counts, 1.0) / counts.sum())
    base = np.array([prior[1] - prior[0]]) if k == 1 else prior
    scores = np.repeat(base[:, None], len(job.y), axis=1)
    test_scores = np.repeat(base[:, None], len(job.table.y_test), axis=1)
    out: dict[str, Any] = {}
    for it in job.iterations(DEFAULT_ITERATIONS):
        g, h = gradients(scores, job.y)
        stats = np.stack([g, h, np.ones_like(g)], axis=2)   # (k, n, 3)
        forest = await trees.grow(job, "hist", xb, stats, depth=o.depth, bins=o.max_bins,
                                  gain=trees.newton_gain(o.l2), value=trees.newton_values(o.l2),
                                  min_leaf=o.min_leaf, before_round=job.compute)
        scores += o.learning_rate * forest.predict(xb)[..., 0]
        test_scores += o.learning_rate * forest.predict(xb_test)[..., 0]
        if job.due(it, job.last(it)):
            loss = float(np.mean(-np.log(np.maximum(
                _proba(scores)[job.y, np.arange(len(job.y))], 1e-12))))
            out = job.report(it, job.score(lambda _: predict(test_scores)), loss=loss)
    return out


def _proba(scores: np.ndarray) -> np.ndarray:
    if scores.shape[0] == 1:
        p = 1.0 / (1.0 + np.exp(-scores[0]))
        return np.stack([1 - p, p])
    return linear.softmax(scores.T).T
