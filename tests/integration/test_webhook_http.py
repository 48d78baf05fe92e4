"""The webhooks' own HTTP/1.1 client (``transports/webhook_http.py``) against a raw receiver on a socket:
a chunked 503 with ``Retry-After`` on a kept-alive connection, an answer whose body runs to the end of its
connection, then keep-alive again; every event once and in order, each request well formed and signed,
connections reused where the receiver allows it."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from pathlib import Path

from hubbub.server import Server
from hubbub.server_config import load_config

from .test_webhooks import SECRET, _cli, _publish

ANSWERS = [
    b"HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\ndone, and this connection with it",
]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class RawReceiver:
    """Reads each request (head, ``Content-Length`` body) and writes the next of ``ANSWERS``, then
    ``OK``; closes the connection after an answer without a length."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, float, dict[str, str], bytes]] = []  # (connection, at, headers, body)
        self.connections = 0
        self.changed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                assert lines[0].startswith("POST /hook HTTP/1.1"), lines[0]
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers["content-length"]))
                self.requests.append((conn, time.monotonic(), headers, body))
                n = len(self.requests)
                answer = ANSWERS[n - 1] if n <= len(ANSWERS) else OK
                writer.write(answer)
                await writer.drain()
                self.changed.set()
                if b"Content-Length" not in answer and b"chunked" not in answer:
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()


def test_chunked_close_delimited_and_kept_alive_answers(tmp_path: Path) -> None:
    async def body() -> None:
        rcv = RawReceiver()
        server = await asyncio.start_server(rcv.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with Server(load_config(cli=_cli(tmp_path, f"http://127.0.0.1:{port}/hook"), env={})) as srv:
            await _publish(srv, "/orders/a", [f"o{i}" for i in range(1, 6)])
            async with asyncio.timeout(10):
                while len(rcv.requests) < 6:
                    rcv.changed.clear()
                    await rcv.changed.wait()
        server.close()
        await server.wait_closed()
        bodies = [json.loads(b) for _, _, _, b in rcv.requests]
        assert [b["seq"] for b in bodies] == [1, 1, 2, 3, 4, 5]  # the 503 tried again, then in order
        assert rcv.requests[1][1] - rcv.requests[0][1] >= 0.95  # its Retry-After, read from a chunked answer
        # The chunked answer left the connection open; the one read to its end closed it; then one again.
        assert [c for c, _, _, _ in rcv.requests] == [1, 1, 2, 2, 2, 2]
        for _, _, headers, raw in rcv.requests:
            assert headers["host"] == f"127.0.0.1:{port}" and headers["content-type"] == "application/json"
            ts = headers["x-hubbub-timestamp"]
            mac = hmac.new(SECRET.encode(), ts.encode() + b"." + raw, hashlib.sha256).hexdigest()
            assert headers["x-hubbub-signature"] == "sha256=" + mac
        assert [h["x-hubbub-attempt"] for _, _, h, _ in rcv.requests[:2]] == ["0", "1"]

    asyncio.run(body())
