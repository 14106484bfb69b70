"""Stacking (Wolpert 1992, "Stacked Generalization") through the PS.

Every worker holds out ``--holdout`` of its partition (its own seeded draw). The base
learners (``base_learners.py``: naive Bayes, logistic regression, a histogram tree)
train through the parameter servers on the rest; a multinomial logistic
meta-learner then trains, by distributed SGD, on the base learners' class probabilities
for the held-out rows -- outputs on rows the base learners never saw, the role
scikit-learn's ``StackingClassifier`` gives cross-validated predictions (a
cross-validation would train every base learner once per fold, across the WAN; the
hold-out split trains them once). Predictions: the meta-learner on the base learners'
probabilities. The job's iterations are the base logistic regression's SGD steps; the
meta-learner takes ``--meta-steps``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import base_learners, linear, trees
from geomx.algorithms.job import AlgorithmError, AlgorithmJob


def add_options(p: argparse.ArgumentParser) -> None:
    base_learners.add_options(p)
    p.add_argument("--holdout", type=float, default=0.25,
                   help="share of each partition held out for the meta-learner")
    p.add_argument("--meta-steps", type=int, default=200, help="SGD steps of the meta-learner")


def check_options(opts: argparse.Namespace) -> None:
    base_learners.check_options(opts)
    if not 0 < opts.holdout < 1:
        raise AlgorithmError(f"--holdout {opts.holdout}: allowed: a share in (0, 1)")
    if opts.meta_steps < 1:
        raise AlgorithmError(f"--meta-steps {opts.meta_steps}: allowed: an integer >= 1")


state_bytes = base_learners.state_bytes


def meta_features(probas: list[np.ndarray]) -> np.ndarray:
    return np.hstack(probas)


async def run(job: AlgorithmJob) -> dict[str, Any]:
    c = job.table.num_classes
    await job.declare(**trees.bin_keys(job), **base_learners.keys(job),
                      meta=np.zeros((3 * c + 1, c)))
    if job.is_master:
        return {}
    o = job.opts
    order = job.local_rng("stacking-holdout").permutation(len(job.y))
    cut = max(1, int(round(len(order) * o.holdout)))
    held, fit = order[:cut], order[cut:]
    edges = await trees.compute_bins(job, o.max_bins)
    models = await base_learners.fit(job, job.x[fit], job.y[fit], edges)
    z = linear.with_bias(meta_features(models.probas(job.x[held])))
    w = await linear.train_sgd(job, "meta", np.zeros((3 * c + 1, c)), z, job.y[held],
                               lambda w, xb, yb: linear.softmax_grad(w, xb, yb, 0.0),
                               iterations=o.meta_steps, server=False, batch=o.batch,
                               tag="meta", steps=o.meta_steps)
    z_test = linear.with_bias(meta_features(models.probas(job.table.x_test)))
    if job.ctx.is_evaluator:
        return job.report(None, job.score(lambda _: np.argmax(z_test @ w, axis=1)))
    return {}
