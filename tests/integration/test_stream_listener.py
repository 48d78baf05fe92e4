"""The TCP listeners of every dialect against raw sockets (``transports/stream_listener.py``): every accepted
socket counts in the connection limits from its accept (on a TLS listener, before its handshake) and is
refused at once over them (native: error 4009; mist, qrpc and MQTT: a close); a socket that has not sent its
first complete message (or finished its TLS handshake) within ``tcp.first_message_timeout_s`` is closed,
counted as the dialect's bad input, and gives its place back; a client that has sent its first message
may then idle past that time. Each under asyncio's loop and under uvloop (which ``hubbub serve`` runs)."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvloop

from hubbub.dialects import mqtt_codec as c
from hubbub.server import Server
from hubbub.server_config import load_config

from .test_auth_reload import client_context, make_cert
from .test_http_listener import WAIT, to_end, until

TIMEOUT = 0.4
PER_IP = 3


@dataclass(frozen=True)
class Dialect:
    """One TCP dialect as a client sees it."""

    #: The dialect's label in ``hubbub_bad_input_total`` and ``hubbub_limit_refusals_total``.
    label: str
    #: Its listener in ``Server.ports``.
    port: str
    #: The beginning of a first message, never completed.
    partial: bytes
    #: A complete first message that is answered, and the answer's beginning.
    first: bytes
    answer: bytes
    #: What a socket over a limit reads to its end after sending ``first``.
    refusal: Callable[[bytes], bool]
    #: A message answered on a connection that has spoken, and its answer's beginning, where ``first`` may
    #: come only once (MQTT's CONNECT); empty: ``first`` again.
    again: bytes = b""
    again_answer: bytes = b""


def native_refusal(data: bytes) -> bool:
    err = json.loads(data)
    return bool(err["op"] == "error" and err["code"] == 4009)


DIALECTS = {
    "native": Dialect(
        "native",
        "native",
        b'{"op":"hello","id":1',
        b'{"op":"ping","id":7}\n',
        b'{"op":"pong","id":7}',
        native_refusal,
    ),
    "mist2015": Dialect("mist", "mist", b"subscri", b"subscribe a\nping\n", b"pong\n", lambda d: d == b""),
    "mist1": Dialect(
        "mist",
        "mist",
        b'{"command":"subscribe","tags":["a"',
        b'{"command":"subscribe","tags":["a"]}{"command":"ping"}',
        b'{"command":"ping","data":"pong"}',
        lambda d: d == b"",
    ),
    "qrpc": Dialect(
        "qpubs",
        "qrpc",
        b'{"v":1,"id":"1","n":"ignore"',
        b'{"v":1,"id":"1","n":"ignore","m":{"topic":"zz"}}\n',
        b'{"v":1,"id":"1","e":null,"s":"end","m":{"ok":true,"removed":0}}',
        lambda d: d == b"",
    ),
}
NATIVE_HELLO = b'{"op":"hello","id":1,"v":1}\n'
#: An MQTT PUBLISH of a newline to the topic ``t``, which the connection subscribed to: its answer is a line.
MQTT_ECHO = c.encode_publish("t", b"\n")
DIALECTS["mqtt"] = Dialect(
    "mqtt",
    "mqtt",
    c.encode_connect("sl")[:6],
    c.encode_connect("sl") + c.encode_subscribe(1, [("t", 0)]) + MQTT_ECHO,
    c.encode_connack(False, 0),
    lambda d: d == b"",
    again=MQTT_ECHO,
    again_answer=MQTT_ECHO[:-1],
)

RUNNERS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


@asynccontextmanager
async def server(tmp_path: Path, **cli: Any) -> AsyncIterator[Server]:
    keys: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "store": "memory",
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "mist.tcp_listen": "127.0.0.1:0",
        "qpubs.qrpc_listen": "127.0.0.1:0",
        "mqtt.tcp_listen": "127.0.0.1:0",
        "limits.max_connections_per_ip": PER_IP,
        "tcp.first_message_timeout_s": TIMEOUT,
        **cli,
    }
    async with Server(load_config(cli=keys, env={})) as srv:
        yield srv


class Client:
    """A client that has spoken: its first message is answered."""

    def __init__(self, dialect: Dialect, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.dialect, self.reader, self.writer = dialect, reader, writer
        self.spoke = False

    @classmethod
    async def open(cls, dialect: Dialect, port: int, ctx: ssl.SSLContext | None = None) -> Client:
        c = cls(dialect, *await asyncio.open_connection("127.0.0.1", port, ssl=ctx))
        if dialect.label == "native":
            c.writer.write(NATIVE_HELLO)
            assert json.loads(await c.line())["op"] == "reply"
        await c.exchange()
        return c

    async def line(self) -> bytes:
        return await asyncio.wait_for(self.reader.readline(), WAIT)

    async def exchange(self) -> None:
        d = self.dialect
        if self.spoke and d.again:
            self.writer.write(d.again)
            assert (await self.line()).startswith(d.again_answer)
            return
        self.writer.write(d.first)
        assert (await self.line()).startswith(d.answer)
        self.spoke = True

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("name", DIALECTS)
def test_silent_and_half_sent_sockets_count_at_accept_and_time_out(
    tmp_path: Path, name: str, runner: str
) -> None:
    """Two sockets that send nothing or half a first message hold their places from the accept, so that a
    fourth socket is refused at once (in the dialect's way); after the timeout both are closed, counted as
    the dialect's bad input, and their places come back. A client that spoke first, accepted before them,
    is still served after they are gone: the timeout is about the first message only."""
    dialect = DIALECTS[name]

    async def main() -> None:
        async with server(tmp_path) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports[dialect.port]
            loop = asyncio.get_running_loop()
            start = loop.time()
            talker = await Client.open(dialect, port)
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            held[1][1].write(dialect.partial)
            await until(lambda: node.limiter.connections == PER_IP, "every socket admitted at accept")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(NATIVE_HELLO if dialect.label == "native" else dialect.first)
            assert dialect.refusal(await to_end(reader))
            writer.close()
            assert node.limiter.refusals == {("max_connections_per_ip", dialect.label): 1}
            for r, w in held:
                assert await to_end(r) == b""  # closed without an answer
                w.close()
            assert loop.time() - start >= TIMEOUT
            await until(lambda: node.limiter.connections == 1, "the closed sockets' places given back")
            assert node.metrics.bad_input == {dialect.label: 2}
            await talker.exchange()  # its own deadline passed before theirs did
            await talker.close()
            await until(lambda: node.limiter.connections == 0, "every place given back")

    RUNNERS[runner](main())


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("name", DIALECTS)
def test_stalled_tls_handshakes_count_at_accept_and_time_out(tmp_path: Path, name: str, runner: str) -> None:
    """On a TLS listener a socket counts from its TCP accept: two that stall in the handshake (nothing
    sent, or the start of a ClientHello) hold their places, so that a fourth socket is closed at once
    without a handshake; after the timeout both are closed and counted, and a TLS client that spoke first
    is still served."""
    dialect = DIALECTS[name]
    cert, key = make_cert(tmp_path, "hubbub-tcp")

    async def main() -> None:
        async with server(tmp_path, **{"tls.cert": str(cert), "tls.key": str(key)}) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports[dialect.port]
            talker = await Client.open(dialect, port, client_context(cert))
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            held[1][1].write(b"\x16\x03\x01\x00\xc8\x01")  # a handshake record of 200 bytes, begun
            await until(lambda: node.limiter.connections == PER_IP, "handshaking sockets admitted at accept")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await to_end(reader) == b""  # refused before any handshake
            writer.close()
            assert node.limiter.refusals == {("max_connections_per_ip", dialect.label): 1}
            for r, w in held:
                assert await to_end(r) == b""
                w.close()
            await until(lambda: node.limiter.connections == 1, "the stalled sockets' places given back")
            assert node.metrics.bad_input == {dialect.label: 2}
            await talker.exchange()
            await talker.close()
            await until(lambda: node.limiter.connections == 0, "every place given back")

    RUNNERS[runner](main())
