"""guble's SMS gateway (docs/connectors.md) against a local server playing Vonage's SMS API: every message
published on the SMS topic is sent once, in order, with the account's key and secret; Vonage throttling
(status 1) is retried; a body that is no SMS and a number Vonage refuses (status 6) go to the dead-letter
channel, and the messages after them still go out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from hubbub.auth import ANONYMOUS
from hubbub.dialects.guble import GubleConfig
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest
from hubbub.server import Server
from hubbub.server_config import load_config


class Vonage:
    """``POST /sms/json``: checks the credentials, answers ``status(to)`` ("0": sent)."""

    def __init__(self, status: Callable[[str], str]) -> None:
        self.status = status
        self.sent: list[dict[str, Any]] = []
        self.requests = 0
        self.port = 0
        self.changed = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self) -> Vonage:
        app = web.Application()
        app.router.add_post("/sms/json", self._sms)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _sms(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests += 1
        if (body.get("api_key"), body.get("api_secret")) != ("key", "secret"):
            status = "4"
        else:
            status = self.status(body["to"])
        if status == "0":
            self.sent.append(body)
        self.changed.set()
        answer = {"message-count": "1", "messages": [{"status": status, "to": body["to"]}]}
        return web.json_response(answer)

    async def wait(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not done():
                self.changed.clear()
                await self.changed.wait()


def test_every_sms_once_in_order_throttling_retried_refusals_dead_lettered(tmp_path: Path) -> None:
    async def body() -> None:
        throttled = 2

        def status(to: str) -> str:
            nonlocal throttled
            if to == "+000":
                return "6"  # invalid message: refused for good
            if throttled:
                throttled -= 1
                return "1"
            return "0"

        vonage = await Vonage(status).start()
        cli = {
            "data_dir": str(tmp_path / "data"),
            "guble.sms": "true",
            "--sms-api-key": "key",
            "--sms-api-secret": "secret",
            "guble.sms_endpoint": f"http://127.0.0.1:{vonage.port}/sms/json",
        }
        async with Server(load_config(cli=cli, env={})) as srv:
            node = srv.node
            assert node is not None and srv.connectors is not None
            bodies = [{"to": f"+49{i}", "from": "hubbub", "text": f"t{i}"} for i in range(1, 9)]
            bodies.insert(3, {"to": "+000", "text": "refused"})
            raw = [orjson.dumps(b) for b in bodies]
            raw.insert(6, b"not an sms")
            for p in raw:
                await node.publish(
                    AppendRequest("/sms", Publisher("guble"), p, "application/json"), None, ANONYMOUS
                )
            await vonage.wait(lambda: len(vonage.sent) >= 8)
            assert [(m["to"], m["text"], m["from"]) for m in vonage.sent] == [
                (f"+49{i}", f"t{i}", "hubbub") for i in range(1, 9)
            ]
            sms = srv.connectors.by_name["sms"]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while sms.stats.dead_lettered < 2:  # (counted after the commit of the dead letter)
                assert loop.time() < deadline
                await asyncio.sleep(0.01)
            dead = (await node.read_channel("/hubbub/dead-letter/sms/gateway", limit=10)).events
            assert [(e.payload, e.headers["x-dead-reason"]) for e in dead] == [
                (raw[3], "sms_status_6"),
                (b"not an sms", "sms_bad_message"),
            ]
            assert sms.stats.failed["sms_status_1"] == 2 and sms.stats.retries == 2
        await vonage.stop()

    asyncio.run(body())


def test_guble_switches_are_given_alone() -> None:
    """guble's boolean options are switches (``--sms``, ``--apns-production``): given without a value, they
    turn the key on; the value forms still work."""
    from hubbub.cli import build_parser

    args = build_parser().parse_args(["serve", "--sms", "--apns-production", "--fcm", "false"])
    assert (args.__dict__["--sms"], args.__dict__["--apns-production"], args.__dict__["--fcm"]) == (
        "true",
        "true",
        "false",
    )
    cli = {flag: args.__dict__[flag] for flag in ("--sms", "--apns-production", "--fcm")}
    cli |= {"guble.sms_api_key": "k", "guble.sms_api_secret": "s"}
    cfg = load_config(cli=cli, env={})
    guble = cfg.dialects["guble"]
    assert isinstance(guble, GubleConfig)
    assert (guble.sms, guble.apns_production, guble.fcm) == (True, True, False)
