"""Incremental PCA from per-DC moment statistics merged through push/pull.

Every round each worker reads its next ``chunk`` rows and pushes their moments -- row
count, sum of rows, sum of outer products -- as one ``(d + 2) x d`` array; the local
servers add their DC's, the global server the DCs'; every worker pulls the round's
totals and adds them to its running totals (Chan, Golub & LeVeque's pairwise update of
means and scatter matrices, here in its plain-sum form). After each round the components
are the top eigenvectors of the covariance of everything seen so far, so the model is
usable mid-stream; after the pass it equals the PCA of the whole training set
(scikit-learn's ``PCA``; ``IncrementalPCA`` reaches the same subspace by merging SVDs).
The score is the share of the test set's variance (about the training mean) that the
components keep.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms.job import AlgorithmError, AlgorithmJob
from geomx.algorithms.stream import pass_rounds, stream


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--components", type=int, default=10, help="principal components kept")
    p.add_argument("--chunk", type=int, default=100, help="rows per worker per round")


def check_options(opts: argparse.Namespace) -> None:
    if opts.components < 1:
        raise AlgorithmError(f"--components {opts.components}: allowed: an integer >= 1")
    if opts.chunk < 1:
        raise AlgorithmError(f"--chunk {opts.chunk}: allowed: an integer >= 1")


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * (table.num_features + 2) * table.num_features


class Moments:
    def __init__(self, d: int):
        self.n = 0.0
        self.sum = np.zeros(d)
        self.outer = np.zeros((d, d))

    def add(self, packed: np.ndarray) -> None:
        d = self.sum.shape[0]
        self.outer += packed[:d]
        self.sum += packed[d]
        self.n += packed[d + 1, 0]

    def components(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(training mean, top-k eigenvectors of the covariance as rows)."""
        mean = self.sum / self.n
        cov = self.outer / self.n - np.outer(mean, mean)
        vals, vecs = np.linalg.eigh(cov)
        order = np.argsort(vals)[::-1][:k]
        return mean, vecs[:, order].T


def pack(x: np.ndarray) -> np.ndarray:
    d = x.shape[1]
    out = np.zeros((d + 2, d))
    out[:d] = x.T @ x
    out[d] = x.sum(axis=0)
    out[d + 1, 0] = len(x)
    return out


def kept_variance(x: np.ndarray, mean: np.ndarray, comps: np.ndarray) -> float:
    c = x - mean
    return float(np.sum((c @ comps.T) ** 2) / np.sum(c * c))


async def run(job: AlgorithmJob) -> dict[str, Any]:
    d, o = job.table.num_features, job.opts
    if o.components > d:
        raise AlgorithmError(f"--components {o.components}: the data has {d} features; "
                             f"allowed: 1..{d}")
    await job.declare(moments=np.zeros((d + 2, d)))
    if job.is_master:
        return {}
    totals = Moments(d)
    rows = stream(job, o.chunk)
    out: dict[str, Any] = {}
    for it in job.iterations(0, cap=pass_rounds(job, o.chunk)):
        b = next(rows)
        local = pack(job.x[b])
        await job.compute()
        totals.add(await job.allreduce("moments", local))
        if job.due(it, job.last(it)):
            mean, comps = totals.components(o.components)
            score = kept_variance(job.table.x_test, mean, comps)
            out = job.report(it, {"metric": "explained_variance", "score": score,
                                  "rows_seen": int(totals.n)})
    return out
