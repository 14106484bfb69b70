"""One operation, two ways to wait: a blocking call in a synchronous program, an
awaitable in an ``async def main``.

Each ``geomx.torch`` operation is written once, as a generator that starts kvstore calls
(``init``, ``push``, ``pull`` return at once) and yields the list of what it must wait
for before it goes on. :func:`drive` runs it: in a plain ``def main(kv, ctx)`` the wait
is ``kv.waitall()``, which blocks there; in an ``async def main`` it returns a coroutine
that awaits the yielded calls. Nothing else differs between the two forms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, TypeVar

from geomx.torch.session import Session

T = TypeVar("T")

#: what an operation yields: the calls it started and must see finished
Waits = list[Any]
Operation = Generator[Waits, None, T]


def drive(session: Session, op: Operation[T]) -> Any:
    """Run ``op`` to its end: blocking in a synchronous program (its value returned), else
    a coroutine to ``await`` (which returns the value)."""
    if session.sync_program():
        return _drive_blocking(session, op)
    return _drive_async(op)


def _drive_blocking(session: Session, op: Operation[T]) -> T:
    from geomx.kv import run_blocking

    try:
        waits = op.send(None)
        while True:
            session.kv.waitall()
            # what is not a kvstore call (a request to the state server) is awaited on
            # the node's loop, which owns it
            for w in waits:
                if isinstance(w, asyncio.Future) and not w.done():
                    run_blocking(_itself, w, call="geomx.torch", async_form="await ...")
            waits = op.send(None)
    except StopIteration as done:
        return done.value


def _itself(awaitable: Any) -> Any:
    return awaitable


def on_loop(session: Session, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` made on the node's event loop: directly in an ``async def main``
    (which runs there), through ``geomx.kv.run_on_loop`` from a synchronous program's
    thread. For calls that touch the node itself rather than the kvstore."""
    if session.sync_program():
        from geomx.kv import run_on_loop

        return run_on_loop(fn, *args, call="geomx.torch")
    return fn(*args)


async def _drive_async(op: Operation[T]) -> T:
    try:
        waits = op.send(None)
        while True:
            if waits:
                await asyncio.gather(*waits)
            waits = op.send(None)
    except StopIteration as done:
        return done.value
