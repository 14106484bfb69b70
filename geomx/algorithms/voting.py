"""Soft voting over base learners trained through the PS (``base_learners.py``).

Gaussian naive Bayes, logistic regression and a histogram decision tree each train on
every worker's partition through the parameter servers; the ensemble predicts the class
with the highest mean probability, as scikit-learn's ``VotingClassifier(voting="soft")``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from geomx.algorithms import base_learners, trees
from geomx.algorithms.job import AlgorithmJob

add_options = base_learners.add_options
check_options = base_learners.check_options
state_bytes = base_learners.state_bytes


async def run(job: AlgorithmJob) -> dict[str, Any]:
    await job.declare(**trees.bin_keys(job), **base_learners.keys(job))
    if job.is_master:
        return {}
    edges = await trees.compute_bins(job, job.opts.max_bins)
    models = await base_learners.fit(job, job.x, job.y, edges)
    probas = models.probas(job.table.x_test)
    row = job.score(lambda _: np.argmax(np.mean(probas, axis=0), axis=1))
    members = {name: float(np.mean(np.argmax(p, axis=1) == job.table.y_test))
               for name, p in zip(("naive_bayes", "logistic", "tree"), probas)}
    if job.ctx.is_evaluator:
        return job.report(None, {**row, **{f"accuracy_{k}": v for k, v in members.items()}})
    return {}

