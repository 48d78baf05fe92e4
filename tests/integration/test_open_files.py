"""A connection flood past the process's open-files limit (``RLIMIT_NOFILE``), against a real
``hubbub serve`` process (uvloop) whose limit is lowered while it runs: on the native TCP listener, on a
WebSocket route and with HTTP publishes, more connections than descriptors. The server stays up without
spinning, refuses what would take the descriptors it keeps free (counted in
``hubbub_limit_refusals_total{limit="open_files"}``, logged as a throttled warning), keeps serving its
existing connections (subscribers get every event, each acked publish is in the log, reads that need a new
store connection still get one), and accepts again
once the flood's connections are gone (``transports/accept.py`` ``OpenFiles``)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tests.integration.serverproc import ServerProcess

#: Descriptors the server may open beyond those it holds when the limit is lowered (the guard keeps 8 of
#: them free at that size).
HEADROOM = 32
#: Connections of each kind in the flood: together well past the headroom.
FLOOD = 40
#: Kept-alive connections that read the log at once during the flood.
READERS = 12


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` (the server's log, its descriptors: nothing to wait on) until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _line(reader: asyncio.StreamReader) -> dict[str, object]:
    out = json.loads(await asyncio.wait_for(reader.readline(), 10))
    assert isinstance(out, dict)
    return out


async def _flood(srv: ServerProcess) -> None:
    pid = srv.proc.pid  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{srv.ports['http']}"
    url = f"ws://127.0.0.1:{srv.ports['http']}/ws/hubbub"
    # One kept-alive connection for the publishes, the reads and /metrics during the flood.
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http,
        aiohttp.ClientSession() as subs,
    ):
        ws = await subs.ws_connect(url, protocols=["hubbub.v1.json"])
        await ws.send_json({"op": "hello", "id": 1, "v": 1})
        assert (await ws.receive_json(timeout=10))["op"] == "reply"
        await ws.send_json({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/t/x"})
        assert (await ws.receive_json(timeout=10))["op"] == "reply"
        tcp_r, tcp_w = await asyncio.open_connection("127.0.0.1", srv.ports["native"])
        tcp_w.write(b'{"op":"hello","id":1,"v":1}\n{"op":"subscribe","id":2,"sub":"s","pattern":"/t/x"}\n')
        assert (await _line(tcp_r))["op"] == "reply" and (await _line(tcp_r))["op"] == "reply"
        async with aiohttp.ClientSession() as pub, pub.post(f"{base}/api/v1/publish/t/x", data=b"0") as r:
            assert r.status == 200, await r.text()

        async def publish(i: int) -> None:
            async with http.post(f"{base}/api/v1/publish/t/x", data=str(i).encode()) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["seq"] == i + 1

        await publish(1)
        readers = [aiohttp.ClientSession() for _ in range(READERS)]
        for reader in readers:
            async with reader.get(f"{base}/healthz") as r:
                assert r.status == 200
        limit = _fds(pid) + HEADROOM
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
        flood: list[asyncio.StreamWriter] = []
        heads = {
            "native": b"",
            "ws": b"GET /ws/hubbub HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Protocol: hubbub.v1.json\r\n\r\n",
            "publish": b"POST /api/v1/publish/t/flood HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx",
        }
        for kind, head in heads.items():
            port = srv.ports["native" if kind == "native" else "http"]
            for _ in range(FLOOD):
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(head)
                flood.append(w)

        def warnings() -> list[str]:
            records = [json.loads(line) for line in srv.log().splitlines() if line.startswith("{")]
            return [r["message"] for r in records if r["level"] == "warning" and "open files" in r["message"]]

        def warned() -> bool:
            said = " ".join(warnings())
            return "native listener" in said and "http listener" in said

        # Said once per listener, whatever the number of sockets refused.
        await _until(warned, "a warning about open files from the native and the HTTP listener")
        assert len(warnings()) == 2, warnings()
        assert _fds(pid) <= limit - 2  # descriptors stay free for what is served already
        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
        counted = {}
        for line in text.splitlines():
            if line.startswith("hubbub_limit_refusals_total{") and 'limit="open_files"' in line:
                counted[line.split('dialect="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
        assert counted["native"] > 0 and counted["http"] > 0, counted
        assert srv.alive
        assert _fds(pid) <= limit - 2  # the descriptors kept free stayed free
        # The accept loops do not spin while the flood waits.
        cpu = _cpu_s(pid)
        await asyncio.sleep(0.5)  # a measurement window, not a wait for a condition
        assert _cpu_s(pid) - cpu < 0.25
        # Existing connections are served: every publish is acked, persisted, and delivered to both.
        for i in range(2, 22):
            await publish(i)

        # Reads over connections opened before the flood, at once: each thread that reads opens its own
        # SQLite connection, a new descriptor (none was left before the reserve: SQLITE_CANTOPEN, 503).
        async def read(reader: aiohttp.ClientSession) -> list[int]:
            async with reader.get(f"{base}/api/v1/log/t/x", params={"format": "jsonl"}) as r:
                assert r.status == 200, await r.text()
                rows = [json.loads(line) for line in (await r.text()).splitlines()]
            return [e["seq"] for e in rows if "seq" in e and "text" in e]

        assert await asyncio.gather(*(read(r) for r in readers)) == [list(range(1, 23))] * len(readers)
        assert [(await ws.receive_json(timeout=10))["seq"] for _ in range(22)] == list(range(1, 23))
        assert [(await _line(tcp_r))["seq"] for _ in range(22)] == list(range(1, 23))
        # Once the flood is gone, new connections are accepted on every listener.
        for w in flood:
            w.close()
        await _until(lambda: _fds(pid) < limit - HEADROOM // 2, "the flood's descriptors freed")
        async with aiohttp.ClientSession() as fresh:
            async with fresh.get(f"{base}/healthz") as r:
                assert r.status == 200
            fresh_ws = await fresh.ws_connect(url, protocols=["hubbub.v1.json"])
            await fresh_ws.send_json({"op": "hello", "id": 1, "v": 1})
            assert (await fresh_ws.receive_json(timeout=10))["op"] == "reply"
            await fresh_ws.close()
        r2, w2 = await asyncio.open_connection("127.0.0.1", srv.ports["native"])
        w2.write(b'{"op":"hello","id":1,"v":1}\n')
        assert (await _line(r2))["op"] == "reply"
        w2.close()
        tcp_w.close()
        await ws.close()
        for reader in readers:
            await reader.close()


def test_a_flood_past_the_open_files_limit(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        asyncio.run(_flood(srv))
        assert srv.alive
    finally:
        srv.terminate()
