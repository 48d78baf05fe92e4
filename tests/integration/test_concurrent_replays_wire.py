"""Receivers of one guble connection replaying at once, over a real socket (``core/hold.py``): guble runs each
receiver's work as its own task, so ``+ /t 0`` and ``+ /t/a 0`` hold at once; the snapshots are read in
either order, with events published before, between and after them. Guble's frames do not name receivers:
the connection gets each receiver's fetch in full and every event of their live streams once (guble.md §5,
§6). A WearScript list subscribes its channels at once too (without a replay), and gets every event once.
Native reads a connection's commands one at a time (a subscribe's replay and junction end before the next
command), so its subscriptions never hold at once: the node-level tests cover frames that name them."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from hubbub.core import ReplayPlan, replay_service
from hubbub.core.replay_plans import plan_selection
from hubbub.server import Server
from hubbub.server_config import load_config

from .test_guble import connect, meta, recv

WAIT = 10.0


class Gates:
    """Each gated pattern's snapshot read waits until its gate is opened (on a reader thread)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.entered = {p: threading.Event() for p in patterns}
        self.release = {p: threading.Event() for p in patterns}

    def plan(self, store: Any, pattern: Any, *args: Any) -> ReplayPlan:
        if pattern.text in self.entered:
            self.entered[pattern.text].set()
            assert self.release[pattern.text].wait(WAIT)
        return plan_selection(store, pattern, *args)

    async def reading(self, pattern: str) -> None:
        assert await asyncio.to_thread(self.entered[pattern].wait, WAIT)


def server(tmp_path: Path) -> Server:
    keys = {"data_dir": str(tmp_path), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}
    return Server(load_config(keys, env={}))


@pytest.mark.parametrize("first", ["/t", "/t/a"], ids=["subtree-first", "channel-first"])
def test_a_guble_connection_with_two_receivers_at_once_gets_every_event_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """Receivers ``+ /t 0`` and ``+ /t/a 0`` (each fetches its subtree from the start, then its live stream
    is exactly what is committed after its snapshot: guble.md §5) added at once: the connection gets each
    receiver's fetch and every event of their live streams, each live one once (guble.md §6)."""
    # A receiver on R subscribes to R's subtree.
    gates = Gates(["/t/**", "/t/a/**"])
    monkeypatch.setattr(replay_service, "plan_selection", gates.plan)
    second = "/t/a" if first == "/t" else "/t"

    async def main() -> None:
        async with server(tmp_path) as srv, aiohttp.ClientSession() as http:
            addr = f"127.0.0.1:{srv.ports['http']}"
            ws, _app = await connect(http, addr)
            pub, _ = await connect(http, addr)
            sent: list[tuple[str, str]] = []

            async def publish(n: int) -> None:
                for i in range(n):
                    ch = ("/t/a", "/t/b")[i % 2]
                    body = f"{ch}:{len(sent)}"
                    await pub.send_str(f"> {ch}\n\n{body}")
                    assert await recv(pub) == b"#send"
                    sent.append((ch, body))

            await pub.send_str("> /t/a\n\nbefore")
            assert await recv(pub) == b"#send"
            sent.append(("/t/a", "before"))
            await ws.send_str("+ /t 0\n")
            await ws.send_str("+ /t/a 0\n")
            for p in gates.entered:
                await gates.reading(p)
            await publish(4)  # both holding, before both snapshots
            gates.release[first + "/**"].set()
            frames: list[bytes] = []

            async def until(frame: bytes) -> None:
                while not frames or frames[-1] != frame:
                    frames.append(await recv(ws))

            await until(f"#subscribed-to {first}".encode())
            await publish(4)  # the second one holding, after the first one's snapshot
            gates.release[second + "/**"].set()
            await until(f"#subscribed-to {second}".encode())
            await publish(4)  # both live
            await pub.send_str("> /t/a\n\nlast")
            assert await recv(pub) == b"#send"
            while not frames[-1].endswith(b"\nlast"):
                frames.append(await recv(ws))
            messages = [f for f in frames if not f.startswith(b"#")]
            got = Counter((meta(f)[0], f.rsplit(b"\n", 1)[1].decode()) for f in messages)
            # Snapshots: the first one's after 1 + 4 events, the second one's after 1 + 8.
            snap = {first: 5, second: 9}
            fetched = sent[: snap["/t"]] + [e for e in sent[: snap["/t/a"]] if e[0] == "/t/a"]
            live = [
                e for i, e in enumerate(sent) if i >= min(snap.values()) if e[0] == "/t/a" or i >= snap["/t"]
            ]
            assert got == Counter([*fetched, *live, ("/t/a", "last")])
            assert meta(messages[-1])[0] == "/t/a" and messages[-1].endswith(b"\nlast")

    asyncio.run(main())


@pytest.mark.parametrize("first", [0, 1], ids=["subtree-first", "channel-first"])
def test_a_wearscript_connection_subscribing_a_list_at_once_gets_every_event_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: int
) -> None:
    """A WearScript list ``["w", "w:a"]`` subscribes both at once (no replay: each one's stream starts at
    its subscribe): events published to ``w:a`` before, between and after the two snapshots reach the
    connection once each, in order, as one WearScript connection gets an event once (wearscript.md)."""
    entered: list[str] = []
    release = [threading.Event(), threading.Event()]
    armed, both = threading.Event(), threading.Event()

    def gated(store: Any, pattern: Any, *args: Any) -> ReplayPlan:
        if armed.is_set():
            entered.append(pattern.text)
            if len(entered) == 2:
                both.set()
            assert release[sorted(["/w/**", "/w/a/**"]).index(pattern.text)].wait(WAIT)
        return plan_selection(store, pattern, *args)

    monkeypatch.setattr(replay_service, "plan_selection", gated)

    async def main() -> None:
        async with server(tmp_path) as srv, aiohttp.ClientSession() as http:
            addr = f"127.0.0.1:{srv.ports['http']}"
            sent: list[str] = []

            async def publish(n: int) -> None:
                for _ in range(n):
                    body = f"e{len(sent)}"
                    async with http.post(f"http://{addr}/api/v1/publish/w/a", data=body.encode()) as r:
                        assert r.status == 200
                    sent.append(body)

            async with http.ws_connect(f"ws://{addr}/wearscript/ws") as ws:

                async def recv() -> Any:
                    msg = await ws.receive(timeout=WAIT)
                    assert msg.type == aiohttp.WSMsgType.BINARY, msg
                    return msgpack.unpackb(msg.data, raw=False)

                assert (await recv())[0] == "subscriptions"  # the hub's own list
                armed.set()
                await ws.send_bytes(msgpack.packb(["subscriptions", "phone:r", ["w", "w:a"]]))
                assert await asyncio.to_thread(both.wait, WAIT)
                await publish(3)  # both holding, before both snapshots
                release[first].set()
                await publish(3)  # one of them may be live: the other holds
                release[1 - first].set()
                await publish(3)
                got = [await recv() for _ in sent]
                assert got == [["w:a", body] for body in sent]
                await publish(1)
                assert await recv() == ["w:a", sent[-1]]

    asyncio.run(main())
