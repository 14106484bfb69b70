"""The per-layer compute model: a worker step as forward and backward passes over layers.

Why: P3 (geomx/sched/p3.py, docs/papers.md §4) wins by overlapping communication with
computation at layer granularity -- backprop produces the last layer's gradient first, the
next forward needs the first layer first. With an iteration's compute charged in one
piece and every gradient pushed after it (``training.layer_compute = "off"``), there is
nothing to overlap and no scheduler can show an effect. With this model (``"flops"`` or
``"shares"``):

* **backward** runs over the keys from last to first, charging
  ``backward_fraction * compute_s * share[k]`` for key ``k`` and pushing its gradient the
  moment it exists (``kv.push(k, g, priority=-k)``, GeoMX's demo convention);
* every pull is then in flight at once (each waits for this worker's push of its key, or
  of its slices under P3);
* the next **forward** runs over the keys from first to last: key ``k``'s share
  ``(1 - backward_fraction) * compute_s * share[k]`` starts only when key ``k`` has been
  pulled.

It applies with P3 on and off: off is GeoMX/MXNet's FIFO push of each key as its gradient
appears, so comparing the two isolates P3's slicing, priority and fusion. The maths is the
real model's, run once per iteration between the two passes (all parameters are pulled by
then); only the *time* is split over layers. Used for FSA and MixedSync (gradient pushing),
as :class:`~geomx.sync.fsa.GradientSync` is; the scenario refuses it for HFA and ESync.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

import numpy as np

from geomx.sync.tensors import phantom


def normalised_shares(weights: Sequence[float], num_keys: int) -> list[float]:
    """Per-key shares of compute summing to 1 (``weights`` are relative, >= 0)."""
    if len(weights) != num_keys:
        raise ValueError(f"per-layer compute: {len(weights)} shares for {num_keys} parameter "
                         "tensors; give one per tensor (kvstore key)")
    total = float(sum(weights))
    if total <= 0 or any(w < 0 for w in weights):
        raise ValueError("per-layer compute: shares must be >= 0 with a positive sum")
    return [float(w) / total for w in weights]


class LayeredGradientSync:
    """Worker side of FSA / MixedSync under the per-layer compute model."""

    name = "gradient-layered"

    def __init__(self, *, node: Any, kv: Any, params: list[Any], pull_weights: bool,
                 local_optimizer: Callable[[], Any], shares: Sequence[float],
                 backward_fraction: float, compute_s: float):
        self.node = node
        self.kv = kv
        self.params = params
        self.shares = normalised_shares(shares, len(params))
        self.backward_fraction = backward_fraction
        self.compute_s = compute_s
        self.local_opt = None
        self.states: list[Any] = []
        self.agg: list[Any] = []
        if not pull_weights and params and not phantom(params[0]):
            self.local_opt = local_optimizer()
            self.local_opt.rescale_grad = 1.0 / kv.num_all_workers
            self.states = [self.local_opt.create_state(k, p) for k, p in enumerate(params)]
            self.agg = [np.zeros_like(p) for p in params]
        self._pulls: list[asyncio.Task[Any] | None] = [None] * len(params)

    async def _charge(self, declared_s: float, measured_s: float = 0.0) -> None:
        if declared_s > 0 or measured_s > 0:
            await self.node.services.compute(declared_s * self.node.compute_factor(),
                                             measured_s)

    async def forward(self, iteration: int) -> None:
        """Forward pass: layer ``k`` computes once its parameters of the last step are in."""
        t0 = self.node.now()
        waited = 0.0
        fwd = (1.0 - self.backward_fraction) * self.compute_s
        for k, share in enumerate(self.shares):
            task = self._pulls[k]
            if task is not None:
                if not task.done():
                    tw = self.node.now()
                    await task
                    waited += self.node.now() - tw
                else:
                    task.result()  # re-raise a failed pull here
                self._pulls[k] = None
            await self._charge(fwd * share)
        self.node.record("forward", t_start=t0, dur=self.node.now() - t0, iteration=iteration,
                         wait_s=waited)

    async def backward(self, iteration: int, grads: list[Any], measured_s: float) -> bool:
        """Backward pass, last key first, pushing each gradient as it appears; then start
        every pull. Returns False: the parameters are in flight (see :meth:`settle`)."""
        t0 = self.node.now()
        bwd = self.backward_fraction * self.compute_s
        kv = self.kv
        for k in reversed(range(len(grads))):
            share = self.shares[k]
            # the real maths ran before this pass: credit it against the declared time
            await self._charge(bwd * share, measured_s * share)
            kv.push(k, grads[k], priority=-k)
        self.node.record("compute", t_start=t0, dur=self.node.now() - t0, iteration=iteration)
        for k in range(len(grads)):
            self._pulls[k] = self.node.spawn(self._pull(k))
        return False

    async def _pull(self, k: int) -> None:
        if self.local_opt is None:
            await self.kv.pull(k, out=self.params[k], priority=-k)
            return
        await self.kv.pull(k, out=self.agg[k], priority=-k)
        self.local_opt.update(k, self.params[k], self.agg[k], self.states[k])

    async def settle(self) -> None:
        """Wait for every outstanding pull: the parameters are then the shared model."""
        tasks = [t for t in self._pulls if t is not None]
        if tasks:
            await asyncio.gather(*tasks)

    async def finish(self) -> None:
        await self.settle()
