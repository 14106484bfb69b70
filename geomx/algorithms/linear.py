"""Linear models trained by distributed SGD through the parameter server.

Two ways, both GeoMX's (docs/geomx-behaviour.md §2.2):

* the scenario names a global optimizer (``[training] optimizer``, ``lr``): the master
  installs it on the global servers, workers push their mini-batch gradients and pull
  the new weights (``examples/cnn.py``); the optimizer sees the mean over workers, and
  MixedSync applies (each DC's push is a step of its own);
* ``optimizer = "none"``: workers pull the *sum* of the gradients and every worker takes
  the same local step with ``worker_optimizer`` (``cnn_bsc.py``). Ensembles that keep
  other sums on the same servers (voting, stacking) always train this way.

Weights are one ``(d + 1) x outputs`` matrix, the last row the intercept (not
regularised). Evaluation uses the running average of the weights over the second half
of training (Polyak-Ruppert averaging), which removes most of SGD's last-iterate noise
without changing the optimum.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np

from geomx.algorithms.job import AlgorithmError, AlgorithmJob

__all__ = ["add_sgd_options", "check_sgd_options", "with_bias", "hinge_grad",
           "epsilon_grad", "softmax_grad", "softmax", "train_sgd", "Batches"]


def add_sgd_options(p: argparse.ArgumentParser, *, alpha: float, batch: int = 32) -> None:
    p.add_argument("--alpha", type=float, default=alpha,
                   help="L2 regularisation strength (scikit-learn's 1 / (C n))")
    p.add_argument("--batch", type=int, default=batch, help="rows per worker per SGD step")


def check_sgd_options(opts: argparse.Namespace) -> None:
    if not opts.alpha >= 0:
        raise AlgorithmError(f"--alpha {opts.alpha}: allowed: a number >= 0")
    if opts.batch < 1:
        raise AlgorithmError(f"--batch {opts.batch}: allowed: an integer >= 1")


def with_bias(x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((len(x), 1))])


def _l2(w: np.ndarray, alpha: float) -> np.ndarray:
    reg = alpha * w
    reg[-1] = 0.0
    return reg


def hinge_grad(w: np.ndarray, xb: np.ndarray, y: np.ndarray, alpha: float) -> tuple[float, np.ndarray]:
    """One-vs-rest hinge loss: ``mean(max(0, 1 - t * x.w)) + alpha/2 |w|^2`` per column,
    ``t = +1`` for the row's class, -1 for the others (one column for two classes)."""
    t = -np.ones((len(y), w.shape[1]))
    if w.shape[1] == 1:
        t[y == 1, 0] = 1.0
    else:
        t[np.arange(len(y)), y] = 1.0
    margin = t * (xb @ w)
    active = (margin < 1.0) * t
    loss = float(np.mean(np.maximum(0.0, 1.0 - margin).sum(axis=1)))
    return loss, -xb.T @ active / len(y) + _l2(w, alpha)


def epsilon_grad(w: np.ndarray, xb: np.ndarray, y: np.ndarray, alpha: float,
                 epsilon: float) -> tuple[float, np.ndarray]:
    """Epsilon-insensitive loss ``mean(max(0, |x.w - y| - epsilon))``."""
    r = (xb @ w)[:, 0] - y
    outside = np.abs(r) > epsilon
    loss = float(np.mean(np.maximum(0.0, np.abs(r) - epsilon)))
    return loss, (xb.T @ (np.sign(r) * outside))[:, None] / len(y) + _l2(w, alpha)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def softmax_grad(w: np.ndarray, xb: np.ndarray, y: np.ndarray, alpha: float,
                 weights: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Multinomial logistic loss (cross-entropy of the softmax), optionally weighted."""
    p = softmax(xb @ w)
    n = len(y)
    sw = np.ones(n) if weights is None else weights
    loss = float(-np.sum(sw * np.log(p[np.arange(n), y] + 1e-12)) / n)
    p[np.arange(n), y] -= 1.0
    return loss, xb.T @ (p * sw[:, None]) / n + _l2(w, alpha)


class Batches:
    """Endless mini-batches of ``n`` local rows, reshuffled every epoch (seeded)."""

    def __init__(self, n: int, size: int, rng: np.random.Generator):
        self.n, self.size, self.rng = n, min(size, n), rng
        self._order = rng.permutation(n)
        self._pos = 0

    def next(self) -> np.ndarray:
        if self._pos + self.size > self.n:
            self._order = self.rng.permutation(self.n)
            self._pos = 0
        b = self._order[self._pos:self._pos + self.size]
        self._pos += self.size
        return b


class LocalStep:
    """``optimizer = "none"``: the same step on every worker from the pulled gradient sum."""

    def __init__(self, config: dict[str, Any], workers: int):
        from geomx.optim import optimizer_from_config

        self.opt = optimizer_from_config(dict(config))
        self.opt.rescale_grad = 1.0 / workers
        self.state: Any = None

    def apply(self, w: np.ndarray, grad_sum: np.ndarray) -> np.ndarray:
        w32 = w.astype(np.float32)
        if self.state is None:
            self.state = self.opt.create_state("w", w32)
        self.opt.update("w", w32, grad_sum.astype(np.float32), self.state)
        return w32.astype(np.float64)


async def train_sgd(job: AlgorithmJob, key: str, w0: np.ndarray, x: np.ndarray, y: np.ndarray,
                    grad: Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[float, np.ndarray]],
                    *, iterations: int, server: bool, batch: int, tag: str = "sgd",
                    on_eval: Callable[[int, np.ndarray, float, bool], None] | None = None,
                    steps: int | None = None) -> np.ndarray:
    """Distributed mini-batch SGD of ``w0`` on this worker's ``(x, y)``; returns the
    averaged weights. ``server``: the global servers run the optimizer (the key must be
    declared after :meth:`AlgorithmJob.use_server_optimizer`). The job's iterations
    (``[run] iterations``, else ``iterations``) count the steps, unless ``steps`` is given
    (a second learner in the same job, such as a stacking meta-learner)."""
    local = None if server else LocalStep(job.ctx.worker_optimizer_config
                                          if job.ctx.optimizer_config is None
                                          else job.ctx.optimizer_config, job.num_workers)
    batches = Batches(len(x), batch, job.local_rng(f"{tag}-batches"))
    w = w0.astype(np.float64).copy()
    avg, n_avg, loss = np.zeros_like(w), 0, float("nan")
    total = job.iteration_limit(iterations) if steps is None else steps
    its = job.iterations(iterations) if steps is None else iter(range(1, steps + 1))
    start = total // 2
    for i, it in enumerate(its):
        b = batches.next()
        loss, g = grad(w, x[b], y[b])
        await job.compute()
        if server:
            w = np.asarray(await job.exchange(key, g.astype(np.float32)), dtype=np.float64)
        else:
            w = local.apply(w, await job.allreduce(key, g))
        if i >= start:
            n_avg += 1
            avg += (w - avg) / n_avg
        if on_eval is not None:
            on_eval(it, avg if n_avg else w, loss, i == total - 1)
    return avg if n_avg else w
