"""The context a transfer scheduler's side gets on its node (geomx/policy/scheduling.py).

One class backs every role: it forwards the few operations a scheduler may use to the
node (messages, events, the clock, tasks, the node's current codec, seeded random
numbers) and, per role, the node's hook for merged pushes and what a side may read of
the node's state. Schedulers never hold the node itself (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from geomx.policy.scheduling import SchedCoordinatorSide, Uniform, Value
from geomx.wire import Kind, Message, Payload

__all__ = ["SchedNodeContext", "install_coordinators"]


class SchedNodeContext:
    """A node as its transfer scheduler sides see it (every role's context protocol)."""

    __slots__ = ("_node", "_job", "_codec_attr", "_accept", "workers", "pushers", "now",
                 "record", "spawn", "request", "post", "on", "reply_error")

    #: the node's own methods, bound once (a scheduler's messages pay no extra call):
    #: ``now() -> float``, ``record(event, **fields)``, ``spawn(coro) -> Task``,
    #: ``await request(msg, timeout_s=None) -> Message``, ``post(msg)``,
    #: ``on(kind, handler)``, ``reply_error(msg, reason)``
    now: Callable[[], float]
    record: Callable[..., None]
    spawn: Callable[..., Any]
    request: Callable[..., Coroutine[Any, Any, Message]]
    post: Callable[[Message], None]
    on: Callable[[Kind, Callable[[Message], None]], None]
    reply_error: Callable[[Message, str], None]

    def __init__(self, node: Any, job: Any, *, codec_attr: str = "codec",
                 accept_merged: Callable[[Message, Value, int, list[str]], None] | None = None,
                 workers: Sequence[str] = (), pushers: Sequence[str] = ()):
        self._node = node
        self._job = job
        self._codec_attr = codec_attr  # the node may replace its codec (a command)
        self._accept = accept_merged
        self.workers = workers
        self.pushers = pushers
        self.now = node.now
        self.record = node.record
        self.spawn = node.spawn
        self.request = node.request
        self.post = node.post
        self.on = node.on
        self.reply_error = node.reply_error

    @property
    def node_name(self) -> str:
        return str(self._node.name)

    @property
    def dc(self) -> str:
        return str(self._node.dc)

    @property
    def job(self) -> Any:
        return self._job

    @property
    def is_master(self) -> bool:
        return bool(getattr(self._node, "is_master", False))

    @property
    def stop_requested(self) -> bool:
        return bool(self._node.stop_requested)

    @property
    def has_optimizer(self) -> bool:
        return self._node.optimizer is not None

    def reply_meta(self, version: int, key: int, part: int) -> dict[str, Any]:
        return dict(self._node.reply_meta(version, key, part))

    def encode_push(self, key: int, value: Value, *,
                    tier: str) -> tuple[list[Payload], dict[str, Any]]:
        return getattr(self._node, self._codec_attr).encode_push(key, value, tier=tier)

    def encode_pull(self, key: int, value: Value, *, tier: str,
                    weights: bool = False) -> tuple[list[Payload], dict[str, Any]]:
        return getattr(self._node, self._codec_attr).encode_pull(key, value, tier=tier,
                                                                 weights=weights)

    def codec_for(self, num_elements: int, *, tier: str) -> Any:
        return getattr(self._node, self._codec_attr).codec_for(num_elements, tier)

    def decode(self, msg: Message, like: Value | None = None) -> Value:
        return getattr(self._node, self._codec_attr).decode(msg, like=like)

    def rng(self, name: str) -> Uniform:
        return self._node.services.rng(name)

    def accept_merged(self, msg: Message, value: Value, count: int,
                      senders: list[str]) -> None:
        if self._accept is None:
            raise ValueError(f"{self._node.name} takes no merged pushes")
        self._accept(msg, value, count, senders)


def install_coordinators(node: Any, job: Any) -> list[object]:
    """Give a scheduler node the coordinators of the job's transfer schedulers (those
    that decide transfers centrally; none for most jobs)."""
    ctx = SchedNodeContext(node, job)
    sides = (s.coordinator_side(ctx) for s in job.transfer_schedulers)
    out = [c for c in sides if c is not None]
    node.coordinators.extend(c for c in out if isinstance(c, SchedCoordinatorSide))
    return out
