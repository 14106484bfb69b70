"""The base learners voting and stacking combine, each trained through the PS.

Gaussian naive Bayes (summed class moments, ``naive_bayes.py``), multinomial logistic
regression (distributed SGD on pulled gradient sums, ``linear.py`` -- local steps,
because these servers also hold plain sums and so run no optimizer) and a histogram
decision tree (``trees.py``). Each exposes ``predict_proba`` so that the ensembles can
average or stack class probabilities.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

from geomx.algorithms import linear, naive_bayes, trees
from geomx.algorithms.job import AlgorithmJob

DEFAULT_ITERATIONS = 200


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha", type=float, default=1e-3, help="L2 of the logistic regression")
    p.add_argument("--batch", type=int, default=32, help="rows per worker per SGD step")
    p.add_argument("--depth", type=int, default=4, help="depth of the decision tree")
    p.add_argument("--max-bins", type=int, default=32, help="histogram bins per feature")


def check_options(opts: argparse.Namespace) -> None:
    linear.check_sgd_options(opts)
    trees.check_tree_options(opts)


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * 2 ** (opts.depth - 1) * table.num_features * opts.max_bins \
        * (table.num_classes + 1)


def keys(job: AlgorithmJob, prefix: str = "") -> dict[str, np.ndarray]:
    c, f, o = job.table.num_classes, job.table.num_features, job.opts
    return {f"{prefix}nb": np.zeros((c, 2 * f + 1)), f"{prefix}lr": np.zeros((f + 1, c)),
            **trees.level_keys(f"{prefix}tree", 1, o.depth, f, o.max_bins, c + 1)}


@dataclass
class BaseModels:
    nb: naive_bayes.GaussianNB
    lr: np.ndarray
    tree: trees.Forest
    edges: np.ndarray

    def probas(self, x: np.ndarray) -> list[np.ndarray]:
        """Class probabilities of each base learner: [naive Bayes, logistic, tree]."""
        return [np.exp(self.nb.log_proba(x)), linear.softmax(linear.with_bias(x) @ self.lr),
                self.tree.predict(trees.binned(x, self.edges))[0]]


async def fit(job: AlgorithmJob, x: np.ndarray, y: np.ndarray, edges: np.ndarray,
              prefix: str = "") -> BaseModels:
    """Train the three on this worker's rows ``(x, y)`` (the job's iterations are the
    logistic regression's SGD steps)."""
    c, o = job.table.num_classes, job.opts
    await job.compute()
    nb = naive_bayes.GaussianNB(await job.allreduce(f"{prefix}nb",
                                                    naive_bayes.class_moments(x, y, c)))
    stats = np.zeros((1, len(y), c + 1))
    stats[0, np.arange(len(y)), y] = 1.0
    stats[0, :, c] = 1.0
    tree = await trees.grow(job, f"{prefix}tree", trees.binned(x, edges), stats, depth=o.depth,
                            bins=o.max_bins, gain=trees.gini_gain, value=trees.class_values,
                            before_round=job.compute)
    w0 = np.zeros((x.shape[1] + 1, c))
    lr = await linear.train_sgd(job, f"{prefix}lr", w0, linear.with_bias(x), y,
                                lambda w, xb, yb: linear.softmax_grad(w, xb, yb, o.alpha),
                                iterations=DEFAULT_ITERATIONS, server=False, batch=o.batch,
                                tag=f"{prefix}lr")
    return BaseModels(nb, lr, tree, edges)
