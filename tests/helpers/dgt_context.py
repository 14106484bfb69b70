"""A stand-in for the scheduler context a DGT sender or receiver is given
(geomx/policy/scheduling.py), so the DGT tests drive geomx/sched/dgt.py without a node:
every post goes through the wire format and is captured, every event is kept."""

from __future__ import annotations

import asyncio

from geomx.node.link_codec import LinkCodec
from geomx.wire import Kind, Message, decode, encode


class FakeSchedContext:
    """Enough of a scheduler context for ``DgtSender`` / ``DgtReceiver``: ``codec`` is the
    job's ``[codec]`` table (``None``: no codec)."""

    def __init__(self, codec: dict | None = None, name: str = "ls:a"):
        self.node_name = name
        self.codec = LinkCodec(codec)
        self.posted: list[Message] = []
        self.events: list[tuple[str, dict]] = []
        self._rid = 0

    def post(self, msg: Message) -> None:
        self.posted.append(decode(b"".join(bytes(f) for f in encode(msg))))

    async def request(self, msg: Message) -> Message:
        self._rid += 1
        msg.request_id = self._rid
        self.post(msg)
        return msg.reply(Kind.PUSH_ACK)

    def record(self, ev: str, **fields) -> None:
        self.events.append((ev, fields))

    def encode_push(self, key, value, *, tier):
        return self.codec.encode_push(key, value, tier=tier)

    def codec_for(self, num_elements, *, tier):
        return self.codec.codec_for(num_elements, tier)

    def decode(self, msg, like=None):
        return self.codec.decode(msg, like=like)


def push_round(sender, ctx: FakeSchedContext, value, round_: int, key: int = 0) -> list[Message]:
    """What ``sender`` posts for one round's push of ``value`` to gs:0."""
    ctx.posted.clear()
    asyncio.run(sender.push(ctx, "gs:0", key, 0, round_, value, {}))
    return list(ctx.posted)
