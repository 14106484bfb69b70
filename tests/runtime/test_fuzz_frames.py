"""Bad input loses nothing: >= 10,000 malformed frames at a TcpTransport over loopback.

Frame-level garbage (a good preamble around a bad body, reserved flags, unknown frame
types) arrives on one handshaken connection and must be dropped one by one while the
connection keeps serving. Stream-level garbage (bad magic, oversized lengths, cuts
mid-frame, bad handshakes) gets a connection each and must close only that connection.
Every rejection is counted and logged; afterwards a well-behaved peer still gets through.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import struct
import time

import numpy as np

from geomx import wire
from geomx.runtime import eventloop
from geomx.runtime.framing import (PREAMBLE, STREAM_HEAD, STREAM_PIECE, FrameType,
                                   control_frame, message_frames, pack_preamble)
from geomx.runtime.tcp import TcpTransport, parse_address
from geomx.wire import Kind, Message, Payload, WireError

MAX_FRAME = 1 << 20
N_BODIES = 9_800


def valid_bodies(rng: random.Random) -> list[bytes]:
    out = []
    for i in range(40):
        payloads = [Payload.of(np.arange(rng.randint(0, 30),
                                         dtype=rng.choice(["<f4", "<i8", "|u1"])))
                    for _ in range(rng.randint(0, 3))]
        meta = {"k": i, "codec": "bsc"} if i % 2 else {}
        out.append(wire.encode_bytes(Message(Kind.PUSH, "fuzz", "victim", key=i, meta=meta,
                                             payloads=payloads)))
    return out


def malformed_bodies(rng: random.Random, n: int) -> tuple[list[bytes], int]:
    """``n`` bodies that ``wire.decode`` rejects (checked here), plus how many were discarded."""
    bases = valid_bodies(rng)
    out: list[bytes] = []
    discarded = 0
    makers = ["truncate", "version", "kind", "garbage", "mutate", "mutate_header", "extend",
              "huge_shape"]
    while len(out) < n:
        base = bytearray(rng.choice(bases))
        how = makers[len(out) % len(makers)]
        if how == "truncate":
            body = base[:rng.randrange(0, len(base))]
        elif how == "version":
            base[2] = rng.choice([0, 2, 7, 255])
            body = base
        elif how == "kind":
            base[3] = rng.choice([0, 9, 15, 99, 200, 255])
            body = base
        elif how == "garbage":
            body = bytearray(rng.randbytes(rng.randrange(0, 300)))
        elif how == "mutate":
            for _ in range(rng.randint(1, 6)):
                base[rng.randrange(len(base))] = rng.randrange(256)
            body = base
        elif how == "mutate_header":
            for _ in range(rng.randint(1, 3)):
                base[rng.randrange(min(len(base), 60))] ^= 1 << rng.randrange(8)
            body = base
        elif how == "extend":
            body = base + rng.randbytes(rng.randint(1, 20))
        else:  # a payload descriptor claiming far more data than the frame holds
            m = Message(Kind.PUSH, "fuzz", "victim",
                        payloads=[Payload.phantom((1 << 40,), "<f4")])
            body = bytearray(wire.encode_bytes(m))
            body[-9] = 0  # phantom flag (before the one 8-byte dim) off: data must follow
        try:
            wire.decode(bytes(body), max_bytes=MAX_FRAME)
        except WireError:
            out.append(bytes(body))
        else:
            discarded += 1  # a mutation that happens to be valid is not a malformed frame
    return out, discarded


def hello(name: str = "fuzz", to: str = "victim", ch: int = 0) -> bytes:
    return control_frame(FrameType.HELLO, v=1, name=name, to=to, ch=ch, auth=False)


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, dict]:
    _, ftype, _, n = PREAMBLE.unpack(await reader.readexactly(PREAMBLE.size))
    return ftype, json.loads(await reader.readexactly(n))


def stream_attacks(rng: random.Random) -> list[tuple[str, bytes, bool]]:
    """(name, bytes to send, whether a handshake precedes them). Each costs one connection."""
    good = b"".join(bytes(f) for f in message_frames(
        Message(Kind.PUSH, "fuzz", "victim", payloads=[Payload.of(np.zeros(10, np.float32))]))[0])
    attacks = []
    for i in range(20):
        attacks.append(("oversize", pack_preamble(FrameType.MESSAGE, MAX_FRAME + 1 + i * 7919),
                        True))
        attacks.append(("oversize_u32", struct.pack("<2sBBI", b"GF", 1, 0, 0xFFFFFFFF), True))
        attacks.append(("bad_magic", rng.randbytes(8 + i), True))
        attacks.append(("truncated", good[:rng.randrange(1, len(good))], True))
        attacks.append(("before_handshake", good, False))
        attacks.append(("control_after_handshake", hello(), True))
        attacks.append(("handshake_oversize", pack_preamble(FrameType.HELLO, 5000), False))
        attacks.append(("handshake_garbage", pack_preamble(FrameType.HELLO, 5) + b"{nope", False))
        attacks.append(("handshake_bad_channel", control_frame(
            FrameType.HELLO, v=1, name="fuzz", to="victim", ch=8 + i, auth=False), False))
        attacks.append(("handshake_misrouted", hello(to="someone-else"), False))
        # streams that lie: a piece of no stream, more than announced, more than allowed
        head = (pack_preamble(FrameType.STREAM_HEAD, STREAM_HEAD.size + 4)
                + STREAM_HEAD.pack(i, FrameType.MESSAGE, 0, 0, 1000 + i) + good[8:12])
        piece = lambda n: (pack_preamble(FrameType.STREAM_PIECE,  # noqa: E731
                                         STREAM_PIECE.size + n) + STREAM_PIECE.pack(i)
                           + rng.randbytes(n))
        attacks.append(("stream_unknown", piece(10), True))
        attacks.append(("stream_overrun", head + piece(500) + piece(1000), True))
        over = bytearray(head)
        STREAM_HEAD.pack_into(over, PREAMBLE.size, i, FrameType.MESSAGE, 0, 0, 1 << 41)
        attacks.append(("stream_oversize", bytes(over), True))
    return attacks


def test_ten_thousand_malformed_frames(caplog):
    caplog.set_level(logging.WARNING, logger="geomx.runtime")
    rng = random.Random(2024)
    bodies, discarded = malformed_bodies(rng, N_BODIES)
    # frame-level rejects that are not WireErrors: reserved flags, unknown frame types
    flagged = [PREAMBLE.pack(b"GF", FrameType.MESSAGE, 1 + i % 255, len(b)) + b
               for i, b in enumerate(valid_bodies(rng) * 3)]
    # (types 9 to 11 are stream frames: their errors close the connection, see below)
    unknown = [pack_preamble(7 + i % 200 + (200 if 9 <= 7 + i % 200 <= 11 else 0), 11)
               + rng.randbytes(11) for i in range(100)]
    attacks = stream_attacks(rng)
    expected_frame_level = len(bodies) + len(flagged) + len(unknown)
    expected = expected_frame_level + len(attacks)
    assert expected >= 10_000

    async def main():
        t0 = time.perf_counter()
        victim = TcpTransport("victim", max_frame_bytes=MAX_FRAME, handshake_timeout_s=5)
        good = TcpTransport("good")
        for t in (victim, good):
            await t.start()
        book = {"victim": victim.local_address(), "good": good.local_address()}
        victim.set_address_book(book)
        good.set_address_book(book)
        host, port = parse_address(victim.local_address())

        # 1) frame-level garbage on one well-handshaken connection, interleaved with
        #    three valid messages that must still be delivered, in order
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(hello())
        ftype, welcome = await read_frame(reader)
        assert ftype == FrameType.WELCOME and welcome["name"] == "victim"
        frames = [pack_preamble(FrameType.MESSAGE, len(b)) + b for b in bodies] + flagged + unknown
        rng.shuffle(frames)
        canaries = []
        for k, at in enumerate((0, len(frames) // 2, len(frames))):
            m = Message(Kind.PUSH, "fuzz", "victim", request_id=1000 + k)
            canaries.append(b"".join(bytes(f) for f in message_frames(m)[0]))
        stream = (canaries[0] + b"".join(frames[:len(frames) // 2]) + canaries[1]
                  + b"".join(frames[len(frames) // 2:]) + canaries[2])
        for off in range(0, len(stream), 65536):
            writer.write(stream[off:off + 65536])
            await writer.drain()
        got = [await victim.recv() for _ in range(3)]
        assert [m.request_id for m in got] == [1000, 1001, 1002]
        writer.close()

        # 2) stream-level attacks, one connection each; the victim must hang up on each
        async def attack(name: str, data: bytes, handshake: bool):
            r, w = await asyncio.open_connection(host, port)
            if handshake:
                w.write(hello())
                assert (await read_frame(r))[0] == FrameType.WELCOME
            w.write(data)
            if name == "truncated":
                w.write_eof()  # the victim sees the stream end mid-frame
            try:
                await asyncio.wait_for(r.read(), 5)  # EOF: the victim closed on us
            except ConnectionError:
                pass
            w.close()

        for i in range(0, len(attacks), 25):
            await asyncio.gather(*(attack(*a) for a in attacks[i:i + 25]))

        # 3) wait for every rejection to be counted, then a well-behaved peer gets through
        deadline = time.perf_counter() + 10
        while victim.stats()["rejected_frames"] < expected and time.perf_counter() < deadline:
            await asyncio.sleep(0.02)
        for i in range(50):
            await good.send(Message(Kind.PUSH, "good", "victim", request_id=i, channel=i % 2,
                                    payloads=[Payload.of(np.full(100, i, np.float32))]))
        ok = [await victim.recv() for _ in range(50)]
        assert sorted(m.request_id for m in ok) == list(range(50))
        assert all(m.src == "good" and m.payloads[0].data[0] == m.request_id for m in ok)
        st = victim.stats()
        await good.close()
        await victim.close()
        return st, time.perf_counter() - t0

    st, elapsed = eventloop.run(asyncio.wait_for(main(), 60))
    rej = st["rejected"]
    assert st["rejected_frames"] == expected, rej
    assert rej["wire"] == len(bodies)
    assert rej["bad_flags"] == len(flagged) and rej["unknown_frame_type"] == len(unknown)
    assert rej["oversize"] == 40 + 20 + 20  # after the handshake: 2 kinds and streams;
    # before it: 20
    assert rej["stream_unknown"] == 20 and rej["stream_overrun"] == 20
    assert rej["bad_magic"] == 20 and rej["truncated"] == 20
    assert rej["protocol"] == 20 + 20 + 20 + 20   # before/after handshake, garbage, channel
    assert rej["misrouted"] == 20
    assert st["peers"]["good"]["msgs_received"] == 50
    logged = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(logged) == expected
    print(f"\n{expected} malformed frames ({discarded} valid mutations discarded) rejected "
          f"in {elapsed:.2f} s: {dict(sorted(rej.items()))}")
    assert elapsed < 20
