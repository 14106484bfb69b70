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


def keep_local_model(ctx: Any, params: list[np.ndarray], states: list[dict[str, Any]]) -> None:
    """Keep a program's own model and local optimizer state in ``ctx.state``, and take
    them back on ``--resume``; call it after the initial pull (:func:`init_and_pull`).

    A program that steps its model itself (the servers sum gradients or models and run
    no optimizer: ``cnn_bsc.py``, ``cnn_fp16.py``, ``cnn_mpq.py``, ``cnn_hfa.py``)
    cannot get its model back from a pull after ``kv.init``: the servers hold the last
    round's sum, not weights. ``ctx.state`` is saved with every checkpoint; the lists
    here are the live arrays and optimizer states (dicts of arrays and counts), so each
    checkpoint saves them as they are, and a resumed run overwrites what the pull gave
    with the checkpoint's model and moments.
    """
    if ctx.resumed and "params" in ctx.state:
        for w, saved in zip(params, ctx.state["params"]):
            w[...] = saved
        for st, saved in zip(states, ctx.state["optimizer"]):
            st.update({k: (np.array(v, dtype=st[k].dtype) if isinstance(st.get(k), np.ndarray)
                           else v) for k, v in saved.items()})
    ctx.state["params"] = params
    ctx.state["optimizer"] = states


def evaluate(ctx: Any, model: Any, data: Any, it: int, loss: float, every: int | None = None) -> None:
    """Test accuracy over the whole test set, reported by the evaluator every ``every``
    iterations (GeoMX evaluates on every worker after every iteration)."""
    every = every or ctx.eval_every
    if ctx.is_evaluator and (it % every == 0 or it == ctx.max_iterations):
        ctx.report(it, loss=loss, accuracy=model.accuracy(data.x_test, data.y_test))
