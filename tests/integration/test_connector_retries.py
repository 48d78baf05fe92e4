"""The connectors' retry schedule and credential pause (docs/connectors.md "Retries"): an event a target
keeps failing is dead-lettered with its reason once its bound is spent and delivery goes on; a
``Retry-After: 0`` is tried again no sooner than the floor; a provider refusing the connector's credentials
pauses the connector (shown in ``GET /api/v1/connectors``), dead-letters nothing and resumes in order."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from hubbub.auth import ANONYMOUS
from hubbub.dialects.guble import GubleConfig
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest
from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports.connector import RetryPolicy

from .apns_server import KEY_ID, TEAM_ID, TOPIC, ApnsServer
from .fcm_server import LEGACY_KEY, FcmServer
from .test_guble_sms import Vonage
from .test_webhooks import SECRET, _cli, _publish, _seqs, until
from .webhook_receiver import Receiver


async def _status(srv: Server, name: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{srv.ports['http']}/api/v1/connectors"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        (c,) = [c for c in (await r.json())["connectors"] if c["name"] == name]
        return dict(c)


def test_the_default_schedule_is_bounded() -> None:
    """Out of the box an event is not tried for ever: a day (about Svix's schedule), Retry-After within
    [1 s, 300 s]."""
    cfg = load_config(cli={}, env={}).validate()
    assert cfg.webhooks.max_retry_s == 86400.0 and cfg.webhooks.retry_after_min_s == 1.0
    policy = RetryPolicy()
    assert policy.next_delay(5, None, 86399.99) is None and policy.next_delay(5, None, 10.0) is not None
    assert policy.delay(0, 0.0) == 1.0 and policy.delay(0, 10**6) == 300.0
    guble = (
        load_config(cli={"guble.fcm": "true", "guble.fcm_api_key": "k"}, env={}).validate().dialects["guble"]
    )
    assert isinstance(guble, GubleConfig)
    assert guble.fcm_max_retry_s == 86400.0


def test_an_event_failing_past_its_bound_is_dead_lettered_and_the_rest_goes_on(tmp_path: Path) -> None:
    """The receiver answers 503 to one event for ever: after ``webhooks.max_retry_s`` it is on the
    dead-letter channel with its reason and tries, and the events after it are delivered in order."""

    async def body() -> None:
        rcv = Receiver(SECRET, answer=lambda b: (503, {}) if b["payload"] == "bad" else (200, {}))
        await rcv.start()
        cli = _cli(tmp_path, rcv.url, **{"webhooks.max_retry_s": "0.5"})
        async with Server(load_config(cli=cli, env={})) as srv:
            assert srv.connectors is not None and srv.node is not None
            hooks = srv.connectors.by_name["webhook"]
            await _publish(srv, "/orders/a", ["a", "bad", "c", "d"])
            await rcv.wait(lambda: len(rcv.accepted) >= 3)
            assert _seqs(rcv.accepted) == [1, 3, 4]
            tried = [r for r in rcv.requests if r.body["seq"] == 2]
            # No try starts past the bound; the receiver stamps a request when it reads it, so its clock
            # may run behind the server's decision by a scheduling delay (0.525 s seen at load 15).
            assert len(tried) >= 3 and tried[-1].at - tried[0].at <= 0.5 + 0.3
            await until(lambda: hooks.stats.dead_lettered >= 1, "the dead letter")
            (ev,) = (await srv.node.read_channel("/hubbub/dead-letter/webhook/orders", limit=10)).events
            assert ev.payload == b"bad" and ev.headers["x-dead-reason"] == "http_503"
            assert ev.headers["x-dead-seq"] == "2" and int(ev.headers["x-dead-attempts"]) == len(tried)
        await rcv.stop()

    asyncio.run(body())


def test_retry_after_zero_waits_for_the_floor(tmp_path: Path) -> None:
    """``Retry-After: 0`` is tried again after ``webhooks.retry_after_min_s`` (1 s), not at once."""

    async def body() -> None:
        calls = 0

        def answer(b: dict[str, Any]) -> tuple[int, dict[str, str]]:
            nonlocal calls
            calls += 1
            return (429, {"Retry-After": "0"}) if calls == 1 else (200, {})

        rcv = await Receiver(SECRET, answer=answer).start()
        async with Server(load_config(cli=_cli(tmp_path, rcv.url), env={})) as srv:
            await _publish(srv, "/orders/a", ["a", "b"])
            await rcv.wait(lambda: len(rcv.accepted) >= 2)
            assert _seqs(rcv.accepted) == [1, 2]
            first, second = rcv.requests[0], rcv.requests[1]
            assert first.body["seq"] == second.body["seq"] == 1
            assert second.at - first.at >= 0.95
        await rcv.stop()

    asyncio.run(body())


def test_refused_credentials_pause_the_connector_and_dead_letter_nothing(tmp_path: Path) -> None:
    """FCM answers 401 (the server key refused): the connector pauses (``paused`` with the reason in the
    status, the subscription ``paused``), probes one push at a time, dead-letters nothing even past
    ``guble.fcm_max_retry_s``, and once FCM accepts the key every message goes, in order."""

    async def body() -> None:
        refusing = True
        fcm = FcmServer(answer=lambda t: (401, {}, {}) if refusing else (200, {}, {}))
        await fcm.start()
        cli = {
            "data_dir": str(tmp_path / "data"),
            "guble.fcm": "true",
            "guble.fcm_api_key": LEGACY_KEY,
            "guble.fcm_endpoint": f"{fcm.base}/fcm/send",
            "guble.fcm_max_retry_s": "0.2",
        }
        async with Server(load_config(cli=cli, env={})) as srv:
            url = f"http://127.0.0.1:{srv.ports['http']}/fcm/dev/u/t"
            async with aiohttp.ClientSession() as s, s.post(url) as r:
                assert r.status == 200
            assert srv.node is not None
            for i in range(1, 6):
                req = AppendRequest(
                    "/t", Publisher("guble"), json.dumps({"i": i}).encode(), "application/json"
                )
                await srv.node.publish(req, None, ANONYMOUS)
            await fcm.wait(lambda: fcm.sends >= 2)  # the refusal, then a probe a second later
            st = await _status(srv, "fcm")
            assert st["paused"]["reason"] == "http_401" and st["paused"]["probes"] >= 1
            assert [s["state"] for s in st["subscriptions"]] == ["paused"]
            assert st["dead_lettered"] == 0
            refusing = False
            await fcm.wait(lambda: len(fcm.delivered) >= 5)
            assert [m["data"]["i"] for _, m in fcm.delivered] == [1, 2, 3, 4, 5]
            st = await _status(srv, "fcm")
            assert st["paused"] is None and st["dead_lettered"] == 0
        await fcm.stop()

    asyncio.run(body())


def test_apns_and_vonage_refusing_credentials_pause_their_connectors(tmp_path: Path) -> None:
    """APNs answering 403 ``InvalidProviderToken`` and Vonage's status 4 (bad credentials) pause their
    connectors as FCM's 401 does: nothing dead-lettered past the bound, every message in order once the
    credentials are accepted."""

    async def body() -> None:
        refusing = True

        def apns_answer(token: str) -> tuple[int, dict[str, Any]]:
            return (403, {"reason": "InvalidProviderToken"}) if refusing else (200, {})

        apns = await ApnsServer(tmp_path, answer=apns_answer).start()
        vonage = await Vonage(lambda to: "4" if refusing else "0").start()
        cli = {
            "data_dir": str(tmp_path / "data"),
            "guble.apns": "true",
            "guble.apns_app_topic": TOPIC,
            "guble.apns_endpoint": apns.base,
            "guble.apns_ca_file": str(apns.ca_file),
            "guble.apns_key_file": str(apns.key_file()),
            "guble.apns_key_id": KEY_ID,
            "guble.apns_team_id": TEAM_ID,
            "guble.apns_max_retry_s": "0.2",
            "guble.sms": "true",
            "guble.sms_api_key": "key",
            "guble.sms_api_secret": "secret",
            "guble.sms_endpoint": f"http://127.0.0.1:{vonage.port}/sms/json",
            "guble.sms_max_retry_s": "0.2",
        }
        async with Server(load_config(cli=cli, env={})) as srv:
            url = f"http://127.0.0.1:{srv.ports['http']}/apns/dev/u/t"
            async with aiohttp.ClientSession() as s, s.post(url) as r:
                assert r.status == 200
            assert srv.node is not None
            for i in range(1, 4):
                for channel, body in (
                    ("/t", {"aps": {"alert": f"a{i}"}}),
                    ("/sms", {"to": "+49", "text": f"s{i}"}),
                ):
                    req = AppendRequest(
                        channel, Publisher("guble"), json.dumps(body).encode(), "application/json"
                    )
                    await srv.node.publish(req, None, ANONYMOUS)
            await apns.wait(lambda: apns.pushes >= 2)  # the refusal, then a probe
            await vonage.wait(lambda: vonage.requests >= 2)
            for name, reason in (("apns", "apns_InvalidProviderToken"), ("sms", "sms_status_4")):
                st = await _status(srv, name)
                assert st["paused"]["reason"] == reason and st["dead_lettered"] == 0, st
            refusing = False
            await apns.wait(lambda: len(apns.delivered) >= 3)
            await vonage.wait(lambda: len(vonage.sent) >= 3)
            assert [p["aps"]["alert"] for _, p in apns.delivered] == ["a1", "a2", "a3"]
            assert [m["text"] for m in vonage.sent] == ["s1", "s2", "s3"]
            for name in ("apns", "sms"):
                st = await _status(srv, name)
                assert st["paused"] is None and st["dead_lettered"] == 0, st
        await apns.stop()
        await vonage.stop()

    asyncio.run(body())
