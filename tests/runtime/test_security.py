"""Shared-secret HMAC handshake (accept / refuse, both directions), datagram tags, and TLS."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import numpy as np
import pytest

from geomx import wire
from geomx.runtime import security, udp
from geomx.runtime.framing import PREAMBLE, FrameType, control_frame, message_frames
from geomx.runtime.tcp import HandshakeRefused, TcpTransport, parse_address
from geomx.wire import Kind, Message, Payload

from tests.helpers.aio import arun

SECRET = b"correct horse battery staple"


async def node(name: str, **kw) -> TcpTransport:
    t = TcpTransport(name, connect_timeout_s=2.0, **kw)
    await t.start()
    return t


def book(*nodes: TcpTransport) -> None:
    b = {n.name: n.local_address() for n in nodes}
    for n in nodes:
        n.set_address_book(b)


def msg(src: str, dst: str, i: int = 0, ch: int = 0) -> Message:
    return Message(Kind.PUSH, src, dst, request_id=i, channel=ch,
                   payloads=[Payload.of(np.arange(8, dtype=np.float32) + i)])


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, dict]:
    _, ftype, _, n = PREAMBLE.unpack(await reader.readexactly(PREAMBLE.size))
    body = await reader.readexactly(n)
    return ftype, json.loads(body)


# -- primitives -----------------------------------------------------------------------------

def test_proofs_are_directional_and_bound_to_names():
    ns, nc = security.new_nonce(), security.new_nonce()
    c = security.client_proof(SECRET, ns, nc, "w:a:0", "ls:a", 0)
    s = security.server_proof(SECRET, ns, nc, "w:a:0", "ls:a", 0)
    assert c != s and len(c) == 32
    assert security.verify(c, security.client_proof(SECRET, ns, nc, "w:a:0", "ls:a", 0))
    for other in (security.client_proof(b"x" + SECRET, ns, nc, "w:a:0", "ls:a", 0),
                  security.client_proof(SECRET, nc, ns, "w:a:0", "ls:a", 0),
                  security.client_proof(SECRET, ns, nc, "w:a:", "0ls:a", 0),
                  security.client_proof(SECRET, ns, nc, "w:a:0", "ls:a", 1)):
        assert not security.verify(c, other)
    assert security.normalize_secret("abc") == b"abc"
    with pytest.raises(ValueError, match="empty"):
        security.normalize_secret(b"")


# -- handshake over loopback ------------------------------------------------------------------

def test_same_secret_accepts_both_ways():
    async def main():
        a, b = await node("a", secret=SECRET), await node("b", secret=SECRET.decode())
        book(a, b)
        await a.send(msg("a", "b", 1))
        assert (await b.recv()).request_id == 1
        await b.send(msg("b", "a", 2, ch=3))
        assert (await a.recv()).request_id == 2
        assert a.stats()["refused_connections"] == b.stats()["refused_connections"] == 0
        await a.close()
        await b.close()
    arun(main())


def test_wrong_secret_is_refused_and_logged(caplog):
    caplog.set_level(logging.WARNING, logger="geomx.runtime")

    async def main():
        a, b = await node("a", secret=b"not the secret"), await node("b", secret=SECRET)
        book(a, b)
        with pytest.raises(HandshakeRefused, match="refused the connection: authentication failed"):
            await a.send(msg("a", "b"))
        await asyncio.sleep(0.05)
        st = b.stats()
        assert st["refused_connections"] == 1 and st["rejected"] == {"auth": 1}
        assert b.pending() == 0 and st["msgs_received"] == 0
        await a.close()
        await b.close()
    arun(main())
    assert any("wrong shared secret" in r.getMessage() and "'a'" in r.getMessage()
               for r in caplog.records)


def test_missing_secret_on_either_side_is_refused():
    async def main():
        plain, guarded = await node("plain"), await node("guarded", secret=SECRET)
        book(plain, guarded)
        with pytest.raises(HandshakeRefused, match="requires a shared secret"):
            await plain.send(msg("plain", "guarded"))
        with pytest.raises(HandshakeRefused, match="without authentication"):
            await guarded.send(msg("guarded", "plain"))
        await asyncio.sleep(0.05)
        assert guarded.stats()["refused_connections"] == 1
        assert guarded.pending() == 0 and plain.pending() == 0
        await plain.close()
        await guarded.close()
    arun(main())


def test_frames_before_the_handshake_never_reach_recv():
    async def main():
        b = await node("b", secret=SECRET)
        host, port = parse_address(b.local_address())
        reader, writer = await asyncio.open_connection(host, port)
        frames, _ = message_frames(msg("evil", "b"))
        writer.writelines(frames)                       # no HELLO, straight to data
        await writer.drain()
        assert await reader.read() == b""               # the server hangs up
        writer.close()
        # a client that says HELLO but answers the challenge with garbage
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(control_frame(FrameType.HELLO, v=1, name="evil", to="b", ch=0, auth=True))
        ftype, ch = await read_frame(reader)
        assert ftype == FrameType.CHALLENGE and ch["name"] == "b"
        writer.write(control_frame(FrameType.AUTH, nonce="00" * 32, mac="11" * 32))
        ftype, refuse = await read_frame(reader)
        assert ftype == FrameType.REFUSE and "authentication" in refuse["reason"]
        assert await reader.read() == b""
        writer.close()
        await asyncio.sleep(0.05)
        st = b.stats()
        assert b.pending() == 0 and st["msgs_received"] == 0
        assert st["rejected"].get("protocol") == 1 and st["rejected"].get("auth") == 1
        await b.close()
    arun(main())


def test_client_refuses_an_impostor_server():
    async def impostor(reader, writer):
        await read_frame(reader)
        writer.write(control_frame(FrameType.CHALLENGE, name="b", nonce="ab" * 32))
        await read_frame(reader)
        writer.write(control_frame(FrameType.WELCOME, name="b", mac="cd" * 32))
        await writer.drain()
        await reader.read()
        writer.close()

    async def main():
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        a = await node("a", secret=SECRET)
        a.set_address_book({"b": f"127.0.0.1:{port}"})
        with pytest.raises(HandshakeRefused, match="failed to prove the shared secret"):
            await a.send(msg("a", "b"))
        await a.close()
        server.close()
    arun(main())


def test_authenticated_peer_cannot_spoof_another_src():
    async def main():
        b = await node("b", secret=SECRET)
        host, port = parse_address(b.local_address())
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(control_frame(FrameType.HELLO, v=1, name="w:0", to="b", ch=0, auth=True))
        _, ch = await read_frame(reader)
        ns, nc = bytes.fromhex(ch["nonce"]), security.new_nonce()
        proof = security.client_proof(SECRET, ns, nc, "w:0", "b", 0)
        writer.write(control_frame(FrameType.AUTH, nonce=nc.hex(), mac=proof.hex()))
        ftype, welcome = await read_frame(reader)
        assert ftype == FrameType.WELCOME
        assert security.verify(security.server_proof(SECRET, ns, nc, "w:0", "b", 0),
                               bytes.fromhex(welcome["mac"]))
        writer.writelines(message_frames(msg("gs:0", "b", 1))[0])   # claims another name
        writer.writelines(message_frames(msg("w:0", "b", 2))[0])    # honest
        await writer.drain()
        got = await b.recv()
        assert (got.src, got.request_id) == ("w:0", 2)
        assert b.stats()["rejected"] == {"src_mismatch": 1}
        writer.close()
        await b.close()
    arun(main())


def test_udp_datagrams_need_the_secret_tag():
    async def main():
        a, b = await node("a", secret=SECRET), await node("b", secret=SECRET)
        book(a, b)
        await a.send(msg("a", "b", 5, ch=8))
        assert (await b.recv()).request_id == 5
        # an attacker without the key: untagged, and tagged with the wrong key
        host, port = parse_address(b.local_address())
        data = wire.encode_bytes(msg("a", "b", 6, ch=8))
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for d in udp.split_message(data, 1, 1400) + udp.split_message(
                data, 2, 1400, key=security.datagram_key(b"guess")):
            s.sendto(d, (host, port))
        s.close()
        await asyncio.sleep(0.1)
        st = b.stats()
        assert b.pending() == 0 and st["rejected"] == {"udp_auth": 2}
        await a.close()
        await b.close()
    arun(main())


# -- TLS ----------------------------------------------------------------------------------------

def test_tls_exchange_with_secret(tls_files):
    cert, key = tls_files

    async def main():
        kw = dict(secret=SECRET, ssl_server=security.make_server_context(cert, key),
                  ssl_client=security.make_client_context(cert))
        a, b = await node("a", **kw), await node("b", **kw)
        book(a, b)
        big = Message(Kind.PUSH, "a", "b", request_id=1,
                      payloads=[Payload.of(np.arange(3_000_000, dtype=np.float32))])  # 12 MB
        await a.send(big)
        await a.send(msg("a", "b", 2))
        got = [await b.recv() for _ in range(2)]
        np.testing.assert_array_equal(got[0].payloads[0].data, big.payloads[0].data)
        assert got[1].request_id == 2
        await b.send(msg("b", "a", 3))
        assert (await a.recv()).request_id == 3
        conn = next(iter(b._incoming))
        assert conn.transport.get_extra_info("ssl_object") is not None
        await a.close()
        await b.close()
    arun(main())


def test_tls_client_rejects_untrusted_server(tls_files, tmp_path):
    cert, key = tls_files
    other_cert, _ = security.generate_self_signed(tmp_path / "other")

    async def main():
        b = await node("b", ssl_server=security.make_server_context(cert, key))
        a = await node("a", ssl_client=security.make_client_context(other_cert))
        book(a, b)
        with pytest.raises(HandshakeRefused, match="TLS"):
            await a.send(msg("a", "b"))
        await asyncio.sleep(0.05)
        assert b.pending() == 0
        await a.close()
        await b.close()
    arun(main())


def test_openssl_cli_fallback_makes_a_usable_cert(tmp_path, monkeypatch):
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    monkeypatch.setattr(security, "tls_tooling", lambda: "openssl")
    cert, key = security.generate_self_signed(tmp_path)
    security.make_server_context(cert, key)
    security.make_client_context(cert)


def test_tls_mismatch_is_explained(tls_files):
    cert, key = tls_files

    async def main():
        b = await node("b", ssl_server=security.make_server_context(cert, key))
        a = TcpTransport("a", connect_timeout_s=0.5)   # plain TCP client
        await a.start()
        book(a, b)
        with pytest.raises(ConnectionError, match="TLS and the other not"):
            await a.send(msg("a", "b"))
        await a.close()
        await b.close()
    arun(main())
