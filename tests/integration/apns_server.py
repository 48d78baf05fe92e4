"""A local server playing Apple's push service for the connector tests: HTTP/2 over TLS (h2, ALPN) on
127.0.0.1, port 0, with its own self-signed certificate. It checks each push's path, ``apns-topic`` and
authentication (a provider token signed by ``key``'s ES256 key, or, with ``client_ca``, the client
certificate the TLS handshake required) and answers ``answer(device_token)`` (default: delivered)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import jwt
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["ApnsServer", "self_signed"]

TOPIC = "com.example.app"
KEY_ID = "KEY123"
TEAM_ID = "TEAM456"


def self_signed(name: str, ip: bool = False) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    )
    if ip:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(name))])
        builder = builder.add_extension(san, critical=False)
    return key, builder.sign(key, hashes.SHA256())


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class ApnsServer:
    workdir: Path
    answer: Callable[[str], tuple[int, dict[str, Any]]] = lambda token: (200, {})
    #: PEM of the CA a client certificate must chain to (certificate mode); None: provider tokens.
    client_ca: bytes | None = None
    port: int = 0
    #: (device token, payload) of every push answered 200, in order.
    delivered: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    pushes: int = 0
    #: When given, nothing a client sends is read until it is set (the pushes wait, unanswered).
    hold: asyncio.Event | None = None
    signing_key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    _server: asyncio.Server | None = None
    #: The connections being served, closed by stop() (asyncio.Server.close leaves them open).
    _conns: dict[asyncio.StreamWriter, asyncio.Task[Any]] = field(default_factory=dict)
    #: Provider tokens already verified: a token is checked once, as Apple caches them.
    _good_tokens: set[str] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "apns-server.pem"

    def key_file(self) -> Path:
        path = self.workdir / "AuthKey.p8"
        path.write_bytes(pem_key(self.signing_key))
        return path

    async def start(self) -> ApnsServer:
        key, cert = self_signed("127.0.0.1", ip=True)
        self.ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path = self.workdir / "apns-server.key"
        key_path.write_bytes(pem_key(key))
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.ca_file, key_path)
        ctx.set_alpn_protocols(["h2"])
        if self.client_ca is not None:
            ctx.load_verify_locations(cadata=self.client_ca.decode())
            ctx.verify_mode = ssl.CERT_REQUIRED
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self.hold is not None:
            self.hold.set()  # (a held connection reads on, to its end)
        for writer in self._conns:
            writer.close()
        await asyncio.gather(*self._conns.values(), return_exceptions=True)

    async def wait(self, done: Callable[[], bool], wait_s: float = 10.0) -> None:
        async with asyncio.timeout(wait_s):
            while not done():
                self._changed.clear()
                await self._changed.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[writer] = task
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        streams: dict[int, tuple[dict[str, str], bytearray]] = {}
        try:
            if self.hold is not None:
                await self.hold.wait()
            while data := await reader.read(65536):
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived):
                        hdrs = {_s(k): _s(v) for k, v in ev.headers or ()}
                        streams[ev.stream_id or 0] = (hdrs, bytearray())
                    elif isinstance(ev, h2.events.DataReceived):
                        streams[ev.stream_id or 0][1].extend(ev.data or b"")
                        conn.acknowledge_received_data(ev.flow_controlled_length or 0, ev.stream_id or 0)
                    elif isinstance(ev, h2.events.StreamEnded):
                        sid = ev.stream_id or 0
                        status, body = self._push(*streams.pop(sid))
                        out = [(":status", str(status)), ("content-type", "application/json")]
                        if status == 429:
                            out.append(("retry-after", "1"))  # (as a relay in front of APNs may)
                        conn.send_headers(sid, out)
                        conn.send_data(sid, orjson.dumps(body) if body else b"", end_stream=True)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            del self._conns[writer]
            writer.close()

    def _push(self, headers: dict[str, str], body: bytearray) -> tuple[int, dict[str, Any]]:
        self.pushes += 1
        path = headers.get(":path", "")
        if headers.get(":method") != "POST" or not path.startswith("/3/device/"):
            return 404, {"reason": "BadPath"}
        if headers.get("apns-topic") != TOPIC:
            return 400, {"reason": "BadTopic"}
        if self.client_ca is None:
            token = headers.get("authorization", "").removeprefix("bearer ")
            try:
                if token not in self._good_tokens:
                    assert jwt.get_unverified_header(token)["kid"] == KEY_ID
                    claims = jwt.decode(token, self.signing_key.public_key(), algorithms=["ES256"])
                    assert claims["iss"] == TEAM_ID
                    self._good_tokens.add(token)
            except (jwt.PyJWTError, AssertionError, KeyError):
                return 403, {"reason": "InvalidProviderToken"}
        device = path.removeprefix("/3/device/")
        status, answer = self.answer(device)
        if status == 200:
            self.delivered.append((device, orjson.loads(bytes(body))))
        self._changed.set()
        return status, answer


def _s(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
