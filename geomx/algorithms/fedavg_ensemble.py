"""Federated averaging of per-DC models (McMahan et al. 2017, "Communication-Efficient
Learning of Deep Networks from Decentralized Data", FedAvg).

Each round every worker starts from the shared model, trains its own copy for
``--local-epochs`` passes of mini-batch SGD over its partition, and pushes it weighted
by its row count (with the count); the PS sums the weighted models per DC and across
DCs; every worker pulls the sums and the new shared model is their row-weighted average
-- the per-DC models are combined by averaging their parameters rather than their
votes. The model is multinomial logistic regression (softmax) with L2. Only one push
per round however many local steps, which is why FedAvg suits a slow WAN.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import linear
from geomx.algorithms.job import AlgorithmError, AlgorithmJob

DEFAULT_ITERATIONS = 20


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local-epochs", type=int, default=2, help="passes over the partition per round")
    p.add_argument("--batch", type=int, default=16, help="rows per local SGD step")
    p.add_argument("--local-lr", type=float, default=0.1, help="learning rate of local SGD")
    p.add_argument("--alpha", type=float, default=1e-3, help="L2 regularisation strength")


def check_options(opts: argparse.Namespace) -> None:
    if opts.local_epochs < 1:
        raise AlgorithmError(f"--local-epochs {opts.local_epochs}: allowed: an integer >= 1")
    if opts.batch < 1:
        raise AlgorithmError(f"--batch {opts.batch}: allowed: an integer >= 1")
    if not opts.local_lr > 0:
        raise AlgorithmError(f"--local-lr {opts.local_lr}: allowed: a number > 0")
    if not opts.alpha >= 0:
        raise AlgorithmError(f"--alpha {opts.alpha}: allowed: a number >= 0")


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * (table.num_features + 2) * table.num_classes


async def run(job: AlgorithmJob) -> dict[str, Any]:
    d, c, o = job.table.num_features + 1, job.table.num_classes, job.opts
    await job.declare(model=np.zeros((d + 1, c)))  # rows: sum of n_i w_i; last: sum of n_i
    if job.is_master:
        return {}
    x, x_test = linear.with_bias(job.x), linear.with_bias(job.table.x_test)
    w = np.zeros((d, c))
    rng = job.local_rng("fedavg")
    out: dict[str, Any] = {}
    for it in job.iterations(DEFAULT_ITERATIONS):
        local, losses = w.copy(), []
        for _ in range(o.local_epochs):
            order = rng.permutation(len(x))
            for s in range(0, len(x), o.batch):
                b = order[s:s + o.batch]
                loss, g = linear.softmax_grad(local, x[b], job.y[b], o.alpha)
                local -= o.local_lr * g
                losses.append(loss)
        push = np.zeros((d + 1, c))
        push[:d] = local * len(x)
        push[d, 0] = len(x)
        await job.compute()
        total = await job.allreduce("model", push)
        w = total[:d] / total[d, 0]
        if job.due(it, job.last(it)):
            out = job.report(it, job.score(lambda _: np.argmax(x_test @ w, axis=1)),
                             loss=float(np.mean(losses)))
    return out
