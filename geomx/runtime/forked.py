"""Start a local node by ``fork()`` from the launcher, without ``exec``.

A node started as ``python -m geomx node ...`` spends about 0.6 s of CPU importing numpy,
Numba, uvloop and geomx before it does anything, and a 13-node job on a 2-core machine
spends 8 s of wall time on that before the first node registers. The launcher has made
those imports once; a child forked from it starts with them done, and then runs exactly
what ``geomx node`` would run, with the same arguments, environment, standard streams,
session and exit code. It is still one process per node.

This follows Python's own ``multiprocessing`` fork start method (``popen_fork.py`` and
``BaseProcess._bootstrap``): the child runs its work, flushes its streams and leaves with
``os._exit`` -- never by unwinding into the launcher's frames or running the launcher's
``atexit`` handlers (which could, for instance, delete a temporary directory the launcher
still uses). It differs in what the child inherits: its standard streams are the node's
log file and a pipe from the launcher, as ``subprocess.Popen`` would set them, and the
other nodes' stdin pipes are closed in it, so a node still sees end-of-file when the
launcher is gone.

Forking is only safe from a process with a single thread (another thread could hold a
lock the child then waits on forever), so :func:`fork_usable` falls back to ``exec`` when
the launcher runs threads (a Jupyter kernel does), off Linux, and when
``GEOMX_NODE_START=exec`` asks for it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import IO, Any, Callable, Iterator, Sequence

from geomx.threads import THREADS_VAR, apply_to_torch

#: Environment variable choosing how the local launcher starts nodes: ``fork`` (the
#: default where it is safe) or ``exec`` (a fresh interpreter per node, always safe).
ENV_VAR = "GEOMX_NODE_START"
_CHOICES = ("fork", "exec")


def start_method() -> str:
    """``"fork"`` or ``"exec"``: what ``GEOMX_NODE_START`` asks for (default ``fork``)."""
    value = os.environ.get(ENV_VAR, "").strip().lower() or "fork"
    if value not in _CHOICES:
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of "
                         f"{', '.join(_CHOICES)}")
    return value


def fork_usable() -> bool:
    """Whether this process may start nodes by fork: asked for (or by default), on Linux,
    only one Python thread running here, no GPU torch loaded (:func:`_torch_with_gpu_loaded`)
    and no Numba parallel thread pool started: the
    pool a parallel kernel leaves behind (an emulated run with a codec, earlier in the
    same process) makes a forked child abort ("fork() called from a process already
    using GNU OpenMP"). OpenBLAS's pool, which numpy starts on import, is fork-safe: it
    shuts down in the child (the case every ``multiprocessing`` fork with numpy relies
    on)."""
    return (start_method() == "fork" and sys.platform.startswith("linux")
            and hasattr(os, "fork") and threading.active_count() == 1
            and not _numba_pool_started() and not _torch_with_gpu_loaded())


def _numba_pool_started() -> bool:
    if "numba" not in sys.modules:
        return False
    try:
        from numba.np.ufunc import parallel
    except ImportError:  # a Numba without it: cannot tell, so do not fork
        return True
    return bool(getattr(parallel, "_is_initialized", True))


#: device files whose presence means a GPU torch could use is on this host
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")


def _torch_with_gpu_loaded() -> bool:
    """Whether torch is loaded here in a state a forked child cannot inherit. A CUDA
    context never survives fork, and once autograd has run a backward pass on a host
    with a GPU, its engine has started per-device threads, after which a forked child's
    first backward raises "Unable to handle autograd's threading in combination with
    fork-based multiprocessing" (on a CPU-only host no such threads start). The engine's
    state cannot be read, and asking torch for the GPU count would itself initialise the
    driver, so a GPU build of torch, imported here on a host with a GPU, rules fork out
    (``geomx run`` never imports torch in the launcher; a notebook or test that trained
    with torch before a real-runtime run starts its nodes by exec)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return True
    except Exception:  # a torch that cannot say: do not fork
        return True
    version = getattr(torch, "version", None)
    gpu_build = getattr(version, "cuda", None) or getattr(version, "hip", None)
    return bool(gpu_build) and any(os.path.exists(p) for p in GPU_DEVICE_FILES)


#: Signals held while a node is forked and recorded (see :func:`signals_deferred`).
_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends; one that came meanwhile is
    raised then, to the handler that was in place. Around ``os.fork()`` this is a
    correctness matter: a Ctrl-C that lands while the interpreter runs its at-fork
    callbacks (logging's lock release, for one) raises KeyboardInterrupt inside the
    callback, where CPython reports it as "Exception ignored" and drops it -- the
    launcher then never stops. The launcher also holds them until the new node is in
    its table, so an interrupt cannot leave a node it does not know about.

    The Python-level handlers are swapped for one that only notes the signal, rather
    than the signal being blocked: a blocked signal sent to the process is delivered to
    another thread (numpy's OpenBLAS pool), whose C handler still has the main thread
    run the Python handler at its next check -- inside the at-fork callback again.
    Main thread only (``signal.signal``)."""
    noted: list[int] = []
    old: dict[int, Any] = {}
    for sig in _DEFERRED:
        handler = signal.getsignal(sig)
        if handler is None or handler == signal.SIG_IGN:
            continue  # not ours to swap, or ignored anyway
        old[sig] = handler
        signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)


def preload(program: str = "") -> None:
    """Import what every node imports, once, before the first fork (each child then
    starts with it done), and the job's training program: a program importing torch
    costs each worker 2-3 s of CPU, five workers at once on two cores ten seconds before
    the job can start, where forked children share one import. Its module-level code
    then runs here, once, not in every node.

    It is imported with the ``sys.argv`` a node has (``geomx node ...``), so a program
    that reads it at import behaves as it would in a node started by exec. The program
    is left to the nodes where a GPU is present (a GPU build of torch imported here
    would rule fork out, :func:`fork_usable`) or where it does not load or exits (each
    node then reports the error with its name)."""
    import geomx.runtime.eventloop  # noqa: F401  (uvloop)
    import geomx.runtime.node_main  # noqa: F401
    import geomx.runtime.tcp  # noqa: F401

    if not program or any(os.path.exists(p) for p in GPU_DEVICE_FILES):
        return
    from geomx.node.program import ProgramError, load_program

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["geomx", "node"]  # what a node's import would see
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            load_program(program)
    except (ProgramError, SystemExit):  # (argparse at module level)
        return  # what it printed is the nodes' to say, in their logs
    finally:
        sys.argv = argv
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())


class ForkedProcess:
    """What the launcher's supervisor uses of ``subprocess.Popen``, for a forked child:
    ``pid``, ``stdin``, ``returncode`` (negative: killed by that signal), ``poll()`` and
    ``wait(timeout)`` (``subprocess.TimeoutExpired`` when it runs past it)."""

    def __init__(self, pid: int, stdin: IO[bytes], args: Sequence[str]):
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it is gone, cause unknown
                self.returncode = 255
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode

    def __repr__(self) -> str:
        return f"ForkedProcess(pid={self.pid}, returncode={self.returncode})"


def fork_command(argv: Sequence[str], log_file: IO[str], env: dict[str, str],
                 close_in_child: Callable[[], None] = lambda: None) -> ForkedProcess:
    """Start ``geomx node ...`` (``argv``: the arguments after ``python -m geomx``, from
    ``node`` on) in a forked child:
    its stdout and stderr go to ``log_file``, its stdin is a new pipe (the returned
    process's ``stdin``), ``env`` is its environment, and it leads a new session (as
    ``Popen(..., start_new_session=True)``). ``close_in_child`` runs first in the child:
    close there what belongs to the launcher (the other nodes' stdin pipes). ``ps`` and
    ``pgrep -f`` show it as ``python -m geomx`` and the arguments, as for an exec'd node."""
    read_fd, write_fd = os.pipe()
    for stream in (sys.stdout, sys.stderr):  # nothing buffered here is printed twice
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    with signals_deferred():
        pid = os.fork()
        if pid == 0:  # the child: never returns, nor leaves this block (whose exit could
            code = 1  # raise a noted signal outside the try, into the launcher's frames);
            try:      # _become_node resets the handlers
                os.close(write_fd)
                _become_node(read_fd, log_file.fileno(), env, close_in_child,
                             shlex.join([sys.executable, "-m", "geomx", *argv]))
                code = _run_cli(list(argv))
            except BaseException:  # noqa: BLE001 - the child must reach os._exit
                try:
                    traceback.print_exc()
                except BaseException:  # noqa: BLE001
                    pass
            finally:
                _leave(code)
    os.close(read_fd)
    return ForkedProcess(pid, os.fdopen(write_fd, "wb"), ["geomx", *argv])


def _become_node(stdin_fd: int, log_fd: int, env: dict[str, str],
                 close_in_child: Callable[[], None], title: str) -> None:
    """The child's set-up: what ``exec`` would have given it (session, command line,
    streams, signal dispositions, environment, logging)."""
    os.setsid()
    _set_title(title)  # before the environment changes: setproctitle finds argv through it
    os.dup2(stdin_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(stdin_fd)
    close_in_child()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGUSR1,
                signal.SIGUSR2, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                      else signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    os.environ.clear()
    os.environ.update(env)
    # fresh streams on the new descriptors (the launcher's may be a test runner's capture
    # objects), line-buffered as PYTHONUNBUFFERED makes a fresh interpreter's
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True,
                                  write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True,
                                  write_through=True)
    if faulthandler.is_enabled():
        faulthandler.enable(sys.stderr)
    root = logging.getLogger()
    for handler in list(root.handlers):  # the CLI configures logging as a new process does
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    cwd = os.getcwd()  # `python -m` puts the working directory first on the path
    if not sys.path or sys.path[0] != cwd:
        sys.path.insert(0, cwd)
    numpy = sys.modules.get("numpy")  # (``random`` reseeds itself after a fork; numpy's
    if numpy is not None:             # legacy global generator does not)
        numpy.random.seed()
    apply_to_torch(env.get(THREADS_VAR))  # a torch loaded before the fork read it then


def _set_title(title: str) -> None:
    """The command line other tools see (``/proc/PID/cmdline``): without it every node
    would show the launcher's. One string, as setproctitle writes it (up to the space of
    the launcher's own arguments and environment)."""
    try:
        from setproctitle import setproctitle
    except ImportError:  # not on Linux, or not installed: ps shows the launcher's
        return
    setproctitle(title)


def _run_cli(argv: list[str]) -> int:
    """``geomx node ARGS`` (the only command the launcher forks)."""
    from geomx.runtime.node_args import node_command_main

    if not argv or argv[0] != "node":
        raise ValueError(f"only `geomx node ...` is forked, not `geomx {' '.join(argv[:1])}`")
    sys.argv = ["geomx", *argv]
    try:
        code: Any = node_command_main(argv[1:])
    except SystemExit as e:
        code = e.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _leave(code: int) -> None:
    """End the child as an interpreter exit would, without the launcher's exit handlers:
    join the node's own non-daemon threads, flush logging and the streams, ``_exit``."""
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    os._exit(code & 0xFF)
