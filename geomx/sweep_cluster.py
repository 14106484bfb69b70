"""Independent tasks on a Dask distributed cluster: the executor seam behind `geomx sweep
--cluster` (and any other runner of independent emulations; docs/sweeps.md says why
`geomx fidelity` is not one).

Why Dask and not a runner of our own: sweep points are independent single-process jobs,
and Dask distributed already schedules such jobs over machines (`dask scheduler` /
`dask worker`, under Slurm with dask-jobqueue or on Kubernetes; see docs/sweeps.md).
It is imported only when a cluster address is given, so local sweeps never load it, and
it is an optional extra (`pip install 'geomx[cluster]'`).

What this module adds to a bare `Client.submit`:

* a connection that fails fast, in one line, when the scheduler does not answer or no
  worker joins it (:data:`CONNECT_TIMEOUT_S`);
* a check, before anything runs, that every worker imports the same geomx as this
  process: a hash of the package's source files (geomx.provenance.package_digest), since the
  version string does not change between commits; each task checks it again, for
  workers that join later;
* a check that the files a scenario names (traces, training programs, user policy
  files, data paths; :func:`scenario_files`) are on the workers when they must be, and
  which worker lacks which;
* a retry of a failed task once on another worker. A worker that dies is the
  scheduler's to handle: it moves the task to another worker, up to its
  `distributed.scheduler.allowed-failures` deaths (1 gives "retried once"), and then
  the task is reported, not tried again here, so that a point that kills its worker
  does not take more workers with it;
* the count of running tasks for a progress bar, and cancelling every task on Ctrl-C.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geomx.provenance import package_digest
from geomx.threads import THREADS_VAR, apply_to_torch

#: Environment variable naming the scheduler when `--cluster` is not given.
CLUSTER_ENV = "GEOMX_CLUSTER"
#: What to install when Dask distributed is missing.
INSTALL_HINT = "pip install 'geomx[cluster]' (or: pip install 'distributed>=2024.1')"
#: Seconds to reach the scheduler, and again for a first worker to join it.
CONNECT_TIMEOUT_S = 5.0
#: how long points may wait with no worker in the cluster before they are reported failed
#: (a sweep never waits forever for workers that are all gone)
NO_WORKER_GRACE_S = 30.0
#: how long fetching a finished point's result may take; longer means the worker that
#: held it has gone, and the scheduler is running the point again
GATHER_TIMEOUT_S = 10.0


class ClusterError(RuntimeError):
    """A cluster that cannot run the tasks: one line saying which part and what to do."""


class TaskError(Exception):
    """Raised by a task body whose message is already the whole one-line reason."""


class TaskFailed(Exception):
    """A task that raised on a worker: the worker's address and the error, one line."""

    def __init__(self, worker: str, error: str) -> None:
        super().__init__(f"{error} (on worker {worker})")
        self.worker = worker
        self.error = error


def cluster_address(option: str | None) -> str | None:
    """The scheduler `geomx sweep` uses: the `--cluster` option, else `$GEOMX_CLUSTER`,
    else None (then the scenario's `[sweep] cluster`, if set, else local processes). Library calls (`run_sweep(cluster=...)`) do not read the
    environment, so that a script's or a test's local sweep stays local."""
    address = option or os.environ.get(CLUSTER_ENV, "")
    return address.strip() or None


def import_distributed() -> Any:
    """`distributed`, or a ClusterError saying what to install."""
    try:
        import distributed
    except ImportError:
        raise ClusterError(f"--cluster needs Dask distributed, which is not installed here: "
                           f"{INSTALL_HINT}") from None
    return distributed


@dataclass(frozen=True)
class ScenarioFile:
    """A file a scenario names: the field (`wan.0.trace`), the path as resolved here,
    and whether it can travel with a task (small text files) or must be on the workers
    (a data set)."""

    field: str
    path: str
    travels: bool

    @property
    def location(self) -> str:
        """The file part of the field's value (a program or policy is `file.py:Name`)."""
        where, sep, name = self.path.rpartition(":")
        return where if sep and where.endswith(".py") and name.isidentifier() else self.path


def scenario_files(s: Any) -> list[ScenarioFile]:
    """The files scenario `s` reads in the emulator: WAN traces, the training program,
    user policy files (`file.py:Class`) and the training data path.

    Paths are the resolved ones (absolute when the file is next to the scenario file;
    see geomx/scenario/parse.py). Module names (`lab.ssp:Cls`) are not files: a worker
    imports them like this process does.
    """
    from geomx.scenario.policies import POLICY_FIELDS, is_user_spec

    out = [ScenarioFile(f"wan.{i}.trace", w.trace, True)
           for i, w in enumerate(s.wans) if w.trace not in ("", "uniform")]
    specs = [("training.program", s.training.program)]
    specs += [(f"{f.section}.{f.key}", getattr(getattr(s, f.section), f.key))
              for f in POLICY_FIELDS if is_user_spec(f, getattr(getattr(s, f.section), f.key))]
    for name, spec in specs:
        f = ScenarioFile(name, spec, True)
        if spec and f.location.endswith(".py"):
            out.append(f)
    if s.training.data_path:
        out.append(ScenarioFile("training.data_path", s.training.data_path, False))
    return out


def file_digest(path: str) -> str:
    """A hash of a file's bytes, or of a folder's files (a data path may be a folder)."""
    p = Path(path)
    h = hashlib.sha256()
    for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
        if f.is_file():
            h.update(f.relative_to(p).as_posix().encode() if p.is_dir() else b"")
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def probe_worker(marker: str | None, marker_text: str | None,
                 files: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Run on each worker before anything else: its geomx digest, whether it sees the
    marker file (so the sweep folder is on a file system it shares with the client), and
    which of `files` ((field, path) pairs that must be there) it lacks."""
    sees = False
    if marker:
        try:
            sees = Path(marker).read_text() == marker_text
        except OSError:
            sees = False
    return {"digest": package_digest(), "sees_folder": sees, "cores": os.cpu_count() or 1,
            "missing": [[field, path] for field, path in files if not os.path.exists(path)]}


def _host(address: str) -> str:
    return address.rpartition("://")[2].rpartition(":")[0]


def limit_kernel_threads(threads: int) -> None:
    """Give this thread's Numba kernels `threads` threads, and this process's OpenMP
    (PyTorch's intra-op threads) as many, unless ``OMP_NUM_THREADS`` says otherwise.

    Several Dask workers on one host, each running kernels on every core, oversubscribe
    it: the codecs' `parallel=True` kernels then wait for descheduled threads on every
    small tensor (the reason geomx/sweep.py gives local processes their share too).
    PyTorch in a training program does the same with one intra-op thread per core,
    less so than in the real runtime (an emulated run's programs take turns): 4 runs of
    a geomx.torch MLP, 2 at a time on 2 cores, took 1-10 % longer with 2 threads each
    than with 1 (35.5 against 31.6 s; 121.9 and 121.3 against 120.1 and 113.3 s). The
    variable is set here, and ``geomx.torch.init`` applies it
    (geomx/torch/session.py); the real runtime's launcher sets it for its nodes
    (geomx/runtime/launcher.py).
    """
    import numba

    n = max(1, int(threads))
    if THREADS_VAR not in os.environ:
        # for what the program starts: geomx.torch.init applies it to torch (Numba's
        # OpenMP pool, started below, leaves its own count in the runtime torch shares)
        os.environ[THREADS_VAR] = str(n)
        apply_to_torch(str(n))  # a torch imported already read the variable then
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def run_checked(digest: str, kernel_threads: dict[str, int], fn: Callable[..., Any],
                *args: Any) -> Any:
    """The task body on a worker: refuse a different geomx, give Numba this host's share
    of the cores (`kernel_threads` by host; a host that joined later: its cores over this
    worker's threads), run `fn(*args)`, and turn an exception into a TaskFailed naming
    this worker."""
    from distributed import get_worker

    worker = get_worker()
    if package_digest() != digest:
        raise TaskFailed(worker.address, f"this worker runs a different geomx (source hash "
                                         f"{package_digest()}, the client's is {digest})")
    try:
        limit_kernel_threads(kernel_threads.get(_host(worker.address)) or
                             max(1, (os.cpu_count() or 1) // max(1, worker.state.nthreads)))
        return fn(*args)
    except TaskError as exc:
        raise TaskFailed(worker.address, str(exc)) from None
    except Exception as exc:
        raise TaskFailed(worker.address, f"{type(exc).__name__}: {exc}") from None


@dataclass
class ClusterTask:
    """One independent task: a name for reports, a function importable on the workers
    (pickled by reference), its arguments, and the tries made so far."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    tries: int = 0
    failed_on: tuple[str, ...] = ()  # the worker of each failed try


class ClusterPool:
    """A checked connection to a Dask scheduler that runs ClusterTasks (see the module
    docstring). Use as a context manager; `close()` cancels what is still running."""

    def __init__(self, address: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        distributed = import_distributed()
        self.address = address
        self._distributed = distributed
        try:
            self.client = distributed.Client(address, timeout=timeout_s, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise ClusterError(f"--cluster {address}: no Dask scheduler answered within "
                               f"{timeout_s:g} s ({type(exc).__name__}); start one with "
                               f"`dask scheduler` and give its tcp://HOST:PORT") from None
        except ValueError as exc:
            raise ClusterError(f"--cluster {address}: {exc}; allowed: a scheduler address "
                               f"like tcp://HOST:8786") from None
        try:
            self.client.wait_for_workers(1, timeout=timeout_s)
        except (OSError, TimeoutError):
            self.client.close()
            raise ClusterError(f"--cluster {address}: the scheduler has no worker (none "
                               f"joined within {timeout_s:g} s); start some with "
                               f"`dask worker {address}`") from None
        self._futures: dict[Any, ClusterTask] = {}
        self.kernel_threads: dict[str, int] = {}

    def __enter__(self) -> ClusterPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _workers_info(self) -> dict[str, Any]:
        """The scheduler's view of every worker (older distributed lists them all by
        default and has no n_workers argument)."""
        try:
            return self.client.scheduler_info(n_workers=-1)["workers"]
        except TypeError:
            return self.client.scheduler_info()["workers"]

    def workers(self) -> list[str]:
        return sorted(self._workers_info())

    def close(self) -> None:
        if self._futures:
            self.client.cancel(list(self._futures), force=True)
            self._futures.clear()
        self.client.close()

    def check_workers(self, files: Iterable[ScenarioFile], marker: Path | None = None,
                      shared: bool | None = None) -> bool:
        """Refuse, in one line, a worker without geomx, with a different geomx, or lacking
        a file it must have; return whether the workers share this process's file system
        (they see `marker`, a file this process wrote; `shared` forces the answer).

        Files that travel must be on the workers only when they share the file system
        (then nothing travels); a data path must be there always.
        """
        marker_text = uuid.uuid4().hex
        if marker is not None:
            marker.write_text(marker_text)
        files = list(files)
        try:
            replies = self.client.run(probe_worker, str(marker) if marker else None,
                                      marker_text, [(f.field, f.location) for f in files],
                                      on_error="return")
        finally:
            if marker is not None:
                marker.unlink(missing_ok=True)
        digest = package_digest()
        for worker, reply in sorted(replies.items()):
            if isinstance(reply, BaseException):
                text = f"{type(reply).__name__}: {reply}"
                # the probe is geomx code: a worker without geomx cannot even unpickle it
                if "No module named 'geomx" in text:
                    raise ClusterError(f"worker {worker} cannot import geomx (No module named "
                                       f"'geomx'); install "
                                       f"this geomx there (pip install 'geomx[cluster]' from "
                                       f"the same checkout or wheel)")
                raise ClusterError(f"worker {worker} failed its check: {text}")
            if reply["digest"] != digest:
                raise ClusterError(f"worker {worker} runs a different geomx (source hash "
                                   f"{reply['digest']}, here {digest}); install the same "
                                   f"geomx on every worker")
        threads: dict[str, int] = {}
        cores: dict[str, int] = {}
        for worker, info in self._workers_info().items():
            if worker in replies:
                threads[_host(worker)] = threads.get(_host(worker), 0) + info["nthreads"]
                cores[_host(worker)] = replies[worker]["cores"]
        self.kernel_threads = {h: max(1, cores[h] // threads[h]) for h in threads}
        if shared is None:
            shared = bool(replies) and all(r["sees_folder"] for r in replies.values())
        elif shared and not all(r["sees_folder"] for r in replies.values()):
            blind = next(w for w, r in sorted(replies.items()) if not r["sees_folder"])
            folder = marker.parent if marker is not None else "the output folder"
            raise ClusterError(f"--shared-fs: worker {blind} does not see {folder}; mount it "
                               f"at the same path on every worker, or give --no-shared-fs to "
                               f"have the files sent back")
        must_exist = {(f.field, f.location) for f in files if shared or not f.travels}
        for worker, reply in sorted(replies.items()):
            for field, path in reply["missing"]:
                if (field, path) in must_exist:
                    why = ("the workers share this file system, so files are read in place"
                           if shared else "data paths do not travel with the tasks")
                    raise ClusterError(f"worker {worker}: {field} {path!r} is not there ({why}); "
                                       f"put it at that path on every worker")
        return shared

    def _submit(self, task: ClusterTask) -> None:
        # a retry goes to another worker when there is one
        others = [w for w in self.workers() if w not in task.failed_on] if task.failed_on else []
        task.tries += 1
        key = f"geomx-{task.name}-{task.tries}-{uuid.uuid4().hex[:8]}"
        fut = self.client.submit(run_checked, package_digest(), self.kernel_threads, task.fn,
                                 *task.args, key=key, pure=False, workers=others or None)
        self._futures[fut] = task

    def running(self) -> int:
        """How many of this pool's tasks workers are running now: those the scheduler
        has handed to a worker, at most as many as the worker has threads (it queues a
        few more than it runs)."""
        keys = {f.key for f in self._futures}
        try:
            processing = self.client.processing()
            info = self._workers_info()
        except Exception:  # a scheduler that went away: the next wait says so
            return 0
        return sum(min(sum(1 for k in ks if k in keys), info.get(w, {}).get("nthreads", 1))
                   for w, ks in processing.items())

    def run(self, tasks: Sequence[ClusterTask],
            on_done: Callable[[ClusterTask, Any, str | None], None],
            on_tick: Callable[[int], None] | None = None, tick_s: float = 1.0) -> None:
        """Run `tasks`; call `on_done(task, result, None)` when one returns and
        `on_done(task, None, error)` when it failed twice (the second time on another
        worker when there is one). `on_tick(running)` is called as the count changes.
        A finished point whose worker went away before its result was fetched runs
        again; points that find no worker for :data:`NO_WORKER_GRACE_S` are reported
        failed, so a cluster whose workers all died ends the sweep instead of hanging it.
        Ctrl-C (or any exception) cancels every task still queued or running."""
        distributed = self._distributed
        for task in tasks:
            self._submit(task)
        last_running = -1
        if on_tick is not None:  # what the workers' threads will take first
            threads = sum(i["nthreads"] for i in self._workers_info().values())
            last_running = min(len(tasks), threads)
            on_tick(last_running)
        no_worker_since: float | None = None
        try:
            while self._futures:
                try:
                    with self.client.as_current():
                        done, _ = distributed.wait(list(self._futures), timeout=tick_s,
                                                   return_when="FIRST_COMPLETED")
                except TimeoutError:
                    done = set()
                for fut in done:
                    task = self._futures.pop(fut)
                    error = self._error(fut)
                    if error is None:
                        try:
                            result = fut.result(timeout=GATHER_TIMEOUT_S)
                        except TimeoutError:  # lost with its worker: it runs again
                            self._futures[fut] = task
                            continue
                        if on_tick is not None and last_running > len(self._futures):
                            last_running = len(self._futures)
                            on_tick(last_running)
                        on_done(task, result, None)
                        continue
                    worker, text = error
                    if not worker:  # the scheduler has retried it already, or lost it
                        on_done(task, None, text)
                    elif task.tries < 2:
                        task.failed_on = (*task.failed_on, worker)
                        self._submit(task)
                    else:
                        tried = " and then ".join((*task.failed_on, worker))
                        on_done(task, None, f"{text} (tried on {tried})")
                if self._futures and not self._workers_info():
                    now = time.monotonic()
                    no_worker_since = now if no_worker_since is None else no_worker_since
                    if now - no_worker_since >= NO_WORKER_GRACE_S:
                        self._fail_all(on_done, f"no Dask worker was left to run it for "
                                       f"{NO_WORKER_GRACE_S:.0f} s (every worker has gone; "
                                       "start workers and run the sweep again: finished "
                                       "points are kept)")
                else:
                    no_worker_since = None
                if on_tick is not None:
                    n = self.running()
                    if n != last_running:
                        last_running = n
                        on_tick(n)
        except BaseException:
            self.client.cancel(list(self._futures), force=True)
            self._futures.clear()
            raise

    def _fail_all(self, on_done: Callable[[ClusterTask, Any, str | None], None],
                  error: str) -> None:
        """Report every point still queued as failed with ``error``, and cancel it."""
        pending = list(self._futures.items())
        self._futures.clear()
        self.client.cancel([fut for fut, _ in pending], force=True)
        for _, task in pending:
            on_done(task, None, error)

    def _error(self, fut: Any) -> tuple[str, str] | None:
        """(worker, one line) for a failed future, None for a finished one; a task whose
        workers died has no worker to name ("")."""
        if fut.status == "finished":
            return None
        if fut.status == "cancelled":
            return "", "cancelled by the scheduler (it restarted or lost the task)"
        exc = fut.exception()
        if isinstance(exc, TaskFailed):
            return exc.worker, exc.error
        if isinstance(exc, self._distributed.KilledWorker):
            return "", (f"the worker running it died, {exc.allowed_failures + 1} times (the "
                        f"last one {exc.last_worker.address}); see that worker's log")
        return "", f"{type(exc).__name__}: {exc}"
