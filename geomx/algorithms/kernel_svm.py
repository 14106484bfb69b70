"""Kernel SVM with an RBF kernel, via random Fourier features, by distributed SGD.

Rahimi & Recht (2007), "Random Features for Large-Scale Kernel Machines": with
``omega ~ N(0, 2 gamma I)`` and ``b ~ U[0, 2 pi)``, ``z(x) = sqrt(2 / D) cos(omega.x + b)``
satisfies ``E[z(x).z(y)] = exp(-gamma |x - y|^2)``, so a linear hinge-loss SVM on ``z``
approximates ``SVC(kernel="rbf", gamma)``. Every node draws the same ``omega, b`` from
the run's seed -- nothing about the features travels -- and the weights over the ``D``
features train like the linear SVM's (``linear_svm.py``).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geomx.algorithms import linear, linear_svm
from geomx.algorithms.job import AlgorithmError, AlgorithmJob

DEFAULT_ITERATIONS = 300


def add_options(p: argparse.ArgumentParser) -> None:
    linear.add_sgd_options(p, alpha=1e-4)
    p.add_argument("--gamma", type=float, default=1.0, help="RBF kernel width exp(-gamma |x-y|^2)")
    p.add_argument("--components", type=int, default=300, help="D, random Fourier features")


def check_options(opts: argparse.Namespace) -> None:
    linear.check_sgd_options(opts)
    if not opts.gamma > 0:
        raise AlgorithmError(f"--gamma {opts.gamma}: allowed: a number > 0")
    if opts.components < 1:
        raise AlgorithmError(f"--components {opts.components}: allowed: an integer >= 1")


def state_bytes(table: Any, opts: argparse.Namespace, workers: int) -> int:
    return 8 * (opts.components + 1) * linear_svm.outputs(table.num_classes)


class FourierFeatures:
    def __init__(self, num_features: int, components: int, gamma: float, rng: np.random.Generator):
        self.omega = rng.normal(0.0, np.sqrt(2.0 * gamma), size=(num_features, components))
        self.offset = rng.uniform(0.0, 2.0 * np.pi, size=components)
        self.scale = np.sqrt(2.0 / components)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.scale * np.cos(x @ self.omega + self.offset)


async def run(job: AlgorithmJob) -> dict[str, Any]:
    o = job.opts
    z = FourierFeatures(job.table.num_features, o.components, o.gamma, job.shared_rng("rff"))
    return await linear_svm.train_hinge(job, z, DEFAULT_ITERATIONS)
