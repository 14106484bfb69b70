"""``MembersOnly``, the real node's transport wrapper, implements the Transport contract
by calling its inner transport's features directly: members' messages pass, strangers'
are dropped and counted, and nothing outside the contract shows through."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from geomx.runtime.node_main import MembersOnly
from geomx.transport import Transport, TransportDefaults
from geomx.wire import Kind, Message
from tests.helpers.aio import arun


class _Inner(TransportDefaults):
    """A transport whose optional features record their calls (and take everything)."""

    name = "w:0"

    def __init__(self, incoming: list[Message]):
        self.incoming = incoming
        self.sent_nowait: list[Message] = []
        self.receives: list[tuple[str, int]] = []
        self.forgotten: list[int] = []

    async def send(self, msg: Message) -> None:
        raise AssertionError("only send_nowait is used here")

    async def recv(self) -> Message:
        raise AssertionError("listen does not use recv")

    def send_nowait(self, msg: Message) -> bool:
        self.sent_nowait.append(msg)
        return True

    async def listen(self, handler: Callable[[Message], None]) -> None:
        for msg in self.incoming:
            handler(msg)

    def receive_into(self, peer: str, request_id: int, sink: Any) -> bool:
        self.receives.append((peer, request_id))
        return True

    def forget_receive(self, request_id: int) -> None:
        self.forgotten.append(request_id)

    def stats(self) -> dict:
        return {}


def test_members_only_is_a_transport_and_filters_both_directions():
    incoming = [Message(Kind.PULL, "gs:0", "w:0", key=1), Message(Kind.PULL, "stranger", "w:0"),
                Message(Kind.PULL, "w:1", "w:0", key=2)]
    inner = _Inner(incoming)
    wrapper = MembersOnly(inner, {"w:0", "w:1", "gs:0"})
    assert isinstance(wrapper, Transport)
    assert wrapper.name == "w:0"
    assert not hasattr(wrapper, "stats")  # the owner of the inner transport reads it

    assert wrapper.send_nowait(Message(Kind.PUSH, "w:0", "gs:0", key=1))
    assert not wrapper.send_nowait(Message(Kind.PUSH, "w:0", "stranger", key=1))
    assert [m.dst for m in inner.sent_nowait] == ["gs:0"]

    got: list[Message] = []
    arun(wrapper.listen(got.append))
    assert [m.src for m in got] == ["gs:0", "w:1"]
    assert wrapper.dropped_from_strangers == 1

    assert wrapper.receive_into("gs:0", 7, np.zeros(4, dtype=np.float32))
    wrapper.forget_receive(7)
    assert inner.receives == [("gs:0", 7)] and inner.forgotten == [7]


def test_sends_to_strangers_are_dropped_and_counted():
    inner = _Inner([])
    wrapper = MembersOnly(inner, {"w:0", "gs:0"})
    arun(wrapper.send(Message(Kind.PUSH_ACK, "w:0", "stranger", key=1)))
    assert wrapper.dropped_to_strangers == 1
