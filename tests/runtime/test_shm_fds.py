"""Shared-memory rings cost nothing where they are not used (geomx/runtime/shm_ring.py,
docs/real-runtime.md "Same-host transfers"): a connection asks for a ring only when it
first has a message of RING_MIN_MESSAGE_BYTES or more, so connections that carry only
small messages -- all of a scheduler's -- hold no ring, mapping or file descriptor on
either side; a large value still goes through one; a peer cannot offer twice or answer
an offer nobody made; a receiver maps a bounded count of rings."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from geomx.runtime.framing import (PREAMBLE, FrameType, control_frame, pack_preamble,
)
from geomx.runtime.shm_ring import (MIN_RING_BYTES, RING_MIN_MESSAGE_BYTES, RingBudget,
                                    SendRing, default_max_rings, host_identity)
from geomx.runtime.tcp import TcpTransport, parse_address
from geomx.wire import Kind, Message, Payload
from tests.helpers.aio import arun, start_pair
from tests.helpers.rings import ring_fds, ring_maps, tcp_pair
from tests.helpers.procs import descendants

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.toml"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="rings are Linux-only")


def msg(n_floats: int, rid: int, src: str = "a", dst: str = "b") -> Message:
    data = np.arange(n_floats, dtype=np.float32)
    return Message(Kind.PUSH, src, dst, key=1, request_id=rid, payloads=[Payload.of(data)])



def test_small_messages_never_make_a_ring_and_the_first_large_one_does():
    """Both directions carry small messages (just under the ring's minimum included):
    neither side holds a ring, a mapping or a ring fd. Then a large value: it goes
    through a ring, from its first piece; each side keeps at most one fd for it (mmap's
    own, before Python 3.13) and one mapping."""
    async def main():
        a, b = await tcp_pair()
        small = RING_MIN_MESSAGE_BYTES // 4 - 64  # floats: just under the minimum
        for i in range(20):
            await a.send(msg(10, rid=i))
            await b.send(msg(10, rid=i, src="b", dst="a"))
        await a.send(msg(small, rid=100))
        for _ in range(21):
            await b.recv()
        for _ in range(20):
            await a.recv()
        for t in (a, b):
            st = t.stats()["shm"]
            assert st["rings_out"] == st["rings_in"] == st["mapped_bytes"] == 0, st
        assert ring_fds() == 0 and ring_maps() == 0

        big = msg(3_000_000, rid=200)  # 12 MB: three 4 MiB pieces
        await a.send(big)
        got = await b.recv()
        np.testing.assert_array_equal(got.payloads[0].data, big.payloads[0].data)
        sa, sb = a.stats()["shm"], b.stats()["shm"]
        assert sa["rings_out"] == 1 and sb["rings_in"] == 1
        assert sa["pieces_out"] == sb["pieces_in"] == 3
        assert sb["rings_out"] == 0 and sa["rings_in"] == 0  # b sent no large message
        assert ring_maps() == 2
        assert ring_fds() == (0 if sys.version_info >= (3, 13) else 2)
        await a.close()
        await b.close()
        assert ring_fds() == 0 and ring_maps() == 0
    arun(main())


def test_a_receiver_without_rings_is_never_offered_one():
    """The receiver has rings off (its WELCOME says so): no large message asks, none
    is ever made, and every value takes the socket."""
    async def main():
        a = TcpTransport("a", udp=False)
        b = TcpTransport("b", udp=False, shm_ring_bytes=0)
        await start_pair(a, b)
        for i in range(3):
            m = msg(600_000, rid=i)
            await a.send(m)
            got = await b.recv()
            np.testing.assert_array_equal(got.payloads[0].data, m.payloads[0].data)
        assert a.stats()["shm"]["rings_out"] == 0
        assert b.stats()["shm"]["refused_offers"] == 0  # rings off: nothing to refuse
        assert ring_fds() == 0 and ring_maps() == 0
        await a.close()
        await b.close()
    arun(main())


async def _raw_open(victim: TcpTransport, hello_shm: str | None):
    """A stranger's connection to ``victim``, its HELLO's ``shm`` ``hello_shm``."""
    host, port = parse_address(victim.local_address())
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(control_frame(FrameType.HELLO, v=1, name="x", to="victim", ch=0,
                               auth=False, **({"shm": hello_shm} if hello_shm else {})))
    ftype, welcome = await _read_frame(reader)
    assert ftype == FrameType.WELCOME
    assert json.loads(welcome).get("shm") is (True if hello_shm == host_identity() else None)
    return reader, writer


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    _, ftype, _, n = PREAMBLE.unpack(await reader.readexactly(PREAMBLE.size))
    return ftype, await reader.readexactly(n)


def _offer_frame(offer: object) -> bytes:
    body = json.dumps({"shm": offer}).encode()
    return pack_preamble(FrameType.SHM_OFFER, len(body)) + body


def test_a_peer_offers_one_ring_at_most_and_only_where_the_handshake_agreed():
    """A stranger whose HELLO said nothing of rings, or named another host: its offer
    (of a genuine ring) is an unknown frame, skipped and never mapped. One whose HELLO did: its first offer is
    answered (no: not a ring of this host), a second one closes the connection as a
    protocol error. The victim maps nothing either way."""
    async def main():
        victim = TcpTransport("victim", udp=False)
        await victim.start()
        ring = SendRing(MIN_RING_BYTES)

        for n, hello_shm in enumerate([None, "another-host"], 1):
            reader, writer = await _raw_open(victim, hello_shm)
            writer.write(_offer_frame(ring.offer()))
            deadline = time.monotonic() + 10
            while victim.stats()["rejected"].get("unknown_frame_type", 0) < n:
                assert time.monotonic() < deadline, victim.stats()["rejected"]
                await asyncio.sleep(0.01)
            assert victim.stats()["shm"]["rings_in"] == 0
            writer.close()

        reader, writer = await _raw_open(victim, host_identity())
        writer.write(_offer_frame({**ring.offer(), "host": "elsewhere"}))
        assert await _read_frame(reader) == (FrameType.SHM_ANSWER, b"\x00")
        writer.write(_offer_frame(ring.offer()))
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed
        st = victim.stats()
        assert st["rejected"].get("protocol", 0) == 1, st["rejected"]
        assert st["shm"]["rings_in"] == 0 and st["shm"]["mapped_bytes"] == 0
        assert st["shm"]["refused_offers"] == 1
        writer.close()
        ring.close()
        await victim.close()
    arun(main())


def test_a_receiver_maps_a_bounded_count_of_rings():
    budget = RingBudget(1 << 40, limit_rings=2)
    assert budget.take(MIN_RING_BYTES) and budget.take(MIN_RING_BYTES)
    assert not budget.take(MIN_RING_BYTES)  # bytes left, but no ring count
    budget.give(MIN_RING_BYTES)
    assert budget.take(MIN_RING_BYTES) and budget.rings == 2
    assert 1 <= RingBudget().limit_rings == default_max_rings() <= 4096


@pytest.mark.slow
def test_a_real_quickstart_holds_no_ring_where_no_large_value_moves(tmp_path):
    """quickstart over real sockets (small model: every message is under the ring's
    minimum): no node -- the schedulers, the global server, anyone -- ever holds a ring
    fd or mapping, sampled through /proc for the whole run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "geomx", "run", str(QUICKSTART), "--runtime", "real",
         "--quiet", "--out", str(tmp_path), "--set", "run.iterations=40",
         "--set", "run.target_accuracy=0", "--set", "metrics.plot=false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    seen: dict[str, tuple[int, int, int]] = {}  # node log -> peak fds, ring fds, maps
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the job did not finish"
            for pid in descendants(proc.pid):
                try:
                    node = os.path.basename(os.readlink(f"/proc/{pid}/fd/1"))
                    sample = (len(os.listdir(f"/proc/{pid}/fd")), ring_fds(pid),
                              ring_maps(pid))
                except OSError:
                    continue  # gone meanwhile
                if not node.endswith(".log"):
                    continue
                old = seen.get(node, (0, 0, 0))
                seen[node] = tuple(max(x, y) for x, y in zip(old, sample))  # type: ignore
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate()
    assert proc.returncode == 0, out + err
    # the global scheduler, the global server and the parties' schedulers were sampled
    assert {"gh.log", "gs_0.log", "lh_party-a.log"} <= set(seen), seen
    assert all(fds > 0 for fds, _, _ in seen.values()), seen
    assert all(rfd == 0 and maps == 0 for _, rfd, maps in seen.values()), seen
