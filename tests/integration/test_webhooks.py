"""Webhooks as durable deliveries (docs/connectors.md) against a real local receiver that checks every
signature: every event in order, the receiver down and back, 429 with ``Retry-After``, 410 removing the
hook's subscription, a permanent refusal to the dead-letter channel, and ``kill -9`` of the server mid-stream.
Every test checks every id: no gap, no duplicate where none may be, and the order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.auth import ANONYMOUS
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest
from hubbub.server import Server
from hubbub.server_config import load_config

from .serverproc import ServerProcess
from .webhook_receiver import Receiver

SECRET = "s3cret"


def _cli(tmp_path: Path, url: str, **extra: Any) -> dict[str, Any]:
    hooks = {"orders": {"url": url, "pattern": "/orders/**", "secret": SECRET}}
    return {
        "data_dir": str(tmp_path / "data"),
        "webhooks.hooks": json.dumps(hooks),
        "webhooks.retry_base_s": "0.02",
        "webhooks.retry_max_s": "0.1",
        **extra,
    }


async def _publish(srv: Server, channel: str, payloads: list[str]) -> None:
    assert srv.node is not None
    for p in payloads:
        req = AppendRequest(channel, Publisher("native"), p.encode(), "text/plain; charset=utf-8")
        await srv.node.publish(req, None, ANONYMOUS)  # (an admin identity: auth may be on)


async def _status(port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/api/v1/connectors") as r:
        assert r.status == 200
        body: dict[str, Any] = await r.json()
        return body


async def until(check: Callable[[], bool], what: str, wait: float = 10.0) -> None:
    """Poll ``check`` (state of the server in this process, which tells no event for it) until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _seqs(bodies: list[dict[str, Any]]) -> list[int]:
    return [b["seq"] for b in bodies]


def test_every_event_in_order_signed_and_counted(tmp_path: Path) -> None:
    """40 events on one channel reach the receiver once each, in seq order, signed, with their fields;
    events outside the pattern do not; the status endpoint counts them."""

    async def body() -> None:
        rcv = await Receiver(SECRET).start()
        async with Server(load_config(cli=_cli(tmp_path, rcv.url), env={})) as srv:
            await _publish(srv, "/orders/a", [f"o{i}" for i in range(1, 41)])
            await _publish(srv, "/other/x", ["nope"])
            await rcv.wait(lambda: len(rcv.accepted) >= 40)
            assert _seqs(rcv.accepted) == list(range(1, 41))
            hooks_c = srv.connectors.by_name["webhook"] if srv.connectors else None
            assert hooks_c is not None
            # (the last answer is recorded before the server reads it)
            await until(lambda: hooks_c.stats.sent >= 40, "the last answer")
            assert [b["payload"] for b in rcv.accepted] == [f"o{i}" for i in range(1, 41)]
            first = rcv.accepted[0]
            assert (first["hook"], first["channel"], first["encoding"]) == ("orders", "/orders/a", "utf-8")
            assert all(r.signed and r.attempt == 0 for r in rcv.requests)
            st = await _status(srv.ports["http"])
            (hooks,) = st["connectors"]
            assert hooks["name"] == "webhook" and hooks["sent"] == 40 and hooks["failed"] == {}
            assert hooks["subscriptions"][0]["consumer"] == "webhook.orders"
            assert hooks["latency_s"]["count"] == 40
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{srv.ports['http']}/metrics") as r,
            ):
                text = await r.text()
            assert 'hubbub_connector_sent_total{connector="webhook"} 40.0' in text
            assert 'hubbub_connector_latency_seconds_count{connector="webhook"} 40.0' in text
        await rcv.stop()

    asyncio.run(body())


def test_receiver_down_then_back_loses_nothing_and_keeps_order(tmp_path: Path) -> None:
    """The receiver answers 503, then is gone (connection refused), then comes back on its port: every
    event is accepted exactly once, in order, and the failures are counted as retries."""

    async def body() -> None:
        rcv = Receiver(SECRET, answer=lambda b: (503, {}))
        await rcv.start()
        async with Server(load_config(cli=_cli(tmp_path, rcv.url), env={})) as srv:
            await _publish(srv, "/orders/a", [f"o{i}" for i in range(1, 11)])
            await rcv.wait(lambda: len(rcv.requests) >= 3)  # retried while refused
            await rcv.stop()  # down: connections refused
            await _publish(srv, "/orders/a", [f"o{i}" for i in range(11, 31)])
            hooks = srv.connectors.by_name["webhook"] if srv.connectors else None
            assert hooks is not None
            await until(lambda: hooks.stats.failed["connect"] >= 2, "refused connections")
            rcv.answer = lambda b: (200, {})
            await rcv.start()  # back, on the same port
            await rcv.wait(lambda: len(rcv.accepted) >= 30)
            assert _seqs(rcv.accepted) == list(range(1, 31))
            await until(lambda: hooks.stats.sent >= 30, "the last answer")
            assert hooks.stats.retries >= 4
            assert hooks.stats.failed["http_503"] >= 2
        await rcv.stop()

    asyncio.run(body())


def test_429_waits_for_retry_after(tmp_path: Path) -> None:
    """A 429 with ``Retry-After: 1`` is tried again no sooner than a second later (the backoff alone would
    be 20 ms), and the events after it wait their turn."""

    async def body() -> None:
        calls = 0

        def answer(b: dict[str, Any]) -> tuple[int, dict[str, str]]:
            nonlocal calls
            calls += 1
            return (429, {"Retry-After": "1"}) if calls == 1 else (200, {})

        rcv = await Receiver(SECRET, answer=answer).start()
        async with Server(load_config(cli=_cli(tmp_path, rcv.url), env={})) as srv:
            await _publish(srv, "/orders/a", ["a", "b", "c"])
            await rcv.wait(lambda: len(rcv.accepted) >= 3)
            assert _seqs(rcv.accepted) == [1, 2, 3]
            first, second = rcv.requests[0], rcv.requests[1]
            assert first.body["seq"] == second.body["seq"] == 1 and second.attempt == 1
            assert second.at - first.at >= 0.95
        await rcv.stop()

    asyncio.run(body())


def test_410_removes_the_subscription(tmp_path: Path) -> None:
    """A 410 deletes the hook's consumer: nothing more is journaled or pushed for it until the next start."""

    async def body() -> None:
        rcv = await Receiver(SECRET, answer=lambda b: (410, {})).start()
        async with Server(load_config(cli=_cli(tmp_path, rcv.url), env={})) as srv:
            assert srv.consumers is not None and srv.connectors is not None
            await _publish(srv, "/orders/a", ["a", "b"])
            hooks = srv.connectors.by_name["webhook"]
            consumers = srv.consumers
            await until(lambda: consumers.info("webhook.orders") is None, "the consumer's delete")
            await _publish(srv, "/orders/a", ["c"])
            st = await _status(srv.ports["http"])
            assert st["connectors"][0]["removed"] == 1 and st["connectors"][0]["subscriptions"] == []
            assert hooks.stats.failed["http_410"] == 1
            assert [r.body["seq"] for r in rcv.requests] == [1]
        await rcv.stop()

    asyncio.run(body())


def test_permanent_refusal_goes_to_the_dead_letter_channel(tmp_path: Path) -> None:
    """A 400 for one event puts it on ``/hubbub/dead-letter/webhook/orders`` with the reason and its place,
    and the events after it are delivered in order."""

    async def body() -> None:
        rcv = Receiver(SECRET, answer=lambda b: (400, {}) if b["payload"] == "bad" else (200, {}))
        await rcv.start()
        async with Server(load_config(cli=_cli(tmp_path, rcv.url), env={})) as srv:
            assert srv.connectors is not None
            hooks = srv.connectors.by_name["webhook"]
            await _publish(srv, "/orders/a", ["a", "bad", "c", "d"])
            await rcv.wait(lambda: len(rcv.accepted) >= 3)
            assert _seqs(rcv.accepted) == [1, 3, 4]
            dead = "/hubbub/dead-letter/webhook/orders"
            await until(lambda: hooks.stats.dead_lettered >= 1, "the dead letter")
            assert srv.node is not None
            (ev,) = (await srv.node.read_channel(dead, limit=10)).events
            assert ev.payload == b"bad"
            assert ev.headers["x-dead-reason"] == "http_400" and ev.headers["x-dead-channel"] == "/orders/a"
            assert ev.headers["x-dead-seq"] == "2"
        await rcv.stop()

    asyncio.run(body())


def test_kill_9_mid_stream_loses_nothing(tmp_path: Path) -> None:
    """A ``hubbub serve`` process with a hook in its TOML file is killed -9 while it pushes 150 events to a
    slow receiver; after a restart every event is accepted, in order (what was out when it died comes
    again: at least once, so the first arrivals are checked)."""
    n = 150

    async def body() -> None:
        rcv = await Receiver(SECRET, delay=0.01).start()
        conf = tmp_path / "hubbub.toml"
        conf.write_text(
            "[webhooks]\nretry_base_s = 0.02\n"
            f'[webhooks.hooks.orders]\nurl = "{rcv.url}"\npattern = "/orders/**"\nsecret = "{SECRET}"\n'
        )
        data = tmp_path / "data"
        srv = await asyncio.to_thread(ServerProcess(data, ["--config", str(conf)]).start)
        try:
            async with aiohttp.ClientSession() as s:
                for i in range(1, n + 1):
                    url = f"http://127.0.0.1:{srv.ports['http']}/api/v1/publish/orders/a"
                    async with s.post(url, data=f"o{i}".encode()) as r:
                        assert r.status == 200, await r.text()
            await rcv.wait(lambda: len(rcv.accepted) >= n // 3)
            srv.kill()
            assert srv.proc is not None
            await asyncio.to_thread(srv.proc.wait, 10)
            before = len(rcv.accepted)
            srv = await asyncio.to_thread(ServerProcess(data, ["--config", str(conf)]).start)
            await rcv.wait(lambda: len({b["seq"] for b in rcv.accepted}) >= n, wait_s=20)
            seqs = _seqs(rcv.accepted)
            first_seen = list(dict.fromkeys(seqs))
            assert first_seen == list(range(1, n + 1))
            # A redelivery starts at an unacknowledged event and goes on in order from there.
            assert seqs[before:] == list(range(seqs[before], n + 1))
            assert seqs[before] <= before + 1
            assert srv.terminate() == 0
        finally:
            srv.kill()
            await rcv.stop()

    asyncio.run(body())


@pytest.mark.parametrize(
    ("hooks", "error"),
    [
        ({"x y": {"url": "http://a/", "pattern": "/a"}}, "webhooks.hooks.x y"),
        ({"a": {"url": "ftp://a/", "pattern": "/a"}}, "webhooks.hooks.a.url"),
        ({"a": {"url": "http://a/", "pattern": "a"}}, "webhooks.hooks.a.pattern"),
        ({"a": {"url": "http://a/", "pattern": "/a", "sekret": "x"}}, "unknown sekret"),
    ],
)
def test_bad_hooks_are_refused_naming_the_key(hooks: dict[str, Any], error: str) -> None:
    from hubbub.config import ConfigError

    with pytest.raises(ConfigError, match=error):
        load_config(cli={"webhooks.hooks": json.dumps(hooks)}, env={}).validate()


def test_status_is_for_admins_and_hooks_deliver_with_auth_on(tmp_path: Path) -> None:
    """With ``auth.mode = token`` the hooks still deliver (the connectors act as the server's own admin
    identity), and ``GET /api/v1/connectors`` and ``/api/v1/webhooks`` answer 401 without a token, 403 to
    a token that is not admin, 200 to an admin token; a PUT by a token that is not admin is 403."""
    tokens = {
        "tok-root": {"user": "root", "admin": True},
        "tok-bob": {"user": "bob", "publish": ["/**"], "subscribe": ["/**"]},
    }

    async def body() -> None:
        rcv = await Receiver(SECRET).start()
        cli = _cli(tmp_path, rcv.url, **{"auth.mode": "token", "auth.tokens": json.dumps(tokens)})
        async with Server(load_config(cli=cli, env={})) as srv, aiohttp.ClientSession() as s:
            await _publish(srv, "/orders/a", ["a", "b"])
            await rcv.wait(lambda: len(rcv.accepted) >= 2)
            assert _seqs(rcv.accepted) == [1, 2]
            for path in ("/api/v1/connectors", "/api/v1/webhooks"):
                url = f"http://127.0.0.1:{srv.ports['http']}{path}"
                statuses = []
                for token in (None, "tok-bob", "tok-root"):
                    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
                    async with s.get(url, headers=headers) as r:
                        statuses.append(r.status)
                assert statuses == [401, 403, 200], path
            url = f"http://127.0.0.1:{srv.ports['http']}/api/v1/webhooks/x"
            hook = json.dumps({"url": rcv.url, "pattern": "/x"})
            async with s.put(url, data=hook, headers={"Authorization": "Bearer tok-bob"}) as r:
                assert r.status == 403
        await rcv.stop()

    asyncio.run(body())


def test_webhooks_over_rest_persist_and_refuse_what_they_must(tmp_path: Path) -> None:
    """``PUT /api/v1/webhooks/<name>`` adds a hook that delivers every event in order and survives a
    restart; ``GET`` lists both kinds without secrets; a bad definition is 400, a hook of the file 409;
    ``DELETE`` removes it with its consumer (404 after)."""

    async def body() -> None:
        rcv = await Receiver(SECRET).start()
        cli = _cli(tmp_path, rcv.url)
        hook = {"url": rcv.url, "pattern": "/api-made/**", "secret": SECRET}

        async def call(srv: Server, method: str, path: str, data: Any = None) -> tuple[int, Any]:
            url = f"http://127.0.0.1:{srv.ports['http']}{path}"
            raw = None if data is None else json.dumps(data).encode()
            async with aiohttp.ClientSession() as s, s.request(method, url, data=raw) as r:
                return r.status, await r.json()

        async with Server(load_config(cli=cli, env={})) as srv:
            assert await call(srv, "PUT", "/api/v1/webhooks/made", hook) == (
                201,
                {"name": "made", "created": True},
            )
            assert (await call(srv, "PUT", "/api/v1/webhooks/made", hook))[0] == 200
            assert (await call(srv, "PUT", "/api/v1/webhooks/orders", hook))[0] == 409
            assert (await call(srv, "PUT", "/api/v1/webhooks/bad", {"url": "ftp://x", "pattern": "/a"}))[
                0
            ] == 400
            await _publish(srv, "/api-made/x", ["a", "b", "c"])
            await rcv.wait(lambda: len(rcv.accepted) >= 3)
            assert [(b["hook"], b["seq"]) for b in rcv.accepted] == [("made", 1), ("made", 2), ("made", 3)]
            status, listed = await call(srv, "GET", "/api/v1/webhooks")
            assert status == 200
            assert [(h["name"], h["source"], h["signed"]) for h in listed["webhooks"]] == [
                ("orders", "config", True),
                ("made", "api", True),
            ]
            assert "secret" not in listed["webhooks"][1]
        async with Server(load_config(cli=cli, env={})) as srv:  # the API's hook is started again
            await _publish(srv, "/api-made/x", ["d"])
            await rcv.wait(lambda: len(rcv.accepted) >= 4)
            assert [b["seq"] for b in rcv.accepted] == [1, 2, 3, 4]
            assert await call(srv, "DELETE", "/api/v1/webhooks/made") == (200, {"deleted": "made"})
            assert srv.consumers is not None and srv.consumers.info("webhook.made") is None
            assert (await call(srv, "DELETE", "/api/v1/webhooks/made"))[0] == 404
            assert (await call(srv, "DELETE", "/api/v1/webhooks/orders"))[0] == 409
        await rcv.stop()

    asyncio.run(body())


def test_two_workers_deliver_each_hook_from_one_of_them(tmp_path: Path) -> None:
    """``--workers 2``: both worker processes run the hook, the consumer's hold lets one of them deliver it,
    so each of 120 events arrives exactly once and in order (the other worker waits for the hold)."""
    n = 120

    async def body() -> None:
        rcv = await Receiver(SECRET).start()
        hooks = {"orders": {"url": rcv.url, "pattern": "/orders/**", "secret": SECRET}}
        extra = ["--workers", "2", "--webhooks-hooks", json.dumps(hooks)]
        start = ServerProcess(tmp_path / "data", extra).start
        srv = await asyncio.to_thread(start, 60.0)
        try:
            async with aiohttp.ClientSession() as s:
                for i in range(1, n + 1):  # (each POST lands on either worker)
                    url = f"http://127.0.0.1:{srv.ports['http']}/api/v1/publish/orders/a"
                    async with s.post(url, data=f"o{i}".encode()) as r:
                        assert r.status == 200, await r.text()
            await rcv.wait(lambda: len(rcv.accepted) >= n, wait_s=30)
            assert _seqs(rcv.accepted) == list(range(1, n + 1))
            assert [b["payload"] for b in rcv.accepted] == [f"o{i}" for i in range(1, n + 1)]
            assert await asyncio.to_thread(srv.terminate) == 0
        finally:
            srv.kill()
            await rcv.stop()

    asyncio.run(body())


def test_a_hook_removed_from_the_file_keeps_its_consumer_until_the_operator_deletes_it(
    tmp_path: Path,
) -> None:
    """Restarted without hook ``orders`` in its file, the node keeps the hook's consumer and its backlog
    (another node of the log may define it) and delivers nothing of it; the operator deletes it through the
    admin API, and it stays gone after the next start."""

    async def body() -> None:
        rcv = await Receiver(SECRET, answer=lambda b: (503, {})).start()
        cli = _cli(tmp_path, rcv.url, **{"http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"})
        async with Server(load_config(cli=cli, env={})) as srv:
            await _publish(srv, "/orders/a", ["o1", "o2", "o3"])
            await rcv.wait(lambda: len(rcv.requests) >= 2)
        cli["webhooks.hooks"] = "{}"

        async def consumers(port: int) -> dict[str, int]:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{port}/api/v1/admin/consumers") as r,
            ):
                assert r.status == 200
                return {c["name"]: c["backlog"] for c in (await r.json())["consumers"]}

        async with Server(load_config(cli=cli, env={})) as srv:
            port = srv.ports["http"]
            assert await consumers(port) == {"webhook.orders": 3}
            url = f"http://127.0.0.1:{port}/api/v1/admin/consumers/webhook.orders"
            async with aiohttp.ClientSession() as s, s.delete(url) as r:
                assert r.status == 200, await r.text()
            assert await consumers(port) == {}
        async with Server(load_config(cli=cli, env={})) as srv:
            assert await consumers(srv.ports["http"]) == {}
        assert rcv.accepted == []
        await rcv.stop()

    asyncio.run(asyncio.wait_for(body(), 60))
