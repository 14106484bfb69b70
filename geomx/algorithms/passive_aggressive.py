"""Online passive-aggressive classifier (PA-I), one pass, iterative parameter mixing.

Crammer et al. (2006), "Online Passive-Aggressive Algorithms": on a row ``x`` with label
``t = +-1`` and hinge loss ``l = max(0, 1 - t w.x)``, ``w += min(C, l / |x|^2) t x``
(one-vs-rest columns for more than two classes, a constant feature for the intercept).

Distributed by iterative parameter mixing (McDonald, Hall & Mann 2010, "Distributed
training strategies for the structured perceptron"): in every round each worker runs PA
over its next ``batch`` rows of the stream starting from the shared weights, pushes how
far it moved them (and its row count); the PS sums the moves per DC and across DCs;
every worker pulls the sum and adds the row-weighted mean move. As scikit-learn's
``average=True``, predictions use the average of the shared weights over the pass.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import linear
from geomx.algorithms.job import AlgorithmError, AlgorithmJob
from geomx.algorithms.linear_svm import outputs, predict
from geomx.algorithms.stream import pass_rounds, stream


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--C", dest="C", type=float, default=1.0, help="aggressiveness cap")
    p.add_argument("--batch", type=int, default=8, help="rows per worker per round")


def check_options(opts: argparse.Namespace) -> None:
    if not opts.C > 0:
        raise AlgorithmError(f"--C {opts.C}: allowed: a number > 0")
    if opts.batch < 1:
        raise AlgorithmError(f"--batch {opts.batch}: allowed: an integer >= 1")


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * (table.num_features + 2) * outputs(table.num_classes)


def pa_pass(w: np.ndarray, xb: np.ndarray, y: np.ndarray, C: float) -> np.ndarray:
    """PA-I over the rows in order; returns the new weights."""
    w = w.copy()
    k = w.shape[1]
    for xi, yi in zip(xb, y):
        t = -np.ones(k)
        if k == 1:
            t[0] = 1.0 if yi == 1 else -1.0
        else:
            t[yi] = 1.0
        loss = np.maximum(0.0, 1.0 - t * (xi @ w))
        tau = np.minimum(C, loss / float(xi @ xi))
        w += np.outer(xi, tau * t)
    return w


async def run(job: AlgorithmJob) -> dict[str, Any]:
    d, k = job.table.num_features + 1, outputs(job.table.num_classes)
    await job.declare(move=np.zeros((d + 1, k)))  # the last row: the row count
    if job.is_master:
        return {}
    o = job.opts
    w = np.zeros((d, k))
    avg = np.zeros_like(w)
    x, x_test = linear.with_bias(job.x), linear.with_bias(job.table.x_test)
    rows = stream(job, o.batch)
    out: dict[str, Any] = {}
    for i, it in enumerate(job.iterations(0, cap=pass_rounds(job, o.batch))):
        b = next(rows)
        local = np.zeros((d + 1, k))
        local[:d] = (pa_pass(w, x[b], job.y[b], o.C) - w) * len(b)
        local[d, 0] = len(b)
        await job.compute()
        total = await job.allreduce("move", local)
        if total[d, 0] > 0:
            w = w + total[:d] / total[d, 0]
        avg += (w - avg) / (i + 1)
        if job.due(it, job.last(it)):
            out = job.report(it, job.score(lambda _, a=avg.copy(): predict(a, x_test)))
    return out
