"""One pass over a stream partitioned across DCs: each worker reads its partition in
order, ``batch`` rows per round, for as many rounds as the largest partition needs (a
worker whose stream has ended sends an empty batch), so every worker takes part in every
round and FSA's rounds line up."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from geomx.algorithms.job import AlgorithmJob


def pass_rounds(job: AlgorithmJob, batch: int) -> int:
    """Rounds of one pass: the largest partition (``ceil(N / W)`` rows) in batches."""
    return math.ceil(math.ceil(len(job.table.y_train) / job.num_workers) / batch)


def stream(job: AlgorithmJob, batch: int) -> Iterator[np.ndarray]:
    """This worker's row indices, ``batch`` at a time, in its partition's order; then
    empty batches."""
    n = len(job.x)
    pos = 0
    while True:
        yield np.arange(pos, min(pos + batch, n))
        pos += batch
