"""Linear support-vector regression (epsilon-insensitive loss) by distributed SGD.

Minimises ``mean(max(0, |x.w + b - y| - epsilon)) + alpha/2 |w|^2`` -- scikit-learn's
``LinearSVR`` with ``C = 1 / (alpha n)`` -- pushing mini-batch (sub)gradients and pulling
the weights the global optimizer makes of them (``linear.py``). Targets are standardised
(``data.py``), so ``epsilon`` is in target standard deviations.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import linear
from geomx.algorithms.job import AlgorithmError, AlgorithmJob

DEFAULT_ITERATIONS = 300


def add_options(p: argparse.ArgumentParser) -> None:
    linear.add_sgd_options(p, alpha=1e-3)
    p.add_argument("--epsilon", type=float, default=0.1,
                   help="half-width of the insensitive tube, in target standard deviations")


def check_options(opts: argparse.Namespace) -> None:
    linear.check_sgd_options(opts)
    if not opts.epsilon >= 0:
        raise AlgorithmError(f"--epsilon {opts.epsilon}: allowed: a number >= 0")


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * (table.num_features + 1)


async def run(job: AlgorithmJob) -> dict[str, Any]:
    d = job.table.num_features
    w0 = np.zeros((d + 1, 1), dtype=np.float32)
    server = job.ctx.optimizer_config is not None
    if server:
        await job.use_server_optimizer(job.ctx.optimizer_config)
    await job.declare(w=w0)
    if job.is_master:
        return {}
    x, x_test = linear.with_bias(job.x), linear.with_bias(job.table.x_test)
    out: dict[str, Any] = {}

    def on_eval(it: int, w: np.ndarray, loss: float, last: bool) -> None:
        if job.due(it, last):
            out.update(job.report(it, job.score(lambda _: (x_test @ w)[:, 0]), loss=loss))

    o = job.opts
    w = await linear.train_sgd(job, "w", w0, x, job.y,
                               lambda w, xb, yb: linear.epsilon_grad(w, xb, yb, o.alpha, o.epsilon),
                               iterations=DEFAULT_ITERATIONS, server=server, batch=o.batch,
                               on_eval=on_eval)
    if job.ctx.is_evaluator:
        out["weights"] = w.tolist()   # (d + 1) x 1, the intercept last
    return out
