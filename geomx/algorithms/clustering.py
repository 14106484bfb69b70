"""What both k-means variants share: options, distributed seeding, assignment.

Seeding follows k-means|| (Bahmani et al. 2012, "Scalable K-Means++") in one round: each
worker samples ``oversample * k`` candidate points of its own partition, the candidates
are all-gathered through the parameter servers, and every worker runs the same seeded
k-means++ (Arthur & Vassilvitskii 2007, with scikit-learn's greedy local trials) on
them. No node ever sees another's raw data beyond those candidates.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from geomx.algorithms.job import AlgorithmError, AlgorithmJob

__all__ = ["add_options", "check_options", "declare_seeding", "seed_centroids", "assign",
           "kmeans_plus_plus"]


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clusters", type=int, default=8, help="k, the number of centres")
    p.add_argument("--oversample", type=int, default=4,
                   help="candidates per worker for seeding, in multiples of k")


def check_options(opts: argparse.Namespace) -> None:
    if opts.clusters < 1:
        raise AlgorithmError(f"--clusters {opts.clusters}: allowed: an integer >= 1")
    if opts.oversample < 1:
        raise AlgorithmError(f"--oversample {opts.oversample}: allowed: an integer >= 1")


def declare_seeding(job: AlgorithmJob) -> dict[str, np.ndarray]:
    """The keys seeding uses: candidates and their validity, data moments (for tol)."""
    k, d, w = job.opts.clusters, job.table.num_features, job.num_workers
    m = k * job.opts.oversample
    return {"candidates": np.zeros((w, m, d + 1)), "moments": np.zeros((3, d))}


async def seed_centroids(job: AlgorithmJob) -> tuple[np.ndarray, float]:
    """(k initial centres, mean per-feature variance of the training data)."""
    k, m = job.opts.clusters, job.opts.clusters * job.opts.oversample
    x = job.x
    pick = job.local_rng("kmeans-candidates").choice(len(x), size=min(m, len(x)), replace=False)
    block = np.zeros((m, x.shape[1] + 1))
    block[:len(pick), :-1] = x[pick]
    block[:len(pick), -1] = 1.0  # valid row
    moments = np.stack([np.full(x.shape[1], len(x), dtype=np.float64), x.sum(axis=0),
                        (x * x).sum(axis=0)])
    cand = (await job.gather("candidates", block)).reshape(-1, x.shape[1] + 1)
    mom = await job.allreduce("moments", moments)
    cand = cand[cand[:, -1] > 0.5, :-1]
    if len(cand) < k:
        raise AlgorithmError(f"--clusters {k}: only {len(cand)} training rows to seed from")
    n = mom[0, 0]
    variance = float(np.mean(mom[2] / n - (mom[1] / n) ** 2))
    return kmeans_plus_plus(cand, k, job.shared_rng("kmeans++")), variance


def kmeans_plus_plus(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Greedy k-means++: each new centre is the best of ``2 + log k`` D^2-sampled trials."""
    trials = 2 + int(math.log(k))
    centres = [x[rng.integers(len(x))]]
    d2 = np.sum((x - centres[0]) ** 2, axis=1)
    for _ in range(1, k):
        total = d2.sum()
        if total <= 0:
            centres.append(x[rng.integers(len(x))])
            continue
        idx = np.searchsorted(np.cumsum(d2), rng.random(trials) * total)
        idx = np.minimum(idx, len(x) - 1)
        cand_d2 = np.minimum(d2[None, :], np.sum((x[None, :, :] - x[idx][:, None, :]) ** 2, axis=2))
        best = int(np.argmin(cand_d2.sum(axis=1)))
        centres.append(x[idx[best]])
        d2 = cand_d2[best]
    return np.array(centres, dtype=np.float64)


def assign(x: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nearest centre of each row, its squared distance)."""
    d2 = (np.sum(x * x, axis=1)[:, None] - 2.0 * x @ centres.T
          + np.sum(centres * centres, axis=1)[None, :])
    labels = np.argmin(d2, axis=1)
    return labels, np.maximum(d2[np.arange(len(x)), labels], 0.0)


def inertia(x: np.ndarray, centres: np.ndarray) -> float:
    """Mean squared distance of ``x`` to its nearest centre."""
    return float(np.mean(assign(x, centres)[1]))
