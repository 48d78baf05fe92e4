"""Every TCP listener (native, mist, qrpc) turns on TCP keepalive for its connections, so a peer that vanished
without closing is dropped by the kernel (transports/tcp.py ``KEEPALIVE``). Checked on the server's side of
real connections, as the kernel reports it (``ss -o``: a ``keepalive`` timer, and the socket's options)."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports.tcp import KEEPALIVE

pytestmark = pytest.mark.skipif(
    shutil.which("ss") is None, reason="needs ss (iproute2) to read socket timers"
)


def server_side_timers(port: int, client_port: int) -> list[str]:
    """The ``ss -o`` line of the server's side of one connection: local port ``port``, peer ``client_port``
    (the exact pair, so no other socket of the machine can match)."""
    out = subprocess.run(
        ["ss", "-tnoH", "state", "established", f"( sport = :{port} and dport = :{client_port} )"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_every_tcp_listener_keeps_its_connections_alive(tmp_path: Path) -> None:
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "mist.tcp_listen": "127.0.0.1:0",
        "qpubs.qrpc_listen": "127.0.0.1:0",
    }

    async def main() -> None:
        async with Server(load_config(cli=cli, env={})) as srv:
            for listener, request, answer in (
                ("native", b'{"op":"hello","id":1,"v":1}\n', b'"op":"reply"'),
                ("mist", b"ping\n", b"pong"),
                ("qrpc", b'{"v":1,"id":"1","n":"ignore","m":{"topic":"x"}}\n', b'"ok":true'),
            ):
                port = srv.ports[listener]
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                try:
                    writer.write(request)  # a round trip: the server's handler runs for this connection
                    line = await asyncio.wait_for(reader.readline(), 10)
                    assert answer in line, (listener, line)
                    lines = server_side_timers(port, writer.get_extra_info("sockname")[1])
                    assert len(lines) == 1, (listener, lines)
                    timer = re.search(r"timer:\(keepalive,(\d+)sec", lines[0])
                    assert timer is not None and int(timer[1]) <= KEEPALIVE[0], (listener, lines)
                    # The client's own socket is untouched: the options are the server's.
                    client = writer.get_extra_info("socket")
                    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
                finally:
                    writer.close()
                    await writer.wait_closed()

    asyncio.run(main())
