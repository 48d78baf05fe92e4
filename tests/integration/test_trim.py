"""``POST /api/v1/trim/<channel>?seq=S&epoch=E`` (docs/native.md "Admin") against a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from hubbub.config import load_config
from hubbub.server import Server


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
            assert (status, body) == (200, {"channel": "/t/a", "epoch": epoch, "first": 4, "top": 5})
            status, log = await call("GET", "/api/v1/log/t/a")
            assert [e["seq"] for e in log["events"]] == [4, 5] and log["first"] == 4
            # Idempotent; a lower seq changes nothing.
            for seq in (3, 1, 0):
                status, body = await call("POST", f"/api/v1/trim/t/a?seq={seq}&epoch={epoch}")
                assert (status, body["first"], body["top"]) == (200, 4, 5)
            # Up to top: empty, and the channel keeps its position; publishing continues at seq 6.
            status, body = await call("POST", f"/api/v1/trim/t/a?seq=5&epoch={epoch}")
            assert (status, body["first"], body["top"]) == (200, 6, 5)
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
