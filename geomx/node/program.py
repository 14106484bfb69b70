"""The user's own training program: ``def main(kv, ctx)`` or ``async def main(kv, ctx)``
run on every worker.

GeoMX users bring a training script (``examples/cnn.py``) that every worker and the master
worker run, told who they are on the command line (``--data-slice-idx``) and through
``DMLC_*`` variables. geomx runs such a program the way Flower runs a ``ClientApp``: the
scenario names it (``[training] program = "train.py"`` or ``"package.module:function"``)
and the worker node calls it with a kvstore and a :class:`ProgramContext`, in the emulator,
over real sockets and in per-host ``geomx node`` launches alike (the node is built by
``cluster.make_node`` in all three).

The context is what the built-in trainer (``geomx/node/trainer.py``) gets from the node,
made public: identity (global worker index and count, DC, rank), data helpers, compute
charged like the built-in trainer's (``await ctx.compute("per_iter")``: the scenario's
``compute_per_iter`` times the DC's heterogeneity and the worker's slowdown; the real
runtime sleeps what the maths did not take), and ``ctx.report(...)`` whose rows become
``progress.csv``, the plots, the progress bar, ``target_accuracy`` stopping and
``summary.json``.

A plain ``def main`` runs on a thread of its own and its calls block
(geomx/node/program_thread.py: it takes turns with the node's loop, so its event log in
the emulator is the ``async def`` program's); it gets the same store and context in
their blocking forms (geomx/node/sync_program.py).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sys
import time
from typing import Any, Callable, Iterator

from geomx.node import checkpoint, kvstore
from geomx.node.program_thread import ProgramThread
from geomx.node.sync_program import SyncKVStore, SyncProgramContext
from geomx.node.trainer import (BatchStream, TrainSpec, build_model, load_data,
                                worker_indices)
from geomx.node.sync_contexts import WorkerSyncContext
from geomx.policy.registry import import_file, import_name


class ProgramError(RuntimeError):
    """The training program could not be loaded, or it raised; names program and node."""


def _split_spec(spec: str) -> tuple[str, str]:
    """``"train.py"`` / ``"train.py:fn"`` / ``"pkg.mod"`` / ``"pkg.mod:fn"`` -> (where, fn)."""
    where, sep, fn = spec.rpartition(":")
    if not sep or os.sep in fn or fn.endswith(".py") or not fn.isidentifier():
        return spec, "main"
    return where, fn


def load_program(spec: str) -> Callable[..., Any]:
    """The function named by ``spec`` (a ``.py`` file or an importable module, optionally
    ``:function``, default ``main``): an ``async def`` or a plain ``def`` (a synchronous
    program, run on its own thread: geomx/node/program_thread.py). Raises
    :class:`ProgramError`.

    A file is imported once per version: the nodes of an emulated job, and the nodes a
    launcher forks, share one import, while a file edited since (a notebook that runs
    the job again) is imported afresh."""
    where, _ = _split_spec(spec)
    stamp: tuple[int, int] | None = None
    if _is_file(where):
        try:
            st = os.stat(where)
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            pass  # _load_program says the file is missing
    return _load_program(spec, stamp)


def _is_file(where: str) -> bool:
    """A program named by its file (else by an importable module)."""
    return where.endswith(".py") or os.sep in where


@functools.lru_cache(maxsize=16)
def _load_program(spec: str, stamp: tuple[int, int] | None) -> Callable[..., Any]:
    where, fn = _split_spec(spec)
    if _is_file(where):
        try:
            module = import_file(where, prefix="geomx_user_program_",
                                 label=f"training program {spec!r}", error=ProgramError,
                                 reuse=False)
        except ProgramError as e:
            cause = e.__cause__
            if isinstance(cause, SyntaxError) and "'await' outside" in str(cause.msg):
                raise ProgramError(
                    f"training program {spec!r} line {cause.lineno}: 'await' in a plain "
                    "`def`: a synchronous `def main(kv, ctx)` calls kv.waitall(), "
                    "ctx.compute(...) without await (they block); to await, write "
                    "`async def main(kv, ctx)`") from cause
            raise
    else:
        try:
            module = import_name(where)
        except Exception as e:
            raise ProgramError(f"training program {spec!r}: cannot import module {where!r}: "
                               f"{type(e).__name__}: {e}") from e
    func = getattr(module, fn, None)
    if func is None:
        raise ProgramError(f"training program {spec!r} has no function {fn!r}; write "
                           f"`def {fn}(kv, ctx):` or `async def {fn}(kv, ctx):`")
    if inspect.iscoroutinefunction(func):
        return func
    if (not callable(func) or inspect.isclass(func) or inspect.isgeneratorfunction(func)
            or inspect.isasyncgenfunction(func)):
        raise ProgramError(f"training program {spec!r}: {fn} must be a function, "
                           f"`def {fn}(kv, ctx):` or `async def {fn}(kv, ctx):`")
    return func


def is_sync_program(func: Callable[..., Any]) -> bool:
    """A plain ``def main(kv, ctx)``: it runs on its own thread and its calls block."""
    return not inspect.iscoroutinefunction(func)


class ProgramContext:
    """What a training program knows about its place in the job (GeoMX passes the same on
    its command line and in ``DMLC_*``) and how it charges compute and reports metrics."""

    def __init__(self, node: Any, spec: TrainSpec, args: list[str], compute_scale: float):
        self._node = node
        self._spec = spec
        self.args: list[str] = list(args)
        self._compute_scale = compute_scale
        self._cpu_mark = time.process_time()
        self._last_report: dict[str, Any] = {}
        self._stop_reason = ""
        #: the program's own loop state, saved with each checkpoint (see ``state``)
        self._state: dict[str, Any] = {}
        self._streams: list[BatchStream] = []
        self._saver = checkpoint.NodeCheckpoints(node.job, node.name)
        self._start_iteration = 0
        self._saved_streams: list[Any] = []
        loaded = None if node.is_master else self._saver.load()
        if loaded is not None:
            self._restore(loaded)
        self._worker_syncs: list[Any] = []

    # ------------------------------------------------------------------ identity
    @property
    def node_name(self) -> str:
        return self._node.name

    @property
    def is_master(self) -> bool:
        """The master worker: configures the global tier, publishes the initial model."""
        return bool(self._node.is_master)

    @property
    def dc(self) -> str:
        return self._node.dc

    @property
    def rank(self) -> int:
        """Rank inside the DC (``kv.rank``)."""
        return int(self._node.rank)

    @property
    def num_all_workers(self) -> int:
        return int(self._node.job.num_all_workers)

    @property
    def worker_index(self) -> int:
        """This worker's global index, GeoMX's ``--data-slice-idx`` (-1 on the master)."""
        if self.is_master:
            return -1
        return self._node.job.all_workers.index(self._node.name)

    @property
    def seed(self) -> int:
        return int(self._spec.seed)

    @property
    def batch_size(self) -> int:
        return int(self._spec.batch_size)

    @property
    def lr(self) -> float:
        """The scenario's global learning rate (``training.lr``)."""
        cfg = self._spec.global_optimizer or self._spec.worker_optimizer
        return float(cfg.get("lr", 0.01))

    @property
    def max_iterations(self) -> int:
        """``[run] iterations`` (or ``epochs`` converted); 0 = no limit."""
        return int(self._spec.iterations)

    @property
    def eval_every(self) -> int:
        """``[run] eval_every``: how often the evaluator should ``report`` accuracy."""
        return max(1, int(self._spec.eval_every))

    @property
    def is_evaluator(self) -> bool:
        """This worker's reports make ``progress.csv`` and the summary (the job's first
        worker); others may report too, their rows stay in ``events.jsonl``."""
        return self._node.name == self._spec.evaluator

    @property
    def kvstore_type(self) -> str:
        """The kvstore type the scenario's ``[sync] algorithm`` means."""
        return self._node.job.sync_algorithm.kvstore_type

    @property
    def sync(self) -> dict[str, Any]:
        """The scenario's sync settings (``algorithm``, ``k1``, ``k2``, ...)."""
        return dict(self._spec.sync)

    @property
    def algorithm(self) -> str:
        """``[training] algorithm`` ("" when the scenario names a model)."""
        return self._spec.algorithm

    @property
    def optimizer_config(self) -> dict[str, Any] | None:
        """The global optimizer the scenario asks for (``training.optimizer``, ``lr``...),
        as ``kv.set_optimizer`` takes it; None for ``optimizer = "none"``."""
        cfg = self._spec.global_optimizer
        return None if cfg is None else dict(cfg)

    @property
    def worker_optimizer_config(self) -> dict[str, Any]:
        """``training.worker_optimizer`` / ``worker_lr`` as a config dict."""
        return dict(self._spec.worker_optimizer)

    # ------------------------------------------------------------------ data
    @property
    def dataset_name(self) -> str:
        return self._spec.dataset

    @property
    def data_path(self) -> str | None:
        return self._spec.data_path

    @property
    def dataset_options(self) -> dict[str, Any]:
        """Generated data sets' sizes (``synthetic_samples`` ...)."""
        return dict(self._spec.dataset_kwargs)

    @property
    def partition_scheme(self) -> str:
        return self._spec.partition

    @property
    def dirichlet_alpha(self) -> float:
        return float(self._spec.dirichlet_alpha)

    def dataset(self) -> Any:
        """The scenario's dataset (``x_train``, ``y_train``, ``x_test``, ``y_test``...)."""
        return load_data(self._spec)

    def partition(self) -> Any:
        """Indices of this worker's share of the training set (``[training] partition``)."""
        if self.is_master:
            raise ProgramError(f"{self._node.name}: the master worker has no data partition")
        return worker_indices(self._spec, self.worker_index, self.num_all_workers)

    def batches(self, batch_size: int | None = None) -> BatchStream:
        """Endless minibatches of this worker's partition, reshuffled every epoch (seeded).

        Checkpoints save every stream made here (its order, position and generator) and a
        resumed run gets each back where it was, in the order the program makes them."""
        stream = BatchStream(self.partition(), batch_size or self._spec.batch_size,
                             self._node.services.rng(f"batches:{self._node.name}"))
        if len(self._streams) < len(self._saved_streams):
            saved = self._saved_streams[len(self._streams)]
            checkpoint.set_rng_state(stream.rng, saved["rng"])
            stream.seek(saved["order"], saved["pos"], saved["epoch"])
        self._streams.append(stream)
        return stream

    # ------------------------------------------------------------------ checkpoints
    @property
    def state(self) -> dict[str, Any]:
        """The program's own loop state, saved with every checkpoint and handed back on
        ``--resume`` (``[checkpoint]``; docs/guide.md, "Checkpoints").

        Put here what the next iterations read that geomx does not hold: a local
        optimizer's state, a learning-rate schedule's step, a generator of your own
        (``rng.bit_generator.state``). Values: numbers, strings, booleans, numpy arrays,
        and lists and dicts of them. geomx itself saves the iteration counter of
        :meth:`iterations`, the streams of :meth:`batches` and the codec's error feedback;
        the model comes back from the servers (pull it after ``kv.init``, as usual) when
        they run an optimizer. Without one the servers hold the last round's sum, so a
        program that steps its model itself keeps the model here too
        (examples/common.py, ``keep_local_model``).
        A checkpoint is taken where :meth:`iterations` starts the next iteration, so
        update this dict before the loop body ends."""
        return self._state

    @property
    def checkpointing(self) -> bool:
        """This job takes checkpoints (``[checkpoint] every``): ``state`` is saved with them."""
        return self._saver.enabled

    @property
    def resumed(self) -> bool:
        """This run continues a checkpoint: ``state`` holds what was saved."""
        return self._start_iteration > 0

    def _restore(self, loaded: Any) -> None:
        tree, meta, arrays = loaded
        saved = checkpoint.unpack(tree, arrays)
        self._state = dict(saved["program"])
        self._saved_streams = list(saved["streams"])
        self._start_iteration = int(saved["iteration"])
        self._last_report = dict(saved["last_report"])
        checkpoint.restore_codec_states(self._node.lan_codec, saved["codec"],
                                       self._node.record)
        self._node.record("restore", round=meta["round"], iteration=self._start_iteration)

    def _save_if_due(self, iteration: int) -> None:
        """This worker's part of a checkpoint round the global tier announced (the
        round's replies carry it): everything the next iterations read."""
        if not self._node.state.ckpt_due or not self._saver.enabled:
            return
        due = self._node.state.take_checkpoint()
        state = {"iteration": iteration, "program": self._state,
                 "streams": [{"rng": checkpoint.rng_state(st.rng), **st.position()}
                             for st in self._streams],
                 "codec": checkpoint.codec_states(self._node.lan_codec),
                 "last_report": self._last_report}
        path = self._saver.save(due, state, {"t": self._node.now(), "iteration": iteration})
        self._node.record("checkpoint", round=due, iteration=iteration, file=path.name)

    def build_model(self) -> Any:
        """The scenario's numpy model (``[training] model``), identical on every node."""
        return build_model(self._spec)

    # ------------------------------------------------------------------ sync
    def worker_sync(self, kv: Any, params: list[Any]) -> Any:
        """The scenario's per-step sync policy for ``params`` (updated in place), the one
        the built-in trainer uses (``SyncAlgorithm.worker_side``, geomx/policy/sync.py): ``await
        sync.step(iteration, grads)`` pushes and pulls as ``[sync] algorithm`` says --
        a gradient under FSA and MixedSync, local steps and a model average every ``k1``
        under HFA, local steps sized by the state server under ESync (docs/papers.md
        §5) -- and returns True when every worker holds the same model. A program that
        uses it trains under every algorithm; its ``finish`` is called when the program
        returns."""
        sync = self._node.job.sync_algorithm.worker_side(self._sync_context(kv, params))
        self._worker_syncs.append(sync)
        return sync

    async def finish_sync(self) -> None:
        """The program returned: end its sync policies (ESync's say goodbye to the state
        server, which stops once every worker has). A worker under ESync that made none
        still says goodbye, so a program that pushes by hand never leaves the state
        server waiting for it."""
        for sync in self._worker_syncs:
            await sync.finish()
        if not self._worker_syncs and not self.is_master:
            await self._node.job.sync_algorithm.worker_left(self._sync_context(None, []))

    def _sync_context(self, kv: Any, params: list[Any]) -> WorkerSyncContext:
        from geomx.optim import optimizer_from_config

        return WorkerSyncContext(
            self._node, kv=kv, params=params,
            pull_weights=self._spec.global_optimizer is not None,
            local_optimizer=lambda: optimizer_from_config(dict(self._spec.worker_optimizer)),
            max_iterations=self.max_iterations)

    # ------------------------------------------------------------------ time
    def now(self) -> float:
        """Job time: emulated seconds in the emulator, wall seconds over sockets."""
        return self._node.now()

    def iterations(self) -> Iterator[int]:
        """1, 2, ... until ``[run] iterations``, a stop (``target_accuracy``, a time limit,
        another worker's stop) or the program breaks out. Sets the node's iteration counter,
        which the summary counts. A resumed run starts after the checkpoint's iteration;
        a checkpoint round is saved here, between two iterations."""
        it = self._start_iteration
        while True:
            self._save_if_due(it)
            if self.max_iterations > 0 and it >= self.max_iterations:
                self._stop_reason = self._stop_reason or "iteration limit"
                return
            if self.stop_requested:
                self._stop_reason = "stop requested (target accuracy or time limit)"
                return
            it += 1
            self._node.iteration = it
            yield it

    @property
    def stop_requested(self) -> bool:
        """Some worker asked the job to stop and the global tier told us."""
        return self._node.state.stop_seen

    def request_stop(self) -> None:
        """Ask the whole job to stop (carried on this worker's next pushes)."""
        self._node.state.want_stop()

    async def compute(self, seconds: float | str = "per_iter", *,
                      measured_s: float | None = None) -> None:
        """Charge compute time like the built-in trainer.

        ``"per_iter"`` charges the scenario's ``compute_per_iter`` for this worker (the DC's
        heterogeneity and the worker's slowdown included); a number of seconds is scaled
        by the same heterogeneity and slowdown. In the emulator that much virtual time
        passes; over sockets the node sleeps what the maths did not already take
        (``measured_s``, default: this process's CPU time since the previous call).
        """
        node = self._node
        if isinstance(seconds, str):
            if seconds != "per_iter":
                raise ProgramError(f"ctx.compute({seconds!r}): allowed: a number of seconds "
                                   "or 'per_iter'")
            declared = float(node.compute_s_per_iter)
        else:
            declared = float(seconds) * self._compute_scale
            if declared < 0:
                raise ProgramError(f"ctx.compute({seconds!r}): seconds must be >= 0")
        cpu = time.process_time()
        measured = (cpu - self._cpu_mark) if measured_s is None else float(measured_s)
        t0 = node.now()
        await node.services.compute(declared * node.compute_factor(), max(0.0, measured))
        node.record("compute", t_start=t0, dur=node.now() - t0, iteration=node.iteration)
        self._cpu_mark = time.process_time()
        if self._spec.max_emulated_s > 0 and node.now() >= self._spec.max_emulated_s:
            self.request_stop()
        if self._spec.max_wall_s > 0 and node.services.wall_elapsed_s() >= self._spec.max_wall_s:
            self.request_stop()

    # ------------------------------------------------------------------ metrics
    def report(self, iteration: int | None = None, *, loss: float | None = None,
               accuracy: float | None = None, **extra: Any) -> None:
        """Record a metrics row (an ``eval`` event). The evaluator's rows (the first worker
        of the job) make ``progress.csv``, the plots, the progress bar and the summary's
        final accuracy; reaching ``[run] target_accuracy`` asks the job to stop."""
        node = self._node
        it = int(node.iteration if iteration is None else iteration)
        if iteration is not None:
            node.iteration = max(int(node.iteration), it)
        row: dict[str, Any] = {"iteration": it,
                               "loss": None if loss is None else float(loss),
                               "accuracy": None if accuracy is None else float(accuracy)}
        for k, v in extra.items():
            row[k] = v.item() if hasattr(v, "item") else v
        node.record("eval", **row)
        self._last_report = row
        target = self._spec.target_accuracy
        if target > 0 and accuracy is not None and accuracy >= target:
            self.request_stop()

    def result(self) -> dict[str, Any]:
        reason = self._stop_reason or ("stop requested (target accuracy or time limit)"
                                       if self.stop_requested else "program returned")
        return {"iterations": int(self._node.iteration), "stop_reason": reason,
                **self._last_report}


class _LocalStepKVStore(kvstore.KVStore):
    """The store handed to a program under an algorithm whose global tier runs no
    optimizer (HFA, ESync: it sums the workers' models or model deltas). A program that
    installs a global optimizer there pushes gradients for it, and would train to chance
    without a word, so ``set_optimizer`` is refused naming the algorithm and the fix."""

    def __init__(self, node: Any, type_: str, algorithm: str):
        super().__init__(node, type_)
        self.algorithm = algorithm

    def set_optimizer(self, optimizer: Any) -> asyncio.Task[Any]:
        raise kvstore.KVStoreError(
            f"kv.set_optimizer: sync.algorithm = {self.algorithm!r} runs no global optimizer (its "
            "servers average the workers' models), so pushed gradients would not train; take "
            "local steps and push models (examples/cnn_hfa.py, or ctx.worker_sync), or use "
            "sync.algorithm = 'fsa'")


def _program_kvstore(node: Any, type_: str, sync: dict[str, Any]) -> kvstore.KVStore:
    """The store ``main(kv, ctx)`` gets: a plain one, or under HFA / ESync one that
    refuses a global optimizer (:class:`_LocalStepKVStore`)."""
    algorithm = node.job.sync_algorithm
    if algorithm.uses_global_optimizer:
        return kvstore.create(type_)
    return _LocalStepKVStore(node, type_, algorithm.name)


def load_program_for(node_name: str, program: str) -> Callable[..., Any]:
    """:func:`load_program` for node ``node_name``, whose name its errors carry.

    A node loads its program when it is built, before it registers with its scheduler:
    importing one can take seconds of CPU (``import torch`` takes 2-3 s, and a job's
    workers import at once), and a node busy importing on its event loop sends no
    heartbeats, so it would be declared dead on a loaded host before it began.
    """
    try:
        return load_program(program)
    except ProgramError as e:
        raise ProgramError(f"{node_name}: {e}") from e


async def run_user_program(node: Any, *, spec: TrainSpec, program: str,
                           main: Callable[..., Any], args: list[str],
                           compute_scale: float = 1.0) -> dict[str, Any]:
    """Run ``program`` on ``node`` (a worker or the master worker); errors name both.
    ``main``: the program's function, loaded when the node was built
    (:func:`load_program_for`)."""
    from geomx.node.base import NodeFailure, NodeStopped

    ctx = ProgramContext(node, spec, args, compute_scale)
    params = inspect.signature(main).parameters
    try:
        kv = _program_kvstore(node, ctx.kvstore_type, spec.sync) if len(params) >= 2 else None
        if is_sync_program(main):
            sync_ctx = SyncProgramContext(ctx)
            returned = await ProgramThread(asyncio.get_running_loop(), node.name).run(
                main, *([sync_ctx] if kv is None else [SyncKVStore(kv), sync_ctx]))
            if inspect.iscoroutine(returned):
                returned.close()  # (never awaited: no warning about it)
                raise ProgramError(f"training program {program!r} on node {node.name}: its "
                                   "plain `def main` returned a coroutine; write `async def "
                                   "main(kv, ctx)` to await one")
        else:
            returned = await (main(ctx) if kv is None else main(kv, ctx))
        for store in node.state.kv_stores:
            await store.waitall()
        await ctx.finish_sync()
    except (asyncio.CancelledError, NodeFailure, NodeStopped, ProgramError):
        raise
    except SystemExit as e:  # argparse on bad ctx.args, or an explicit sys.exit
        raise ProgramError(f"training program {program!r} exited on node {node.name} with "
                           f"status {e.code!r} (bad program arguments {ctx.args}?)") from e
    except Exception as e:
        raise ProgramError(f"training program {program!r} raised on node {node.name}: "
                           f"{type(e).__name__}: {e}") from e
    result = ctx.result()
    if isinstance(returned, dict):
        result.update({k: v for k, v in returned.items() if isinstance(k, str)})
    if not node.is_master:
        node.record("worker_done", iterations=result["iterations"],
                    stop_reason=result["stop_reason"])
    return result
