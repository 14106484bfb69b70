"""Running a test's coroutine on geomx's own event loop, failing instead of hanging."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from geomx.runtime import eventloop

T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T], timeout_s: float = 30.0,
         use_uvloop: bool | None = None) -> T:
    """Run ``coro`` on a fresh loop (uvloop where geomx would pick it, unless ``use_uvloop``
    says otherwise); a test that waits more than ``timeout_s`` seconds fails with
    TimeoutError rather than stalling the suite until pytest-timeout kills it."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, timeout_s)

    return eventloop.run(guarded(), use_uvloop=use_uvloop)


async def start_pair(a: Any, b: Any) -> None:
    """Start transports ``a`` and ``b`` (named "a" and "b") and give each the other's
    address."""
    for t in (a, b):
        await t.start()
    book = {"a": a.local_address(), "b": b.local_address()}
    a.set_address_book(book)
    b.set_address_book(book)
