"""Token auth against a real server (in process, real sockets on loopback): JWT expiry closing connections
with each dialect's code, RS256 keys from PEM and from a JWKS file, the audit log (structured, without token
values) and the ``/metrics`` refusal counters (protocols README §6, docs/security.md).

The permission cases of each dialect are conformance cases (tests/conformance/security/); this module has
what needs a clock, keys made at test time or a look at the logs.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from hubbub.server import Server
from hubbub.server_config import load_config

SECRET = "integration-hs256-secret-0123456789abcdef"
TOKENS = {
    "tok-root": {"user": "root", "admin": True},
    "tok-alice": {"user": "alice", "publish": ["/pub/**"], "subscribe": ["/pub/**"]},
}


@asynccontextmanager
async def server(tmp_path: Path, **extra: Any) -> AsyncIterator[Server]:
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "auth.mode": "token",
        "auth.tokens": TOKENS,
        "auth.jwt_keys": [SECRET],
    }
    cli.update(extra)
    async with Server(load_config(cli=cli, env={})) as srv:
        yield srv


def hs256(sub: str, ttl: float | None = None, **claims: Any) -> str:
    body: dict[str, Any] = {"sub": sub, **claims}
    if ttl is not None:
        body["exp"] = int(time.time() + ttl)
    return jwt.encode(body, SECRET, algorithm="HS256")


async def metrics(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with http.get(base + "/metrics", headers={"Authorization": "Bearer tok-root"}) as r:
        assert r.status == 200
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_expiry_closes_each_dialect(tmp_path: Path) -> None:
    """A token that expires closes the connection: native pushes 4103 and closes with 4103; ivy and guble,
    which have no error reply for it, close with 1008. Connections with a longer token stay open."""

    async def main() -> None:
        async with server(tmp_path, **{"auth.jwt_leeway_s": 0}) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"
            ws_base = f"ws://127.0.0.1:{srv.ports['http']}"
            # exp is whole seconds: 2 s from now expires between 1 and 2 s from now.
            short, long_ = hs256("shorty", ttl=2), hs256("longer", ttl=600)
            t0 = time.monotonic()
            nat = await http.ws_connect(ws_base + "/ws/hubbub", protocols=("hubbub.v1.json",))
            await nat.send_json({"op": "hello", "id": 1, "v": 1, "token": short})
            assert (await nat.receive_json())["user"] == "shorty"
            ivy = await http.ws_connect(ws_base + f"/ws?token={short}", protocols=("ivy1",))
            assert (await ivy.receive_str()).startswith("@")
            gub = await http.ws_connect(ws_base + "/stream/", headers={"Authorization": f"Bearer {short}"})
            assert b'"UserId": "shorty"' in await gub.receive_bytes()
            keep = await http.ws_connect(ws_base + "/ws/hubbub", protocols=("hubbub.v1.json",))
            await keep.send_json({"op": "hello", "id": 1, "v": 1, "token": long_})
            assert (await keep.receive_json())["user"] == "longer"
            m = await metrics(http, base)
            assert m["hubbub_token_expiry_timers"] == 4

            err = await asyncio.wait_for(nat.receive_json(), 10)
            assert err == {"op": "error", "code": 4103, "message": "token expired", "temporary": True}
            msg = await asyncio.wait_for(nat.receive(), 5)
            assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 4103)
            for ws in (ivy, gub):
                msg = await asyncio.wait_for(ws.receive(), 10)
                assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1008)
            assert time.monotonic() - t0 < 5
            await keep.send_json({"op": "ping", "id": 2})
            assert await keep.receive_json() == {"op": "pong", "id": 2}
            m = await metrics(http, base)
            assert m['hubbub_auth_refusals_total{reason="token_expired"}'] == 3
            assert m["hubbub_token_expiry_timers"] == 1
            await keep.close()

    asyncio.run(main())


def test_refresh_extends_expiry(tmp_path: Path) -> None:
    """``op: auth`` with a later token re-arms the expiry: the connection outlives its first token."""

    async def main() -> None:
        async with server(tmp_path, **{"auth.jwt_leeway_s": 0}) as srv, aiohttp.ClientSession() as http:
            ws = await http.ws_connect(
                f"ws://127.0.0.1:{srv.ports['http']}/ws/hubbub", protocols=("hubbub.v1.json",)
            )
            await ws.send_json({"op": "hello", "id": 1, "v": 1, "token": hs256("u", ttl=2)})
            await ws.receive_json()
            await ws.send_json({"op": "auth", "id": 2, "token": hs256("u", ttl=600)})
            assert await ws.receive_json() == {"op": "reply", "id": 2, "user": "u"}
            # Past the first token's expiry, the connection answers (a push of 4103 would come first).
            deadline = time.time() + 3
            n = 3
            while time.time() < deadline:
                await ws.send_json({"op": "ping", "id": n})
                assert await ws.receive_json() == {"op": "pong", "id": n}
                n += 1
                await asyncio.sleep(0.5)
            await ws.close()

    asyncio.run(main())


def b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _rsa() -> tuple[rsa.RSAPrivateKey, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return key, pem


def test_rs256_pem_and_jwks(tmp_path: Path) -> None:
    """RS256 tokens verify against a PEM public key in auth.jwt_keys and against a JWKS file by kid; a
    token signed by another key, or an HS256 token forged with the RSA public key as its secret (algorithm
    confusion), is refused."""
    k1, pem1 = _rsa()
    k2, _pem2 = _rsa()
    k3, _ = _rsa()
    jwk2 = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k2.public_key()))
    jwk2["kid"] = "k2"
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk2]}))

    async def main() -> None:
        extra = {"auth.jwt_keys": [pem1.decode()], "auth.jwks_file": str(jwks)}
        async with server(tmp_path, **extra) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"

            async def status(token: str) -> int:
                h = {"Authorization": f"Bearer {token}"}
                async with http.get(base + "/api/v1/log/pub/x", headers=h) as r:
                    return r.status

            assert await status(jwt.encode({"sub": "a"}, k1, algorithm="RS256")) == 200
            assert await status(jwt.encode({"sub": "b"}, k2, algorithm="RS256", headers={"kid": "k2"})) == 200
            assert await status(jwt.encode({"sub": "c"}, k3, algorithm="RS256", headers={"kid": "k2"})) == 401
            # PyJWT refuses to sign HS256 with a PEM key: the forgery is built by hand.
            signing = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(b'{"sub":"x"}')
            sig = hmac.new(pem1, signing.encode(), hashlib.sha256).digest()
            assert await status(signing + "." + b64(sig)) == 401
            assert await status("none." + b64(b'{"sub":"x"}') + ".") == 401

    asyncio.run(main())


def test_audit_log_and_refusal_counters(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every refusal is one structured audit line (event, code, reason, dialect, and peer, user or
    channel where known) and a count on /metrics by reason; no log line ever holds a token."""
    bad_jwt = hs256("mallory", ttl=-3600)

    async def main() -> None:
        async with server(tmp_path, **{"auth.jwt_leeway_s": 0}) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"
            async with http.get(base + "/api/v1/log/pub/x") as r:
                assert r.status == 401
            async with http.get(base + "/events/pub/x?token=tok-secret-value") as r:
                assert r.status == 401
            async with http.get(
                base + "/api/v1/log/pub/x", headers={"Authorization": f"Bearer {bad_jwt}"}
            ) as r:
                assert r.status == 401
            h = {"Authorization": "Bearer tok-alice"}
            async with http.post(base + "/api/v1/publish/secret/x", headers=h, data=b"x") as r:
                assert r.status == 403
            async with http.post(base + "/events/secret/x", headers=h, data={"data": "x"}) as r:
                assert r.status == 403
            async with http.get(base + "/admin/router", headers=h) as r:
                assert r.status == 403
            m = await metrics(http, base)
            assert m['hubbub_auth_refusals_total{reason="auth_required"}'] == 1
            assert m['hubbub_auth_refusals_total{reason="bad_token"}'] == 1
            assert m['hubbub_auth_refusals_total{reason="token_expired"}'] == 1
            assert m['hubbub_auth_refusals_total{reason="forbidden"}'] == 3

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    audit = [r for r in caplog.records if r.name == "hubbub.audit"]
    fields = [(r.__dict__["code"], r.__dict__["dialect"], r.__dict__.get("channel")) for r in audit]
    assert fields == [
        (4100, "native", None),
        (4101, "ivy", None),
        (4103, "native", None),
        (4102, "native", "/secret/x"),
        (4102, "ivy", "/secret/x"),
        (4102, "guble", None),
    ]
    for r in audit:
        assert r.__dict__["event"] == "auth_refused" and r.__dict__["reason"]
        assert r.__dict__["peer" if r.__dict__["code"] != 4102 else "user"]
    everything = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    for secret in ("tok-secret-value", "tok-alice", bad_jwt, bad_jwt.split(".")[2], SECRET):
        assert secret not in everything


def test_every_dialect_takes_a_basic_or_cookie_token(tmp_path: Path) -> None:
    """The token forms of transports/http.py ``request_token`` (Basic, the hubbub_token cookie) are found
    once for every HTTP surface and upgrade; ``Access`` checks them as any other token."""
    basic = {"Authorization": "Basic " + base64.b64encode(b":tok-root").decode()}
    cookie = {"Cookie": "hubbub_token=tok-root"}

    async def main() -> None:
        async with server(tmp_path) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"
            for method, path in [
                ("GET", "/api/v1/log/x"),  # native
                ("GET", "/events/x"),  # ivy
                ("POST", "/api/message/x"),  # guble
                ("POST", "/qpubs/emit?topic=x"),  # qpubs
                ("GET", "/metrics"),
            ]:
                for headers, ok in [({}, False), (basic, True), (cookie, True)]:
                    async with http.request(method, base + path, data=b"1", headers=headers) as r:
                        assert (r.status != 401) == ok, (path, headers, r.status)
            for path in ("/ws", "/stream/", "/wearscript/ws", "/mist/ws"):  # 401 without a token
                for headers in (basic, cookie):
                    async with http.ws_connect(base.replace("http", "ws") + path, headers=headers) as ws:
                        await ws.close()

    asyncio.run(main())
