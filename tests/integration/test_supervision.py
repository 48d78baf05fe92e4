"""A component whose failure must stop the node (the log writer: nothing more could be committed) stops the
server cleanly, the failure logged with its component and counted on ``/metrics``
(``hubbub_component_failures_total``)."""

from __future__ import annotations

import asyncio
import logging
import re
import types
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub import server as server_module
from hubbub.channels import parse_pattern
from hubbub.cluster.broker import BrokerSettings, RedisBroker
from hubbub.cluster.view import ClusterView
from hubbub.core import Node, Session
from hubbub.core.writer import LogWriter
from hubbub.events import Publisher
from hubbub.log import MemoryLogStore
from hubbub.log.base import AppendRequest
from hubbub.server import Server
from hubbub.server_config import load_config
from tests.redisserver import RedisServer

from .test_node import Enc

HOST = "127.0.0.1"
WAIT = 10.0


async def failures(http: aiohttp.ClientSession, server: Server) -> dict[str, float]:
    async with http.get(f"http://{HOST}:{server.ports['http']}/metrics") as r:
        text = await r.text()
    return {
        m[1]: float(m[2])
        for m in re.finditer(r'^hubbub_component_failures_total\{component="(\w+)"\} (\S+)$', text, re.M)
    }


def test_a_writer_that_dies_stops_the_node_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = LogWriter._process
    armed: list[bool] = []

    def process(self: LogWriter, pending: list[Any]) -> None:
        if armed:
            raise RuntimeError("writer bug")  # outside any one append: the thread dies
        real(self, pending)

    monkeypatch.setattr(LogWriter, "_process", process)
    cli = {"data_dir": str(tmp_path / "d"), "http.listen": f"{HOST}:0", "native.tcp_listen": f"{HOST}:0"}

    async def main() -> None:
        async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
            node = server.node
            assert node is not None
            assert (await failures(http, server))["writer"] == 0
            armed.append(True)
            lost = asyncio.ensure_future(node.reset_channel("/a"))  # in hand when the thread dies
            reason = await asyncio.wait_for(server.wait(asyncio.Event()), WAIT)
            assert reason == "writer: log-writer"
            assert (await failures(http, server))["writer"] == 1
            lost.cancel()
        assert server.node is None  # stopped: every component left, the store closed
        assert node.closing

    asyncio.run(main())
    (record,) = [r for r in caplog.records if getattr(r, "component", None) == "writer"]
    assert record.levelno == logging.ERROR and "writer bug" in record.getMessage()
    assert "stopping the node" in record.getMessage()


def test_stream_writers_end_with_their_requests_at_shutdown(tmp_path: Path) -> None:
    """The writers of a native SSE stream and a qpubs HTTP stream belong to their request's lifetime: once the
    server has stopped, neither is left running, and both clients see their stream end."""
    cli = {
        "data_dir": str(tmp_path / "d"),
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "qpubs.qrpc_listen": f"{HOST}:0",
        "qpubs.heartbeat_s": "0.2",
    }

    def writers() -> list[str]:
        # The writers' tasks run coroutines (async def), the objects with a __qualname__.
        coros = [t.get_coro() for t in asyncio.all_tasks() if not t.done()]
        names = (c.__qualname__ for c in coros if isinstance(c, types.CoroutineType))
        return [n for n in names if n in ("_sse_writer", "QpubsHttp._write")]

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            server = Server(load_config(cli=cli, env={}))
            async with server:
                base = f"http://{HOST}:{server.ports['http']}"
                sse = await http.get(f"{base}/api/v1/stream/s/**")
                assert await asyncio.wait_for(sse.content.readline(), WAIT) == b"retry: 2000\n"
                listen = await http.get(f"{base}/qpubs/listen?topic=h.*")
                assert await asyncio.wait_for(listen.content.readline(), WAIT) == b"\n"  # a heartbeat
                assert sorted(writers()) == ["QpubsHttp._write", "_sse_writer"]
            assert writers() == []
            for stream in (sse, listen):
                rest = await asyncio.wait_for(stream.content.read(), WAIT)  # the end of the stream
                assert b"data:" not in rest
                stream.close()

    asyncio.run(main())


def test_hubbub_serve_exits_with_status_1_when_a_component_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hubbub serve`` (``server.run``) shuts down as on SIGTERM when the writer dies, then exits 1."""
    real_process, real_start = LogWriter._process, Server.start

    def process(self: LogWriter, pending: list[Any]) -> None:
        if armed:
            raise RuntimeError("writer bug")
        real_process(self, pending)

    async def start(self: Server) -> None:
        await real_start(self)
        assert self.node is not None and self.node._batcher.writer is not None
        armed.append(True)
        self.node._batcher.writer.submit_control(lambda store: None)  # the thread dies on it

    armed: list[bool] = []
    monkeypatch.setattr(LogWriter, "_process", process)
    monkeypatch.setattr(Server, "start", start)
    monkeypatch.setattr(server_module, "tune_gc", lambda: None)  # not this test process's collector
    cli = {"data_dir": str(tmp_path / "d"), "http.listen": f"{HOST}:0", "native.tcp_listen": f"{HOST}:0"}
    with pytest.raises(SystemExit) as exit_:
        server_module.run(load_config(cli=cli, env={}))
    assert exit_.value.code == 1


def test_a_crashed_redis_receive_loop_is_logged_counted_and_restarted(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A cluster node whose Redis receive loop raises (here on the first message) goes on receiving: the
    loop is started again, and the event it dropped is filled from the log with the next one, in order."""

    async def main() -> None:
        store = MemoryLogStore()
        nodes: list[Node] = []
        brokers: list[RedisBroker] = []
        for name in ("x", "y"):
            # No watch of the log within the test: only Redis brings node X's events to node Y.
            settings = BrokerSettings(redis_server.url, name, gap_wait_s=0.05, poll_interval_s=60.0)
            b = RedisBroker(settings, store)
            node = Node(store, view=ClusterView(store, b))
            await node.__aenter__()
            await b.start(node)
            nodes.append(node)
            brokers.append(b)
        x, y = nodes
        real = brokers[1]._on_message
        crashed = asyncio.Event()

        def on_message(data: Any) -> None:
            if not crashed.is_set():
                crashed.set()
                raise RuntimeError("receive bug")
            real(data)

        brokers[1]._on_message = on_message  # type: ignore[method-assign]  # a test double
        try:
            live = Session("native", Enc(), max_items=1024, max_bytes=1 << 24)
            y.attach(live)
            await y.subscribe(live, "l", parse_pattern("/r"), on_snapshot=lambda p: None)
            await x.publish(AppendRequest("/r", Publisher("native"), b"r1", "text/plain"))
            await asyncio.wait_for(crashed.wait(), WAIT)
            await x.publish(AppendRequest("/r", Publisher("native"), b"r2", "text/plain"))
            got: list[bytes] = []
            async with asyncio.timeout(WAIT):
                while len(got) < 2:
                    got += await live.next_frames()
            assert [eval(f.decode())[1] for f in got] == [1, 2]
            assert y.supervision.failures == {"broker": 1}
        finally:
            for b, node in zip(brokers, nodes, strict=True):
                await node.close()
                await b.close()

    asyncio.run(main())
    (record,) = [r for r in caplog.records if getattr(r, "component", None) == "broker"]
    assert record.__dict__["task"] == "cluster-receive" and "receive bug" in record.getMessage()
