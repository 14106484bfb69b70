"""Linear SVM (hinge loss, one-vs-rest), trained by distributed SGD through the PS.

Minimises ``mean(hinge) + alpha/2 |w|^2`` -- scikit-learn's ``LinearSVC(loss="hinge")``
with ``C = 1 / (alpha n)`` -- by mini-batch SGD: every worker pushes the gradient of its
batch, the global servers' optimizer (``[training] optimizer``, ``lr``) updates the
weights, every worker pulls them (``linear.py``).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import linear
from geomx.algorithms.job import AlgorithmJob

DEFAULT_ITERATIONS = 300


def add_options(p: argparse.ArgumentParser) -> None:
    linear.add_sgd_options(p, alpha=1e-3)


check_options = linear.check_sgd_options


def outputs(num_classes: int) -> int:
    return 1 if num_classes == 2 else num_classes


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * (table.num_features + 1) * outputs(table.num_classes)


def predict(w: np.ndarray, xb: np.ndarray) -> np.ndarray:
    s = xb @ w
    return (s[:, 0] > 0).astype(np.int64) if w.shape[1] == 1 else np.argmax(s, axis=1)


async def train_hinge(job: AlgorithmJob, features: Any, default_iterations: int) -> dict[str, Any]:
    """Shared by the linear and the kernel SVM: ``features(x)`` maps rows to the model's
    inputs (the identity, or random Fourier features)."""
    d = features(job.table.x_train[:1]).shape[1]
    w0 = np.zeros((d + 1, outputs(job.table.num_classes)), dtype=np.float32)
    server = job.ctx.optimizer_config is not None
    if server:
        await job.use_server_optimizer(job.ctx.optimizer_config)
    await job.declare(w=w0)
    if job.is_master:
        return {}
    x = linear.with_bias(features(job.x))
    x_test = linear.with_bias(features(job.table.x_test))
    out: dict[str, Any] = {}

    def on_eval(it: int, w: np.ndarray, loss: float, last: bool) -> None:
        if job.due(it, last):
            out.update(job.report(it, job.score(lambda _: predict(w, x_test)), loss=loss))

    alpha = job.opts.alpha
    w = await linear.train_sgd(job, "w", w0, x, job.y,
                               lambda w, xb, yb: linear.hinge_grad(w, xb, yb, alpha),
                               iterations=default_iterations, server=server,
                               batch=job.opts.batch, on_eval=on_eval)
    if job.ctx.is_evaluator:
        out["weights"] = w.tolist()   # (d + 1) x outputs, the intercept last
    return out


async def run(job: AlgorithmJob) -> dict[str, Any]:
    return await train_hinge(job, lambda x: x, DEFAULT_ITERATIONS)
