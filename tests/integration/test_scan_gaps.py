"""A pattern's replay from a time tells the gap of a channel trimmed or reset while it runs (ARCHITECTURE §5:
a gap that cannot be filled is told, never hidden): the replay knows, from its snapshot, which events of
each channel it must find (``LogStore.log_census``), so a channel whose events went meanwhile gets a ``gap``
where they were, however few channels the client's ``since`` map names."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from hubbub.channels import parse_pattern
from hubbub.client import AsyncClient
from hubbub.client import Gap as ClientGap
from hubbub.core import Node, ReplaySpec, Session
from hubbub.core.replay import Gap
from hubbub.events import Event
from hubbub.server import Server
from hubbub.server_config import load_config

from .test_node import Enc, Run, req, run

__all__ = ["run"]


class _Paced(Session):
    """A session that says when a replay first waits for room in its queue."""

    def __init__(self) -> None:
        super().__init__("native", Enc(), max_items=64, max_bytes=1 << 24)
        self.stalled = asyncio.Event()

    async def wait_replay_room(self) -> None:
        self.stalled.set()
        await super().wait_replay_room()


def test_a_channel_trimmed_or_reset_while_a_from_time_replay_runs_is_told(run: Run) -> None:
    async def body(node: Node) -> None:
        await asyncio.gather(*(node.publish(req("/t/a", f"a{i}")) for i in range(1, 5001)))
        b = [await node.publish(req("/t/b", f"b{i}")) for i in range(1, 5)]
        for i in (1, 2):
            await node.publish(req("/t/c", f"c{i}"))
        await node.publish(req("/t/b", "b5"))
        s = _Paced()
        node.attach(s)

        def on_gap(g: Gap) -> None:
            s.push(repr(("gap", g.channel, g.since.seq, g.position.seq, g.reason)).encode())

        task = asyncio.ensure_future(
            node.subscribe(
                s,
                "s",
                parse_pattern("/t/**"),
                selection=ReplaySpec(from_time=1),
                on_snapshot=lambda p: None,
                on_gap=on_gap,
            )
        )
        frames: list[Any] = []
        async with asyncio.timeout(20):
            await s.stalled.wait()  # the replay waits for room, two pages of /t/a read at most
            # While it waits: /t/b loses its first two events, /t/c its epoch (both later in the log).
            await node.trim("/t/b", b[0].event.epoch, 2)
            await node.reset_channel("/t/c")
            while not task.done() or s.queued:
                frames += [eval(f.decode()) for f in await s.next_frames()]
        assert frames[:5000] == [("/t/a", i, ("s",), True, f"a{i}") for i in range(1, 5001)]
        assert frames[5000:] == [
            ("gap", "/t/b", 0, 2, "trimmed"),  # b1 and b2, trimmed before the replay read them
            ("/t/b", 3, ("s",), True, "b3"),
            ("/t/b", 4, ("s",), True, "b4"),
            ("/t/b", 5, ("s",), True, "b5"),
            ("gap", "/t/c", 0, 0, "epoch"),  # c1 and c2, gone with their epoch
        ]

    run(body)


@pytest.mark.parametrize("transport", ["ws", "tcp"])
def test_the_python_client_is_told_the_gap_of_a_channel_trimmed_while_its_replay_runs(
    tmp_path: Path, transport: str
) -> None:
    """Over native WebSocket and TCP, a ``/**``-style subscriber replaying from a time gets a :class:`Gap`
    for each channel trimmed or reset while its replay runs, where the events were, and every other event
    exactly. The replay is held (its read of the page holding /t/b waits) while the channels lose them, so
    the order of things is certain."""

    async def body() -> None:
        cli = {
            "data_dir": str(tmp_path / "d"),
            "http.listen": "127.0.0.1:0",
            "native.tcp_listen": "127.0.0.1:0",
        }
        async with Server(load_config(cli=cli, env={})) as server:
            node = server.node
            assert node is not None
            await asyncio.gather(*(node.publish(req("/t/a", f"a{i}")) for i in range(1, 3001)))
            store = node._store
            before_b = store.log_mark().pos
            b = [await node.publish(req("/t/b", f"b{i}")) for i in range(1, 5)]
            for i in (1, 2):
                await node.publish(req("/t/c", f"c{i}"))
            await node.publish(req("/t/b", "b5"))
            hit, go = threading.Event(), threading.Event()
            read_log = store.read_log

            def gated(after_pos: int, *args: Any, **kwargs: Any) -> Any:
                if after_pos < before_b + 1 <= after_pos + 2048:  # the page that holds /t/b 1
                    hit.set()
                    go.wait(10)
                return read_log(after_pos, *args, **kwargs)

            store.read_log = gated  # type: ignore[method-assign]  # a test double
            port = server.ports["http" if transport == "ws" else "native"]
            url = f"ws://127.0.0.1:{port}" if transport == "ws" else f"tcp://127.0.0.1:{port}"
            async with AsyncClient.connect(url) as client, client.subscribe("/t/**", from_time=1) as sub:
                assert await asyncio.to_thread(hit.wait, 10)
                await node.trim("/t/b", b[0].event.epoch, 2)
                await node.reset_channel("/t/c")
                go.set()
                got: list[Any] = []
                while len(got) < 3005:
                    item = await sub.get(10)
                    if isinstance(item, Event):
                        got.append((item.channel, item.seq, item.payload.decode()))
                    else:
                        assert isinstance(item, ClientGap)
                        got.append(("gap", item.channel, item.since.seq, item.position.seq, item.reason))
                assert got[:3000] == [("/t/a", i, f"a{i}") for i in range(1, 3001)]
                assert got[3000:] == [
                    ("gap", "/t/b", 0, 2, "trimmed"),
                    ("/t/b", 3, "b3"),
                    ("/t/b", 4, "b4"),
                    ("/t/b", 5, "b5"),
                    ("gap", "/t/c", 0, 0, "epoch"),
                ]
                # Live after the replay: /t/c goes on in its new epoch, /t/b after 5.
                await node.publish(req("/t/c", "c-new"))
                item = await sub.get(10)
                assert isinstance(item, Event) and (item.channel, item.seq, item.payload) == (
                    "/t/c",
                    1,
                    b"c-new",
                )

    asyncio.run(body())
