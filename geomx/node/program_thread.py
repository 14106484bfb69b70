"""A synchronous training program's thread, taking turns with its node's event loop.

A user who writes ``def main(kv, ctx)`` (docs/guide.md, "Synchronous programs") blocks in
``kv.waitall()`` and ``ctx.compute(...)`` as an MXNet or PyTorch script would. The node
itself is asyncio code, so the program runs on a thread of its own, and every call it
makes into geomx is handed to the node's loop: the thread *submits* the call and waits;
the loop side (:meth:`ProgramThread.run`, one task) runs it -- a plain call at once, a
waiting one (``waitall``, ``compute``) with ``await`` -- and hands the result back.
Nothing but that task touches the node for the program, so the node stays
single-threaded as every node is.

The same code serves both runtimes; only *where the loop side waits for the thread's
next call* depends on the loop:

* a wall-clock loop (asyncio's, uvloop) keeps running while the thread computes: the
  task awaits a future the thread resolves through ``call_soon_threadsafe``, so
  messages, heartbeats and the transfers the program started go on beside it;
* the emulator's loop (geomx/sim/loop.py) cannot let a thread run beside it -- virtual
  time would not see the wall time it takes -- and says so with
  ``threads_run_in_turn``: there the task waits for the thread *inside the callback
  that handed over*, so no other callback runs and the clock stands still until the
  thread blocks on its next call or ends. Exactly one thread runs at a time, the
  program's calls land in the loop at the points an ``async def main`` would have made
  them, and the event log is the async program's, byte for byte (SimGrid's actor
  contexts and SimPy's processes are the same turn-taking, with threads here).

The handoff is two locks used as signals (a lock may be released by another thread):
the thread waits on its own until the loop side replies; in the emulator the loop side
waits on the other until the thread's next call. A cancelled program (the node stops,
Ctrl-C) gets :class:`asyncio.CancelledError` raised from the call it is blocked in, and
from any call it makes after that.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from typing import Any, Callable

__all__ = ["ProgramThread", "SyncCallError", "in_sync_program", "run_blocking",
           "run_on_loop"]

# What the thread submits: a call to run at once, one whose result is awaited, its end.
_CALL = 0
_AWAIT = 1
_END = 2

#: The program and the thread ident it runs on, set in the program thread's context only.
_program: contextvars.ContextVar[tuple["ProgramThread", int] | None] = contextvars.ContextVar(
    "geomx_sync_program", default=None)


class SyncCallError(RuntimeError):
    """A blocking call made outside a sync program's thread, or an async-only call made
    inside one; the message names the call to use instead."""


def in_sync_program() -> bool:
    """True on the thread of a synchronous training program (``def main(kv, ctx)``), where
    geomx calls block; False in an ``async def main`` and everywhere else. Library code
    that serves both kinds of program (``geomx.torch``) asks this to pick ``kv.waitall()``
    or ``await kv.waitall()``."""
    return _on_program_thread() is not None


def _on_program_thread() -> "ProgramThread | None":
    current = _program.get()
    if current is None or current[1] != threading.get_ident():
        return None  # (another thread that copied the program's context is not it)
    return current[0]


def _current(call: str, async_form: str) -> "ProgramThread":
    program = _on_program_thread()
    if program is None:
        raise SyncCallError(f"{call} blocks, so only a synchronous program (`def main(kv, "
                            f"ctx)`) may call it, from its own thread; in `async def main` "
                            f"write `{async_form}`")
    return program


def run_on_loop(fn: Callable[..., Any], *args: Any, call: str = "",
                async_form: str = "") -> Any:
    """From a sync program's thread: ``fn(*args)`` run on the node's event loop, its
    result returned (an exception it raises is raised here). For calls that return at
    once (``kv.push`` enqueues); ``call`` and ``async_form`` name it in the error a
    caller outside a sync program gets."""
    program = _current(call or getattr(fn, "__qualname__", "this call"),
                       async_form or "the async call")
    return program.submit(_CALL, fn, args)


def run_blocking(fn: Callable[..., Any], *args: Any, call: str = "",
                 async_form: str = "") -> Any:
    """From a sync program's thread: ``fn(*args)`` run on the node's event loop and, when
    it returns an awaitable (a coroutine, a task), awaited there; the thread waits for
    the result. ``kv.waitall()`` and ``ctx.compute()`` of a sync program are this."""
    program = _current(call or getattr(fn, "__qualname__", "this call"),
                       async_form or "await ...")
    return program.submit(_AWAIT, fn, args)


class ProgramThread:
    """Run one synchronous function on its own thread, its geomx calls on ``loop``.

    ``await ProgramThread(loop, name).run(fn, *args)`` from a task on ``loop`` returns
    what ``fn`` returned or raises what it raised; the thread's calls reach the loop
    through :func:`run_on_loop` and :func:`run_blocking`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str):
        self._loop = loop
        self._name = name
        # the emulator's loop runs threads in turn (module docstring); wall-clock loops
        # (asyncio's own, uvloop) run beside them and do not carry the attribute
        self._in_turn = bool(getattr(loop, "threads_run_in_turn", False))
        self._thread_turn = threading.Lock()   # held while the thread must wait
        self._loop_turn = threading.Lock()     # held while the loop side must wait (in turn)
        self._thread_turn.acquire()
        self._loop_turn.acquire()
        # guards _request and _cancelled, so a cancel never misses a thread that is
        # about to wait for its reply
        self._guard = threading.Lock()
        self._request: tuple[int, Any, Any] | None = None
        self._reply: tuple[bool, Any] = (True, None)
        self._waiter: asyncio.Future[None] | None = None
        self._cancelled = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ loop side
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Start ``fn(*args)`` on a new thread (in a copy of this task's context, so
        ``geomx.kv.current_node`` and context variables carry over) and serve its calls
        until it returns."""
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=self._main, args=(context, fn, args),
                                        name=f"program {self._name}", daemon=True)
        self._arm()
        self._thread.start()
        blocked = False  # the thread waits for a reply
        try:
            request = await self._next()
            while True:
                kind, call, call_args = request
                if kind == _END:
                    ok, value = call
                    if ok:
                        return value
                    raise value
                blocked = True
                try:
                    value = call(*call_args)
                    if kind == _AWAIT and inspect.isawaitable(value):
                        value = await value
                    reply = (True, value)
                except Exception as e:
                    reply = (False, e)
                blocked = False
                request = await self._hand_back(reply)
        except BaseException:
            self._cancel(blocked)
            raise

    def _arm(self) -> None:
        if not self._in_turn:
            self._waiter = self._loop.create_future()

    async def _next(self) -> tuple[int, Any, Any]:
        """The thread's next request: waited for in this callback when the loop runs
        threads in turn, awaited beside the loop's other work otherwise."""
        if self._in_turn:
            # (Ctrl-C meanwhile raises KeyboardInterrupt here, in the loop's thread: it
            # leaves the loop at once, before any other callback, and ends the run)
            self._loop_turn.acquire()
        else:
            assert self._waiter is not None
            await self._waiter
        with self._guard:
            request, self._request = self._request, None
        assert request is not None
        return request

    async def _hand_back(self, reply: tuple[bool, Any]) -> tuple[int, Any, Any]:
        self._reply = reply
        self._arm()
        self._thread_turn.release()
        return await self._next()

    def _cancel(self, blocked: bool) -> None:
        """The task serving the program was cancelled (or failed): the thread's pending
        call and every later one raise CancelledError, so the thread unwinds without
        reaching the node again (nothing it does then can touch the loop or its log)."""
        with self._guard:
            self._cancelled = True
            waiting = blocked or self._request is not None
            self._request = None
        if waiting:
            self._reply = (False, asyncio.CancelledError())
            self._thread_turn.release()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ thread side
    def _main(self, context: contextvars.Context, fn: Callable[..., Any],
              args: tuple[Any, ...]) -> None:
        context.run(_program.set, (self, threading.get_ident()))
        try:
            end: tuple[bool, Any] = (True, context.run(fn, *args))
        except BaseException as e:  # handed to the loop side, which raises it
            end = (False, e)
        try:
            self._signal(_END, end, None)
        except asyncio.CancelledError:
            pass  # nobody waits for the end of a cancelled program

    def submit(self, kind: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Hand ``fn(*args)`` to the loop side and wait for its result (thread side)."""
        self._signal(kind, fn, args)
        self._thread_turn.acquire()
        ok, value = self._reply
        self._reply = (True, None)
        if not ok:
            raise value
        return value

    def _signal(self, kind: int, fn: Any, args: Any) -> None:
        with self._guard:
            if self._cancelled:
                raise asyncio.CancelledError()
            self._request = (kind, fn, args)
            if self._in_turn:
                self._loop_turn.release()
                return
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop is closed: the node is gone, so is the program
                self._cancelled = True
                self._request = None
                raise asyncio.CancelledError() from None
