"""``POST /api/v1/trim/<channel>?seq=S&epoch=E`` (docs/native.md "Admin") against a real server: the
current epoch, and retired epochs (docs/log.md "Epochs") on both store engines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.log.base import ChannelInfo, EventLog, LogStore, StoreStats
from hubbub.server import Server
from hubbub.server_config import load_config


def test_trim_endpoint(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = load_config(
            {"data_dir": str(tmp_path), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"},
            env={},
        )
        async with Server(cfg) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"

            async def call(method: str, path: str) -> tuple[int, Any]:
                async with http.request(method, base + path) as r:
                    return r.status, await r.json()

            epoch = ""
            for i in range(5):
                status, body = await call("POST", f"/api/v1/publish/t/a?x={i}")
                assert status == 200
                epoch = body["epoch"]
            assert (await call("POST", "/api/v1/publish/t/b"))[0] == 200

            status, body = await call("POST", f"/api/v1/trim/t/a?seq=3&epoch={epoch}")
            assert (status, body) == (
                200,
                {"channel": "/t/a", "epoch": epoch, "first": 4, "top": 5, "current": True},
            )
            status, log = await call("GET", "/api/v1/log/t/a")
            assert [e["seq"] for e in log["events"]] == [4, 5] and log["first"] == 4
            # Idempotent; a lower seq changes nothing.
            for seq in (3, 1, 0):
                status, body = await call("POST", f"/api/v1/trim/t/a?seq={seq}&epoch={epoch}")
                assert (status, body["first"], body["top"]) == (200, 4, 5)
            # Up to top: empty, and the channel keeps its position; publishing continues at seq 6.
            status, body = await call("POST", f"/api/v1/trim/t/a?seq=5&epoch={epoch}")
            assert (status, body["first"], body["top"]) == (200, 6, 5)
            # Listings leave the emptied channel out, unless asked for it with its position.
            status, listing = await call("GET", "/api/v1/channels/t/*")
            assert [c["channel"] for c in listing["channels"]] == ["/t/b"]
            status, listing = await call("GET", "/api/v1/channels/t/*?include_empty=1")
            assert listing["channels"][0] == {"channel": "/t/a", "epoch": epoch, "first": 6, "top": 5}
            assert [c["channel"] for c in listing["channels"]] == ["/t/a", "/t/b"]
            status, body = await call("GET", "/api/v1/channels/t/*?include_empty=maybe")
            assert (status, body["error"]["code"]) == (400, 4001)
            status, pub = await call("POST", "/api/v1/publish/t/a")
            assert (pub["seq"], pub["epoch"]) == (6, epoch)
            status, log = await call("GET", "/api/v1/log/t/b")
            assert [e["seq"] for e in log["events"]] == [1]  # other channels untouched

            # Errors: wrong epoch (409 with the position), seq beyond top, bad params, bad channel.
            status, body = await call("POST", "/api/v1/trim/t/a?seq=1&epoch=zzzzzzzz")
            assert status == 409
            assert body == {
                "error": {
                    "code": 4202,
                    "message": "epoch mismatch",
                    "temporary": False,
                    "position": {"seq": 6, "epoch": epoch},
                }
            }
            status, body = await call("POST", "/api/v1/trim/never?seq=0&epoch=zzzzzzzz")
            assert status == 409 and body["error"]["position"] == {"seq": 0, "epoch": ""}
            for query in (f"seq=7&epoch={epoch}", f"seq=-1&epoch={epoch}", f"seq=x&epoch={epoch}", "seq=1"):
                status, body = await call("POST", f"/api/v1/trim/t/a?{query}")
                assert (status, body["error"]["code"]) == (400, 4001), query
            status, body = await call("POST", f"/api/v1/trim/{'x' * 1100}?seq=1&epoch={epoch}")
            assert (status, body["error"]["code"]) == (400, 4004)
            # Nothing of that changed the log.
            status, log = await call("GET", "/api/v1/log/t/a")
            assert (log["first"], log["top"], [e["seq"] for e in log["events"]]) == (6, 6, [6])

    asyncio.run(main())


@pytest.mark.parametrize("store", ["sqlite", "memory"])
def test_trim_endpoint_trims_a_retired_epoch(tmp_path: Path, store: str) -> None:
    """A retired epoch is trimmed by name, exactly up to ``seq``, leaving the current epoch (and the other
    channels) alone; ``seq`` is checked against that epoch's top; trimmed up to its top, the retired epoch is
    gone, and naming it again is 409 like an epoch that never existed."""

    async def main() -> None:
        cfg = load_config(
            {
                "data_dir": str(tmp_path),
                "store": store,
                "http.listen": "127.0.0.1:0",
                "native.tcp_listen": "127.0.0.1:0",
            },
            env={},
        )
        async with Server(cfg) as srv, aiohttp.ClientSession() as http:
            node = srv.node
            assert node is not None
            base = f"http://127.0.0.1:{srv.ports['http']}"

            async def call(method: str, path: str) -> tuple[int, Any]:
                async with http.request(method, base + path) as r:
                    return r.status, await r.json()

            async def seqs(channel: str, epoch: str) -> list[int]:
                def read(st: EventLog) -> list[int]:
                    return [e.seq for e in st.read(channel, 0, 1000, epoch=epoch)]

                return await node._reads.call(read)

            # The epochs' admin reads: the node's reads go to the store itself (no cluster view here).
            async def retired(channel: str) -> list[ChannelInfo]:
                def read(st: EventLog) -> list[ChannelInfo]:
                    assert isinstance(st, LogStore)
                    return st.retired_epochs(channel)

                return await node._reads.call(read)

            async def store_stats() -> StoreStats:
                def read(st: EventLog) -> StoreStats:
                    assert isinstance(st, LogStore)
                    return st.stats()

                return await node._reads.call(read)

            for i in range(5):
                status, body = await call("POST", f"/api/v1/publish/t/a?x={i}")
                assert status == 200
            old = body["epoch"]
            assert (await call("POST", "/api/v1/publish/t/b"))[0] == 200
            new = (await node.reset_channel("/t/a")).epoch
            for i in range(3):
                status, body = await call("POST", f"/api/v1/publish/t/a?y={i}")
                assert (status, body["seq"], body["epoch"]) == (200, i + 1, new)
            old_top_time = (await retired("/t/a"))[0].top_time

            status, body = await call("POST", f"/api/v1/trim/t/a?seq=2&epoch={old}")
            assert (status, body) == (
                200,
                {"channel": "/t/a", "epoch": old, "first": 3, "top": 5, "current": False},
            )
            assert await seqs("/t/a", old) == [3, 4, 5]
            assert await retired("/t/a") == [ChannelInfo("/t/a", old, 3, 5, old_top_time)]
            status, log = await call("GET", "/api/v1/log/t/a")  # the current epoch is untouched
            assert (log["epoch"], log["first"], log["top"]) == (new, 1, 3)
            assert [e["seq"] for e in log["events"]] == [1, 2, 3]
            # Idempotent; a lower seq changes nothing.
            for seq in (2, 1, 0):
                status, body = await call("POST", f"/api/v1/trim/t/a?seq={seq}&epoch={old}")
                assert (status, body["first"], body["top"], body["current"]) == (200, 3, 5, False)

            # seq beyond the retired epoch's top (though within the current one's range, or not): 400.
            for seq in (6, 100, -1):
                status, body = await call("POST", f"/api/v1/trim/t/a?seq={seq}&epoch={old}")
                assert (status, body["error"]["code"]) == (400, 4001), seq
            # An epoch the channel never had: 409 with the current position, as before.
            status, body = await call("POST", "/api/v1/trim/t/a?seq=1&epoch=zzzzzzzz")
            assert status == 409
            assert body["error"]["code"] == 4202 and body["error"]["position"] == {"seq": 3, "epoch": new}
            # A retired epoch of another channel is not this channel's.
            status, body = await call("POST", f"/api/v1/trim/t/b?seq=1&epoch={old}")
            assert status == 409 and body["error"]["position"]["epoch"] != old
            assert await seqs("/t/a", old) == [3, 4, 5]

            # The current epoch by name still works, and says it is current; the retired one is untouched.
            status, body = await call("POST", f"/api/v1/trim/t/a?seq=1&epoch={new}")
            assert (status, body) == (
                200,
                {"channel": "/t/a", "epoch": new, "first": 2, "top": 3, "current": True},
            )
            assert await seqs("/t/a", old) == [3, 4, 5]

            # Up to its top: the retired epoch is gone with its last event. The reply is its final position
            # (first = top + 1); naming it again is 409, like an epoch that never existed.
            status, body = await call("POST", f"/api/v1/trim/t/a?seq=5&epoch={old}")
            assert (status, body) == (
                200,
                {"channel": "/t/a", "epoch": old, "first": 6, "top": 5, "current": False},
            )
            assert await retired("/t/a") == [] and await seqs("/t/a", old) == []
            status, body = await call("POST", f"/api/v1/trim/t/a?seq=5&epoch={old}")
            assert (status, body["error"]["position"]) == (409, {"seq": 3, "epoch": new})
            stats = await store_stats()
            assert (stats.events, stats.retired_epochs) == (2 + 1, 0)  # /t/a's seqs 2 and 3, /t/b's 1

            # The current epoch goes on where it was.
            status, pub = await call("POST", "/api/v1/publish/t/a")
            assert (pub["seq"], pub["epoch"]) == (4, new)
            status, log = await call("GET", "/api/v1/log/t/b")
            assert [e["seq"] for e in log["events"]] == [1]  # other channels untouched

    asyncio.run(main())
