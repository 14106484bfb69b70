"""k-means (Lloyd), MapReduce-style: per-DC sums and counts aggregated by a push.

Each Lloyd iteration is one map/reduce round (Dean & Ghemawat's k-means example): every
worker assigns its rows to the nearest centre and pushes, per centre, the sum of its rows,
their count and their squared distances (a ``k x (d + 2)`` array); the local servers add
their DC's workers' arrays, the global server adds the DCs'; every worker pulls the total
and sets each centre to its mean (an empty centre stays where it was). It stops when
the centres move less than ``tol`` times the data's mean variance (scikit-learn's
criterion) or after ``[run] iterations``. Seeding: ``clustering.py``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import clustering
from geomx.algorithms.job import AlgorithmJob

DEFAULT_ITERATIONS = 300


def add_options(p: argparse.ArgumentParser) -> None:
    clustering.add_options(p)
    p.add_argument("--tol", type=float, default=1e-4,
                   help="stop when the centres' squared shift < tol x mean feature variance")


check_options = clustering.check_options


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    d = table.num_features
    return 8 * max(opts.clusters * (d + 2), workers * opts.clusters * opts.oversample * (d + 1))


async def run(job: AlgorithmJob) -> dict[str, Any]:
    k, d = job.opts.clusters, job.table.num_features
    await job.declare(**clustering.declare_seeding(job), stats=np.zeros((k, d + 2)))
    if job.is_master:
        return {}
    centres, variance = await clustering.seed_centroids(job)
    tol = job.opts.tol * variance
    x = job.x
    it, train_inertia = 0, float("nan")
    for it in job.iterations(DEFAULT_ITERATIONS):
        labels, d2 = clustering.assign(x, centres)
        stats = np.zeros((k, d + 2))
        np.add.at(stats[:, :d], labels, x)
        stats[:, d] = np.bincount(labels, minlength=k)
        stats[:, d + 1] = np.bincount(labels, weights=d2, minlength=k)
        await job.compute()
        total = await job.allreduce("stats", stats)
        counts = total[:, d]
        new = centres.copy()
        filled = counts > 0
        new[filled] = total[filled, :d] / counts[filled, None]
        shift = float(np.sum((new - centres) ** 2))
        train_inertia = float(total[:, d + 1].sum() / counts.sum())  # at the old centres
        centres = new
        done = shift <= tol
        if job.due(it, done or job.last(it)):
            job.report(it, {"metric": "inertia",
                            "score": clustering.inertia(job.table.x_test, centres),
                            "train_inertia": train_inertia}, loss=train_inertia)
        if done:
            break
    if not job.ctx.is_evaluator:
        return {}
    test = clustering.inertia(job.table.x_test, centres)
    return {"metric": "inertia", "score": test, "train_inertia": train_inertia,
            "lloyd_iterations": it, "centres": centres.tolist()}
