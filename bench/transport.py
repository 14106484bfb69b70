"""Benchmark: TcpTransport against a raw uvloop socket, two processes on loopback.

    python bench/transport.py [--mb 100] [--repeat 3] [--pings 2000] [--json out.json]

What it measures, in one run:

* **push + pull**: the parent pushes one message of ``--mb`` MB (25M float32 for 100 MB)
  to a child process, which answers with a message of the same size (the "pull reply").
  Timed from the start of the push until the reply has been received and decoded;
  GB/s counts both directions (2 x size / time).
* **raw**: the same bytes the same way (8-byte length prefix, then the data, received
  into an uninitialised buffer just as the transport does) over plain
  sockets driven by the same event loop, two ways -- ``sock_sendall`` /
  ``sock_recv_into`` into a preallocated buffer, and a bare ``BufferedProtocol`` with
  ``transport.write`` -- and the faster of the two is the baseline: the ceiling for a
  Python process.
* **round trip**: ``--pings`` request/reply pairs with a 64-byte payload through
  TcpTransport (p50, p99), and the same over the raw socket for reference.

After one untimed warm-up round, the contenders take turns ``--repeat`` times; the best
and the median are reported (loopback numbers are noisy on a shared machine) and the
ratio is TcpTransport throughput / raw throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from geomx.runtime.eventloop import loop_kind, run  # noqa: E402
from geomx.runtime.tcp import TcpTransport  # noqa: E402
from geomx.wire import Kind, Message, Payload  # noqa: E402

LEN = struct.Struct("<Q")


# -- raw socket helpers -------------------------------------------------------------------

async def _recv_exact_into(loop, sock: socket.socket, buf: memoryview) -> None:
    got = 0
    n = buf.nbytes
    while got < n:
        k = await loop.sock_recv_into(sock, buf[got:])
        if k == 0:
            raise ConnectionError("raw peer closed")
        got += k


async def _raw_recv_msg(loop, sock: socket.socket) -> np.ndarray:
    hdr = bytearray(LEN.size)
    await _recv_exact_into(loop, sock, memoryview(hdr))
    (n,) = LEN.unpack(hdr)
    buf = np.empty(n, np.uint8)  # like the transport: no zero-filling
    await _recv_exact_into(loop, sock, memoryview(buf))
    return buf


async def _raw_send_msg(loop, sock: socket.socket, data: memoryview) -> None:
    await loop.sock_sendall(sock, LEN.pack(data.nbytes))
    await loop.sock_sendall(sock, data)


class _RawProto(asyncio.BufferedProtocol):
    """The leanest stream reader: length prefix, then the body read into its own buffer."""

    def __init__(self, on_msg):
        self.on_msg = on_msg
        self.hdr = bytearray(LEN.size)
        self.buf: np.ndarray | None = None
        self.filled = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        target = self.hdr if self.buf is None else self.buf
        return memoryview(target)[self.filled:]

    def buffer_updated(self, n):
        self.filled += n
        if self.buf is None:
            if self.filled == LEN.size:
                (size,) = LEN.unpack(self.hdr)
                self.buf, self.filled = np.empty(size, np.uint8), 0
        elif self.filled == len(self.buf):
            msg, self.buf, self.filled = self.buf, None, 0
            self.on_msg(self, msg)

    def send(self, data: memoryview) -> None:
        self.transport.write(LEN.pack(data.nbytes))
        self.transport.write(data)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)


# -- child process ------------------------------------------------------------------------

async def child_main(nbytes: int) -> None:
    loop = asyncio.get_running_loop()
    node = TcpTransport("bench:b")
    await node.start()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    lsock.setblocking(False)
    reply = np.ones(nbytes // 4, dtype=np.float32)
    big = memoryview(reply).cast("B")

    def echo(proto: _RawProto, msg: np.ndarray) -> None:
        proto.send(big if len(msg) == nbytes else memoryview(msg))

    proto_server = await loop.create_server(lambda: _RawProto(echo), "127.0.0.1", 0)
    print(json.dumps({"tcp": node.local_address(),
                      "raw": f"127.0.0.1:{lsock.getsockname()[1]}",
                      "raw_proto": f"127.0.0.1:{proto_server.sockets[0].getsockname()[1]}",
                      "loop": loop_kind()}), flush=True)

    async def raw_server() -> None:
        conn, _ = await loop.sock_accept(lsock)
        _tune(conn)
        big = memoryview(reply).cast("B")
        try:
            while True:
                msg = await _raw_recv_msg(loop, conn)
                if len(msg) == nbytes:
                    await _raw_send_msg(loop, conn, big)
                else:  # ping
                    await _raw_send_msg(loop, conn, memoryview(msg))
        except ConnectionError:
            conn.close()

    raw_task = loop.create_task(raw_server())
    book_set = False
    while True:
        msg = await node.recv()
        if not book_set:
            node.set_address_book({"bench:a": msg.meta["reply_to"]})
            book_set = True
        if msg.kind == Kind.SHUTDOWN:
            break
        if msg.kind == Kind.PUSH:
            await node.send(msg.reply(Kind.PULL_REPLY, payloads=[Payload.of(reply)], meta={}))
        elif msg.kind == Kind.PROBE:
            await node.send(msg.reply(Kind.PROBE_REPLY, payloads=msg.payloads, meta={}))
    raw_task.cancel()
    lsock.close()
    proto_server.close()
    await node.close()


# -- parent -------------------------------------------------------------------------------

async def parent_main(args: argparse.Namespace) -> dict:
    loop = asyncio.get_running_loop()
    nbytes = int(args.mb * 1_000_000) // 4 * 4
    proc = subprocess.Popen([sys.executable, __file__, "--child", "--mb", str(args.mb)],
                            stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(await loop.run_in_executor(None, proc.stdout.readline))
        node = TcpTransport("bench:a")
        await node.start()
        node.set_address_book({"bench:b": info["tcp"]})
        me = {"reply_to": node.local_address()}
        push = np.full(nbytes // 4, 2.0, dtype=np.float32)
        big = memoryview(push).cast("B")
        ping = np.zeros(16, dtype=np.float32)  # 64-byte payload
        small = memoryview(bytes(64))
        # connect everything first (and warm up the transport's two connections)
        await node.send(Message(Kind.PROBE, "bench:a", "bench:b", meta=me,
                                payloads=[Payload.of(ping)]))
        await node.recv()
        host, port = info["raw"].rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _tune(sock)
        await loop.sock_connect(sock, (host, int(port)))
        host, port = info["raw_proto"].rsplit(":", 1)
        replies: asyncio.Queue = asyncio.Queue()
        _, rp = await loop.create_connection(
            lambda: _RawProto(lambda p, m: replies.put_nowait(m)), host, int(port))

        async def tcp_bulk() -> None:
            await node.send(Message(Kind.PUSH, "bench:a", "bench:b", key=0,
                                    payloads=[Payload.of(push)]))
            rep = await node.recv()
            assert rep.kind == Kind.PULL_REPLY and rep.payloads[0].nbytes == nbytes

        async def sock_bulk() -> None:
            await _raw_send_msg(loop, sock, big)
            assert len(await _raw_recv_msg(loop, sock)) == nbytes

        async def proto_bulk() -> None:
            rp.send(big)
            assert len(await replies.get()) == nbytes

        async def tcp_ping(i: int) -> None:
            await node.send(Message(Kind.PROBE, "bench:a", "bench:b", request_id=i,
                                    payloads=[Payload.of(ping)]))
            assert (await node.recv()).request_id == i

        async def sock_ping(i: int) -> None:
            await _raw_send_msg(loop, sock, small)
            await _raw_recv_msg(loop, sock)

        async def proto_ping(i: int) -> None:
            rp.send(small)
            await replies.get()

        # interleave the contenders so that load from other processes hits them alike
        bulk = {"tcp": (tcp_bulk, []), "sock": (sock_bulk, []), "proto": (proto_bulk, [])}
        for fn, _ in bulk.values():  # one untimed round: first-touch and socket warm-up
            await fn()
        for _ in range(args.repeat):
            for fn, times in bulk.values():
                t0 = time.perf_counter()
                await fn()
                times.append(time.perf_counter() - t0)
        pings = {"tcp": (tcp_ping, []), "sock": (sock_ping, []), "proto": (proto_ping, [])}
        block = 100
        for start in range(0, args.pings, block):
            for fn, rtts in pings.values():
                for i in range(start, min(start + block, args.pings)):
                    t0 = time.perf_counter()
                    await fn(i)
                    rtts.append(time.perf_counter() - t0)
        sock.close()
        rp.transport.close()
        await node.send(Message(Kind.SHUTDOWN, "bench:a", "bench:b"))
        await node.close()
    finally:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()

    import resource
    moved = 2 * nbytes
    tcp_times = bulk["tcp"][1]
    raw_name = min(("sock", "proto"), key=lambda k: min(bulk[k][1]))
    raw_best = min(bulk[raw_name][1])
    raw_median = min(float(np.median(bulk[k][1])) for k in ("sock", "proto"))
    rtts = np.array(pings["tcp"][1])
    raw_rtt_name = min(("sock", "proto"), key=lambda k: np.percentile(pings[k][1], 50))
    raw_rtts = np.array(pings[raw_rtt_name][1])
    return {
        "loop": loop_kind(), "child_loop": info["loop"],
        "message_bytes": nbytes, "repeat": args.repeat, "pings": args.pings,
        "tcp_transport_GBps": moved / min(tcp_times) / 1e9,
        "raw_socket_GBps": moved / raw_best / 1e9,
        "ratio": raw_best / min(tcp_times),
        "tcp_transport_GBps_median": moved / float(np.median(tcp_times)) / 1e9,
        "raw_socket_GBps_median": moved / raw_median / 1e9,
        "ratio_median": raw_median / float(np.median(tcp_times)),
        "raw_baseline": {"sock": "sock_sendall/sock_recv_into",
                         "proto": "BufferedProtocol/transport.write"}[raw_name],
        "times_s": {k: v[1] for k, v in bulk.items()},
        "rtt_p50_us": float(np.percentile(rtts, 50) * 1e6),
        "rtt_p99_us": float(np.percentile(rtts, 99) * 1e6),
        "raw_rtt_p50_us": float(np.percentile(raw_rtts, 50) * 1e6),
        "raw_rtt_p99_us": float(np.percentile(raw_rtts, 99) * 1e6),
        "parent_max_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cpus": os.cpu_count(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=100.0, help="message size in MB (10^6 bytes)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pings", type=int, default=2000)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run(child_main(int(args.mb * 1_000_000) // 4 * 4))
        return
    r = run(parent_main(args))
    mb = r["message_bytes"] / 1e6
    fmt = lambda ts: ", ".join(f"{t:.3f}" for t in ts)  # noqa: E731
    print(f"event loop: {r['loop']} (child: {r['child_loop']}), {r['cpus']} CPUs")
    print(f"push+pull of {mb:.0f} MB each way ({2 * mb:.0f} MB moved), "
          f"{r['repeat']} interleaved runs:")
    print(f"  TcpTransport : best {r['tcp_transport_GBps']:.3f} GB/s, median "
          f"{r['tcp_transport_GBps_median']:.3f} GB/s  (s: {fmt(r['times_s']['tcp'])})")
    print(f"  raw socket   : best {r['raw_socket_GBps']:.3f} GB/s [{r['raw_baseline']}], "
          f"median {r['raw_socket_GBps_median']:.3f} GB/s [the better variant]")
    print(f"                 (sock_sendall s: {fmt(r['times_s']['sock'])}; "
          f"protocol s: {fmt(r['times_s']['proto'])})")
    print(f"  ratio        : best/best {r['ratio']:.2f}, median/median {r['ratio_median']:.2f} "
          "(target >= 0.7)")
    print(f"round trip, {r['pings']} pings of 64 B:")
    print(f"  TcpTransport : p50 {r['rtt_p50_us']:.0f} us, p99 {r['rtt_p99_us']:.0f} us")
    print(f"  raw (best)   : p50 {r['raw_rtt_p50_us']:.0f} us, p99 {r['raw_rtt_p99_us']:.0f} us")
    print(f"parent peak RSS: {r['parent_max_rss_MB']:.0f} MB")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
