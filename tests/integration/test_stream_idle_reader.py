"""An idle byte-stream connection of every dialect (native TCP, mist TCP, qrpc, MQTT; plain and TLS) holds no
task reading it: its bytes reach the dialect from its socket's ``data_received``, and its connection's task
only waits for the end. It still reads what comes later, and a peer's end of stream still ends it."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import orjson
import pytest

import hubbub.dialects.mqtt_codec as c
from hubbub.server import Server
from hubbub.server_config import load_config

from .mqttclient import MqttClient
from .qrpcclient import QrpcClient
from .test_auth_reload import client_context, make_cert

WAIT = 10.0
HOST = "127.0.0.1"


def _chain(coro: Any) -> list[str]:
    """The qualified names of the coroutines a task's coroutine awaits, outermost first."""
    names = []
    while hasattr(coro, "cr_code"):
        names.append(coro.cr_code.co_qualname)
        coro = coro.cr_await
    return names


def _connections() -> list[list[str]]:
    """The chains of the tasks that serve a byte-stream connection."""
    chains = [_chain(t.get_coro()) for t in asyncio.all_tasks()]
    return [ch for ch in chains if "serve_stream" in ch]


async def _idle(count: int) -> list[list[str]]:
    """The connections' chains once ``count`` connections are served and none is in a step."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        chains = _connections()
        if len(chains) == count and all(ch[-1] == "_serve" for ch in chains):
            return chains
        assert loop.time() < deadline, chains
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_an_idle_stream_connection_holds_no_reader_task(tmp_path: Path, tls: bool) -> None:
    cli = {
        "data_dir": str(tmp_path / "d"),
        "store": "memory",
        "durability": "none",
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "mist.tcp_listen": f"{HOST}:0",
        "qpubs.qrpc_listen": f"{HOST}:0",
        "mqtt.tcp_listen": f"{HOST}:0",
    }
    ctx: ssl.SSLContext | None = None
    if tls:
        cert, key = make_cert(tmp_path, "hubbub-idle")
        cli |= {"tls.cert": str(cert), "tls.key": str(key)}
        ctx = client_context(cert)

    async def line(reader: asyncio.StreamReader) -> bytes:
        return await asyncio.wait_for(reader.readline(), WAIT)

    async def main() -> None:
        async with Server(load_config(cli=cli, env={})) as server:
            ports = server.ports
            nr, nw = await asyncio.open_connection(HOST, ports["native"], ssl=ctx)
            nw.write(b'{"op":"hello","id":1,"v":1}\n')
            assert orjson.loads(await line(nr))["op"] == "reply"
            mr, mw = await asyncio.open_connection(HOST, ports["mist"], ssl=ctx)
            mw.write(b"ping\n")
            assert await line(mr) == b"pong\n"
            q = await QrpcClient.connect(ports["qrpc"], ssl_context=ctx)
            assert await q.call("ignore", {"topic": "__idle__"}) == {"ok": True, "removed": 0}
            mq = await MqttClient.open(ports["mqtt"], ssl_context=ctx)
            assert (await mq.handshake("idle")).code == 0

            chains = await _idle(4)
            # Before, each waited in its reader task: StreamListener._run > ... > StreamReader.read.
            assert not any(n.startswith("StreamReader.") for ch in chains for n in ch), chains

            # Still read: each answers again, then a native peer's end of stream ends its connection.
            nw.write(b'{"op":"ping","id":2}\n')
            assert orjson.loads(await line(nr))["id"] == 2
            mw.write(b"ping\n")
            assert await line(mr) == b"pong\n"
            assert await q.call("ignore", {"topic": "__idle__"}) == {"ok": True, "removed": 0}
            mq.send(bytes([c.PINGREQ << 4, 0]))
            assert await mq.next() == c.Empty(c.PINGRESP)
            await _idle(4)
            nw.close()
            await _idle(3)
            for w in (mw, q.writer, mq.writer):
                w.close()
            await _idle(0)

    asyncio.run(main())


def test_a_half_closed_stream_connection_gets_its_answers_then_the_end(tmp_path: Path) -> None:
    """A peer that sends its last requests and shuts its write side (a half-close) still gets every answer,
    in order, then the server's end of stream: native's hello and pings, mist's pings."""
    cli = {
        "data_dir": str(tmp_path / "d"),
        "store": "memory",
        "durability": "none",
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "mist.tcp_listen": f"{HOST}:0",
    }

    async def main() -> None:
        async with Server(load_config(cli=cli, env={})) as server:
            nr, nw = await asyncio.open_connection(HOST, server.ports["native"])
            pings = b"".join(b'{"op":"ping","id":%d}\n' % i for i in range(2, 40))
            nw.write(b'{"op":"hello","id":1,"v":1}\n' + pings)
            nw.write_eof()
            got = await asyncio.wait_for(nr.read(), WAIT)  # up to the server's end of stream
            assert [orjson.loads(x)["id"] for x in got.splitlines()] == list(range(1, 40))
            nw.close()
            mr, mw = await asyncio.open_connection(HOST, server.ports["mist"])
            mw.write(b"ping\n" * 20)
            mw.write_eof()
            assert await asyncio.wait_for(mr.read(), WAIT) == b"pong\n" * 20
            mw.close()
            await _idle(0)

    asyncio.run(main())
