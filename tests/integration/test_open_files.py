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
import contextlib
import json
import os
import resource
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

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


async def _flood(srv: ServerProcess, pids: list[int]) -> None:
    """The flood against the processes ``pids`` that accept (the server, or each worker of a node)."""
    base = f"http://127.0.0.1:{srv.ports['http']}"
    url = f"ws://127.0.0.1:{srv.ports['http']}/ws/hubbub"
    # One kept-alive connection for the publishes, the reads and /metrics during the flood.
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http,
        aiohttp.ClientSession() as subs,
        contextlib.AsyncExitStack() as stack,
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
        readers = [await stack.enter_async_context(aiohttp.ClientSession()) for _ in range(READERS)]
        for reader in readers:
            async with reader.get(f"{base}/healthz") as r:
                assert r.status == 200
        limits = {pid: _fds(pid) + HEADROOM for pid in pids}
        for pid, limit in limits.items():
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
        flood: list[asyncio.StreamWriter] = []
        heads = {
            "native": b"",
            "ws": b"GET /ws/hubbub HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Protocol: hubbub.v1.json\r\n\r\n",
            "publish": b"POST /api/v1/publish/t/flood HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx",
        }
        # The kinds take turns, so that each still comes once the descriptors are short, on every worker.
        for _ in range(FLOOD):
            for kind, head in heads.items():
                port = srv.ports["native" if kind == "native" else "http"]
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
        assert len(warnings()) <= 2 * len(pids), warnings()
        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
        counted = {}
        for line in text.splitlines():
            if line.startswith("hubbub_limit_refusals_total{") and 'limit="open_files"' in line:
                counted[line.split('dialect="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
        assert counted["native"] > 0 and counted["http"] > 0, counted
        assert srv.alive
        assert all(_fds(pid) <= limit - 2 for pid, limit in limits.items())  # descriptors kept free
        # The accept loops do not spin while the flood waits.
        cpu = sum(map(_cpu_s, pids))
        await asyncio.sleep(0.5)  # a measurement window, not a wait for a condition
        assert sum(map(_cpu_s, pids)) - cpu < 0.25
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
        await _until(
            lambda: all(_fds(pid) < limit - HEADROOM // 2 for pid, limit in limits.items()),
            "the flood's descriptors freed",
        )
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


@pytest.mark.parametrize("workers", [1, 2])
def test_a_flood_past_the_open_files_limit(tmp_path: Path, workers: int) -> None:
    """On a single process and on each worker of a node (``serve --workers 2``: the parent accepts nothing,
    its workers each have their own descriptors and their own readers of the log's file)."""
    extra = ["--workers", "2"] if workers > 1 else []
    srv = ServerProcess(tmp_path / "data", extra=extra).start()
    try:
        assert srv.proc is not None
        pids = [srv.proc.pid] if workers == 1 else _workers(srv)
        assert len(pids) == workers
        asyncio.run(_flood(srv, pids))
        assert srv.alive
    finally:
        srv.terminate()


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            out.update(int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return out


def _workers(srv: ServerProcess) -> list[int]:
    """A node's worker processes: the children of its fork server, the parent's one child."""
    assert srv.proc is not None
    return sorted(pid for fork_server in _children(srv.proc.pid) for pid in _children(fork_server))
