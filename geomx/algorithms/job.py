"""What every algorithm trains with: named shared arrays on the parameter servers.

An algorithm's shared state lives under kvstore keys that every node declares in the
same order (so they get the same int keys, which P3 can slice). The global servers run
no optimizer for these keys, so after a round of FSA a key holds the *sum* of what the
job's workers pushed (geomx/node/global_server.py: ``store <- grad``): a push followed by
a pull is an all-reduce through the two tiers (workers -> local server -> global server
and back), charged by the WAN model and passed through the codecs like any gradient. On
that one primitive:

* :meth:`AlgorithmJob.allreduce` -- sums, counts, moments, histograms (MapReduce's
  reduce, aggregated per DC by the local servers first);
* :meth:`AlgorithmJob.gather` -- every worker writes its block into its own row of a
  zero array, so the sum is the concatenation (an all-gather);
* the SGD algorithms instead install the scenario's optimizer on the global servers and
  push gradients / pull weights (``geomx/algorithms/linear.py``).

Every worker derives the same decisions from the same pulled sums (centroids, splits,
components), so state stays replicated without a leader, as in allreduce-based
distributed GBDT (XGBoost's Rabit, LightGBM's data-parallel mode).
"""

from __future__ import annotations

import argparse
import zlib
from typing import Any, Iterator

import numpy as np

from geomx.algorithms.data import Table

__all__ = ["AlgorithmJob", "AlgorithmError"]


class AlgorithmError(ValueError):
    """An algorithm cannot run with these options or this data (names the option)."""


class AlgorithmJob:
    """One node's view of an algorithm run: options, data partition, shared keys."""

    def __init__(self, kv: Any, ctx: Any, name: str, opts: argparse.Namespace, table: Table):
        self.kv = kv
        self.ctx = ctx
        self.name = name
        self.opts = opts
        self.table = table
        self.is_master: bool = bool(ctx.is_master)
        self.num_workers: int = int(ctx.num_all_workers)
        self.worker: int = int(ctx.worker_index)   # -1 on the master
        self.seed: int = int(ctx.seed)
        self._keys: dict[str, int] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self.limit = 0
        self.x = self.y = None
        if not self.is_master:
            from geomx.ml.partition import partition

            scheme = ctx.partition_scheme
            labels = table.y_train
            if table.task == "regression":
                if scheme in ("by_class", "dirichlet"):
                    raise AlgorithmError(f"training.partition = {scheme!r} needs class labels; "
                                         f"{table.name!r} is a regression table; allowed: "
                                         "'iid', 'contiguous'")
                labels = np.zeros(len(labels), dtype=np.int64)
            kw = {"alpha": ctx.dirichlet_alpha} if scheme == "dirichlet" else {}
            part = partition(labels, self.num_workers, scheme, seed=self.seed, **kw)[self.worker]
            self.x = table.x_train[part]
            self.y = table.y_train[part]
            #: index of each local row in the training set (bootstrap draws use it)
            self.rows = np.asarray(part, dtype=np.int64)

    # ------------------------------------------------------------------ randomness
    def shared_rng(self, tag: str) -> np.random.Generator:
        """The same stream on every node (decisions every worker must agree on)."""
        return np.random.default_rng([self.seed, zlib.crc32(tag.encode())])

    def local_rng(self, tag: str) -> np.random.Generator:
        """A stream of this worker's own (its sampling of its own data)."""
        return np.random.default_rng([self.seed, zlib.crc32(tag.encode()), self.worker + 1])

    # ------------------------------------------------------------------ shared keys
    async def use_server_optimizer(self, config: dict[str, Any]) -> None:
        """Install ``config`` on the global servers (the master's call acts, as in GeoMX);
        then every key declared afterwards is updated by it: push gradients, pull weights."""
        await self.kv.set_optimizer(dict(config))

    async def declare(self, **initial: np.ndarray) -> None:
        """Declare shared keys with their initial values (the master's are published; a
        sum key starts at zeros). Every node declares the same names in the same order."""
        names = list(initial)
        for n in names:
            if n in self._keys:
                raise AlgorithmError(f"shared key {n!r} declared twice")
            self._keys[n] = len(self._keys)
            self._shapes[n] = tuple(np.shape(initial[n]))
        await self.kv.init([self._keys[n] for n in names],
                           [np.ascontiguousarray(initial[n]) for n in names])

    async def allreduce(self, name: str, local: np.ndarray) -> np.ndarray:
        """Push this worker's ``local`` for key ``name``; return the sum over all workers
        of this round (float64)."""
        key = self._keys[name]
        value = np.ascontiguousarray(local, dtype=np.float64).reshape(self._shapes[name])
        self.kv.push(key, value)
        out = np.empty(self._shapes[name], dtype=np.float64)
        await self.kv.pull(key, out=out)
        return out

    async def exchange(self, name: str, local: np.ndarray) -> np.ndarray:
        """Push ``local`` (a gradient) and pull the key's new value (the weights the global
        optimizer made of it), in the key's own dtype."""
        key = self._keys[name]
        value = np.ascontiguousarray(local).reshape(self._shapes[name])
        self.kv.push(key, value)
        return await self.kv.pull(key)

    async def fetch(self, name: str) -> np.ndarray:
        """The key's current value (the published initial value before any round)."""
        return await self.kv.pull(self._keys[name])

    async def gather(self, name: str, block: np.ndarray) -> np.ndarray:
        """All-gather: key ``name`` has shape ``(num_workers, *block.shape)``; this
        worker's block goes in its own row, the others push zeros there."""
        full = np.zeros(self._shapes[name], dtype=np.float64)
        full[self.worker] = block
        return await self.allreduce(name, full)

    # ------------------------------------------------------------------ progress
    def iterations(self, default: int, *, cap: int | None = None) -> Iterator[int]:
        """1, 2, ... up to ``[run] iterations`` (``default`` when that is 0) and at most
        ``cap`` (one pass over a stream, one counting pass), or until the job is asked to
        stop (target accuracy, time limit; seen by every worker after the same round).
        Lazy: each iteration sets the node's iteration counter when it starts."""
        self.limit = self.iteration_limit(default, cap=cap)
        return self._iterate(self.limit)

    def _iterate(self, limit: int) -> Iterator[int]:
        for _, it in zip(range(limit), self.ctx.iterations()):
            yield it

    def iteration_limit(self, default: int, *, cap: int | None = None) -> int:
        """How many iterations :meth:`iterations` will run unless a stop comes first."""
        limit = int(self.ctx.max_iterations) or int(default)
        if cap is not None:
            limit = int(cap) if limit <= 0 else min(limit, int(cap))
        return limit

    def last(self, it: int) -> bool:
        """Whether ``it`` is the last iteration of the running :meth:`iterations` loop
        (barring a stop request)."""
        return it >= self.limit

    def planned_iterations(self, default: int) -> int:
        """``[run] iterations`` or ``default``: for algorithms that must size their keys
        by it (trees grown at once)."""
        return self.iteration_limit(default)

    async def compute(self) -> None:
        """Charge one iteration's compute (``compute_per_iter`` of this worker's DC)."""
        await self.ctx.compute("per_iter")

    def due(self, it: int, last: bool = False) -> bool:
        """Whether the evaluator reports at iteration ``it``."""
        return self.ctx.is_evaluator and (last or it % self.ctx.eval_every == 0)

    def score(self, predict: Any) -> dict[str, Any]:
        """Test-set score of ``predict(x) -> labels / values``: accuracy or R^2."""
        t = self.table
        pred = np.asarray(predict(t.x_test))
        if t.task == "regression":
            resid = float(np.sum((t.y_test - pred) ** 2))
            total = float(np.sum((t.y_test - t.y_test.mean()) ** 2))
            return {"metric": "r2", "score": 1.0 - resid / total}
        acc = float(np.mean(pred == t.y_test))
        return {"metric": "accuracy", "score": acc, "accuracy": acc}

    def report(self, it: int | None, row: dict[str, Any], *,
               loss: float | None = None) -> dict[str, Any]:
        """Write a progress row (the evaluator's rows make progress.csv); ``it`` None:
        the node's current iteration."""
        extra = {k: v for k, v in row.items() if k not in ("accuracy",)}
        self.ctx.report(it, loss=loss, accuracy=row.get("accuracy"), **extra)
        return row
