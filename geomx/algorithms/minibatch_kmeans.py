"""Mini-batch k-means with incremental centroid updates (Sculley 2010, "Web-scale k-means
clustering").

Every step each worker draws ``batch`` rows of its partition, assigns them to the
nearest centre and pushes, per centre, their sum and count (``k x (d + 1)``); the PS adds
them per DC and across DCs; every worker pulls the totals and moves each centre towards
its batch mean with the per-centre learning rate ``batch count / count so far`` --
Sculley's ``c <- (1 - eta) c + eta x`` applied to the whole step's rows at once -- so
each centre is the running mean of every row ever assigned to it. The counts so far are
replicated (every worker adds the same pulled counts). Seeding: ``clustering.py``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import clustering
from geomx.algorithms.job import AlgorithmError, AlgorithmJob

DEFAULT_ITERATIONS = 100


def add_options(p: argparse.ArgumentParser) -> None:
    clustering.add_options(p)
    p.add_argument("--batch", type=int, default=64, help="rows per worker per step")


def check_options(opts: argparse.Namespace) -> None:
    clustering.check_options(opts)
    if opts.batch < 1:
        raise AlgorithmError(f"--batch {opts.batch}: allowed: an integer >= 1")


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    d = table.num_features
    return 8 * max(opts.clusters * (d + 1), workers * opts.clusters * opts.oversample * (d + 1))


async def run(job: AlgorithmJob) -> dict[str, Any]:
    k, d = job.opts.clusters, job.table.num_features
    await job.declare(**clustering.declare_seeding(job), batch_sums=np.zeros((k, d + 1)))
    if job.is_master:
        return {}
    centres, _ = await clustering.seed_centroids(job)
    counts = np.zeros(k)
    rng = job.local_rng("minibatch")
    x = job.x
    out: dict[str, Any] = {}
    for it in job.iterations(DEFAULT_ITERATIONS):
        b = rng.choice(len(x), size=min(job.opts.batch, len(x)), replace=False)
        labels, _ = clustering.assign(x[b], centres)
        local = np.zeros((k, d + 1))
        np.add.at(local[:, :d], labels, x[b])
        local[:, d] = np.bincount(labels, minlength=k)
        await job.compute()
        total = await job.allreduce("batch_sums", local)
        got = total[:, d] > 0
        counts += total[:, d]
        centres[got] += (total[got, :d] - total[got, d, None] * centres[got]) / counts[got, None]
        if job.due(it, job.last(it)):
            out = job.report(it, {"metric": "inertia",
                                  "score": clustering.inertia(job.table.x_test, centres)})
    return out
