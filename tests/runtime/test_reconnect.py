"""Transient network faults in the real runtime: a TCP connection that drops is
dialled again, and what the receiver had not got is written again, in order, once.

Connections are killed, not processes: ``transport.abort()`` on either end (a reset), or,
for the whole job, ``ss -K`` on the sockets between its nodes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from geomx.runtime import security
from geomx.runtime.framing import (PREAMBLE, SEQ, FrameType, control_frame,
                                   sequenced_frames, stamp_sequence)
from geomx.runtime.shaper import LinkShape, Shaper
from geomx.runtime.tcp import TcpTransport, parse_address
from geomx.runtime.tcp_conn import OPEN
from geomx.wire import Kind, Message, Payload

from tests.helpers.aio import arun
from tests.helpers.procs import descendants

SECRET = b"reconnect-test-secret"


async def cluster(*names: str, **kw) -> list[TcpTransport]:
    nodes = [TcpTransport(n, udp=False, **kw) for n in names]
    for n in nodes:
        await n.start()
    book = {n.name: n.local_address() for n in nodes}
    for n in nodes:
        n.set_address_book(book)
    return nodes


def msg(src: str, dst: str, i: int, *, ch: int = 0, n: int = 2048) -> Message:
    return Message(Kind.PUSH, src, dst, key=i, request_id=i, channel=ch,
                   payloads=[Payload.of(np.arange(n, dtype=np.float32) + i)])


def kill_incoming(t: TcpTransport, peer: str) -> int:
    """Reset every open connection ``peer`` has to ``t``, from ``t``'s end."""
    conns = [c for c in t._incoming if c.peer == peer and c.state == OPEN]
    for c in conns:
        c.transport.abort()
    return len(conns)


def kill_outgoing(t: TcpTransport, peer: str) -> int:
    """Reset every open connection ``t`` has to ``peer``, from ``t``'s end."""
    outs = [o for (p, _), o in t._out.items() if p == peer and o.is_open]
    for o in outs:
        o.proto.transport.abort()
    return len(outs)


def no_acks(t: TcpTransport) -> None:
    """``t`` acknowledges only in handshakes (so every kill finds messages unacknowledged)."""
    t._streams.ack_delay_s = 3600.0
    t._streams.ack_every_bytes = t._streams.ack_every_frames = 1 << 60


def acks_on(t: TcpTransport) -> None:
    """``t`` acknowledges what it has, and from now on every message."""
    t._streams.ack_every_frames = 1
    t._streams.flush_all()


async def reopened(t: TcpTransport) -> None:
    """Wait until every stream of ``t`` is connected again."""
    while not all(o.is_open for o in t._out.values()):
        await asyncio.sleep(0.001)


async def recv_all(t: TcpTransport, n: int) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {}
    for _ in range(n):
        m = await t.recv()
        np.testing.assert_array_equal(m.payloads[0].data,
                                      np.arange(m.payloads[0].data.size, dtype=np.float32)
                                      + m.request_id)
        got.setdefault(m.channel, []).append(m.request_id)
    return got


# -- one stream, connections reset under it -----------------------------------------------------

def test_every_message_arrives_once_in_order_across_killed_connections():
    n, kills_at = 3000, range(250, 3000, 400)   # 7 kills, alternating ends

    async def main():
        a, b = await cluster("a", "b")
        no_acks(b)

        async def produce():
            killed = {"in": 0, "out": 0}
            for i in range(n):
                await a.send(msg("a", "b", i, ch=i % 2))
                await asyncio.sleep(0)  # b reads meanwhile
                if i in kills_at:
                    await reopened(a)   # each kill hits live connections
                    if (i // 400) % 2 == 0:
                        killed["in"] += kill_incoming(b, "a")
                    else:
                        killed["out"] += kill_outgoing(a, "b")
            return killed

        producer = asyncio.ensure_future(produce())
        got = await recv_all(b, n)
        killed = await producer
        acks_on(b)
        for t in (a, b):
            await t.close()
        return got, killed, a.stats(), b.stats()

    got, killed, sa, sb = arun(main(), timeout_s=60.0)
    assert got == {0: list(range(0, n, 2)), 1: list(range(1, n, 2))}  # once each, in order
    assert killed["in"] >= 4 and killed["out"] >= 3
    st = sa["streams"]
    # every kill found messages unacknowledged (b acks only in handshakes): each
    # connection killed was dialled again; a kill at b's end loses what b had not read
    assert st["reconnects"] == killed["in"] + killed["out"]
    assert st["resent_messages"] >= 4 and st["resent_bytes"] >= 4 * 8192
    assert st["reconnect_failures"] == 0 and sa["dropped_messages"] == 0
    assert sb["streams"]["resumed_in"] == st["reconnects"]
    assert sb["peers"]["a"]["msgs_received"] == n
    assert sb["rejected_frames"] == 0  # a stream cut mid-frame is not an attack
    print(f"\n{killed} connections killed: {st}")


def test_acks_bound_what_the_sender_keeps():
    """A receiver that does not acknowledge stalls its sender at ``retain_limit_bytes``;
    acknowledgements let the rest through and empty the window."""
    limit = 1 << 20

    async def main():
        a = TcpTransport("a", udp=False, retain_limit_bytes=limit)
        (b,) = await cluster("b")
        await a.start()
        book = {"a": a.local_address(), "b": b.local_address()}
        a.set_address_book(book)
        b.set_address_book(book)
        no_acks(b)
        for i in range(40):                          # 40 x 128 KiB = 5 MiB
            await a.send(msg("a", "b", i, n=32768))
        await asyncio.sleep(0.3)
        held = a.stats()["streams"]["unacked_bytes"]
        arrived = b.pending()
        b._streams.flush_all()                       # what arrived is acknowledged ...
        b._streams.ack_every_frames = 1              # ... and from now on every message
        got = await recv_all(b, 40)
        for _ in range(100):
            if a.stats()["streams"]["unacked_bytes"] == 0:
                break
            await asyncio.sleep(0.02)
        after = a.stats()["streams"]
        await a.close()
        await b.close()
        return held, arrived, got, after

    held, arrived, got, after = arun(main(), timeout_s=60.0)
    frame = 32768 * 4 + 200
    assert 0 < held <= limit + frame and 0 < arrived <= limit // (32768 * 4) + 1  # stalled
    assert got == {0: list(range(40))}
    assert after["unacked_bytes"] == 0 and after["max_unacked_bytes"] <= limit + frame
    assert after["acks_received"] >= 2


def test_peer_that_never_comes_back_fails_by_name_after_the_bound(caplog):
    caplog.set_level(logging.INFO, logger="geomx.runtime.tcp")

    async def main():
        a, b = await cluster("a", "b", reconnect_timeout_s=1.0, connect_timeout_s=0.5)
        no_acks(b)
        for i in range(10):
            await a.send(msg("a", "b", i))
        await recv_all(b, 10)
        # b "crashes": stops listening and its connections reset, nothing acknowledged
        b._server.close()
        t0 = time.monotonic()
        kill_incoming(b, "a")
        while a.stats()["streams"]["reconnect_failures"] == 0 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.02)
        gave_up_s = time.monotonic() - t0
        st = a.stats()
        with pytest.raises(ConnectionError, match="'b'"):
            await a.send(msg("a", "b", 99))
        await a.close()
        await b.close()
        return gave_up_s, st

    gave_up_s, st = arun(main(), timeout_s=60.0)
    assert st["streams"]["reconnect_failures"] == 1 and st["streams"]["reconnects"] == 0
    assert st["dropped_messages"] == 10  # nothing was acknowledged: all ten are given up
    assert gave_up_s < 5.0
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("gave up reconnecting to b" in w and "10 message(s) dropped" in w
               for w in warned), warned


def test_a_restarted_peer_is_a_new_stream_and_the_old_window_is_dropped(caplog):
    """A receiver that comes back as a new process (same name, same port) cannot have
    what its predecessor did not acknowledge: that is dropped and counted, as before
    resumable streams, and the stream goes on with the new process from #1."""
    caplog.set_level(logging.WARNING, logger="geomx.runtime.tcp")

    async def main():
        a, b = await cluster("a", "b", reconnect_timeout_s=10.0)
        no_acks(b)
        for i in range(5):
            await a.send(msg("a", "b", i))
        await recv_all(b, 5)
        port = b.port
        b._server.close()
        kill_incoming(b, "a")
        await asyncio.sleep(0.2)               # a keeps dialling meanwhile
        b2 = TcpTransport("b", port=port, udp=False)
        await b2.start()
        await a.send(msg("a", "b", 5))
        got = await recv_all(b2, 1)
        st = a.stats()
        for t in (a, b, b2):
            await t.close()
        return got, st

    got, st = arun(main(), timeout_s=60.0)
    assert got == {0: [5]}
    assert st["streams"]["unacked_dropped"] == 5 and st["dropped_messages"] == 5
    assert st["streams"]["reconnect_failures"] == 0
    assert any("the peer restarted; 5 unacknowledged message(s) dropped" in r.getMessage()
               for r in caplog.records)


def test_receiver_forgets_only_streams_without_a_connection():
    """The receiver's table of streams is bounded (names are free without a secret)."""
    from geomx.runtime.tcp_resume import InStreams

    class FakeConn:
        stream = None

        def carry_stream(self, stream):
            self.stream = stream

        def abort(self):
            pass

    streams = InStreams(max_streams=3)
    live = [FakeConn() for _ in range(3)]
    for k, c in enumerate(live):
        streams.attach(c, f"p{k}", 0, f"{k:016x}")
    extra = FakeConn()
    streams.attach(extra, "p9", 0, "9" * 16)   # every stream has a connection: kept
    assert len(streams) == 4 and streams.evicted == 0
    streams.detach(live[1])
    streams.attach(FakeConn(), "p10", 0, "a" * 16)
    assert len(streams) == 4 and streams.evicted == 1     # p1's, the one without
    # p0 resumes: it is still there, and says where it was
    assert streams.attach(FakeConn(), "p0", 0, f"{0:016x}")["ack"] == 0
    assert streams.resumed == 1


# -- what the receiver does with a resumed stream -------------------------------------------------

async def raw_hello(host: str, port: int, session: str, name: str = "x"):
    r, w = await asyncio.open_connection(host, port)
    w.write(control_frame(FrameType.HELLO, v=1, name=name, to="b", ch=0, auth=False,
                          sess=session))
    _, ftype, _, length = PREAMBLE.unpack(await r.readexactly(PREAMBLE.size))
    return r, w, ftype, json.loads(await r.readexactly(length))


def seq_frame(seq: int, i: int) -> bytes:
    frames, _ = sequenced_frames(msg("x", "b", i, n=4))
    stamp_sequence(frames, seq)
    return b"".join(bytes(f) for f in frames)


def test_receiver_drops_duplicates_and_refuses_gaps():
    async def main():
        (b,) = await cluster("b")
        host, port = parse_address(b.local_address())
        session = "ab" * 8
        r, w, ftype, welcome = await raw_hello(host, port, session)
        assert ftype == FrameType.WELCOME and welcome["ack"] == 0 and welcome["inc"]
        w.write(b"".join(seq_frame(s, s) for s in (1, 2, 3)))
        got = [(await b.recv()).request_id for _ in range(3)]
        _, ftype, _, _ = PREAMBLE.unpack(await r.readexactly(PREAMBLE.size))
        acked = SEQ.unpack(await r.readexactly(SEQ.size))[0]
        assert ftype == FrameType.ACK and acked == 3
        w.close()
        # the same session again: b says where it is; a resend of 2 and 3 is dropped
        r, w, ftype, again = await raw_hello(host, port, session)
        assert again["ack"] == 3 and again["inc"] == welcome["inc"]
        w.write(b"".join(seq_frame(s, s) for s in (2, 3, 4)))
        got.append((await b.recv()).request_id)
        w.write(seq_frame(6, 6))                     # 5 is missing: out of order
        assert await asyncio.wait_for(r.read(), 5) == b""  # b hung up
        await asyncio.sleep(0.05)
        # another session of the same name is another stream, from 0
        r, w, ftype, other = await raw_hello(host, port, "cd" * 8)
        assert other["ack"] == 0
        w.close()
        st = b.stats()
        await b.close()
        return got, st

    got, st = arun(main(), timeout_s=60.0)
    assert got == [1, 2, 3, 4] and st["streams"]["duplicates_dropped"] == 2
    assert st["rejected"]["protocol"] == 1 and st["inbox_messages"] == 0


def test_stranger_cannot_take_over_a_session():
    """With a secret, a HELLO naming a node and its session, without the proof, is
    refused as any other (and the stream is untouched: the session is looked at only
    after authentication); a bad session id is refused; without a secret another session
    under the same name is another stream."""
    async def main():
        a, b = await cluster("a", "b", secret=SECRET)
        for i in range(5):
            await a.send(msg("a", "b", i))
        await recv_all(b, 5)
        live = next(o for o in a._out.values()).proto
        session = next(o for o in a._out.values()).window.session
        host, port = parse_address(b.local_address())
        r, w = await asyncio.open_connection(host, port)
        w.write(control_frame(FrameType.HELLO, v=1, name="a", to="b", ch=0, auth=True,
                              sess=session))
        _, ftype, _, length = PREAMBLE.unpack(await r.readexactly(PREAMBLE.size))
        assert ftype == FrameType.CHALLENGE
        await r.readexactly(length)
        w.write(control_frame(FrameType.AUTH, nonce="00" * security.NONCE_BYTES, mac="11" * 32))
        _, ftype, _, length = PREAMBLE.unpack(await r.readexactly(PREAMBLE.size))
        assert ftype == FrameType.REFUSE
        w.close()
        r, w = await asyncio.open_connection(host, port)
        w.write(control_frame(FrameType.HELLO, v=1, name="a", to="b", ch=0, auth=True,
                              sess="not-hex"))
        _, ftype, _, length = PREAMBLE.unpack(await r.readexactly(PREAMBLE.size))
        assert ftype == FrameType.REFUSE
        w.close()
        await asyncio.sleep(0.05)
        untouched = live.state == OPEN and b.stats()["streams"]["resumed_in"] == 0
        for i in range(5, 10):
            await a.send(msg("a", "b", i))
        got = await recv_all(b, 5)
        st = b.stats()
        for t in (a, b):
            await t.close()

        # no secret: names are taken on trust, sessions are not
        a, b = await cluster("a", "b")
        await a.send(msg("a", "b", 0))
        await recv_all(b, 1)
        live = next(o for o in a._out.values()).proto
        r, w, ftype, welcome = await raw_hello(host=parse_address(b.local_address())[0],
                                               port=b.port, session="ef" * 8, name="a")
        assert ftype == FrameType.WELCOME and welcome["ack"] == 0
        await a.send(msg("a", "b", 1))
        got2 = await recv_all(b, 1)
        untouched2 = live.state == OPEN
        w.close()
        for t in (a, b):
            await t.close()
        return untouched, got, st, untouched2, got2

    untouched, got, st, untouched2, got2 = arun(main(), timeout_s=60.0)
    assert untouched and got == {0: [5, 6, 7, 8, 9]}
    assert st["refused_connections"] == 2 and st["rejected"]["auth"] == 1
    assert st["rejected"]["protocol"] == 1 and st["peers"]["a"]["msgs_received"] == 10
    assert untouched2 and got2 == {0: [1]}


# -- with the shaper and with TLS -------------------------------------------------------------

def test_resent_bytes_are_paced_again():
    rate_bps, n, size = 16e6, 24, 100_000          # 2.4 MB at 2 MB/s

    async def main():
        a = TcpTransport("a", udp=False, shaper=Shaper({"b": LinkShape(rate_bps, 0.005)}, seed=1))
        (b,) = await cluster("b")
        await a.start()
        book = {"a": a.local_address(), "b": b.local_address()}
        a.set_address_book(book)
        b.set_address_book(book)
        no_acks(b)
        link = a.shaper.link("b")
        paced = [0]
        transmit = link.transmit

        def counting(nbytes, now, flow=None):
            paced[0] += nbytes
            return transmit(nbytes, now, flow)

        link.transmit = counting
        t0 = time.monotonic()
        for i in range(n):
            await a.send(msg("a", "b", i, n=size // 4))
        got = []
        for k in range(n):
            m = await b.recv()
            got.append(m.request_id)
            if k in (4, 12):
                await reopened(a)
                kill_incoming(b, "a")
        elapsed = time.monotonic() - t0
        st = a.stats()
        acks_on(b)
        await a.close()
        await b.close()
        return got, paced[0], elapsed, st

    got, paced, elapsed, st = arun(main(), timeout_s=60.0)
    frames, frame = sequenced_frames(msg("a", "b", 0, n=size // 4))
    assert got == list(range(n))
    s = st["streams"]
    assert s["reconnects"] == 2 and s["resent_messages"] >= 2
    # every message went through the token bucket once, and every resent byte again (a
    # message cut while being paced is resent whole: at most one per reconnect)
    assert n * frame + s["resent_bytes"] - 2 * frame <= paced <= n * frame + s["resent_bytes"]
    assert elapsed >= paced / (rate_bps / 8) * 0.97


def test_reconnect_over_tls_with_a_secret(tls_files):
    cert, key = tls_files

    async def main():
        a, b = await cluster("a", "b", secret=SECRET,
                             ssl_server=security.make_server_context(cert, key),
                             ssl_client=security.make_client_context(cert))
        no_acks(b)
        for i in range(300):
            await a.send(msg("a", "b", i))
            await asyncio.sleep(0)
            if i in (50, 150, 250):
                await reopened(a)
            if i in (50, 150):
                kill_incoming(b, "a")
            if i == 250:
                kill_outgoing(a, "b")
        got = await recv_all(b, 300)
        acks_on(b)
        st = a.stats()["streams"]
        tls = all(c.transport.get_extra_info("ssl_object") is not None for c in b._incoming)
        await a.close()
        await b.close()
        return got, st, tls

    got, st, tls = arun(main(), timeout_s=60.0)
    assert got == {0: list(range(300))} and tls
    assert st["reconnects"] == 3 and st["resent_messages"] >= 2


# -- a real job whose connections are killed (not its processes) ---------------------------------


def ss_kill_works() -> bool:
    """Can this host destroy a TCP socket from outside its process (``ss -K``: root and a
    kernel with CONFIG_INET_DIAG_DESTROY)?"""
    if shutil.which("ss") is None or os.geteuid() != 0:
        return False
    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    try:
        subprocess.run(["ss", "-K", "-tnH", "state", "established", "dst", "127.0.0.1",
                        f"( dport = :{srv.getsockname()[1]} )"], capture_output=True, timeout=10)
        try:
            c.send(b"x")
        except OSError:
            return True
        return False
    finally:
        for x in (c, s, srv):
            x.close()


class ConnectionKiller(threading.Thread):
    """Kills, ``times`` times ``every_s`` apart, every TCP connection between the nodes of
    a job started by this process (sockets dialled to a port one of them listens on), once
    ``ready()`` says training is under way. Processes are left alone."""

    def __init__(self, ready, *, times: int, every_s: float, root_pid: int | None = None):
        super().__init__(daemon=True)
        self.ready = ready
        self.times = times
        self.every_s = every_s
        self.root_pid = root_pid or os.getpid()
        self.kills: list[int] = []  # sockets destroyed by each kill
        self.halt = threading.Event()

    def node_ports(self) -> set[int]:
        pids = descendants(self.root_pid)
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        ports = set()
        for line in out.splitlines():
            if any(f"pid={p}," in line for p in pids):
                ports.add(int(line.split()[3].rsplit(":", 1)[1]))
        return ports

    def run(self) -> None:
        while not self.halt.is_set() and not self.ready():
            time.sleep(0.05)
        while not self.halt.is_set() and len(self.kills) < self.times:
            ports = self.node_ports()
            if ports:
                flt = "( " + " or ".join(f"dport = :{p}" for p in sorted(ports)) + " )"
                r = subprocess.run(["ss", "-K", "-tnH", "state", "established", "dst",
                                    "127.0.0.1", flt], capture_output=True, text=True)
                self.kills.append(len(r.stdout.splitlines()))
            self.halt.wait(self.every_s)


def training_started(runs: Path, iterations: int = 5):
    """True once a worker of the (only) run under ``runs`` logged ``iterations`` steps."""
    def ready() -> bool:
        for f in runs.glob("*/nodes/w_party-a_0.events.jsonl"):
            try:
                return f.read_text().count('"ev":"compute"') >= iterations
            except OSError:
                return False
        return False
    return ready


@pytest.mark.slow
def test_real_job_finishes_with_the_clean_model_despite_killed_connections(scenario_of, tmp_path):
    if not ss_kill_works():
        pytest.skip("needs root and a kernel that lets `ss -K` destroy sockets")
    from geomx.experiment import run_scenario

    s = scenario_of("quickstart.toml", "run.iterations=40", "run.target_accuracy=0",
                    "metrics.plot=false", "real.reconnect_timeout=20s")
    # FSA over two DCs of two workers sums in any order to the same bits: the emulator's
    # model is the clean real run's (tests/node/test_checkpoint.py relies on it too)
    clean = run_scenario(s, runtime="emu").summary
    killer = ConnectionKiller(training_started(tmp_path / "runs"), times=3, every_s=1.0)
    killer.start()
    try:
        real = run_scenario(s, runtime="real").summary
    finally:
        killer.halt.set()
        killer.join()
    streams = [t["streams"] for t in real.extra["transport"].values()]
    total = {k: sum(st[k] for st in streams) for k in streams[0]}
    print(f"\nkills: {killer.kills} sockets; {total}; accuracy {real.final_accuracy!r} "
          f"(clean {clean.final_accuracy!r}), wall {real.wall_seconds:.1f} s")
    assert len(killer.kills) >= 2 and min(killer.kills) > 0, killer.kills
    assert real.iterations == 40
    assert real.final_accuracy == pytest.approx(clean.final_accuracy, abs=1e-9)
    assert real.final_loss == pytest.approx(clean.final_loss, abs=1e-9)
    assert total["reconnects"] > 0 and total["reconnect_failures"] == 0
    assert total["unacked_dropped"] == 0
    assert all(t["dropped_messages"] == 0 for t in real.extra["transport"].values())
