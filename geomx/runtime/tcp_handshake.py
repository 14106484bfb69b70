"""The handshake every TCP connection starts with: hello, optional authentication, refusal.

ps-lite's van trusts the node id written in each message (its only "handshake" is the
``ADD_NODE`` exchange with the scheduler, which is membership, see
:mod:`geomx.runtime.membership`). geomx authenticates each connection before it carries
a message, so the exchange has a module of its own. It owns

* the dialling side, :func:`client_handshake`: HELLO (version, names, channel) ->
  CHALLENGE + AUTH + WELCOME with a shared secret, or WELCOME without one; every way
  this can go wrong raises :class:`HandshakeRefused` (retrying will not help);
* the accepting side, :func:`serve_handshake`: checks the HELLO, challenges with a
  secret, answers WELCOME or REFUSE (:class:`Refuse` carries the reason logged here and
  the one told to the peer), counts and logs refusals, and opens the connection;
* the field checks (:func:`hex_field`, names up to ``MAX_NAME_BYTES``, the version);
* resuming a stream (:mod:`geomx.runtime.tcp_resume`): the HELLO may carry the
  sender's session id (``sess``); once the peer is authenticated the accepting side
  asks its ``resume`` callback for the last message it delivered on that session and
  answers it in the WELCOME (``ack``, with its incarnation ``inc``). A HELLO without
  ``sess`` opens a plain stream (MESSAGE frames, no acknowledgements);
* the accepting side's limits (:func:`limits_of`): the WELCOME says the longest frame
  and the largest message it takes, and the dialling side's connection keeps them
  (:class:`~geomx.runtime.tcp_conn.Conn`'s ``peer_max_*``) for its sender;
* whether shared-memory rings may be offered later (:mod:`geomx.runtime.shm_ring`):
  the HELLO names the dialling side's host identity (``shm``,
  :func:`~geomx.runtime.shm_ring.host_identity`) where it could offer one, the WELCOME
  says ``shm: true`` where the accepting side would map one and shares that identity
  (same host, namespaces and user: a peer elsewhere is never offered a ring, so its
  first large message waits for no answer); both tell the connection (``Conn.agree_rings``).
  No ring is made here: one is offered on the open connection when its
  sender first has a large message (:mod:`geomx.runtime.framing`, "Same-host pieces"),
  so a connection that carries only small messages never holds one, and on a
  connection that did not agree to rings the ring frames are unknown frames.

The cryptography (nonces, HMAC proofs, constant-time compare) is
:mod:`geomx.runtime.security`'s; the frames are :mod:`geomx.runtime.framing`'s; the
socket is a :class:`~geomx.runtime.tcp_conn.Conn`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from geomx.runtime import security
from geomx.runtime.framing import FrameType, RejectLog, control_frame, parse_control
from geomx.runtime.shm_ring import host_identity
from geomx.runtime.tcp_conn import Conn
from geomx.runtime.tcp_resume import SESSION_BYTES
from geomx.wire import UNRELIABLE_BASE

# the transport's logger: one name to filter for every part of the TCP transport
log = logging.getLogger("geomx.runtime.tcp")

DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
HANDSHAKE_VERSION = 1
MAX_NAME_BYTES = 255


class HandshakeRefused(ConnectionError):
    """The peer (or this side) refused the handshake; retrying will not help."""


def hex_field(body: dict, key: str, size: int) -> bytes:
    """``body[key]`` as ``size`` bytes written in hex; HandshakeRefused otherwise."""
    v = body.get(key)
    try:
        b = bytes.fromhex(v) if isinstance(v, str) else b""
    except ValueError:
        b = b""
    if len(b) != size:
        raise HandshakeRefused(f"handshake field {key!r} must be {size} hex-encoded bytes")
    return b


class Refuse(Exception):
    """The accepting side refuses: ``reason`` is logged, ``public`` is told to the peer."""

    def __init__(self, reason: str, category: str, public: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.category = category
        self.public = public or reason


async def next_control(conn: Conn) -> tuple[FrameType, dict]:
    """The next handshake frame on ``conn`` as ``(type, fields)``."""
    ftype, body = await conn.next_control()
    try:
        return FrameType(ftype), parse_control(body)
    except ValueError as e:
        raise HandshakeRefused(str(e)) from None


def limits_of(conn: Conn) -> dict[str, int]:
    """The WELCOME's word on what this node accepts: the longest frame (``frame``) and
    the largest message (``msg``). The sender cuts its streams' pieces to fit and refuses
    a larger message itself, naming the setting, instead of having it refused here
    (which closes the connection) and writing it again on every reconnect."""
    return {"frame": conn.tr.max_frame_bytes, "msg": conn.tr.max_message_bytes}


async def client_handshake(proto: Conn, *, name: str, peer: str, channel: int,
                           secret: bytes | None, host: str, port: int,
                           session: str | None = None, rings: bool = False) -> tuple[int, str]:
    """Handshake as node ``name`` dialling ``peer`` at ``host:port`` on ``channel``.

    Opens ``proto`` on success; raises :class:`HandshakeRefused` (or ConnectionError if
    the connection closes) otherwise. With a ``session`` (a resumable stream), returns
    the WELCOME's ``(ack, inc)``: the last message of the session the peer delivered
    and the peer's incarnation; ``(0, "")`` without one. ``rings``: this side could
    offer a shared-memory ring later (``proto.agree_rings`` says whether the peer agrees).
    """
    ch = channel
    where = f"{peer!r} at {host}:{port}"
    fields: dict[str, Any] = {"sess": session} if session is not None else {}
    if rings:
        fields["shm"] = host_identity()
    proto.write(control_frame(FrameType.HELLO, v=HANDSHAKE_VERSION, name=name, to=peer,
                              ch=ch, auth=secret is not None, **fields))
    ftype, body = await next_control(proto)
    if ftype == FrameType.REFUSE:
        raise HandshakeRefused(f"{name}: {where} refused the connection: "
                               f"{body.get('reason', '?')}")
    if body.get("name") != peer:
        raise HandshakeRefused(f"{name}: {host}:{port} answers as {body.get('name')!r}, "
                               f"not {peer!r} (is the address book stale?)")
    if ftype == FrameType.CHALLENGE:
        if secret is None:
            raise HandshakeRefused(f"{name}: {where} requires a shared secret and this "
                                   "node has none")
        ns = hex_field(body, "nonce", security.NONCE_BYTES)
        nc = security.new_nonce()
        proof = security.client_proof(secret, ns, nc, name, peer, ch)
        proto.write(control_frame(FrameType.AUTH, nonce=nc.hex(), mac=proof.hex()))
        ftype, body = await next_control(proto)
        if ftype == FrameType.REFUSE:
            raise HandshakeRefused(f"{name}: {where} refused the connection: "
                                   f"{body.get('reason', '?')} (do both nodes use the "
                                   "same shared secret?)")
        if ftype != FrameType.WELCOME:
            raise HandshakeRefused(f"{name}: {where} sent {ftype.name} instead of WELCOME")
        mac = hex_field(body, "mac", 32)
        if not security.verify(security.server_proof(secret, ns, nc, name, peer, ch), mac):
            raise HandshakeRefused(f"{name}: {where} failed to prove the shared secret; "
                                   "refusing it")
    elif ftype == FrameType.WELCOME:
        if secret is not None:
            raise HandshakeRefused(f"{name}: {where} accepted without authentication "
                                   "(it has no shared secret); refusing it")
    else:
        raise HandshakeRefused(f"{name}: unexpected {ftype.name} frame from {where}")
    limits = {}
    for field, key in (("frame", "peer_max_frame_bytes"), ("msg", "peer_max_message_bytes")):
        value = body.get(field)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise HandshakeRefused(f"{name}: {where} announced a bad limit {field}="
                                       f"{value!r}")
            limits[key] = value
    resumed = (0, "")
    if session is not None:
        ack, inc = body.get("ack"), body.get("inc")
        if not isinstance(ack, int) or isinstance(ack, bool) or ack < 0 \
                or not isinstance(inc, str) or not inc:
            raise HandshakeRefused(f"{name}: {where} did not answer where the stream "
                                   f"resumes (ack={ack!r}, inc={inc!r})")
        resumed = (ack, inc)
    proto.agree_rings(rings and body.get("shm") is True)
    proto.open(peer, ch, **limits)
    return resumed


async def serve_handshake(conn: Conn, *, name: str, secret: bytes | None, timeout_s: float,
                          rejects: RejectLog, on_refused: Callable[[], None],
                          resume: Callable[[Conn, str, int, str], dict] | None = None,
                          rings: bool = False) -> None:
    """Answer the handshake on the accepted connection ``conn`` as node ``name``.

    Opens ``conn`` on success. A HELLO with a session id asks to resume a stream:
    ``resume(conn, peer, channel, session)`` -- called only once the peer is
    authenticated -- gives the WELCOME's extra fields (without ``resume`` such a HELLO
    is refused). ``rings``: this side maps shared-memory rings; a HELLO with ``shm``
    naming this host's identity is then answered ``shm: true`` (``Conn.agree_rings``). A
    refusal is logged in ``rejects`` (by category),
    counted through ``on_refused``, told to the peer when it is a :class:`Refuse`, and
    closes (or aborts) the connection; this function does not raise for it.
    """
    claimed = "?"
    challenged = False
    try:
        async with asyncio.timeout(timeout_s):
            ftype, hello = await next_control(conn)
            if ftype != FrameType.HELLO:
                raise Refuse(f"expected HELLO, got {ftype.name}", "protocol")
            claimed = hello.get("name")
            ch = hello.get("ch")
            if hello.get("v") != HANDSHAKE_VERSION:
                raise Refuse(f"handshake version {hello.get('v')!r}, this node speaks "
                             f"{HANDSHAKE_VERSION}", "protocol")
            if not isinstance(claimed, str) or not 0 < len(claimed.encode()) <= MAX_NAME_BYTES:
                raise Refuse(f"bad node name {claimed!r}", "protocol")
            if not isinstance(ch, int) or isinstance(ch, bool) or not 0 <= ch < UNRELIABLE_BASE:
                raise Refuse(f"bad channel {ch!r} (reliable channels are 0..7)", "protocol")
            if hello.get("to") != name:
                raise Refuse(f"this node is {name!r}, not {hello.get('to')!r} (stale "
                             "address book?)", "misrouted")
            session = hello.get("sess")
            if session is not None:
                if resume is None:
                    raise Refuse("this node does not resume streams", "protocol")
                try:
                    hex_field(hello, "sess", SESSION_BYTES)
                except HandshakeRefused as e:
                    raise Refuse(str(e), "protocol") from None
            if secret is not None:
                ns = security.new_nonce()
                conn.write(control_frame(FrameType.CHALLENGE, name=name, nonce=ns.hex()))
                challenged = True
                ftype, auth = await next_control(conn)
                if ftype != FrameType.AUTH:
                    raise Refuse(f"expected AUTH, got {ftype.name} (peer has no shared "
                                 "secret?)", "auth", "authentication required")
                try:
                    nc = hex_field(auth, "nonce", security.NONCE_BYTES)
                    mac = hex_field(auth, "mac", 32)
                except HandshakeRefused as e:
                    raise Refuse(str(e), "auth", "authentication failed") from None
                expected = security.client_proof(secret, ns, nc, claimed, name, ch)
                if not security.verify(expected, mac):
                    raise Refuse("wrong shared secret", "auth", "authentication failed")
                proof = security.server_proof(secret, ns, nc, claimed, name, ch)
                extra = (resume(conn, claimed, ch, session) if session is not None
                         else {})
                conn.write(control_frame(FrameType.WELCOME, name=name, mac=proof.hex(),
                                         **limits_of(conn), **extra,
                                         **_rings_answer(conn, hello, rings)))
            else:
                extra = (resume(conn, claimed, ch, session) if session is not None
                         else {})
                conn.write(control_frame(FrameType.WELCOME, name=name, **limits_of(conn),
                                         **extra, **_rings_answer(conn, hello, rings)))
            conn.open(claimed, ch)
    except Refuse as r:
        on_refused()
        rejects.reject(conn.label, f"refused connection claiming to be {claimed!r}: "
                       f"{r.reason}", r.category)
        conn.write(control_frame(FrameType.REFUSE, reason=r.public))
        conn.close()
    except HandshakeRefused as e:
        on_refused()
        rejects.reject(conn.label, f"refused connection: {e}", "protocol")
        conn.abort()
    except TimeoutError:
        on_refused()
        rejects.reject(conn.label, f"handshake not completed within "
                       f"{timeout_s:g} s", "handshake_timeout")
        conn.abort()
    except ConnectionError as e:
        if challenged:  # it could not answer the challenge: a peer without the secret
            on_refused()
            rejects.reject(conn.label, f"peer claiming to be {claimed!r} closed the "
                           "connection instead of answering the challenge (no "
                           "shared secret?)", "auth")
        else:
            log.debug("%s: connection from %s closed during the handshake: %s", name,
                      conn.label, e)


def _rings_answer(conn: Conn, hello: dict, rings: bool) -> dict[str, bool]:
    """The WELCOME's ``shm``: whether the peer may offer this side a ring later (told to
    ``conn.agree_rings``): this side maps rings and the peer is on this host, in its
    namespaces, as its user."""
    ok = rings and hello.get("shm") == host_identity()
    conn.agree_rings(ok)
    return {"shm": True} if ok else {}
