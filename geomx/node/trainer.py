"""The built-in training program: GeoMX's ``examples/cnn.py`` loop on numpy models.

Written only against the kvstore API (``geomx.kv``, implemented in
:mod:`geomx.node.kvstore`) so it is also the reference for users writing their own
loop. What a step sends and receives is the sync algorithm's worker side
(``SyncAlgorithm.worker_side``, geomx/policy/sync.py). A side that pushes gradients
(geomx/sync/fsa.py) has two modes, as in GeoMX's examples (docs/geomx-behaviour.md §2.2):

* a global optimizer is installed (``cnn.py``): workers push mean gradients and pull the
  new *weights*;
* no global optimizer (``cnn_bsc.py``, ``cnn_fp16.py``): workers pull the aggregated
  gradient sum and take a local optimizer step with it, divided by ``num_all_workers``.

A side that takes local steps with ``worker_optimizer`` synchronises models now and
then (GeoMX's ``cnn_hfa.py``); its ``step`` says when every worker holds the same model,
and the evaluator evaluates only at such points, the first one at or after each
multiple of ``eval_every``.

Differences from the GeoMX examples, on purpose: each worker reshuffles its partition
every epoch (GeoMX iterates slices in order, unshuffled); test accuracy is over all test
samples (not the mean of batch means) and is computed by one evaluator every
``eval_every`` iterations instead of by every worker after every iteration.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from geomx.node import checkpoint, kvstore
from geomx.node.checkpoint import NodeCheckpoints
from geomx.node.sync_contexts import WorkerSyncContext
from geomx.wire import Payload


@dataclass
class TrainSpec:
    """Everything the training program needs; built from the scenario by ``cluster.py``."""

    model: str = "mlp"
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    dataset: str = "digits"
    data_path: str | None = None
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    batch_size: int = 32
    global_optimizer: dict[str, Any] | None = None     # config dict, None = plain sum
    worker_optimizer: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 0.01})
    codec: dict[str, Any] = field(default_factory=lambda: {"type": "none"})
    iterations: int = 100
    eval_every: int = 10
    target_accuracy: float = 0.0
    max_emulated_s: float = 0.0
    max_wall_s: float = 0.0
    phantom_sizes: list[int] = field(default_factory=list)
    evaluator: str = ""
    seed: int = 0
    sync: dict[str, Any] = field(default_factory=dict)
    program: str = ""                                  # "" = the built-in loop (train_program)
    algorithm: str = ""                                # [training] algorithm (geomx/algorithms)
    program_args: list[str] = field(default_factory=list)
    #: per-layer compute model (geomx/node/layered.py): per-key compute shares, [] = off
    layer_shares: list[float] = field(default_factory=list)
    backward_fraction: float = 0.667

    @property
    def phantom(self) -> bool:
        return self.model == "phantom"


@functools.lru_cache(maxsize=4)
def _dataset(name: str, path: str | None, seed: int, kw: tuple[tuple[str, Any], ...]):
    from geomx.ml.datasets import load_dataset

    return load_dataset(name, path=path, seed=seed, **dict(kw))


def load_data(spec: TrainSpec):
    return _dataset(spec.dataset, spec.data_path, spec.seed,
                    tuple(sorted(spec.dataset_kwargs.items())))


@functools.lru_cache(maxsize=4)
def _partitions(name: str, path: str | None, seed: int, kw: tuple, scheme: str, parts: int,
                alpha: float) -> list[np.ndarray]:
    from geomx.ml.partition import partition

    data = _dataset(name, path, seed, kw)
    kw = {"alpha": alpha} if scheme == "dirichlet" else {}
    return partition(data.y_train, parts, scheme, seed=seed, **kw)


def worker_indices(spec: TrainSpec, global_rank: int, num_all_workers: int) -> np.ndarray:
    return _partitions(spec.dataset, spec.data_path, spec.seed,
                       tuple(sorted(spec.dataset_kwargs.items())), spec.partition,
                       num_all_workers, spec.dirichlet_alpha)[global_rank]


def build_model(spec: TrainSpec):
    """The model every node builds identically (same seed → same initial weights)."""
    from geomx.ml.models import build_model as _build

    data = load_data(spec)
    rng = np.random.default_rng(spec.seed)
    return _build(spec.model, data.input_shape, data.num_classes, rng, **spec.model_kwargs)


def initial_params(spec: TrainSpec) -> list[Any]:
    if spec.phantom:
        return [Payload.phantom((n,), "<f4") for n in spec.phantom_sizes]
    return build_model(spec).params


class BatchStream:
    """Endless minibatches over one worker's partition, reshuffled every epoch (seeded)."""

    def __init__(self, indices: np.ndarray, batch_size: int, rng: np.random.Generator):
        if len(indices) == 0:
            raise ValueError("this worker's data partition is empty; use fewer workers or "
                             "a larger dataset / different partition")
        self.indices = np.asarray(indices)
        self.batch_size = batch_size
        self.rng = rng
        self.epoch = 0
        self._order = self.rng.permutation(self.indices)
        self._pos = 0

    def next(self) -> np.ndarray:
        if self._pos >= len(self._order):
            self.epoch += 1
            self._order = self.rng.permutation(self.indices)
            self._pos = 0
        b = self._order[self._pos:self._pos + self.batch_size]
        self._pos += self.batch_size
        return b

    def position(self) -> dict[str, Any]:
        """Where the stream is (the epoch's shuffled order, the next index into it and
        the epoch), for a checkpoint; :meth:`seek` goes back there. The generator's
        state is saved with ``rng``."""
        return {"order": self._order, "pos": self._pos, "epoch": self.epoch}

    def seek(self, order: np.ndarray, pos: int, epoch: int) -> None:
        """Continue from a :meth:`position` (with ``rng`` restored to its state then)."""
        self._order = order
        self._pos = int(pos)
        self.epoch = int(epoch)


def iterations_for_epochs(spec: TrainSpec, epochs: float, num_all_workers: int) -> int:
    """Iterations that make ``epochs`` passes over an average worker partition."""
    data = load_data(spec)
    per_worker = data.num_train / max(1, num_all_workers)
    return max(1, math.ceil(epochs * per_worker / spec.batch_size))


async def master_program(node: Any, spec: TrainSpec) -> None:
    """The master worker: configure the global servers and publish the initial model."""
    kv = kvstore.create(node.job.sync_algorithm.kvstore_type)
    if spec.global_optimizer is not None:
        await kv.set_optimizer(spec.global_optimizer)
    params = initial_params(spec)
    await kv.init(list(range(len(params))), params)
    node.record("master_ready", keys=len(params))


async def train_program(node: Any, spec: TrainSpec) -> dict[str, Any]:
    """One worker's training loop (GeoMX ``examples/cnn.py`` shape)."""
    from geomx.optim import optimizer_from_config

    kv = kvstore.create(node.job.sync_algorithm.kvstore_type)
    job = node.job
    global_rank = job.all_workers.index(node.name)
    evaluator = node.name == spec.evaluator
    model = None if spec.phantom else build_model(spec)
    params = initial_params(spec) if spec.phantom else model.params
    node.params = params  # for inspection by tests and notebooks
    await kv.init(list(range(len(params))), params)  # one barrier for all keys
    # one pull per key (not one BATCH per server, as a list call would send): the
    # built-in trainer's emulated timings and event logs are those of per-key pulls
    await asyncio.gather(*(kv.pull(k, out=p) for k, p in enumerate(params)))

    sync: Any
    layered = None
    if spec.layer_shares:
        from geomx.node.layered import LayeredGradientSync

        sync = layered = LayeredGradientSync(
            node=node, kv=kv, params=params, pull_weights=spec.global_optimizer is not None,
            local_optimizer=lambda: optimizer_from_config(dict(spec.worker_optimizer)),
            shares=spec.layer_shares, backward_fraction=spec.backward_fraction,
            compute_s=node.compute_s_per_iter)
    else:
        sync = job.sync_algorithm.worker_side(WorkerSyncContext(
            node, kv=kv, params=params, pull_weights=spec.global_optimizer is not None,
            local_optimizer=lambda: optimizer_from_config(dict(spec.worker_optimizer)),
            max_iterations=spec.iterations))

    data = None if spec.phantom else load_data(spec)
    stream = None
    if data is not None:
        stream = BatchStream(worker_indices(spec, global_rank, kv.num_all_workers),
                             spec.batch_size, node.services.rng(f"batches:{node.name}"))
    losses: list[float] = []
    last_eval: dict[str, Any] = {}
    it = 0
    next_eval = spec.eval_every
    saver = NodeCheckpoints(job, node.name)
    loaded = saver.load()
    if loaded is not None:
        it, next_eval, losses, last_eval = restore_worker(node, loaded, params, sync, stream)
        node.iteration = it
    if node.rejoining or saver.rejoins:
        # a restarted worker (geomx/node/restart.py), or one the resumed checkpoint had
        # lost, pulled the current model of round ``seen_version``: it trains from the
        # next round on, to the job's last iteration
        it = node.state.seen_version
        next_eval = (it // spec.eval_every + 1) * spec.eval_every if spec.eval_every > 0 else 0
        node.iteration = it
        if hasattr(sync, "rejoined"):
            sync.rejoined(it)
        node.record("rejoined", iteration=it)
    while (spec.iterations <= 0 or it < spec.iterations) and not kv.stop_requested:
        it += 1
        node.iteration = it
        if layered is not None:
            await layered.forward(it)  # layer by layer, as the last step's pulls arrive
            if node.state.ckpt_due and saver.enabled:
                # the last round's pulls have all landed only now, and nothing of this
                # iteration has been computed yet: this is the state after iteration it - 1
                save_worker(node, saver, it - 1, next_eval, losses, last_eval, params, sync,
                            stream)
        t0 = time.perf_counter()
        if model is not None:
            idx = stream.next()
            loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
            losses.append(float(loss))
            kv.report_loss(loss)
        else:
            grads = params
        measured = time.perf_counter() - t0
        if layered is not None:
            await layered.backward(it, grads, measured)  # pushes as gradients appear
            shared = True  # once settled (below, only when evaluating)
        else:
            t_compute = node.now()
            await node.services.compute(node.compute_s_per_iter * node.compute_factor(),
                                        measured)
            node.record("compute", t_start=t_compute, dur=node.now() - t_compute, iteration=it)
            shared = await sync.step(it, grads)
        if evaluator and shared and spec.eval_every > 0 and it >= next_eval:
            if layered is not None:
                await layered.settle()
            next_eval = (it // spec.eval_every + 1) * spec.eval_every
            last_eval = evaluate(node, model, data, it, losses)
            if spec.target_accuracy > 0 and last_eval.get("accuracy", 0) >= spec.target_accuracy:
                kv.request_stop()
        if layered is None and node.state.ckpt_due and saver.enabled:
            save_worker(node, saver, it, next_eval, losses, last_eval, params, sync, stream)
        if spec.max_emulated_s > 0 and node.now() >= spec.max_emulated_s:
            kv.request_stop()
        if spec.max_wall_s > 0 and node.services.wall_elapsed_s() >= spec.max_wall_s:
            kv.request_stop()
    await kv.waitall()
    await sync.finish()
    if layered is not None and node.state.ckpt_due and saver.enabled:
        # the last iteration's pulls, settled by finish(), ended a checkpoint round
        save_worker(node, saver, it, next_eval, losses, last_eval, params, sync, stream)
    if evaluator and last_eval.get("iteration") != it:
        last_eval = evaluate(node, model, data, it, losses)
    reason = "stop requested (target accuracy or time limit)" if kv.stop_requested \
        else "iteration limit"
    node.record("worker_done", iterations=it, stop_reason=reason)
    return {"iterations": it, "stop_reason": reason, **last_eval}


def save_worker(node: Any, saver: NodeCheckpoints, it: int, next_eval: int,
                losses: list[float], last_eval: dict[str, Any], params: list[Any], sync: Any,
                stream: BatchStream | None) -> None:
    """This worker's part of the checkpoint round now due (``node.state.ckpt_due``,
    geomx/node/checkpoint.py): everything the next iterations read -- the model, local
    optimizer states (FSA without a global optimizer, HFA), the data stream and its RNG,
    the codec's error feedback."""
    round_ = node.state.take_checkpoint()
    state = {"iteration": it, "next_eval": next_eval, "losses": losses[-20:],
             "last_eval": last_eval, "params": list(params),
             "sync_states": list(getattr(sync, "states", [])),
             "sync_side": sync.state_dict() if hasattr(sync, "state_dict") else None,
             "codec": checkpoint.codec_states(node.lan_codec),
             "stream": None if stream is None else {
                 "rng": checkpoint.rng_state(stream.rng), **stream.position()}}
    path = saver.save(round_, state, {"t": node.now(), "iteration": it})
    node.record("checkpoint", round=round_, iteration=it, file=path.name)


def restore_worker(node: Any, loaded: Any, params: list[Any], sync: Any,
                   stream: BatchStream | None) -> tuple[int, int, list[float], dict[str, Any]]:
    """Resuming: put a checkpoint's worker state back (the inverse of save_worker)."""
    tree, meta, arrays = loaded
    state = checkpoint.unpack(tree, arrays)
    if len(state["params"]) != len(params):
        raise checkpoint.CheckpointError(f"the checkpoint has {len(state['params'])} "
                                         f"parameter arrays, this model {len(params)}")
    for p, saved in zip(params, state["params"]):
        np.copyto(p, saved)
    if getattr(sync, "states", None) is not None:
        sync.states = checkpoint.restore_into(state["sync_states"], list(sync.states))
    if state.get("sync_side") is not None:
        sync.load_state_dict(state["sync_side"])
    checkpoint.restore_codec_states(node.lan_codec, state["codec"], node.record)
    saved_stream = state["stream"]
    if stream is not None and saved_stream is not None:
        checkpoint.set_rng_state(stream.rng, saved_stream["rng"])
        stream.seek(saved_stream["order"], saved_stream["pos"], saved_stream["epoch"])
    node.record("restore", round=meta["round"], iteration=state["iteration"])
    return (int(state["iteration"]), int(state["next_eval"]), list(state["losses"]),
            dict(state["last_eval"]))


def evaluate(node: Any, model: Any, data: Any, iteration: int, losses: list[float]) -> dict[str, Any]:
    """Test accuracy of this worker's current model (takes no emulated time)."""
    if model is None:
        row = {"iteration": iteration, "accuracy": None, "loss": None}
    else:
        acc = float(model.accuracy(data.x_test, data.y_test))
        recent = losses[-20:]
        loss = float(np.mean(recent)) if recent else None
        row = {"iteration": iteration, "accuracy": acc, "loss": loss}
    node.record("eval", **row)
    return row
