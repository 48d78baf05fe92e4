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
    # MQTT 3.1.1 over WebSocket: CONNECT (client id "c", clean session), answered by CONNACK accepted.
    "mqtt": ("/mqtt", "mqtt", 0x2, [b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"], b"\x20\x02\x00\x00"),
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


async def open_answered(port: int, route: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Upgrade on ``route`` and send its messages, masked; returns the connection and what the server sent
    up to and with the dialect's answer."""
    path, protocol, opcode, messages, answer = ROUTES[route]
    reader, writer = await connect(port, upgrade(path, protocol))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    assert parse(head)[0] == 101, head
    writer.write(b"".join(client_frame(m, opcode, masked=True) for m in messages))
    data = b""
    while answer not in data:
        chunk = await asyncio.wait_for(reader.read(65536), WAIT)
        assert chunk, data
        data += chunk
    return reader, writer, data


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


def _chain(coro: Any) -> list[str]:
    """The qualified names of the coroutines a task's coroutine awaits, outermost first."""
    names = []
    while hasattr(coro, "cr_code"):
        names.append(coro.cr_code.co_qualname)
        coro = coro.cr_await
    return names


def _held_by_aiohttp() -> list[list[str]]:
    """The chains of the tasks that run aiohttp's per-connection protocol or a request's handler."""
    chains = [_chain(t.get_coro()) for t in asyncio.all_tasks()]
    return [c for c in chains if any(n.startswith("RequestHandler.") for n in c)]


@pytest.mark.parametrize("route", list(ROUTES))
def test_an_upgraded_connection_leaves_aiohttp(tmp_path: Path, route: str) -> None:
    """Once answered, an idle WebSocket holds no aiohttp task (its ``RequestHandler.start``, the request's
    ``_handle_request`` and the route's handler have returned): the connection is hubbub's own, and it
    still answers, pings included, and ends with the close handshake (the peer's close echoed)."""

    async def main() -> None:
        async with server(tmp_path) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports["http"]
            reader, writer, _ = await open_answered(port, route)
            await until(lambda: not _held_by_aiohttp(), "the upgrade's request and handler ended")
            assert node.sessions
            writer.write(client_frame(b"are you there", 0x9, masked=True))
            pong = await asyncio.wait_for(reader.readexactly(2 + 13), WAIT)
            assert server_frames(pong) == [(0xA, b"are you there")]
            writer.write(client_frame(struct.pack("!H", 1000) + b"bye", 0x8, masked=True))
            assert server_frames(await to_end(reader))[-1] == (0x8, struct.pack("!H", 1000))
            writer.close()
            await until(lambda: not node.sessions, "the sessions ended")

    asyncio.run(main())


def _fragments(payload: bytes, opcode: int, pieces: int) -> bytes:
    """``payload`` as a fragmented message of ``pieces`` masked frames (RFC 6455 §5.4)."""
    size = -(-len(payload) // pieces)
    parts = [payload[i : i + size] for i in range(0, len(payload), size)]
    out = b""
    for i, part in enumerate(parts):
        first = (opcode if i == 0 else 0) | (0x80 if i == len(parts) - 1 else 0)
        key = os.urandom(4)
        out += bytes((first, 0x80 | len(part))) + key + bytes(b ^ key[j % 4] for j, b in enumerate(part))
    return out


#: Client frames that break RFC 6455 and the close each gets, on the native route.
_BROKEN: dict[str, tuple[bytes, int]] = {
    "rsv1 set": (bytes((0xC1, 0x80)) + b"\0\0\0\0", 1002),
    "unknown opcode": (bytes((0x83, 0x80)) + b"\0\0\0\0", 1002),
    "fragmented ping": (bytes((0x09, 0x80)) + b"\0\0\0\0", 1002),
    "long ping": (bytes((0x89, 0xFE, 0, 126)) + b"\0\0\0\0" + b"x" * 126, 1002),
    "lone continuation": (bytes((0x80, 0x80)) + b"\0\0\0\0", 1002),
    "text not UTF-8": (bytes((0x81, 0x82)) + b"\0\0\0\0" + b"\xc3\x28", 1007),
    "close of one byte": (bytes((0x88, 0x81)) + b"\0\0\0\0" + b"\x03", 1002),
    "close code 1005": (bytes((0x88, 0x82)) + b"\0\0\0\0" + struct.pack("!H", 1005), 1002),
}


@pytest.mark.parametrize("case", list(_BROKEN))
def test_a_broken_frame_fails_the_websocket(tmp_path: Path, case: str) -> None:
    """RFC 6455's rules on the server's side: each broken frame gets its close code and the end of the
    connection, counted as bad input of the WebSocket layer (``http``)."""
    frame, code = _BROKEN[case]

    async def main() -> None:
        async with server(tmp_path) as srv:
            assert srv.node is not None
            got = await _session(srv.ports["http"], "native", frame)
            assert got and got[-1][0] == 0x8 and struct.unpack("!H", got[-1][1][:2])[0] == code, got
            assert srv.node.metrics.bad_input.get("http") == 1

    asyncio.run(main())


def test_fragments_are_reassembled_and_the_limit_applies_to_the_whole_message(tmp_path: Path) -> None:
    """A fragmented message (a ping between its fragments) is one message to the dialect; a message whose
    fragments together pass ``max_frame`` gets close 1009, counted as the dialect's bad input and a refused
    ``max_frame``, though each fragment is small."""
    hello = b'{"op":"hello","id":1,"v":1}'
    ping = client_frame(b"p", 0x9, masked=True)

    async def main() -> None:
        async with server(tmp_path, **{"limits.max_frame": 1024}) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports["http"]
            frames = _fragments(hello, 0x1, 3)
            first_len = 6 + len(hello[: -(-len(hello) // 3)])
            mixed = frames[:first_len] + ping + frames[first_len:]
            got = await _session(port, "native", mixed, until_answer=b'"op":"reply"')
            assert (0xA, b"p") in got and any(b'"op":"reply"' in p for _, p in got), got
            big = b'{"op":"hello","id":1,"v":1,"x":"' + b"y" * 1100 + b'"}'
            got = await _session(port, "native", _fragments(big, 0x1, 12))
            assert got[-1][0] == 0x8 and struct.unpack("!H", got[-1][1][:2])[0] == 1009, got
            assert node.metrics.bad_input.get("native") == 1

    asyncio.run(main())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_websocket_over_tls_is_taken_over(tmp_path: Path, loop: str) -> None:
    """The take-over moves a TLS transport too (``set_protocol`` on asyncio's and uvloop's SSL transports):
    a native WebSocket over TLS says hello, publishes a message of several TLS records (fragmented) and
    reads its acknowledgement and its own event, then closes with the handshake."""
    import aiohttp
    import uvloop

    from .test_auth_reload import client_context, make_cert

    cert, key = make_cert(tmp_path, "hubbub-ws")
    text = "z" * 100_000

    async def main() -> None:
        async with (
            server(tmp_path, **{"tls.cert": str(cert), "tls.key": str(key)}) as srv,
            aiohttp.ClientSession() as http,
        ):
            url = f"wss://127.0.0.1:{srv.ports['http']}/ws/hubbub"
            ws = await http.ws_connect(url, protocols=("hubbub.v1.json",), ssl=client_context(cert))
            await ws.send_json({"op": "hello", "id": 1, "v": 1})
            assert (await ws.receive_json(timeout=WAIT))["op"] == "reply"
            await ws.send_json({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/tls/**"})
            assert (await ws.receive_json(timeout=WAIT))["op"] == "reply"
            await ws.send_json({"op": "publish", "id": 3, "channel": "/tls/a", "text": text, "ack": True})
            got = [await ws.receive_json(timeout=WAIT) for _ in range(2)]
            assert sorted(f["op"] for f in got) == ["event", "reply"], [f["op"] for f in got]
            assert next(f for f in got if f["op"] == "event")["text"] == text
            await ws.close()
            assert ws.close_code == 1000
            assert srv.node is not None
            node = srv.node
            await until(lambda: not node.sessions, "the session ended")

    (uvloop.run if loop == "uvloop" else asyncio.run)(main())


def test_a_close_the_peer_never_answers_drops_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's close (a kicked session: native closes 1001) waits ``CLOSE_TIMEOUT_S`` for the peer's
    close, then drops the connection; a peer gone in the middle of a frame ends its session too."""
    from hubbub.disconnect import Disconnect
    from hubbub.transports import ws_socket

    monkeypatch.setattr(ws_socket, "CLOSE_TIMEOUT_S", 0.2)
    path, protocol, opcode, messages, answer = ROUTES["native"]

    async def open_native(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await connect(port, upgrade(path, protocol))
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        writer.write(client_frame(messages[0], opcode, masked=True))
        data = b""
        while answer not in data:
            data += await asyncio.wait_for(reader.read(65536), WAIT)
        return reader, writer

    async def main() -> None:
        async with server(tmp_path) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports["http"]
            reader, writer = await open_native(port)
            (sess,) = node.sessions
            sess.kick(Disconnect.GOING_AWAY)
            # Read to the end without answering the close: the server drops the connection itself.
            frames = server_frames(await to_end(reader))
            assert frames[-1] == (0x8, struct.pack("!H", 1001)), frames
            writer.close()
            await until(lambda: not node.sessions, "the kicked session ended")

            reader, writer = await open_native(port)
            writer.write(client_frame(b'{"op":"ping","id":2}', 0x1, masked=True)[:5])  # half a frame
            await writer.drain()
            writer.close()
            await until(lambda: not node.sessions, "the session of a peer gone mid-frame ended")

    asyncio.run(main())


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_close_the_server_sends_first_ends_at_the_peers_close(
    tmp_path: Path, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's close (a kicked session) is answered by the peer's: the server drops the message and
    the ping that came in between, sends nothing after its close, and closes the connection on the peer's
    close, not after ``CLOSE_TIMEOUT_S`` (set far beyond the test's wait here), with the session gone and
    the connection's place in ``limits.max_connections`` free for the peer's next one at once."""
    from hubbub.disconnect import Disconnect
    from hubbub.transports import ws_socket

    monkeypatch.setattr(ws_socket, "CLOSE_TIMEOUT_S", 600.0)
    _, _, opcode, messages, answer = ROUTES[route]

    async def main() -> None:
        async with server(tmp_path, **{"limits.max_connections": 1}) as srv:
            assert srv.node is not None
            node, port = srv.node, srv.ports["http"]
            for _ in range(2):  # the second connection is admitted: the first one's place is free
                reader, writer, data = await open_answered(port, route)
                (sess,) = node.sessions
                sess.kick(Disconnect.GOING_AWAY)
                while not any(op == 0x8 for op, _ in server_frames(data)):
                    chunk = await asyncio.wait_for(reader.read(65536), WAIT)
                    assert chunk, data
                    data += chunk
                close_at = data.index(bytes((0x88,)), data.index(answer))
                writer.write(
                    b"".join(client_frame(m, opcode, masked=True) for m in messages)
                    + client_frame(b"still there?", 0x9, masked=True)
                    + client_frame(struct.pack("!H", 1000), 0x8, masked=True)
                )
                rest = data[close_at:] + await to_end(reader)  # within WAIT, not CLOSE_TIMEOUT_S
                frames = server_frames(rest)
                assert frames[0][0] == 0x8 and len(frames) == 1, frames
                writer.close()
                await until(lambda: not node.sessions, "the kicked session ended")

    asyncio.run(main())


def test_guble_pings_and_drops_a_silent_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """guble's spec has no keepalive: the server pings every ``HEARTBEAT_S`` (what aiohttp's heartbeat did)
    and ends a connection silent for half as long again, with a close frame."""
    from hubbub.transports import guble, ws_socket

    monkeypatch.setattr(guble, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(ws_socket, "CLOSE_TIMEOUT_S", 0.2)
    path, protocol, *_ = ROUTES["guble"]

    async def main() -> None:
        async with server(tmp_path) as srv:
            assert srv.node is not None
            node = srv.node
            reader, writer = await connect(srv.ports["http"], upgrade(path, protocol))
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            frames = server_frames(await to_end(reader))  # nothing answered: pinged, then closed
            assert frames[-1][0] == 0x8, frames
            assert any(op == 0x9 for op, _ in frames), frames
            writer.close()
            await until(lambda: not node.sessions, "the silent session ended")

    asyncio.run(main())
