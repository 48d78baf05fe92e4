"""The HTTP/WebSocket listener against raw sockets (``transports/http_listener.py``): every accepted socket
counts in the connection limits and is refused at accept over them; a request head that does not arrive in
``http.head_timeout_s`` closes the connection; requests aiohttp cannot parse get hubbub's 400 (no versions,
no echo, a counted and throttled warning, never an ERROR); and an unmasked client frame fails a WebSocket
of every dialect with close 1002."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 10.0
HEAD_TIMEOUT = 0.4


@asynccontextmanager
async def server(tmp_path: Path, **cli: Any) -> AsyncIterator[Server]:
    keys: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "store": "memory",
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        **cli,
    }
    async with Server(load_config(cli=keys, env={})) as srv:
        yield srv


async def until(cond: Any, what: str) -> None:
    """Wait for ``cond()`` to hold (the server's side of a socket runs on the same loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not cond():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.01)


async def connect(port: int, data: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
    return reader, writer


async def to_end(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes (within WAIT)."""
    return await asyncio.wait_for(reader.read(), WAIT)


def parse(resp: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, body


def assert_no_versions(resp: bytes) -> None:
    head = resp.partition(b"\r\n\r\n")[0].lower()
    assert b"\r\nserver: hubbub\r\n" in head + b"\r\n", resp[:400]
    assert b"aiohttp" not in head and b"python" not in head, resp[:400]


# -- admission at accept and the head timeout ----------------------------------------------------------------


def test_half_sent_heads_count_at_accept_and_time_out(tmp_path: Path) -> None:
    """Sockets that send ``G`` and stop, or nothing: the first ``max_connections_per_ip`` are accepted and
    closed once the head timeout passes (counted as the listener's bad input); the others are refused at
    once with 503 and native error 4009 (counted as ``http`` refusals). Then the address is served again."""

    async def main() -> None:
        async with server(
            tmp_path, **{"limits.max_connections_per_ip": 3, "http.head_timeout_s": HEAD_TIMEOUT}
        ) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports["http"]
            loop = asyncio.get_running_loop()
            start = loop.time()
            held = [await connect(port, b"G"), await connect(port, b"G"), await connect(port)]
            await until(lambda: node.limiter.connections == 3, "three sockets admitted")
            for _ in range(2):
                reader, writer = await connect(port, b"G")
                status, headers, body = parse(await to_end(reader))
                assert (status, headers["server"], headers["connection"]) == (503, "hubbub", "close")
                assert json.loads(body)["error"]["code"] == 4009
                writer.close()
            assert node.limiter.refusals == {("max_connections_per_ip", "http"): 2}
            for reader, writer in held:
                assert await to_end(reader) == b""  # closed without an answer
                writer.close()
            assert loop.time() - start >= HEAD_TIMEOUT
            await until(lambda: node.limiter.connections == 0, "held sockets released")
            assert node.metrics.bad_input == {"http": 3}
            reader, writer = await connect(
                port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            assert parse(await to_end(reader))[0] == 200
            writer.close()

    asyncio.run(main())


def test_total_limit_at_accept_and_a_later_head_on_a_kept_alive_connection_times_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with server(
            tmp_path, **{"limits.max_connections": 1, "http.head_timeout_s": HEAD_TIMEOUT}
        ) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports["http"]
            reader, writer = await connect(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            length = int(parse(head)[1]["content-length"])
            await asyncio.wait_for(reader.readexactly(length), WAIT)  # kept alive, holding the one place
            other, other_writer = await connect(port)
            assert parse(await to_end(other))[0] == 503
            other_writer.close()
            assert node.limiter.refusals == {("max_connections", "http"): 1}
            loop = asyncio.get_running_loop()
            sent = loop.time()
            writer.write(b"GE")  # a second request that never finishes its head
            assert await to_end(reader) == b""
            assert loop.time() - sent >= HEAD_TIMEOUT
            writer.close()
            await until(lambda: node.limiter.connections == 0, "released")
            assert node.metrics.bad_input == {"http": 1}

    asyncio.run(main())


# -- aiohttp's error answers ---------------------------------------------------------------------------------

MARK = b"ECHOME"
BAD_HEADS = {
    "request line over 8 KiB": b"GET /" + MARK + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "header over 8 KiB": b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + MARK + b"b" * 9000 + b"\r\n\r\n",
    "bad method": b"G<T>" + MARK + b" / HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad chunk size": b"POST /api/v1/publish/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"ZZ"
    + MARK
    + b"\r\n",
    "invalid header name": b"GET / HTTP/1.1\r\nHost: x\r\nX-Bad\x01" + MARK + b": v\r\n\r\n",
    "invalid header value": b"GET / HTTP/1.1\r\nHost: x\r\nX-Bad: " + MARK + b"\x00\r\n\r\n",
}


def test_malformed_requests_get_hubbubs_400(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Each gets 400 ``bad request`` with ``Server: hubbub`` and without its input echoed, is counted, and is
    logged at most as one throttled warning: no ERROR, no traceback. A bad chunk size that comes in a later
    read, while the handler reads the body, is answered the same (aiohttp alone leaves that handler waiting
    for ever)."""
    caplog.set_level(logging.DEBUG, logger="hubbub")

    async def main() -> None:
        async with server(tmp_path) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports["http"]
            for i, (name, data) in enumerate(BAD_HEADS.items(), 1):
                reader, writer = await connect(port, data)
                resp = await to_end(reader)
                writer.close()
                status, _, body = parse(resp)
                assert (status, body) == (400, b"bad request\n"), (name, resp[:300])
                assert_no_versions(resp)
                assert MARK not in resp, name
                assert node.metrics.bad_input == {"http": i}, name
            reader, writer = await connect(
                port,
                b"POST /api/v1/publish/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n",
            )
            manager = srv._runner.server if srv._runner is not None else None
            assert manager is not None
            # The handler reads the body (aiohttp's handler of the connection has the request).
            await until(lambda: any(c._current_request is not None for c in manager.connections), "reading")
            writer.write(b"ZZ" + MARK + b"\r\n")
            resp = await to_end(reader)
            writer.close()
            assert parse(resp)[0] == 400 and MARK not in resp, resp
            assert node.metrics.bad_input == {"http": len(BAD_HEADS) + 1}
            page = await node.read_channel("/a", since=0, limit=10)
            assert page.events == []  # the broken body was not published

    asyncio.run(main())
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("malformed HTTP request from 127.0.0.1"), warnings
    assert all(MARK.decode() not in r.getMessage() for r in caplog.records)


def test_every_answer_says_server_hubbub_without_versions(tmp_path: Path) -> None:
    async def main() -> None:
        async with server(tmp_path, **{"limits.max_frame": 1024}) as srv:
            port = srv.ports["http"]
            requests = {
                200: b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                404: b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                405: b"DELETE /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                413: b"POST /api/v1/publish/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n"
                + b"Connection: close\r\n\r\n"
                + b"x" * 2000,
                400: b"GET /ws/hubbub HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            }
            for status, data in requests.items():
                reader, writer = await connect(port, data)
                resp = await to_end(reader)
                writer.close()
                assert parse(resp)[0] == status, resp[:300]
                assert_no_versions(resp)
            reader, writer = await connect(port, upgrade("/ws/hubbub", "hubbub.v1.json"))
            resp = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            assert parse(resp)[0] == 101
            assert_no_versions(resp)
            writer.close()

    asyncio.run(main())


# -- unmasked client frames ----------------------------------------------------------------------------------


def upgrade(path: str, protocol: str | None = None) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    )
    if protocol:
        head += f"Sec-WebSocket-Protocol: {protocol}\r\n"
    return (head + "\r\n").encode()


def client_frame(payload: bytes, opcode: int, *, masked: bool) -> bytes:
    assert len(payload) < 126
    if not masked:
        return bytes((0x80 | opcode, len(payload))) + payload
    key = os.urandom(4)
    return (
        bytes((0x80 | opcode, 0x80 | len(payload)))
        + key
        + bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    )


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """The (opcode, payload) of each whole server frame in ``data`` (unmasked, RFC 6455 §5.2)."""
    out = []
    i = 0
    while i + 2 <= len(data):
        opcode, n = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if n == 126:
            n = struct.unpack("!H", data[i : i + 2])[0]
            i += 2
        elif n == 127:
            n = struct.unpack("!Q", data[i : i + 8])[0]
            i += 8
        out.append((opcode, data[i : i + n]))
        i += n
    return out


#: A WebSocket route of each dialect, its subprotocol, the opcode of its messages, messages it answers and
#: (part of) the answer: the answer proves masked frames are read; the same messages with the first one
#: unmasked must get close 1002 instead, and no answer.
ROUTES: dict[str, tuple[str, str | None, int, list[bytes], bytes]] = {
    "native": ("/ws/hubbub", "hubbub.v1.json", 0x1, [b'{"op":"hello","id":1,"v":1}'], b'"op":"reply"'),
    "ivy": ("/ws", "ivy1", 0x1, [b"@"], b"##@"),
    "guble": ("/stream/user/u", None, 0x1, [b"+ /a"], b"#subscribed-to"),
    "wearscript": (
        "/wearscript/ws",
        None,
        0x2,
        [msgpack.packb(["subscriptions", "d:1", ["r"]]), msgpack.packb(["test:server:0", "group", "r"])],
        msgpack.packb(["r", "server"]),
    ),
    "mist2015": ("/mist/ws", None, 0x1, [b'{"cmd":"nope"}'], b'"success":false'),
    "mist1": ("/mist/v1/ws", None, 0x1, [b'{"nope":1}'], b'"error":'),
}


async def _session(
    port: int, route: str, frames: bytes, *, with_upgrade: bool = False, until_answer: bytes = b""
) -> list[tuple[int, bytes]]:
    """Upgrade on ``route``, send ``frames`` (with the upgrade request when ``with_upgrade``), and read the
    server's frames until it closes the connection, or until ``until_answer`` is among the bytes read."""
    path, protocol, *_ = ROUTES[route]
    reader, writer = await connect(port, upgrade(path, protocol) + (frames if with_upgrade else b""))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    assert parse(head)[0] == 101, head
    if not with_upgrade:
        writer.write(frames)
    try:
        if not until_answer:
            return server_frames(await to_end(reader))
        data = b""
        while until_answer not in data:
            chunk = await asyncio.wait_for(reader.read(65536), WAIT)
            assert chunk, data
            data += chunk
        return server_frames(data)
    finally:
        writer.close()


@pytest.mark.parametrize("route", list(ROUTES))
def test_an_unmasked_client_frame_fails_the_websocket(tmp_path: Path, route: str) -> None:
    """A masked message gets the dialect's answer; the same message unmasked gets close 1002 and the end
    of the connection, and nothing of it is read (no answer). Also when it comes with the upgrade request."""
    _, _, opcode, messages, answer = ROUTES[route]
    close = (0x8, struct.pack("!H", 1002) + b"protocol error")
    masked = b"".join(client_frame(m, opcode, masked=True) for m in messages)
    first_unmasked = (
        client_frame(messages[0], opcode, masked=False)
        + masked[len(client_frame(messages[0], opcode, masked=True)) :]
    )

    async def main() -> None:
        async with server(tmp_path) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports["http"]
            got = await _session(port, route, masked, until_answer=answer)
            assert any(answer in payload for _, payload in got), got
            for with_upgrade in (False, True):
                got = await _session(port, route, first_unmasked, with_upgrade=with_upgrade)
                assert got[-1] == close, got
                assert not any(answer in payload for op, payload in got if op != 0x8), got
            assert node.metrics.bad_input.get("http") == 2
            await until(lambda: not node.sessions, "the sessions ended")

    asyncio.run(main())
