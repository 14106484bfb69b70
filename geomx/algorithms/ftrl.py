"""FTRL-proximal logistic regression, one pass over the stream partitioned across DCs.

McMahan et al. (2013), "Ad Click Prediction: a View from the Trenches", Algorithm 1:
per coordinate, ``w = 0`` if ``|z| <= l1`` else
``-(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)``; a gradient ``g`` then updates
``sigma = (sqrt(n + g^2) - sqrt(n)) / alpha``, ``z += g - sigma w``, ``n += g^2``.

Distributed: in every round each worker computes the gradient of the log loss of its
next ``batch`` rows at the current weights and pushes it with its row count; the PS sums
both (per DC, then across DCs); every worker pulls the sums and applies the same FTRL
step with the mean gradient, so ``z`` and ``n`` stay replicated and the pass equals a
centralised FTRL pass whose mini-batch is the round's rows of all workers. Two classes
use the logistic (one column), more the multinomial softmax. The loss reported is
progressive validation: each batch's loss before its update.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import linear
from geomx.algorithms.job import AlgorithmError, AlgorithmJob
from geomx.algorithms.stream import pass_rounds, stream


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha", type=float, default=0.5, help="per-coordinate learning-rate scale")
    p.add_argument("--beta", type=float, default=1.0, help="learning-rate smoothing")
    p.add_argument("--l1", type=float, default=1e-3, help="L1 strength (sparsity)")
    p.add_argument("--l2", type=float, default=1e-3, help="L2 strength")
    p.add_argument("--batch", type=int, default=8, help="rows per worker per round")


def check_options(opts: argparse.Namespace) -> None:
    for name in ("alpha", "beta"):
        if not getattr(opts, name) > 0:
            raise AlgorithmError(f"--{name} {getattr(opts, name)}: allowed: a number > 0")
    for name in ("l1", "l2"):
        if not getattr(opts, name) >= 0:
            raise AlgorithmError(f"--{name} {getattr(opts, name)}: allowed: a number >= 0")
    if opts.batch < 1:
        raise AlgorithmError(f"--batch {opts.batch}: allowed: an integer >= 1")


def columns(num_classes: int) -> int:
    return 1 if num_classes == 2 else num_classes


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * (table.num_features + 2) * columns(table.num_classes)


class Ftrl:
    def __init__(self, shape: tuple[int, int], opts: argparse.Namespace):
        self.z = np.zeros(shape)
        self.n = np.zeros(shape)
        self.o = opts

    def weights(self) -> np.ndarray:
        o = self.o
        w = -(self.z - np.sign(self.z) * o.l1) / ((o.beta + np.sqrt(self.n)) / o.alpha + o.l2)
        w[np.abs(self.z) <= o.l1] = 0.0
        return w

    def update(self, g: np.ndarray) -> None:
        w = self.weights()
        sigma = (np.sqrt(self.n + g * g) - np.sqrt(self.n)) / self.o.alpha
        self.z += g - sigma * w
        self.n += g * g


def loss_grad_sum(w: np.ndarray, xb: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Summed log loss and its gradient over the rows (not divided by their count)."""
    if len(y) == 0:
        return 0.0, np.zeros_like(w)
    if w.shape[1] == 1:
        p = 1.0 / (1.0 + np.exp(-(xb @ w)[:, 0]))
        loss = -np.sum(np.where(y == 1, np.log(p + 1e-12), np.log(1 - p + 1e-12)))
        return float(loss), (xb.T @ (p - y))[:, None]
    p = linear.softmax(xb @ w)
    loss = -np.sum(np.log(p[np.arange(len(y)), y] + 1e-12))
    p[np.arange(len(y)), y] -= 1.0
    return float(loss), xb.T @ p


def predict(w: np.ndarray, xb: np.ndarray) -> np.ndarray:
    s = xb @ w
    return (s[:, 0] > 0).astype(np.int64) if w.shape[1] == 1 else np.argmax(s, axis=1)


async def run(job: AlgorithmJob) -> dict[str, Any]:
    d, k = job.table.num_features + 1, columns(job.table.num_classes)
    # rows 0..d-1: the summed gradient; row d: [row count, summed loss, 0...]
    await job.declare(grad=np.zeros((d + 1, max(k, 2))))
    if job.is_master:
        return {}
    o = job.opts
    model = Ftrl((d, k), o)
    x, x_test = linear.with_bias(job.x), linear.with_bias(job.table.x_test)
    rows = stream(job, o.batch)
    out: dict[str, Any] = {}
    seen = loss_total = 0.0
    for it in job.iterations(0, cap=pass_rounds(job, o.batch)):
        b = next(rows)
        loss, g = loss_grad_sum(model.weights(), x[b], job.y[b])
        local = np.zeros((d + 1, max(k, 2)))
        local[:d, :k] = g
        local[d, :2] = len(b), loss
        await job.compute()
        total = await job.allreduce("grad", local)
        count = total[d, 0]
        seen += count
        loss_total += total[d, 1]
        if count > 0:
            model.update(total[:d, :k] / count)
        if job.due(it, job.last(it)):
            w = model.weights()
            out = job.report(it, {**job.score(lambda _: predict(w, x_test)),
                                  "nonzero_weights": int(np.count_nonzero(w)),
                                  "rows_seen": int(seen)}, loss=loss_total / max(seen, 1.0))
    if job.ctx.is_evaluator:
        out["weights"] = model.weights().tolist()
    return out
