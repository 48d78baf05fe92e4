"""TLS and key reload on a real ``hubbub serve`` process: certificates made at test time, a JWKS file
rewritten and a real SIGHUP. Connections open across the reload stay open and keep working; new ones are
checked against the new keys and get the new certificate."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .serverproc import ServerProcess

SECRET_1 = "first-hs256-secret-of-the-jwks-0123456789"
SECRET_2 = "second-hs256-secret-of-the-jwks-987654321"


def make_cert(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 with common name ``name``: (cert file, key file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def write_jwks(path: Path, kid: str, secret: str) -> None:
    k = {"kty": "oct", "kid": kid, "alg": "HS256", "k": jwt.utils.base64url_encode(secret.encode()).decode()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"keys": [k]}))
    tmp.replace(path)


def copy_file(src: Path, dst: Path) -> None:
    dst.write_bytes(src.read_bytes())


def write_text(path: Path, text: str) -> None:
    path.write_text(text)


def token(kid: str, secret: str, sub: str) -> str:
    return jwt.encode({"sub": sub}, secret, algorithm="HS256", headers={"kid": kid})


def client_context(cert: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False  # the certificate names 127.0.0.1 as an IP SAN; checked by the CA pin
    return ctx


def peer_cn(ssl_object: Any) -> str:
    der = ssl_object.getpeercert(binary_form=True)
    cn = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    return str(cn)


async def shut(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        await writer.wait_closed()


async def tcp_hello(
    port: int, ctx: ssl.SSLContext, tok: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    writer.write(json.dumps({"op": "hello", "id": 1, "v": 1, "token": tok}).encode() + b"\n")
    reply = json.loads(await asyncio.wait_for(reader.readline(), 10))
    return reader, writer, reply


def test_tls_and_sighup_reload(tmp_path: Path) -> None:
    cert1, key1 = make_cert(tmp_path, "hubbub-one")
    cert2, key2 = make_cert(tmp_path, "hubbub-two")
    live_cert, live_key = tmp_path / "live.crt", tmp_path / "live.key"
    live_cert.write_bytes(cert1.read_bytes())
    live_key.write_bytes(key1.read_bytes())
    jwks = tmp_path / "jwks.json"
    write_jwks(jwks, "k1", SECRET_1)
    srv = ServerProcess(
        tmp_path / "data",
        [
            "--auth-mode", "token",
            "--auth-jwks-file", str(jwks),
            "--tls-cert", str(live_cert),
            "--tls-key", str(live_key),
        ],
    )  # fmt: skip
    srv.start()
    try:
        asyncio.run(_exercise(srv, cert1, cert2, key2, live_cert, live_key, jwks))
    finally:
        srv.terminate()
    assert "Traceback" not in srv.log()


async def _exercise(
    srv: ServerProcess, cert1: Path, cert2: Path, key2: Path, live_cert: Path, live_key: Path, jwks: Path
) -> None:
    ctx1 = client_context(cert1)
    http_port, tcp_port = srv.ports["http"], srv.ports["native"]
    # Plain text on a TLS listener gets no service.
    reader, writer = await asyncio.open_connection("127.0.0.1", tcp_port)
    writer.write(b'{"op":"hello","id":1,"v":1}\n')
    assert b'"op":"reply"' not in await asyncio.wait_for(reader.read(), 10)
    await shut(writer)

    reader, writer, reply = await tcp_hello(tcp_port, ctx1, token("k1", SECRET_1, "before"))
    assert reply["user"] == "before"
    assert peer_cn(writer.get_extra_info("ssl_object")) == "hubbub-one"
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            f"wss://127.0.0.1:{http_port}/ws/hubbub", protocols=("hubbub.v1.json",), ssl=ctx1
        )
        await ws.send_json({"op": "hello", "id": 1, "v": 1, "token": token("k1", SECRET_1, "ws")})
        assert (await ws.receive_json())["user"] == "ws"
        await ws.send_json({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/r/**"})
        assert (await ws.receive_json())["op"] == "reply"

        # Rotate: the JWKS now holds only k2, the certificate is the second one. Then SIGHUP.
        write_jwks(jwks, "k2", SECRET_2)
        copy_file(cert2, live_cert)
        copy_file(key2, live_key)
        assert srv.proc is not None
        reloads = srv.log().count("reloaded keys and certificates")
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while srv.log().count("reloaded keys and certificates") == reloads:
            assert time.monotonic() < deadline, srv.log()
            await asyncio.sleep(0.05)

        # The connections opened before the reload are open and keep their identity.
        writer.write(b'{"op":"publish","id":2,"channel":"/r/a","text":"after reload","ack":true}\n')
        ack = json.loads(await asyncio.wait_for(reader.readline(), 10))
        assert (ack["op"], ack["seq"]) == ("reply", 1)
        ev = await asyncio.wait_for(ws.receive_json(), 10)
        assert (ev["op"], ev["text"], ev["channel"]) == ("event", "after reload", "/r/a")

        # New connections: the old kid is refused, the new one accepted, with the new certificate.
        ctx2 = client_context(cert2)
        _r2, w2, reply = await tcp_hello(tcp_port, ctx2, token("k1", SECRET_1, "old"))
        assert reply["code"] == 4101
        await shut(w2)
        _r3, w3, reply = await tcp_hello(tcp_port, ctx2, token("k2", SECRET_2, "new"))
        assert reply["user"] == "new"
        assert peer_cn(w3.get_extra_info("ssl_object")) == "hubbub-two"
        await shut(w3)
        async with http.get(
            f"https://127.0.0.1:{http_port}/api/v1/log/r/a",
            headers={"Authorization": "Bearer " + token("k2", SECRET_2, "http")},
            ssl=ctx2,
        ) as r:
            assert r.status == 200 and r.headers["Server"] == "hubbub"
            assert (await r.json())["top"] == 1

        # A reload that cannot read its keys changes nothing.
        write_text(jwks, "not json")
        bad = srv.log().count("reload failed")
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while srv.log().count("reload failed") == bad:
            assert time.monotonic() < deadline, srv.log()
            await asyncio.sleep(0.05)
        _r4, w4, reply = await tcp_hello(tcp_port, ctx2, token("k2", SECRET_2, "still"))
        assert reply["user"] == "still"
        await shut(w4)
        await ws.close()
    await shut(writer)
