"""Rank claims (geomx/runtime/rank_claim.py): a process started without a rank gets the
first free name of its kind from its scheduler, reserved for its token."""

from __future__ import annotations

import pytest

from geomx.node.scheduler import CLAIM_PREFIX, Scheduler
from geomx.transport import TransportDefaults
from geomx.wire import Kind, Message


class _Book(TransportDefaults):
    """A scheduler's transport stand-in: records what it sends."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.book: dict[str, str] = {}

    def set_address_book(self, book: dict[str, str]) -> None:
        from geomx.runtime.tcp import parse_address

        for address in book.values():
            parse_address(address)  # ValueError, as the real transport's
        self.book = dict(book)


def _scheduler() -> tuple[Scheduler, list[Message]]:
    members = ["ls:a", "w:a:0", "w:a:1", "w:a:2"]
    sched = Scheduler("lh:a", "a", _Book(), _Services(), members)  # handlers only: no loop
    sent: list[Message] = []
    sched.post = sent.append  # type: ignore[method-assign]
    return sched, sent


class _Services:
    def now(self) -> float:
        return 0.0

    def record(self, *a, **k) -> None:
        pass

    def count_bytes(self, msg) -> None:
        pass


def _claim(token: str, kind: str = "w:a:", src: str | None = None) -> Message:
    return Message(Kind.REGISTER, src or f"{CLAIM_PREFIX}{token}", "lh:a", request_id=1,
                   meta={"claim": token, "kind": kind, "address": "127.0.0.1:1"})


def test_claims_get_the_first_free_rank_in_asking_order_and_are_reserved():
    sched, sent = _scheduler()
    sched._on_register(Message(Kind.REGISTER, "w:a:0", "lh:a", request_id=1,
                               meta={"address": "127.0.0.1:2"}))  # explicit rank 0 came first
    sched._on_register(_claim("t1"))
    sched._on_register(_claim("t2"))
    sched._on_register(_claim("t1"))  # a retry gets the same name
    acks = [m for m in sent if m.kind == Kind.REGISTER_ACK]
    assert [m.meta["claimed"] for m in acks] == ["w:a:1", "w:a:2", "w:a:1"]
    assert all(m.dst.startswith(CLAIM_PREFIX) for m in acks)  # replies go to the claimant
    sched._on_register(_claim("t3"))  # none left
    err = sent[-1]
    assert err.kind == Kind.ERROR and "no free w:a:*" in err.meta["reason"]
    # the claimed name is only the token holder's
    sched._on_register(Message(Kind.REGISTER, "w:a:1", "lh:a", request_id=2,
                               meta={"address": "127.0.0.1:3"}))
    assert sent[-1].kind == Kind.ERROR and "claimed by another process" in sent[-1].meta["reason"]
    sched._on_register(Message(Kind.REGISTER, "w:a:1", "lh:a", request_id=2,
                               meta={"address": "127.0.0.1:3", "claim_token": "t1"}))
    assert "w:a:1" in sched._register_requests


def test_a_claim_flood_cannot_grow_the_scheduler():
    sched, sent = _scheduler()
    for i in range(10_000):
        sched._on_register(_claim(f"x{i}", kind="gs:"))  # no such members here
    assert len(sched._claimants) == sched._max_claimants == 2 * 4 + 8
    assert len(sched.address_book) <= sched._max_claimants
    assert len(sent) == sched._max_claimants  # beyond the bound, no answer at all
    # a claim must come from a provisional name, and name a kind that exists
    sched2, sent2 = _scheduler()
    sched2._on_register(_claim("t", src="w:a:0"))
    assert sent2 == []
    sched2._on_register(_claim("t", kind="w:a"))  # no trailing ':'
    assert sent2[-1].kind == Kind.ERROR


@pytest.mark.parametrize("kind", ["w:a:", "gs:"])
def test_kind_prefix_of_names(kind):
    from geomx.runtime.rank_claim import _kind_prefix

    assert _kind_prefix(kind + "3") == kind


def test_an_unreachable_claimant_does_not_stop_the_scheduler():
    """A stranger's claim with an address nobody listens at: the answer fails to send,
    and the scheduler goes on (a failed send to a member would fail it by name)."""
    import asyncio

    class Unreachable(_Book):
        async def send(self, msg):
            raise ConnectionError(f"cannot reach {msg.dst}")

    async def main():
        sched = Scheduler("lh:a", "a", Unreachable(), _Services(), ["ls:a", "w:a:0"])
        outbox: asyncio.PriorityQueue = asyncio.PriorityQueue()
        outbox.put_nowait((0, 1, Message(Kind.REGISTER_ACK, "lh:a", f"{CLAIM_PREFIX}x")))
        outbox.put_nowait((0, 2, None))
        await asyncio.wait_for(sched._send_loop(outbox), 5)  # returns: no NodeFailure
        outbox.put_nowait((0, 3, Message(Kind.REGISTER_ACK, "lh:a", "w:a:0")))
        with pytest.raises(Exception, match="could not deliver"):
            await asyncio.wait_for(sched._send_loop(outbox), 5)
    asyncio.run(main())


def test_claims_without_a_usable_address_get_no_answer():
    sched, sent = _scheduler()
    for address in ("", "no-port", "host:notaport"):
        sched._on_register(Message(Kind.REGISTER, f"{CLAIM_PREFIX}t", "lh:a", request_id=1,
                                   meta={"claim": "t", "kind": "w:a:", "address": address}))
    assert sent == [] and sched._claims == {} and not sched._claimants
