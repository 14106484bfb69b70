"""One request as a future and callbacks, not a task: the kvstore's per-key push and pull.

``kv.push(key, value)`` could be a task that builds the message, awaits
:meth:`~geomx.node.base.Node.request` and learns from the reply. A task costs the loop a
first step, a wake-up and a done callback per call, plus a coroutine frame; for a program
that pushes and pulls thousands of small keys (MXNet-style per-key calls) that is most of
the per-message work. :func:`request_soon` does the same with one call_soon'd start and the
reply future's callback, in the same places of the loop's ready queue as the task's first
step and its wake-up, so the emulator's order of events (and hence every emulated time) is
what the task would give. It uses the node's public request API (``open_request``,
``close_request``, ``track_call``, ``set_failure``), as :meth:`Node.request` does.

Failures follow :meth:`Node.spawn`'s rule: the returned future fails with the error, and
the node stops with it unless it was caused by the node stopping. Futures still open when
the node stops are cancelled, as its tasks are.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from typing import Any, Callable

from geomx.node.base import Node, expire_reply, no_reply, refused
from geomx.policy.guard import PolicyFailed
from geomx.wire import Kind, Message

log = logging.getLogger(__name__)

_ERROR = Kind.ERROR  # (a module global reads faster than the enum's attribute)

#: builds the request when the call starts: the message and an array its reply's dense
#: payload may be received into (or None)
Start = Callable[[], "tuple[Message, Any]"]


def request_soon(node: Node, start: Start, then: Callable[[Message], Any], *,
                 after: asyncio.Future[Any] | None = None,
                 after_failed: Callable[[BaseException], BaseException] | None = None
                 ) -> asyncio.Future[Any]:
    """What ``node.spawn(c())`` gives for ``async def c(): await after; msg, sink = start();
    return then(await node.request(msg, sink=sink))``, without the task.

    ``after``: a call this one must follow (this worker's previous call on the key); its
    failure fails this one with ``after_failed(exc)``.
    """
    loop = node.event_loop()
    done = loop.create_future()
    node.track_call(done)
    # the task's first step would run on the next turn: so does this start
    loop.call_soon(_first_step, node, start, then, done, after, after_failed)
    return done


def _first_step(node: Node, start: Start, then: Callable[[Message], Any],
                done: asyncio.Future[Any], after: asyncio.Future[Any] | None,
                after_failed: Callable[[BaseException], BaseException] | None) -> None:
    if done.done():
        return  # cancelled: the node stopped
    if after is not None and not after.done():
        after.add_done_callback(functools.partial(_after_done, node, start, then, done,
                                                  after_failed))
        return
    if after is not None:
        _after_done(node, start, then, done, after_failed, after)
        return
    _send(node, start, then, done)


def _after_done(node: Node, start: Start, then: Callable[[Message], Any],
                done: asyncio.Future[Any],
                after_failed: Callable[[BaseException], BaseException] | None,
                after: asyncio.Future[Any]) -> None:
    if done.done() or _settled_by(node, done, after, after_failed):
        return
    _send(node, start, then, done)


def _settled_by(node: Node, done: asyncio.Future[Any], fut: asyncio.Future[Any],
                failure: Callable[[BaseException], BaseException] | None) -> bool:
    """Cancel ``done`` if ``fut`` was cancelled, fail it with ``failure(exc)`` (or the
    exception itself) if ``fut`` failed; whether either happened."""
    if fut.cancelled():
        _cancel(node, done)
        return True
    exc = fut.exception()
    if exc is None:
        return False
    _fail(node, done, failure(exc) if failure is not None else exc)
    return True


def _no_reply(node: Node, msg: Message, exc: BaseException) -> BaseException:
    """A reply future's failure as the caller sees it: its timeout names the peer."""
    if isinstance(exc, asyncio.TimeoutError):
        return no_reply(node.name, msg, node.request_timeout_s)
    return exc


def _send(node: Node, start: Start, then: Callable[[Message], Any],
          done: asyncio.Future[Any]) -> None:
    """:meth:`Node.request`'s part before its ``await``."""
    try:
        msg, sink = start()
    except BaseException as e:  # (as a task's exception would be)
        _fail(node, done, e)
        return
    fut, into = node.open_request(msg, sink)
    try:
        node.post(msg)
    except BaseException as e:
        node.close_request(msg.request_id, into)
        _fail(node, done, e)
        return
    timer = None
    if node.request_timeout_s > 0 and node.request_timeout_s != math.inf:
        timer = node.event_loop().call_later(node.request_timeout_s, expire_reply, fut)
    fut.add_done_callback(functools.partial(_replied, node, msg, then, done, timer, into))


def _replied(node: Node, msg: Message, then: Callable[[Message], Any],
             done: asyncio.Future[Any], timer: asyncio.TimerHandle | None, into: bool,
             fut: asyncio.Future[Message]) -> None:
    """:meth:`Node.request`'s part after its ``await``, then ``then``."""
    if timer is not None:
        timer.cancel()
    node.close_request(msg.request_id, into)
    if done.done() or _settled_by(node, done, fut, functools.partial(_no_reply, node, msg)):
        return
    reply = fut.result()
    if reply.kind == _ERROR:
        _fail(node, done, refused(msg, reply))
        return
    try:
        result = then(reply)
    except BaseException as e:
        _fail(node, done, e)
        return
    node.untrack_call(done)
    done.set_result(result)


def _cancel(node: Node, done: asyncio.Future[Any]) -> None:
    node.untrack_call(done)
    done.cancel()


def _fail(node: Node, done: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail the call, and the node with it, as the node does when one of its tasks fails."""
    node.untrack_call(done)
    done.set_exception(exc)
    done.exception()  # retrieved: the node reports it, as it does a task's
    if node.set_failure(exc):
        log.error("%s: request failed: %r", node.name, exc,
                  exc_info=None if isinstance(exc, PolicyFailed) else exc)
        node.stop()
