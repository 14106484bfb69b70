"""A virtual-time asyncio event loop: the emulator's clock.

Why: node code must run unchanged in the emulator and over real sockets, so it may only
use plain asyncio (``sleep``, ``Queue``, ``Event``, ``wait_for``, ``asyncio.timeout``,
``loop.time()``). Instead of faking those primitives we fake *time*: ``loop.time()``
returns a virtual clock, and whenever no callback is ready the clock jumps straight to
the next timer. A one-hour ``asyncio.sleep`` therefore finishes instantly in wall time.
This is the "autojump" idea of trio's ``MockClock`` (trio.testing.MockClock with
``autojump_threshold=0``), applied to an asyncio loop.

How: :class:`VirtualTimeLoop` subclasses :class:`asyncio.BaseEventLoop` and replaces its
private ``_run_once`` (the hot path of every asyncio loop). There is no selector and no
self-pipe: the loop does no I/O at all and starts no threads. Replacing ``_run_once``
rather than plugging in a fake selector buys three things:

* the clock jumps to *exactly* the next timer's deadline (no ``now + (when - now)``
  rounding, no dependence on the monotonic clock's resolution), so closed-form
  timings in tests come out exact;
* timers with equal deadlines run in the order they were scheduled (a ``(when, seq)``
  heap of tuples, compared in C), which makes runs easy to reason about and
  deterministic;
* deadlock detection is a single branch: nothing ready and no timer pending while the
  loop has not been asked to stop raises :class:`EmulationDeadlock` instead of
  sleeping forever.

The loop also offers :meth:`VirtualTimeLoop.call_when_idle`: callbacks that run once
everything at the current virtual instant has run, just before the clock advances. The
network model uses it to recompute flow rates once per instant instead of once per
message. And :meth:`VirtualTimeLoop.call_at_plain`, a timer without a handle (a heap
entry ``(when, seq, fn, arg)``, nothing else): the network schedules one per delivered
message, and a ``TimerHandle`` with its copied ``contextvars`` context costs more than
the delivery itself. Plain timers draw their ``seq`` from the same counter as ordinary
ones, so the order of everything due at one instant is the order it was scheduled in,
whichever kind it is. ``call_soon``/``call_at`` build their handles without the base
class's layers of checks (the same handles, the same order; debug mode keeps the base
class's path). :meth:`VirtualTimeLoop.soon_plain_entry` is the ``call_soon`` of plain
entries (a transport's inbox drain).

Relies on private names of ``asyncio.BaseEventLoop`` that have been stable from Python
3.8 to 3.13 (``_ready``, ``_stopping``, ``_timer_cancelled_count`` and the
``TimerHandle`` fields ``_when``/``_scheduled``/``_cancelled``).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import heapq
import itertools
import math
from asyncio import events
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "EmulationDeadlock", "EmulationLivelock", "VirtualTimeLoop", "cancel_remaining", "new_virtual_loop",
    "run_virtual",
]

T = TypeVar("T")

# Rebuild the timer heap when more than this many cancelled timers sit in it and they
# are more than half of it (wait_for/timeout cancel most of their timers).
_PURGE_MIN_CANCELLED = 256

# The cyclic garbage collector while the loop runs (see VirtualTimeLoop.run_forever): a
# young collection every this many callbacks, every _GC_MIDDLE-th one a middle one, and
# every _GC_FULL-th one a full one (cycles that outlived two collections, e.g. messages
# that sat in a WAN queue, are otherwise only freed when the run ends).
_GC_EVERY_CALLBACKS = 1_000_000
_GC_MIDDLE = 10
_GC_FULL = 100
# ...and at least this many callbacks per object the last young collection had to walk
# (its cost grows with what is in flight; this keeps it to a bounded share of the run).
_GC_CALLBACKS_PER_YOUNG_OBJECT = 8

_heappush = heapq.heappush
_Handle = events.Handle
_TimerHandle = events.TimerHandle
_copy_context = contextvars.copy_context
# Build handles field by field (half the cost of Handle.__init__, which also asks the
# loop for its debug flag) when the handle layout is the one this was written against
# (CPython 3.11-3.13); otherwise through the constructors.
_HANDLE_SLOTS = {"_callback", "_args", "_cancelled", "_loop", "_source_traceback", "_repr",
                 "_context"}
_FAST_HANDLES = (_HANDLE_SLOTS <= set(getattr(_Handle, "__slots__", ()))
                 and {"_when", "_scheduled"} <= set(getattr(_TimerHandle, "__slots__", ())))


class EmulationDeadlock(RuntimeError):
    """Nothing can ever happen again: no callback is ready and no timer is pending,
    but the main coroutine has not finished (every task waits on something that only
    another waiting task could provide)."""


class EmulationLivelock(EmulationDeadlock):
    """The loop keeps running callbacks but virtual time never moves on: some task
    polls (``while not ready: await asyncio.sleep(0)``), which in virtual time starves
    every timer, including message deliveries. Wait on an ``Event``/``Queue`` instead."""


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An asyncio event loop whose ``time()`` is a virtual clock that autojumps.

    Use :func:`run_virtual` for the common case. The loop supports everything that
    does not need real I/O or threads: callbacks, timers, tasks, futures and the
    synchronisation primitives built on them. Socket, pipe, subprocess, signal and
    executor methods are not available (``NotImplementedError`` from the base class).

    ``max_iterations_per_instant`` bounds how many scheduling rounds may run at one
    virtual instant before :class:`EmulationLivelock` is raised (legitimate bursts use
    a few thousand rounds at most).
    """

    max_iterations_per_instant = 1_000_000

    #: A thread cannot run beside this loop: virtual time would not see the wall time it
    #: takes. Code that hands control to a thread of its own (a synchronous training
    #: program, geomx/node/program_thread.py) therefore waits for it inside the callback
    #: that handed over, so no other callback runs and the clock stands still until the
    #: thread hands control back. (asyncio's own loops and uvloop run beside threads.)
    threads_run_in_turn = True

    def __init__(self, *, start_time: float = 0.0) -> None:
        super().__init__()
        self._now = float(start_time)
        self._timers: list[tuple[float, int, events.TimerHandle]] = []
        self._timer_seq = itertools.count()
        self._idle: list[events.Handle] = []
        self._callbacks_run = 0
        self._rounds_at_instant = 0
        self._gc_due = math.inf       # callbacks_run at which to collect garbage next
        self._gc_collections = 0

    # -- clock -------------------------------------------------------------------

    def time(self) -> float:
        """Virtual seconds; only advances when nothing is ready to run."""
        return self._now

    @property
    def callbacks_run(self) -> int:
        """Number of callbacks executed so far (a cheap progress/profiling figure)."""
        return self._callbacks_run

    # -- scheduling --------------------------------------------------------------

    def call_soon(self, callback: Callable[..., Any], *args: Any,
                  context: Any = None) -> events.Handle:
        """``BaseEventLoop.call_soon`` without its layers (same handle, same FIFO order)."""
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._debug or not _FAST_HANDLES:
            return super().call_soon(callback, *args, context=context)
        handle = _Handle.__new__(_Handle)
        handle._context = _copy_context() if context is None else context
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)
        return handle

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: Any = None) -> events.TimerHandle:
        """Schedule ``callback(*args)`` at virtual time ``when`` (FIFO among equal times)."""
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._debug or not _FAST_HANDLES:
            timer = _TimerHandle(when, callback, args, self, context)
        else:
            timer = _TimerHandle.__new__(_TimerHandle)
            timer._context = _copy_context() if context is None else context
            timer._loop = self
            timer._callback = callback
            timer._args = args
            timer._cancelled = False
            timer._repr = None
            timer._source_traceback = None
            timer._when = when
        heapq.heappush(self._timers, (when, next(self._timer_seq), timer))
        timer._scheduled = True
        return timer

    def call_at_plain(self, when: float, fn: Callable[[Any], Any], arg: Any) -> None:
        """Run ``fn(arg)`` at virtual time ``when``, in scheduling order with every other
        timer due then. No handle: it cannot be cancelled, and it runs in the loop's own
        ``contextvars`` context (for the emulator's internal callbacks, which read none)."""
        if self._closed:
            raise RuntimeError("Event loop is closed")
        _heappush(self._timers, (when, next(self._timer_seq), fn, arg))

    def soon_plain_entry(self, fn: Callable[[Any], Any],
                         arg: Any) -> tuple[Callable[[Any], None], tuple[float, int, Any, Any]]:
        """A reusable ``call_soon`` for ``fn(arg)`` without a handle: returns the ready
        queue's ``append`` and the entry to pass it; each append runs ``fn(arg)`` once,
        in FIFO order with every other callback, like ``call_soon(fn, arg)`` would, but
        in the loop's own ``contextvars`` context (``fn`` may be ``context.run`` to pick
        another) and without allocating anything per call. It cannot be cancelled."""
        return self._ready.append, (0.0, 0, fn, arg)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any,
                   context: Any = None) -> events.TimerHandle:
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_when_idle(self, callback: Callable[..., Any], *args: Any,
                       context: Any = None) -> events.Handle:
        """Run ``callback(*args)`` once nothing else is ready at the current virtual
        instant, before the clock advances (used to batch per-instant work)."""
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = events.Handle(callback, args, self, context)
        self._idle.append(handle)
        return handle

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> Any:
        """Refused: a thread would run in wall time, outside the virtual clock. Charge
        compute time with ``NodeServices.compute`` (an ``asyncio.sleep``) instead."""
        raise NotImplementedError(
            "run_in_executor/asyncio.to_thread is not available in virtual time: the emulator "
            "runs no threads; charge compute with services.compute(...) instead")

    def _write_to_self(self) -> None:
        # call_soon_threadsafe pokes the selector's self-pipe; there is none here
        # (and no other thread could be running this loop's callbacks anyway).
        pass

    def _process_events(self, event_list: Any) -> None:  # pragma: no cover - no I/O
        pass

    # -- running -----------------------------------------------------------------

    def run_forever(self) -> None:
        """``BaseEventLoop.run_forever`` with CPython's cyclic garbage collector paced by
        the loop instead of by allocations (restored afterwards).

        Every emulated message allocates a handful of container objects (futures,
        handles, tasks, messages) that die young and almost never in a reference cycle:
        reference counting frees them. The collector is triggered by how many more
        objects were allocated than freed, and an emulation's live set swings by that
        much every round (everything in flight), so whatever thresholds are set it keeps
        walking the objects in flight and finding nothing: with the default ones (700,
        10, 10) 40% of the CPU on 8 DCs x 16 workers; with (100k, 20, 100) still 10-13%
        (72 collections reclaimed 352 objects in a 400k-message run). So while the loop
        runs the automatic collector is off, and the loop collects the young generation
        itself every ``_GC_EVERY_CALLBACKS`` callbacks (a middle collection every
        ``_GC_MIDDLE``-th time, a full one every ``_GC_FULL``-th, so a long run does not
        keep old cyclic garbage until it ends): cyclic garbage still goes, at a pace that follows the
        work done. A young collection walks every young object still alive, which is
        roughly everything in flight: 0.5-0.8 s each on 16 DCs x 64 workers, 6% of that
        run at a fixed pace. So the gap to the next collection is also at least
        ``_GC_CALLBACKS_PER_YOUNG_OBJECT`` callbacks per object the last one walked
        (``gc.get_count()[0]``: objects allocated and not freed since the one before; a
        count, not a clock, so the pace is the same on every run). A collector that was
        off stays off.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        self._gc_due = self._callbacks_run + _GC_EVERY_CALLBACKS if was_enabled else math.inf
        try:
            super().run_forever()
        finally:
            if was_enabled:
                gc.enable()

    def _collect_garbage(self) -> None:
        """The loop's own pace of garbage collection (see :meth:`run_forever`)."""
        self._gc_collections += 1
        young = gc.get_count()[0]
        self._gc_due = self._callbacks_run + max(_GC_EVERY_CALLBACKS,
                                                 _GC_CALLBACKS_PER_YOUNG_OBJECT * young)
        n = self._gc_collections
        gc.collect(2 if n % _GC_FULL == 0 else 1 if n % _GC_MIDDLE == 0 else 0)

    # -- the hot path ------------------------------------------------------------

    def _run_once(self) -> None:
        """Run callbacks until the loop is asked to stop.

        ``BaseEventLoop.run_forever`` calls this once per iteration and stops when
        ``_stopping`` is set; we keep iterating inside to save a call and a dozen
        attribute lookups per iteration, and return as soon as ``_stopping`` is set,
        which is exactly when ``run_forever`` would have broken out.

        One iteration: if nothing is ready, run the idle callbacks, or else jump the
        clock to the earliest live timer (deadlock if there is none); move all due
        timers to the ready queue in (deadline, scheduling order); run what is ready.
        """
        ready = self._ready
        popleft = ready.popleft
        heappop = heapq.heappop
        while True:
            timers = self._timers
            if not ready:
                if self._stopping:
                    return
                if self._idle:
                    ready.extend(self._idle)
                    self._idle = []
                else:
                    while timers:
                        head = timers[0]
                        if len(head) != 3 or not head[2]._cancelled:
                            break
                        heappop(timers)[2]._scheduled = False
                        self._timer_cancelled_count -= 1
                    if not timers:
                        raise EmulationDeadlock(self._deadlock_report())
                    when = timers[0][0]
                    if when > self._now:
                        self._now = when
                        self._rounds_at_instant = 0

            self._rounds_at_instant += 1
            if self._rounds_at_instant > self.max_iterations_per_instant:
                self._rounds_at_instant = 0
                raise EmulationLivelock(
                    f"{self.max_iterations_per_instant} scheduling rounds at virtual time "
                    f"{self._now:.9g} s without the clock advancing: a task is probably "
                    "polling with asyncio.sleep(0); wait on an Event or Queue instead")

            if self._timer_cancelled_count > _PURGE_MIN_CANCELLED:
                if 2 * self._timer_cancelled_count > len(timers):
                    self._purge_cancelled()
                    timers = self._timers

            now = self._now
            while timers and timers[0][0] <= now:
                entry = heappop(timers)
                if len(entry) == 4:
                    ready.append(entry)  # a plain timer: (when, seq, fn, arg)
                    continue
                handle = entry[2]
                handle._scheduled = False
                if handle._cancelled:
                    self._timer_cancelled_count -= 1
                else:
                    ready.append(handle)

            ntodo = len(ready)
            self._callbacks_run += ntodo
            if self._callbacks_run >= self._gc_due:
                self._collect_garbage()
            for _ in range(ntodo):
                handle = popleft()
                if handle.__class__ is tuple:
                    try:
                        handle[2](handle[3])
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        self.call_exception_handler({
                            "message": f"Exception in callback {handle[2]!r}({handle[3]!r})",
                            "exception": exc,
                        })
                    continue
                if handle._cancelled:
                    continue
                try:
                    handle._context.run(handle._callback, *handle._args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self.call_exception_handler({
                        "message": f"Exception in callback {handle._callback!r}",
                        "exception": exc,
                        "handle": handle,
                    })
            handle = None  # break reference cycles if an exception is being handled
            if self._stopping:
                return

    def _purge_cancelled(self) -> None:
        kept = []
        for entry in self._timers:
            if len(entry) == 4:
                kept.append(entry)
                continue
            handle = entry[2]
            if handle._cancelled:
                handle._scheduled = False
            else:
                kept.append(entry)
        heapq.heapify(kept)
        self._timers[:] = kept
        self._timer_cancelled_count = 0

    def _deadlock_report(self) -> str:
        waiting = []
        for task in sorted(asyncio.all_tasks(self), key=lambda t: t.get_name()):
            coro = task.get_coro()
            where = getattr(coro, "__qualname__", repr(coro))
            frame = getattr(coro, "cr_frame", None)
            if frame is not None:
                where += f" at {frame.f_code.co_filename}:{frame.f_lineno}"
            waiting.append(f"  {task.get_name()}: {where}")
        detail = "\n".join(waiting[:20])
        if len(waiting) > 20:
            detail += f"\n  ... and {len(waiting) - 20} more"
        return (f"emulation deadlock at virtual time {self._now:.9g} s: no callback is "
                f"ready and no timer is pending, but {len(waiting)} task(s) still wait"
                + (":\n" + detail if detail else ""))

    def close(self) -> None:
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        for entry in self._timers:
            if len(entry) == 3:
                entry[2]._scheduled = False
        self._timers.clear()
        self._idle.clear()
        super().close()


def new_virtual_loop(*, start_time: float = 0.0) -> VirtualTimeLoop:
    """A fresh :class:`VirtualTimeLoop` whose clock reads ``start_time``."""
    return VirtualTimeLoop(start_time=start_time)


def cancel_remaining(loop: VirtualTimeLoop) -> None:
    """Cancel every task still pending on ``loop`` and let them finish in virtual time
    (a job that failed leaves its other nodes' tasks behind)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    try:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    except EmulationDeadlock:
        # A task swallowed its cancellation and went back to waiting; nothing more
        # can be done for it in a loop that is about to close.
        return
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            loop.call_exception_handler({
                "message": "unhandled exception in a task cancelled at the end of run_virtual",
                "exception": t.exception(),
                "task": t,
            })


def run_virtual(coro: Coroutine[Any, Any, T] | Awaitable[T], *,
                start_time: float = 0.0) -> T:
    """Run ``coro`` to completion on a new :class:`VirtualTimeLoop` and return its result.

    Like :func:`asyncio.run` but in virtual time: tasks still pending when ``coro``
    returns are cancelled, the loop is closed. Raises :class:`EmulationDeadlock` if the
    program can make no further progress.
    """
    loop = new_virtual_loop(start_time=start_time)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            cancel_remaining(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
