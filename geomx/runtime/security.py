"""Who may talk to a node: a shared-secret HMAC handshake, optional TLS, datagram tags.

Shared-secret handshake (mutual challenge-response)
---------------------------------------------------
Every TCP connection starts with a handshake before any message frame (frame types in
:mod:`geomx.runtime.framing`)::

    client -> server  HELLO     {v, name, to, ch, auth}   who I am, whom I want, channel
    server -> client  CHALLENGE {name, nonce: Ns}         (only when the server has a secret)
    client -> server  AUTH      {nonce: Nc, mac: C}
    server -> client  WELCOME   {name, mac: S}            (or REFUSE {reason})

    C = HMAC-SHA256(secret, "...|c2s|" || Ns || Nc || client || server || channel)
    S = HMAC-SHA256(secret, "...|s2c|" || Ns || Nc || client || server || channel)

The server refuses a HELLO whose ``to`` is not its own name (a stale address book shows
up as a clear error, not as messages for the wrong node), and a client sends no message
frame before WELCOME; a message frame before that, or a handshake frame after it,
closes the connection. The server challenges first and answers the client's nonce only after the client has
proved it knows the secret, so an unauthenticated client gets nothing it could use.
The client checks ``S`` (the server proves the secret too: mutual), and both sides
compare MACs in constant time (:func:`hmac.compare_digest`). Direction labels
(``c2s``/``s2c``) stop a proof from being reflected back; fresh 32-byte nonces on both
sides stop replays; names are length-prefixed so no two (client, server) pairs encode
alike. A peer with a wrong or missing secret is refused, logged, and none of its frames
reaches ``recv()``. Without a secret on either side the handshake is HELLO/WELCOME and
only names are exchanged (a client that has a secret refuses a server that does not).

The secret authenticates membership of the job, not the individual node: every holder
can claim any name. Confidentiality needs TLS.

TLS
---
:func:`make_server_context` / :func:`make_client_context` build standard-library
:class:`ssl.SSLContext` objects (TLS 1.2+, certificate verification on by default);
:func:`generate_self_signed` writes a throwaway certificate for tests and single-host
trials (``cryptography`` if installed, else the ``openssl`` command).

Datagrams
---------
UDP channels cannot run a handshake, so with a secret every datagram carries a 16-byte
truncated HMAC-SHA256 tag under a key derived from the secret (:func:`datagram_key`);
untagged or wrongly tagged datagrams are dropped. Datagrams are not encrypted (no DTLS
in the standard library) and replays are not detected.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import shutil
import ssl
import subprocess
from pathlib import Path

NONCE_BYTES = 32
DATAGRAM_TAG_BYTES = 16
_C2S = b"geomx-handshake-v1|c2s|"
_S2C = b"geomx-handshake-v1|s2c|"
_UDP = b"geomx-datagram-key-v1"


class AuthError(ConnectionError):
    """A handshake failed: wrong or missing secret, or a protocol violation."""


def normalize_secret(secret: bytes | str | None) -> bytes | None:
    """``bytes`` (a ``str`` is UTF-8 encoded); ``None`` stays ``None``; empty is an error."""
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"secret must be bytes or str, got {type(secret).__name__}")
    if not secret:
        raise ValueError("secret must not be empty (use None for no authentication)")
    return bytes(secret)


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def _transcript(server_nonce: bytes, client_nonce: bytes, client: str, server: str,
                channel: int) -> bytes:
    c, s = client.encode(), server.encode()
    return b"".join((server_nonce, client_nonce, len(c).to_bytes(2, "little"), c,
                     len(s).to_bytes(2, "little"), s, channel.to_bytes(2, "little")))


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, client: str,
                 server: str, channel: int) -> bytes:
    """The MAC a client sends to prove it knows ``secret``."""
    return hmac.new(secret, _C2S + _transcript(server_nonce, client_nonce, client, server,
                                               channel), hashlib.sha256).digest()


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, client: str,
                 server: str, channel: int) -> bytes:
    """The MAC a server sends back once the client is accepted."""
    return hmac.new(secret, _S2C + _transcript(server_nonce, client_nonce, client, server,
                                               channel), hashlib.sha256).digest()


def verify(expected: bytes, received: bytes) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(expected, received)


def datagram_key(secret: bytes) -> bytes:
    """The key that tags UDP datagrams, derived from the shared secret."""
    return hmac.new(secret, _UDP, hashlib.sha256).digest()


def datagram_tag(key: bytes, *parts: bytes | memoryview) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(p)
    return h.digest()[:DATAGRAM_TAG_BYTES]


# -- TLS ----------------------------------------------------------------------------------

def make_server_context(cert: str | os.PathLike, key: str | os.PathLike, *,
                        client_cafile: str | os.PathLike | None = None) -> ssl.SSLContext:
    """A server-side TLS context from a PEM certificate chain and key.

    With ``client_cafile`` clients must present a certificate signed by it (mutual TLS).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(os.fspath(cert), os.fspath(key))
    if client_cafile is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=os.fspath(client_cafile))
    return ctx


def make_client_context(cafile: str | os.PathLike | None = None, *, check_hostname: bool = True,
                        cert: str | os.PathLike | None = None,
                        key: str | os.PathLike | None = None) -> ssl.SSLContext:
    """A client-side TLS context that verifies servers against ``cafile``.

    ``cafile=None`` uses the system trust store. ``cert``/``key`` present a client
    certificate (for a server built with ``client_cafile``).
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                     cafile=os.fspath(cafile) if cafile is not None else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    if cert is not None:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key) if key is not None else None)
    return ctx


def tls_tooling() -> str | None:
    """What :func:`generate_self_signed` would use: "cryptography", "openssl" or None."""
    try:
        import cryptography  # noqa: F401
        return "cryptography"
    except ImportError:
        pass
    return "openssl" if shutil.which("openssl") else None


def generate_self_signed(directory: str | os.PathLike,
                         hostnames: tuple[str, ...] = ("localhost", "127.0.0.1"),
                         *, days: int = 2) -> tuple[Path, Path]:
    """Write a throwaway self-signed certificate and key; return ``(cert.pem, key.pem)``.

    The certificate names every entry of ``hostnames`` as a subject alternative name
    (IP addresses as IP entries) and is its own CA, so a client context built with
    ``cafile=cert.pem`` accepts it. For tests and trials only.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    tool = tls_tooling()
    if tool == "cryptography":
        _self_signed_cryptography(cert_path, key_path, hostnames, days)
    elif tool == "openssl":
        _self_signed_openssl(cert_path, key_path, hostnames, days)
    else:
        raise RuntimeError("cannot make a certificate: neither the 'cryptography' package "
                           "nor the 'openssl' command is available")
    return cert_path, key_path


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def _self_signed_cryptography(cert_path: Path, key_path: Path, hostnames: tuple[str, ...],
                              days: int) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0])])
    sans = [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h)
            for h in hostnames]
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(key_path, 0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _self_signed_openssl(cert_path: Path, key_path: Path, hostnames: tuple[str, ...],
                         days: int) -> None:
    san = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hostnames)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key_path), "-out", str(cert_path), "-days", str(days),
         "-subj", f"/CN={hostnames[0]}", "-addext", f"subjectAltName={san}",
         "-addext", "basicConstraints=critical,CA:TRUE"],
        check=True, capture_output=True, timeout=60)
    os.chmod(key_path, 0o600)
