"""guble's APNs connector (docs/connectors.md) against a local HTTP/2 TLS server playing Apple's push
service: provider tokens from a .p8 key, and guble's .p12 client certificate; every message in order to
every subscribed device, 410 Unregistered removing the device, and 429 with Retry-After."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from hubbub.auth import ANONYMOUS
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest
from hubbub.server import Server
from hubbub.server_config import load_config

from .apns_server import KEY_ID, TEAM_ID, TOPIC, ApnsServer, self_signed


async def _publish(srv: Server, channel: str, payloads: list[bytes]) -> None:
    assert srv.node is not None
    for p in payloads:
        req = AppendRequest(channel, Publisher("guble"), p, "application/json")
        await srv.node.publish(req, None, ANONYMOUS)


async def _call(srv: Server, method: str, path: str) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{srv.ports['http']}{path}"
    async with aiohttp.ClientSession() as s, s.request(method, url) as r:
        return r.status, orjson.loads(await r.read())


def _cli(tmp_path: Path, apns: ApnsServer, **auth: str) -> dict[str, Any]:
    return {
        "data_dir": str(tmp_path / "data"),
        "guble.apns": "true",
        "guble.apns_app_topic": TOPIC,
        "guble.apns_endpoint": apns.base,
        "guble.apns_ca_file": str(apns.ca_file),
        **auth,
    }


def test_provider_token_every_message_in_order_and_unregistered_removed(tmp_path: Path) -> None:
    """Two devices on /alerts: the live one gets all 12 messages in order (JSON bodies as they are, text as
    an alert), one provider token signs them all; the one APNs answers 410 is removed."""

    async def body() -> None:
        def answer(token: str) -> tuple[int, dict[str, Any]]:
            return (410, {"reason": "Unregistered"}) if token == "gone" else (200, {})

        apns = await ApnsServer(tmp_path, answer=answer).start()
        auth = {
            "guble.apns_key_file": str(apns.key_file()),
            "guble.apns_key_id": KEY_ID,
            "guble.apns_team_id": TEAM_ID,
        }
        async with Server(load_config(cli=_cli(tmp_path, apns, **auth), env={})) as srv:
            assert await _call(srv, "POST", "/apns/live/u1/alerts") == (200, {"subscribed": "/alerts"})
            assert await _call(srv, "POST", "/apns/gone/u2/alerts") == (200, {"subscribed": "/alerts"})
            msgs = [orjson.dumps({"aps": {"alert": f"m{i}"}, "i": i}) for i in range(1, 12)] + [b"plain"]
            await _publish(srv, "/alerts", msgs)
            await apns.wait(lambda: len(apns.delivered) >= 12)
            assert [d for d, _ in apns.delivered] == ["live"] * 12
            assert [p.get("i") for _, p in apns.delivered[:11]] == list(range(1, 12))
            assert apns.delivered[11][1] == {"aps": {"alert": "plain"}}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while (await _call(srv, "GET", "/apns/"))[1] != ["alerts"]:  # the removal follows the 410
                assert loop.time() < deadline
                await asyncio.sleep(0.01)
            assert srv.connectors is not None
            apns_c = srv.connectors.by_name["apns"]
            assert apns_c.stats.removed == 1 and apns_c.stats.sent == 12
            provider = apns_c.provider
            assert getattr(provider, "tokens_made", None) == 1
        await apns.stop()

    asyncio.run(body())


def test_p12_client_certificate_and_retry_after(tmp_path: Path) -> None:
    """guble's .p12 client certificate (with its password) opens the TLS connection the server requires a
    certificate on; a 429 with Retry-After 1 is tried again a second later, and the order is kept."""

    async def body() -> None:
        key, cert = self_signed("hubbub-client")
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        p12 = tmp_path / "client.p12"
        enc = serialization.BestAvailableEncryption(b"pw")
        p12.write_bytes(pkcs12.serialize_key_and_certificates(b"hubbub", key, cert, None, enc))
        seen: list[float] = []

        def answer(token: str) -> tuple[int, dict[str, Any]]:
            seen.append(time.monotonic())
            return (429, {"reason": "TooManyRequests"}) if len(seen) == 1 else (200, {})

        apns = await ApnsServer(tmp_path, answer=answer, client_ca=cert_pem).start()
        auth = {"guble.apns_cert_file": str(p12), "guble.apns_cert_password": "pw"}
        async with Server(load_config(cli=_cli(tmp_path, apns, **auth), env={})) as srv:
            assert (await _call(srv, "POST", "/apns/dev/u/t"))[0] == 200
            await _publish(srv, "/t", [b'{"aps":{"alert":"a"}}', b'{"aps":{"alert":"b"}}'])
            await apns.wait(lambda: len(apns.delivered) >= 2)
            assert [p["aps"]["alert"] for _, p in apns.delivered] == ["a", "b"]
            assert seen[1] - seen[0] >= 0.95  # Retry-After, not the backoff
        await apns.stop()

    asyncio.run(body())
