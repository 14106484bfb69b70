"""Traffic shaping in the transport: bandwidth, delay, jitter, loss (timing asserted loosely)."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from geomx.runtime.shaper import (MATHIS_C, MSS_BYTES, LinkShape, Shaper, TokenBucket)
from geomx.runtime.tcp import TcpTransport
from geomx.wire import Kind, Message, Payload

from tests.helpers.aio import arun, start_pair


async def pair(shape: LinkShape, seed: int = 1, **kw) -> tuple[TcpTransport, TcpTransport]:
    a = TcpTransport("a", shaper=Shaper({"b": shape}, seed=seed), **kw)
    b = TcpTransport("b", **kw)
    await start_pair(a, b)
    return a, b


def blob(nbytes: int, i: int = 0, ch: int = 0, prio: int = 0) -> Message:
    return Message(Kind.PUSH, "a", "b", request_id=i, channel=ch, priority=prio,
                   payloads=[Payload.of(np.ones(nbytes // 4, np.float32))])


# -- the model, without sockets ------------------------------------------------------------

def test_link_shape_validation_and_units():
    s = LinkShape(50e6, 0.04)
    assert s.rate_Bps == 6.25e6 and math.isinf(s.reliable_rate_Bps)
    assert s.transfer_time_s(20_000_000) == pytest.approx(3.24)
    assert math.isinf(LinkShape(0).rate_Bps)
    for bad in (dict(bandwidth_bps=-1), dict(bandwidth_bps=1, delay_s=-1),
                dict(bandwidth_bps=1, jitter_s=math.inf), dict(bandwidth_bps=1, loss=1.5),
                dict(bandwidth_bps=1, burst_bytes=0)):
        with pytest.raises(ValueError, match="LinkShape"):
            LinkShape(**bad)
    with pytest.raises(TypeError, match="'x'"):
        Shaper({"x": (1, 2)})  # type: ignore[dict-item]


def test_mathis_cap_for_lossy_reliable_links():
    s = LinkShape(1e9, 0.025, loss=0.01)
    want = MSS_BYTES * MATHIS_C / (0.05 * 0.1)
    assert s.reliable_rate_Bps == pytest.approx(want)
    assert s.transfer_time_s(1_000_000) == pytest.approx(1_000_000 / want + 0.025)
    assert LinkShape(1e9, 0.0, loss=0.01).reliable_rate_Bps == pytest.approx(
        MSS_BYTES * MATHIS_C / (0.001 * 0.1))  # RTT floor
    assert LinkShape(1e9, 0.05, tcp_window_bytes=4 << 20).reliable_rate_Bps == \
        pytest.approx((4 << 20) / 0.1)             # the optional window/RTT cap
    assert LinkShape(1e9, 0.05, loss=0.01, rtt_s=0.2).rtt == 0.2


def test_token_bucket_is_a_virtual_finish_time():
    b = TokenBucket(1000.0, burst_bytes=100)
    assert b.transmit(100, now=10.0) == pytest.approx(10.0)      # the burst credit
    assert b.transmit(500, now=10.0) == pytest.approx(10.5)      # then paced at the rate
    assert b.transmit(500, now=10.2) == pytest.approx(11.0)      # queued behind the last
    assert b.transmit(50, now=20.0) == pytest.approx(20.0)       # idle: credit again, capped
    assert b.transmit(200, now=20.0) == pytest.approx(20.15)


def test_jitter_and_loss_are_seeded():
    shape = LinkShape(1e6, 0.01, jitter_s=0.005, loss=0.3)

    def draws(seed):
        link = Shaper({"p": shape}, seed=seed).link("p")
        return [link.sample_delay() for _ in range(50)], [link.lose() for _ in range(200)]

    d1, l1 = draws(7)
    assert (d1, l1) == draws(7) and (d1, l1) != draws(8)
    assert all(0.005 <= d <= 0.015 for d in d1)  # the emulator's: delay +- jitter
    assert abs(sum(d1) / len(d1) - 0.01) < 0.0015  # centred on the delay (mean jitter 0)
    big = Shaper({"p": LinkShape(1e6, 0.001, jitter_s=0.01)}, seed=3).link("p")
    assert min(big.sample_delay() for _ in range(100)) == 0.0  # never negative
    assert 30 < sum(l1) < 90
    assert Shaper({}, seed=1).link("p") is None
    assert Shaper({}, default=shape).link("p").shape is shape


# -- over loopback --------------------------------------------------------------------------

@pytest.mark.slow
def test_20MB_over_50Mbps_40ms_takes_3_24_s():
    async def main():
        a, b = await pair(LinkShape(50e6, 0.040))
        await a.connect("b", 0)
        t0 = time.perf_counter()
        await a.send(blob(20_000_000))
        got = await b.recv()
        elapsed = time.perf_counter() - t0
        assert got.payloads[0].nbytes == 20_000_000
        await a.close()
        await b.close()
        return elapsed
    elapsed = arun(main())
    print(f"\n20 MB over 50 Mbps / 40 ms: {elapsed:.3f} s (ideal 3.240 s)")
    assert elapsed == pytest.approx(3.24, rel=0.25)


def test_delay_does_not_serialise_the_link():
    async def main():
        a, b = await pair(LinkShape(1e9, 0.100))
        await a.connect("b", 0)
        t0 = time.perf_counter()
        for i in range(20):
            await a.send(blob(1000, i))
        arrivals = []
        for _ in range(20):
            m = await b.recv()
            arrivals.append((m.request_id, time.perf_counter() - t0))
        await a.close()
        await b.close()
        return arrivals
    arrivals = arun(main())
    assert [i for i, _ in arrivals] == list(range(20))
    assert arrivals[0][1] >= 0.095            # nothing arrives before the delay ...
    assert arrivals[-1][1] < 0.100 + 0.3      # ... and 20 messages take ~one delay, not 20


def test_bandwidth_paces_a_stream_of_messages():
    async def main():
        a, b = await pair(LinkShape(40e6, 0.0))   # 5 MB/s
        await a.connect("b", 0)
        t0 = time.perf_counter()
        for i in range(10):
            await a.send(blob(200_000, i))          # 2 MB in all -> 0.4 s
        for _ in range(10):
            await b.recv()
        elapsed = time.perf_counter() - t0
        st = a.stats()["peers"]["b"]
        await a.close()
        await b.close()
        return elapsed, st
    elapsed, st = arun(main())
    assert 0.3 <= elapsed <= 0.7   # ideal 0.4 s; loose: the machine is shared
    assert st["msgs_sent"] == 10 and st["bytes_sent"] > 2_000_000


def test_loss_on_reliable_channels_slows_instead_of_dropping():
    shape = LinkShape(1e9, 0.005, loss=0.01)
    predicted = shape.transfer_time_s(1_000_000)     # Mathis: ~0.57 s

    async def main():
        a, b = await pair(shape)
        await a.connect("b", 0)
        t0 = time.perf_counter()
        for i in range(4):
            await a.send(blob(250_000, i))
        ids = [(await b.recv()).request_id for _ in range(4)]
        elapsed = time.perf_counter() - t0
        await a.close()
        await b.close()
        return ids, elapsed
    ids, elapsed = arun(main())
    assert ids == [0, 1, 2, 3]
    assert 0.8 * predicted <= elapsed <= 1.6 * predicted


def test_loss_applies_to_udp_datagrams():
    async def main():
        a, b = await pair(LinkShape(1e9, 0.002, loss=0.3), seed=11)
        n = 200
        for i in range(n):
            await a.send(blob(400, i, ch=8))          # one datagram each
        await a.send(blob(400, 999, ch=0))            # a reliable marker, sent last
        got = []
        while True:
            m = await b.recv()
            if m.request_id == 999:
                break
            got.append(m.request_id)
        await asyncio.sleep(0.05)
        while b.pending():
            got.append((await b.recv()).request_id)
        lost = a.stats()["shaper"]["b"]["datagrams_lost"]
        await a.close()
        await b.close()
        return n, got, lost
    n, got, lost = arun(main())
    assert 30 < lost < 90
    assert len(got) == n - lost and len(set(got)) == len(got)


def test_multi_chunk_udp_message_lost_when_any_chunk_is():
    async def main():
        a, b = await pair(LinkShape(0, 0.0, loss=1.0), udp_reassembly_timeout_s=0.1)
        for i in range(3):
            await a.send(blob(10_000, i, ch=9))
        await a.send(blob(100, 7, ch=1))       # reliable channels are never dropped
        m = await b.recv()
        await asyncio.sleep(0.2)
        st_a, st_b = a.stats(), b.stats()
        await a.close()
        await b.close()
        return m, st_a, st_b
    m, st_a, st_b = arun(main())
    assert m.request_id == 7 and st_b["udp"]["messages_received"] == 0
    assert st_a["udp"]["datagrams_lost_by_shaper"] == st_a["udp"]["datagrams_sent"] == 3 * 8


def test_priority_order_on_a_shaped_link():
    async def main():
        a, b = await pair(LinkShape(20e6, 0.01))
        await a.connect("b", 0)
        prios = [0, 3, 1, 3, 2, 0, 5]
        for i, p in enumerate(prios):
            await a.send(blob(50_000, i, prio=p))
        order = [(await b.recv()).request_id for _ in prios]
        await a.close()
        await b.close()
        return prios, order
    prios, order = arun(main())
    assert order == sorted(range(len(prios)), key=lambda i: (-prios[i], i))
