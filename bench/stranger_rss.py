"""What a stranger can make a node hold: resident memory of a victim process under attack.

The attacks, and what each costs a transport that holds whatever a peer announces
(measured against a running ``gs:0`` with no bounds): 2,500 13-byte UDP datagrams
claiming chunk 0 of 65,535 grow it by 300-730 MB; 8 connections announcing 128 MiB
frames by ~1 GB (which stays after they close) -- and the same with streams, the form a
message too long for one frame takes (geomx/runtime/framing.py), announced at 128 MiB and
at the largest message the victim accepts; 2,000 connections that never finish the
handshake (secret set) by 264 MB. This bench repeats each against a victim process -- a node's transport with the defaults ``geomx
node`` uses (UDP on, as with DGT's "udp" bands; a node without them binds none) -- and
prints the growth of its resident set (VmRSS before, the peak VmHWM during, VmRSS after;
the peak is reset between attacks through /proc/PID/clear_refs, Linux >= 4.0). Target: <
64 MiB each. The victim's transport is built the way ``geomx node`` builds it for the
scenario (``--scenario``, default the quickstart, with DGT's "udp" bands so that a UDP
socket is open to attack): its frame cap comes from the job's largest message. A baseline row sends the same bytes as an honest peer would, so the
attack's cost reads against what ordinary traffic costs.

    python bench/stranger_rss.py            # all attacks
    python bench/stranger_rss.py --quick    # smaller counts (CI smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from geomx.runtime import eventloop  # noqa: E402
from geomx.runtime.framing import (STREAM_HEAD, STREAM_PIECE, FrameType,  # noqa: E402
                                   control_frame, pack_preamble)
from geomx.runtime.tcp import parse_address  # noqa: E402
from geomx.runtime.udp import CHUNK_HEADER, CHUNK_MAGIC, CHUNK_VERSION  # noqa: E402

VICTIM = r"""
import asyncio, os, sys
from geomx.cluster import plan_job
from geomx.runtime import eventloop
from geomx.runtime.node_main import transport_limits
from geomx.runtime.tcp import TcpTransport
from geomx.scenario import load_scenario
s = load_scenario(sys.argv[1], sys.argv[2:])
limits = transport_limits(s, plan_job(s, "real"))
async def main():
    t = TcpTransport("gs:0", secret=os.environ.get("VICTIM_SECRET", "").encode() or None,
                     **limits)
    await t.start()
    print(t.local_address(), flush=True)
    while True:
        await t.recv()
eventloop.run(main())
"""

MIB = 1 << 20


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":")
            out[k] = int(v.split()[0]) * 1024
    return out


def _reset_peak(pid: int) -> None:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass  # not permitted: the peak then counts from the process's start


def _hello(name: str) -> bytes:
    return control_frame(FrameType.HELLO, v=1, name=name, to="gs:0", ch=0, auth=False)


async def _udp_chunk_claims(host: str, port: int, n: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(n):
        s.sendto(CHUNK_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, 0, i, 0, 0xFFFF) + b"x",
                 (host, port))
        if i % 200 == 0:
            await asyncio.sleep(0)
    s.close()
    await asyncio.sleep(1.0)


async def _announce_and_stall(host: str, port: int, conns: int, head: bytes, chunk: bytes,
                              chunks: int) -> None:
    """On ``conns`` connections: say hello, send ``head``, then ``chunks`` copies of
    ``chunk`` as fast as the victim reads them, and never finish."""
    writers = []
    for i in range(conns):
        r, w = await asyncio.open_connection(host, port)
        w.write(_hello(f"evil{i}"))
        await asyncio.wait_for(r.read(4096), 10)  # WELCOME
        w.write(head)
        writers.append(w)
    await asyncio.sleep(0.2)
    deadline = time.monotonic() + 15
    for _ in range(chunks):
        writers = [w for w in writers if not w.is_closing()]
        if not writers:
            break  # the victim refused every one and hung up
        for w in writers:
            w.write(chunk)
        try:
            await asyncio.wait_for(asyncio.gather(*(w.drain() for w in writers),
                                                  return_exceptions=True), 1.0)
        except asyncio.TimeoutError:
            if time.monotonic() > deadline:
                break  # the victim stopped reading: what it holds is what we measure
    await asyncio.sleep(1.0)
    for w in writers:
        w.close()
    await asyncio.sleep(1.0)


async def _large_frames(host: str, port: int, conns: int, frame: int) -> None:
    """Frames of ``frame`` bytes announced and sent but for their last MiB."""
    await _announce_and_stall(host, port, conns, pack_preamble(FrameType.MESSAGE, frame),
                              b"\0" * MIB, frame // MIB - 1)


async def _large_streams(host: str, port: int, conns: int, total: int) -> None:
    """Streams (a message too long for one frame, sent as pieces) announced on ``conns``
    connections and sent but for their last MiB: never finished."""
    head = (pack_preamble(FrameType.STREAM_HEAD, STREAM_HEAD.size + 1)
            + STREAM_HEAD.pack(1, FrameType.MESSAGE, 0, 0, total) + b"G")
    piece = pack_preamble(FrameType.STREAM_PIECE, STREAM_PIECE.size + MIB) + STREAM_PIECE.pack(1)
    await _announce_and_stall(host, port, conns, head, piece + b"\0" * MIB, total // MIB - 1)


async def _pending_handshakes(host: str, port: int, n: int) -> None:
    conns = []
    for _ in range(n):
        try:
            conns.append(await asyncio.wait_for(asyncio.open_connection(host, port), 2))
        except (OSError, asyncio.TimeoutError):
            pass
    await asyncio.sleep(1.0)
    for _, w in conns:
        w.close()
    await asyncio.sleep(0.5)


async def _malformed(host: str, port: int, n: int) -> None:
    import random

    rng = random.Random(7)
    sent = 0
    while sent < n:
        try:
            r, w = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        w.write(_hello(f"junk{sent}"))
        for _ in range(50):
            w.write(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
            sent += 1
        w.close()
        await asyncio.sleep(0)
    await asyncio.sleep(0.5)


async def _honest(host: str, port: int, nbytes: int) -> None:
    """The baseline: an honest peer sends ``nbytes`` as 8 MiB messages."""
    import numpy as np

    from geomx.runtime.tcp import TcpTransport
    from geomx.wire import Kind, Message, Payload

    t = TcpTransport("peer", udp=False)
    await t.start()
    t.set_address_book({"gs:0": f"{host}:{port}"})
    arr = np.zeros(2 * MIB, np.float32)
    for i in range(max(1, nbytes // (8 * MIB))):
        await t.send(Message(Kind.PUSH, "peer", "gs:0", key=1, request_id=i,
                             payloads=[Payload.of(arr)]))
    await asyncio.sleep(1.0)
    await t.close()


def _largest_message(args: argparse.Namespace) -> int:
    """The largest message the victim accepts (its transport's ``max_message_bytes``)."""
    from geomx.cluster import plan_job
    from geomx.runtime.node_main import transport_limits
    from geomx.scenario import load_scenario

    s = load_scenario(args.scenario, args.overrides)
    limits = transport_limits(s, plan_job(s, "real"))
    # (a transport without streams: its frame cap, less the preamble)
    return limits.get("max_message_bytes", limits["max_frame_bytes"] - 8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller counts")
    p.add_argument("--scenario", default=str(ROOT / "scenarios/quickstart.toml"))
    p.add_argument("--set", dest="overrides", action="append", default=["sched.dgt=udp"])
    args = p.parse_args(argv)
    q = args.quick
    attacks = [
        ("honest peer: 64 MiB as 8 MiB pushes (baseline)", False,
         lambda h, pt: _honest(h, pt, (16 if q else 64) * MIB)),
        ("UDP: 2,500 x 13-byte 'chunk 0 of 65,535'", False,
         lambda h, pt: _udp_chunk_claims(h, pt, 500 if q else 2500)),
        ("TCP: 8 conns announcing 128 MiB frames", False,
         lambda h, pt: _large_frames(h, pt, 8, (16 if q else 128) * MIB)),
        ("TCP: 8 conns announcing frames of the largest message", False,
         lambda h, pt: _large_frames(h, pt, 8, _largest_message(args) & ~(MIB - 1))),
        ("TCP: 8 conns announcing 128 MiB streams", False,
         lambda h, pt: _large_streams(h, pt, 8, (16 if q else 128) * MIB)),
        ("TCP: 8 conns announcing streams of the largest message", False,
         lambda h, pt: _large_streams(h, pt, 8, _largest_message(args) & ~(MIB - 1))),
        ("TCP: 2,000 conns never finishing the handshake (secret set)", True,
         lambda h, pt: _pending_handshakes(h, pt, 400 if q else 2000)),
        ("TCP: 7,000 malformed frames after HELLO", False,
         lambda h, pt: _malformed(h, pt, 1000 if q else 7000)),
    ]
    print(f"{'attack':62s} {'RSS before':>11s} {'peak +':>9s} {'after +':>9s}")
    rows = []
    for label, secret, attack in attacks:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if secret:
            env["VICTIM_SECRET"] = "s3cret"
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, args.scenario, *args.overrides],
                                  stdout=subprocess.PIPE, text=True, env=env)
        try:
            host, port = parse_address(victim.stdout.readline().strip())
            time.sleep(0.3)
            before = _status(victim.pid)["VmRSS"]
            _reset_peak(victim.pid)
            eventloop.run(attack(host, port))
            st = _status(victim.pid)
            alive = victim.poll() is None
        finally:
            victim.kill()
            victim.wait()
        row = {"attack": label, "rss_before_MiB": before / MIB,
               "peak_growth_MiB": (st["VmHWM"] - before) / MIB,
               "after_growth_MiB": (st["VmRSS"] - before) / MIB, "victim_alive": alive}
        rows.append(row)
        print(f"{label:62s} {row['rss_before_MiB']:9.1f}MB {row['peak_growth_MiB']:7.1f}MB "
              f"{row['after_growth_MiB']:7.1f}MB" + ("" if alive else "  (victim died)"))
    worst = max(r["peak_growth_MiB"] for r in rows[1:])
    print(f"\nworst attack peak growth: {worst:.1f} MiB (target < 64 MiB); "
          f"honest 64 MiB baseline: {rows[0]['peak_growth_MiB']:.1f} MiB")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
