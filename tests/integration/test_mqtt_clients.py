"""MQTT with stock clients (docs/dialects/mqtt.md): mosquitto_pub and mosquitto_sub (Debian's
mosquitto-clients), and paho-mqtt over TCP, TLS and the ``/mqtt`` WebSocket, with native, qpubs and guble
clients on the same channels."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import shutil
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from hubbub.client import AsyncClient
from hubbub.events import Event
from hubbub.server import Server
from hubbub.server_config import load_config

from .qrpcclient import QrpcClient
from .test_auth_reload import make_cert

WAIT = 10.0
MOSQUITTO = shutil.which("mosquitto_sub") and shutil.which("mosquitto_pub")
needs_mosquitto = pytest.mark.skipif(
    not MOSQUITTO, reason="mosquitto-clients not installed (.ci/run installs it)"
)


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **overrides: Any) -> AsyncIterator[Server]:
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "mqtt.tcp_listen": "127.0.0.1:0",
        "qpubs.qrpc_listen": "127.0.0.1:0",
    }
    cli.update(overrides)
    async with Server(load_config(cli=cli, env={})) as srv:
        yield srv


async def subscribed(srv: Server, channel: str, n: int = 1) -> None:
    """Wait until ``n`` subscriptions match ``channel`` (a client outside this loop subscribed)."""
    node = srv.node
    assert node is not None
    changed = asyncio.Event()
    stop = node.watch_subscriptions(lambda _sub, _added: changed.set())
    try:
        async with asyncio.timeout(WAIT):
            while len(node.matching(channel)) < n:
                await changed.wait()
                changed.clear()
    finally:
        stop()


@needs_mosquitto
def test_mosquitto_pub_and_sub_with_native_and_qpubs(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = str(srv.ports["mqtt"])
            sub = await asyncio.create_subprocess_exec(
                "mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-i", "msub", "-q", "2", "-v",
                "-t", "ms/#", "-C", "5", "-W", "20",
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            await subscribed(srv, "/ms/x")
            for qos in ("0", "1", "2"):
                pub = await asyncio.create_subprocess_exec(
                    "mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-q", qos,
                    "-t", f"ms/q{qos}", "-m", f"m{qos}",
                )  # fmt: skip
                assert await pub.wait() == 0
            async with AsyncClient.connect(f"ws://127.0.0.1:{srv.ports['http']}") as native:
                await native.publish("/ms", b"native")
            q = await QrpcClient.connect(srv.ports["qrpc"])
            await q.call("emit", {"topic": "ms.qpubs", "value": {"k": 1}})
            await q.close()
            out, _ = await asyncio.wait_for(sub.communicate(), WAIT)
            assert sub.returncode == 0
            assert out.decode().splitlines() == [
                "ms/q0 m0",
                "ms/q1 m1",
                "ms/q2 m2",
                "ms native",
                'ms/qpubs {"k":1}',
            ]

    asyncio.run(main())


@needs_mosquitto
def test_mosquitto_pub_qos1_to_a_native_subscriber(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = str(srv.ports["mqtt"])
            url = f"ws://127.0.0.1:{srv.ports['http']}"
            async with AsyncClient.connect(url) as native, native.subscribe("/r/**") as nsub:
                for i in range(5):
                    pub = await asyncio.create_subprocess_exec(
                        "mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-q", "1", "-t", "r/x", "-m", f"v{i}"
                    )  # fmt: skip
                    assert await pub.wait() == 0
                got = [await nsub.get(WAIT) for _ in range(5)]
                events = [e for e in got if isinstance(e, Event)]
                assert events == got, got  # events only: no gap, no end
                assert [(e.channel, e.seq, e.payload) for e in events] == [
                    ("/r/x", i + 1, f"v{i}".encode()) for i in range(5)
                ]

    asyncio.run(main())


class Paho:
    """A paho-mqtt client on its own network thread; messages and acknowledgements in thread-safe queues."""

    def __init__(self, client_id: str, transport: Literal["tcp", "websockets"] = "tcp") -> None:
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311, transport=transport
        )
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.client.on_message = lambda _c, _u, m: self.messages.put(m)
        self.client.on_connect = lambda _c, _u, _f, rc, _p: self._connected(rc)
        self.client.on_subscribe = lambda _c, _u, _mid, codes, _p: self.subacks.put(list(codes))

    def _connected(self, rc: Any) -> None:
        if rc == 0:
            self.connected.set()

    def start(self, port: int) -> None:
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        assert self.connected.wait(WAIT)

    def subscribe(self, topic: str, qos: int) -> list[Any]:
        self.client.subscribe(topic, qos)
        return self.subacks.get(timeout=WAIT)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@contextlib.contextmanager
def paho_pair(
    port: int, transport: Literal["tcp", "websockets"] = "tcp", tls: ssl.SSLContext | None = None
) -> Iterator[tuple[Paho, Paho]]:
    sub, pub = Paho("paho-sub", transport), Paho("paho-pub", transport)
    for p in (sub, pub):
        if transport == "websockets":
            p.client.ws_set_options(path="/mqtt")
        if tls is not None:
            p.client.tls_set_context(tls)
        p.start(port)
    try:
        yield sub, pub
    finally:
        sub.stop()
        pub.stop()


def _paho_round(
    port: int, transport: Literal["tcp", "websockets"] = "tcp", tls: ssl.SSLContext | None = None
) -> None:
    """QoS 0, 1 and 2 from paho to paho: every message in order, each at its QoS (run on a thread of its
    own: paho blocks)."""
    with paho_pair(port, transport, tls) as (sub, pub):
        _round(sub, pub)


def _round(sub: Paho, pub: Paho) -> None:
    assert [c.value for c in sub.subscribe("p/+", 2)] == [2]
    infos = [pub.client.publish("p/t", f"m{i}".encode(), qos=i % 3) for i in range(30)]
    for info in infos:
        info.wait_for_publish(WAIT)
    got = [sub.messages.get(timeout=WAIT) for _ in range(30)]
    assert all(m.topic == "p/t" for m in got)
    # paho hands a QoS 2 message over at its PUBREL, later than the QoS 0 and 1 ones sent after it: each
    # QoS's messages arrive all, once, in order.
    for qos in (0, 1, 2):
        mine = [m.payload for m in got if m.qos == qos]
        assert mine == [f"m{i}".encode() for i in range(qos, 30, 3)], (qos, mine)


@pytest.mark.parametrize("transport", ["tcp", "websockets"])
def test_paho_qos_0_1_2(tmp_path: Path, transport: Literal["tcp", "websockets"]) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"] if transport == "tcp" else srv.ports["http"]
            await asyncio.to_thread(_paho_round, port, transport)

    asyncio.run(main())


def test_paho_over_tls(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path, "mqtt")
    ctx = ssl.create_default_context(cafile=str(cert))

    async def main() -> None:
        async with serve(tmp_path, **{"tls.cert": str(cert), "tls.key": str(key)}) as srv:
            await asyncio.to_thread(_paho_round, srv.ports["mqtt"], "tcp", ctx)
            # A plain-TCP client gets no CONNACK from the TLS listener.
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.ports["mqtt"])
            writer.write(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x1e\x00\x00")
            assert not (await asyncio.wait_for(reader.read(4), WAIT)).startswith(b"\x20\x02")
            writer.close()

    asyncio.run(main())


def test_the_websocket_route_needs_an_upgrade(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv, aiohttp.ClientSession() as http:
            r = await http.get(f"http://127.0.0.1:{srv.ports['http']}/mqtt")
            assert r.status == 400
            r.release()

    asyncio.run(main())
