"""guble's FCM connector (docs/connectors.md, docs/dialects/guble.md) against a local server playing FCM
(HTTP v1 with its OAuth2 token endpoint, and the legacy API): devices subscribed over guble's REST API get
every message of their topic's subtree in order, the subscriptions survive a restart, an unregistered device
is removed, a new token is substituted without losing what was pending, and FCM down comes back in order."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from hubbub.auth import ANONYMOUS
from hubbub.config import ConfigError
from hubbub.dialects.guble import GubleConfig
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest
from hubbub.server import Server
from hubbub.server_config import load_config

from .fcm_server import LEGACY_KEY, UNREGISTERED, FcmServer
from .serverproc import ServerProcess


def _v1_cli(tmp_path: Path, fcm: FcmServer) -> dict[str, Any]:
    return {
        "data_dir": str(tmp_path / "data"),
        "guble.fcm": "true",
        "guble.fcm_credentials_file": str(fcm.service_account(tmp_path / "sa.json")),
        "guble.fcm_endpoint": fcm.base,
    }


async def _publish(srv: Server, channel: str, payloads: list[bytes]) -> None:
    assert srv.node is not None
    for p in payloads:
        await srv.node.publish(
            AppendRequest(channel, Publisher("guble"), p, "application/json"), None, ANONYMOUS
        )


async def _stored(srv: Server, connector: str = "fcm") -> list[str]:
    """The device tokens of the subscriptions the log keeps."""
    assert srv.node is not None
    return [orjson.loads(r.body)["device_token"] for r in await srv.node.routes.records(connector)]


async def _call(srv: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{srv.ports['http']}{path}"
    data = None if body is None else orjson.dumps(body)
    async with aiohttp.ClientSession() as s, s.request(method, url, data=data) as r:
        return r.status, orjson.loads(await r.read())


def test_subscribe_over_rest_and_receive_every_message_in_order_v1(tmp_path: Path) -> None:
    """A device subscribed to /news gets the 20 messages of /news and /news/sport in commit order (one
    OAuth2 token for all of them), not /other's; the REST answers are guble's; the subscription survives a
    restart and delivers the messages published after it."""

    async def body() -> None:
        fcm = await FcmServer().start()
        cli = _v1_cli(tmp_path, fcm)
        async with Server(load_config(cli=cli, env={})) as srv:
            assert await _call(srv, "POST", "/fcm/dev-1/user-1/news") == (200, {"subscribed": "/news"})
            assert await _call(srv, "POST", "/fcm/dev-1/user-1/news") == (
                200,
                {"error": "subscription already exists"},
            )
            assert await _call(srv, "POST", "/fcm/dev-2/user-2/other") == (200, {"subscribed": "/other"})
            msgs = [orjson.dumps({"n": i, "title": f"t{i}"}) for i in range(1, 21)]
            await _publish(srv, "/news", msgs[:10])
            await _publish(srv, "/news/sport", msgs[10:])
            await fcm.wait(lambda: len(fcm.delivered) >= 20)
            assert [d for d, _ in fcm.delivered] == ["dev-1"] * 20
            assert [m["data"]["n"] for _, m in fcm.delivered] == [str(i) for i in range(1, 21)]
            assert fcm.delivered[0][1]["data"]["title"] == "t1"
            assert fcm.tokens_issued == 1
            assert await _call(srv, "GET", "/fcm/?user_id=user-1") == (200, ["news"])
            assert await _call(srv, "GET", "/fcm/") == (200, ["news", "other"])
            status, st = await _call(srv, "GET", "/api/v1/connectors")
            assert status == 200
            (fcm_status,) = [c for c in st["connectors"] if c["name"] == "fcm"]
            assert fcm_status["sent"] == 20 and len(fcm_status["subscriptions"]) == 2
        async with Server(load_config(cli=cli, env={})) as srv:
            await _publish(srv, "/news", [b"after restart"])
            await fcm.wait(lambda: len(fcm.delivered) >= 21)
            assert fcm.delivered[20] == ("dev-1", {"token": "dev-1", "data": {"message": "after restart"}})
            assert await _call(srv, "DELETE", "/fcm/dev-1/user-1/news") == (200, {"unsubscribed": "news"})
            assert await _call(srv, "DELETE", "/fcm/dev-1/user-1/news") == (
                404,
                {"error": "subscription not found"},
            )
            assert await _call(srv, "GET", "/fcm/") == (200, ["other"])
        await fcm.stop()

    asyncio.run(body())


def test_unregistered_device_is_removed_and_fcm_down_keeps_order(tmp_path: Path) -> None:
    """FCM answers 503 to the first three sends, then delivers: the healthy device gets every
    message in order. The device FCM calls UNREGISTERED is removed: from the list and from the log."""

    async def body() -> None:
        down = 3

        def answer(token: str) -> tuple[int, dict[str, Any], dict[str, str]]:
            nonlocal down
            if token == "gone":
                return UNREGISTERED
            if down:
                down -= 1
                return 503, {"error": {"code": 503, "status": "UNAVAILABLE"}}, {}
            return 200, {}, {}

        fcm = await FcmServer(answer=answer).start()
        async with Server(load_config(cli=_v1_cli(tmp_path, fcm), env={})) as srv:
            assert (await _call(srv, "POST", "/fcm/ok/u/t"))[0] == 200
            assert (await _call(srv, "POST", "/fcm/gone/u/t"))[0] == 200
            await _publish(srv, "/t", [f'{{"i":{i}}}'.encode() for i in range(1, 11)])
            await fcm.wait(lambda: len(fcm.delivered) >= 10)
            assert [m["data"]["i"] for _, m in fcm.delivered] == [str(i) for i in range(1, 11)]
            assert {d for d, _ in fcm.delivered} == {"ok"}
            # (The removal is written after FCM's answer and nothing tells it: poll the log.)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while await _stored(srv) != ["ok"]:
                assert loop.time() < deadline, await _stored(srv)
                await asyncio.sleep(0.01)
            assert await _call(srv, "GET", "/fcm/") == (200, ["t"])
        await fcm.stop()

    asyncio.run(body())


def test_substitute_keeps_what_was_pending_legacy(tmp_path: Path) -> None:
    """Legacy API (guble's key): while FCM refuses, three messages wait for device old-tok; substituting its
    token (POST /fcm/substitute/) sends them, in order, to the new token."""

    async def body() -> None:
        up = asyncio.Event()
        fcm = FcmServer(answer=lambda t: (200, {}, {}) if up.is_set() else (500, {}, {}))
        await fcm.start()
        cli = {
            "data_dir": str(tmp_path / "data"),
            "guble.fcm": "true",
            "guble.fcm_api_key": LEGACY_KEY,
            "guble.fcm_endpoint": f"{fcm.base}/fcm/send",
        }
        async with Server(load_config(cli=cli, env={})) as srv:
            assert (await _call(srv, "POST", "/fcm/old-tok/u/t"))[0] == 200
            await _publish(srv, "/t", [b"a", b"b", b"c"])
            await fcm.wait(lambda: fcm.sends >= 2)
            sub = {"field": "device_token", "old_value": "old-tok", "new_value": "new-tok"}
            assert await _call(srv, "POST", "/fcm/substitute/", sub) == (200, {"modified": 1})
            up.set()
            await fcm.wait(lambda: len(fcm.delivered) >= 3)
            assert [(d, m["data"]["message"]) for d, m in fcm.delivered] == [
                ("new-tok", "a"),
                ("new-tok", "b"),
                ("new-tok", "c"),
            ]
            assert await _call(srv, "GET", "/fcm/?device_token=new-tok") == (200, ["t"])
        await fcm.stop()

    asyncio.run(body())


def test_fcm_configuration_is_checked() -> None:
    """guble's FCM options are read under guble's names, and refused without a key; several workers share
    the subscriptions (kept with the log)."""
    cfg = load_config(cli={"--fcm": "true", "--fcm-api-key": "k", "--fcm-workers": "3"}, env={}).validate()
    guble = cfg.dialects["guble"]
    assert isinstance(guble, GubleConfig)
    assert (guble.fcm, str(guble.fcm_api_key), guble.fcm_workers) == (True, "k", 3)
    assert repr(guble.fcm_api_key) == "'***'"
    env = {"GUBLE_FCM": "true", "GUBLE_FCM_API_KEY": "k2", "GUBLE_FCM_PREFIX": "/push/"}
    guble = load_config(cli={}, env=env).validate().dialects["guble"]
    assert isinstance(guble, GubleConfig)
    assert (str(guble.fcm_api_key), guble.fcm_prefix) == ("k2", "/push/")
    with pytest.raises(ConfigError, match=r"guble\.fcm needs guble\.fcm_api_key"):
        load_config(cli={"guble.fcm": "true"}, env={}).validate()
    for section in ("fcm", "apns"):
        keys = {"fcm_api_key": "k"} if section == "fcm" else {"apns_app_topic": "t", "apns_key_file": "k.p8"}
        keys |= {"apns_key_id": "i", "apns_team_id": "t"} if section == "apns" else {}
        cli = {
            f"guble.{section}": "true",
            "server.workers": "2",
            **{f"guble.{k}": v for k, v in keys.items()},
        }
        assert load_config(cli=cli, env={}).validate().server.workers == 2


def test_subscriptions_past_the_consumer_limit_are_refused(tmp_path: Path) -> None:
    """Each device subscription is a durable consumer: past ``limits.max_consumers`` a subscription is
    refused (400, nothing stored), and the same subscription asked twice at once is made once."""

    async def body() -> None:
        fcm = await FcmServer().start()
        cli = {**_v1_cli(tmp_path, fcm), "limits.max_consumers": "1"}
        async with Server(load_config(cli=cli, env={})) as srv:
            first, again = await asyncio.gather(
                _call(srv, "POST", "/fcm/d1/u/t"), _call(srv, "POST", "/fcm/d1/u/t")
            )
            assert sorted([first, again], key=str) == [
                (200, {"error": "subscription already exists"}),
                (200, {"subscribed": "/t"}),
            ]
            status, answer = await _call(srv, "POST", "/fcm/d2/u/t")
            assert status == 400 and answer["error"].startswith("subscription refused")
            assert await _call(srv, "GET", "/fcm/") == (200, ["t"])
        await fcm.stop()

    asyncio.run(body())


def test_legacy_canonical_id_replaces_the_token(tmp_path: Path) -> None:
    """The legacy API answers a canonical registration id: the next messages go to the new token, and the
    subscription is listed and stored under it (as guble's connector replaced it)."""

    async def body() -> None:
        def answer(token: str) -> tuple[int, dict[str, Any], dict[str, str]]:
            if token == "old-tok":
                canonical = {"message_id": "1", "registration_id": "new-tok"}
                return 200, {"success": 1, "failure": 0, "canonical_ids": 1, "results": [canonical]}, {}
            return 200, {}, {}

        fcm = await FcmServer(answer=answer).start()
        cli = {
            "data_dir": str(tmp_path / "data"),
            "guble.fcm": "true",
            "guble.fcm_api_key": LEGACY_KEY,
            "guble.fcm_endpoint": f"{fcm.base}/fcm/send",
        }
        async with Server(load_config(cli=cli, env={})) as srv:
            assert (await _call(srv, "POST", "/fcm/old-tok/u/t"))[0] == 200
            await _publish(srv, "/t", [b"a", b"b", b"c"])
            await fcm.wait(lambda: len(fcm.delivered) >= 3)
            assert [(d, m["data"]["message"]) for d, m in fcm.delivered] == [
                ("old-tok", "a"),
                ("new-tok", "b"),
                ("new-tok", "c"),
            ]
            assert await _call(srv, "GET", "/fcm/?device_token=new-tok") == (200, ["t"])
            assert await _stored(srv) == ["new-tok"]
        await fcm.stop()

    asyncio.run(body())


def test_a_registry_file_of_an_older_hubbub_is_taken_into_the_log(tmp_path: Path) -> None:
    """``data_dir/connectors/fcm.json`` (the registry before it was kept with the log) is read at start:
    its subscription is listed and delivered, and the file is renamed ``fcm.json.migrated``."""

    async def body() -> None:
        fcm = await FcmServer().start()
        old = tmp_path / "data" / "connectors" / "fcm.json"
        old.parent.mkdir(parents=True)
        fields = {"device_token": "dev-old", "user_id": "u", "topic": "/old"}
        old.write_text(json.dumps({"format": 1, "subscriptions": {"fcm.0123abcd-00ff": fields}}))
        async with Server(load_config(cli=_v1_cli(tmp_path, fcm), env={})) as srv:
            assert not old.exists() and old.with_name("fcm.json.migrated").exists()
            assert await _call(srv, "GET", "/fcm/?device_token=dev-old") == (200, ["old"])
            await _publish(srv, "/old", [b"m1", b"m2"])
            await fcm.wait(lambda: len(fcm.delivered) >= 2)
            assert [(d, m["data"]["message"]) for d, m in fcm.delivered] == [
                ("dev-old", "m1"),
                ("dev-old", "m2"),
            ]
            assert await _call(srv, "DELETE", "/fcm/dev-old/u/old") == (200, {"unsubscribed": "old"})
            assert await _stored(srv) == []
        await fcm.stop()

    asyncio.run(body())


def test_two_workers_share_the_device_subscriptions(tmp_path: Path) -> None:
    """``--workers 2``: devices subscribed through either worker (each request on a connection of its own,
    spread by the kernel) are listed by both, each gets every message once and in order from one worker,
    and one unsubscribed through either is gone for both."""
    devices = [f"dev-{i}" for i in range(6)]
    n = 30

    async def body() -> None:
        fcm = await FcmServer().start()
        extra = [
            "--workers", "2", "--fcm", "--fcm-api-key", LEGACY_KEY, "--fcm-endpoint", f"{fcm.base}/fcm/send",
            "--cluster-poll-interval-s", "0.2",
        ]  # fmt: skip
        srv = await asyncio.to_thread(ServerProcess(tmp_path / "data", extra).start, 60.0)
        port = srv.ports["http"]

        async def call(method: str, path: str) -> tuple[int, Any]:
            async with aiohttp.ClientSession() as s, s.request(method, f"http://127.0.0.1:{port}{path}") as r:
                return r.status, orjson.loads(await r.read())

        try:
            for d in devices:
                assert await call("POST", f"/fcm/{d}/u/t") == (200, {"subscribed": "/t"})
            for _ in range(8):
                assert await call("GET", "/fcm/?user_id=u") == (200, ["t"] * len(devices))
            async with aiohttp.ClientSession() as s:
                for i in range(1, n + 1):
                    async with s.post(
                        f"http://127.0.0.1:{port}/api/v1/publish/t/x", data=str(i).encode()
                    ) as r:
                        assert r.status == 200, await r.text()
            await fcm.wait(lambda: len(fcm.delivered) >= n * len(devices), 30)
            for d in devices:
                got = [int(m["data"]["message"]) for t, m in fcm.delivered if t == d]
                assert got == list(range(1, n + 1)), (d, got)
            assert len(fcm.delivered) == n * len(devices)
            assert await call("DELETE", "/fcm/dev-0/u/t") == (200, {"unsubscribed": "t"})
            for _ in range(8):
                assert await call("GET", "/fcm/?device_token=dev-0") == (200, [])
            assert await asyncio.to_thread(srv.terminate) == 0
        finally:
            srv.kill()
            await fcm.stop()

    asyncio.run(body())
