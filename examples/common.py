"""Shared pieces of the example programs: GeoMX's demo skeleton (docs/geomx-behaviour.md §2.2).

Each example is a geomx training program, ``async def main(kv, ctx)``, run by
``geomx run examples/<name>.toml`` on every worker and on the master worker, in the
emulator or over real sockets. They are GeoMX's ``examples/cnn*.py`` written against
``geomx.kv`` with the scenario's numpy model (``[training] model``) and dataset.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np


def arg_parser(prog: str, ctx: Any) -> argparse.ArgumentParser:
    """GeoMX's common flags (``-lr``, ``-bs``); the rest comes from the context."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("-lr", "--learning-rate", type=float, default=ctx.lr)
    p.add_argument("-bs", "--batch-size", type=int, default=ctx.batch_size)
    return p


async def init_and_pull(kv: Any, params: list[np.ndarray]) -> None:
    """Skeleton step 4: every worker inits every key, non-masters pull the master's
    initial weights (GeoMX's loop, one key at a time)."""
    for idx, p in enumerate(params):
        kv.init(idx, p)
        if not kv.is_master_worker:
            kv.pull(idx, out=p)
    await kv.waitall()


def evaluate(ctx: Any, model: Any, data: Any, it: int, loss: float, every: int | None = None) -> None:
    """Test accuracy over the whole test set, reported by the evaluator every ``every``
    iterations (GeoMX evaluates on every worker after every iteration)."""
    every = every or ctx.eval_every
    if ctx.is_evaluator and (it % every == 0 or it == ctx.max_iterations):
        ctx.report(it, loss=loss, accuracy=model.accuracy(data.x_test, data.y_test))
