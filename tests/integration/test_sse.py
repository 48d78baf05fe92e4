"""Server-sent events: resume with Last-Event-ID replays exactly what came after, and reports trimmed gaps."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from hubbub.server import Server
from hubbub.server_config import load_config


async def read_sse(resp: aiohttp.ClientResponse, n: int) -> list[dict[str, Any]]:
    """The next ``n`` SSE events (comments and retry-only blocks skipped)."""
    out: list[dict[str, Any]] = []
    block: dict[str, str] = {}
    while len(out) < n:
        raw = await asyncio.wait_for(resp.content.readline(), 5)
        line = raw.decode().rstrip("\n")
        if line == "":
            if "data" in block:
                out.append(
                    {
                        "id": block.get("id"),
                        "event": block.get("event", "message"),
                        **json.loads(block["data"]),
                    }
                )
            block = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            block[key] = value
    return out


def test_last_event_id_resume_with_trimmed_gap(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = load_config(
            {
                "data_dir": str(tmp_path),
                "http.listen": "127.0.0.1:0",
                "native.tcp_listen": "127.0.0.1:0",
                "log.retention.max_events": "2",
            },
            env={},
        )
        async with Server(cfg) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"

            async def pub(ch: str, body: str) -> None:
                async with http.post(f"{base}/api/v1/publish{ch}", data=body) as r:
                    assert r.status == 200

            async with http.get(f"{base}/api/v1/stream/s/**") as stream:
                await pub("/s/a", "a1")
                first = (await read_sse(stream, 1))[0]
            assert first["channel"] == "/s/a" and first["seq"] == 1
            # Away: /s/a gets two more (retained), /s/b gets three (only the last two are retained).
            for body in ("a2", "a3"):
                await pub("/s/a", body)
            for body in ("b1", "b2", "b3"):
                await pub("/s/b", body)
            headers = {"Last-Event-ID": first["id"]}
            async with http.get(f"{base}/api/v1/stream/s/**", headers=headers) as stream:
                events = await read_sse(stream, 6)
            *replayed, recovered = events
            # Exactly what came after the id, in merged (commit) order: no duplicate of /s/a 1; /s/b's gap
            # (b1 trimmed) just before its first event.
            assert [(e["event"], e["channel"], e.get("seq")) for e in replayed] == [
                ("message", "/s/a", 2),
                ("message", "/s/a", 3),
                ("gap", "/s/b", None),
                ("message", "/s/b", 2),
                ("message", "/s/b", 3),
            ]
            gap = replayed[2]
            assert gap["reason"] == "trimmed" and gap["position"] == {"seq": 1, "epoch": replayed[3]["epoch"]}
            assert all(e["replay"] for e in replayed if e["event"] == "message")
            assert recovered["event"] == "recovered" and recovered["replayed"] == 4

    asyncio.run(main())


def test_a_resume_reads_the_heads_of_the_channels_it_replays_not_of_every_channel(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = load_config(
            {
                "data_dir": str(tmp_path),
                "http.listen": "127.0.0.1:0",
                "native.tcp_listen": "127.0.0.1:0",
                "log.retention.max_events": "2",
            },
            env={},
        )
        async with Server(cfg) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"

            async def pub(ch: str, body: str) -> None:
                async with http.post(f"{base}/api/v1/publish{ch}", data=body) as r:
                    assert r.status == 200

            for i in range(40):  # channels with trimmed history, idle since before the resume point
                for body in ("x1", "x2", "x3"):
                    await pub(f"/s/idle{i}", body)
            async with http.get(f"{base}/api/v1/stream/s/**") as stream:
                await pub("/s/a", "a1")
                first = (await read_sse(stream, 1))[0]
            await pub("/s/a", "a2")
            for body in ("b1", "b2", "b3"):
                await pub("/s/b", body)
            assert srv.node is not None
            store = srv.node._store
            heads: list[str] = []
            listed: list[str] = []
            real_heads, real_channels = store.heads, store.channels

            def counting_heads(channels: Any) -> Any:
                channels = list(channels)
                heads.extend(channels)
                return real_heads(channels)

            def counting_channels(*args: Any, **kwargs: Any) -> Any:
                out = real_channels(*args, **kwargs)
                listed.extend(ci.channel for ci in out)
                return out

            store.heads = counting_heads  # type: ignore[method-assign]  # a test double
            store.channels = counting_channels  # type: ignore[method-assign]  # a test double
            headers = {"Last-Event-ID": first["id"]}
            async with http.get(f"{base}/api/v1/stream/s/**", headers=headers) as stream:
                events = await read_sse(stream, 5)
            # The heads read: the id's channel and the one channel the replay started past its seq 1.
            assert listed == [] and sorted(heads) == ["/s/a", "/s/b"]
            assert [(e["event"], e["channel"], e.get("seq")) for e in events[:4]] == [
                ("message", "/s/a", 2),
                ("gap", "/s/b", None),
                ("message", "/s/b", 2),
                ("message", "/s/b", 3),
            ]
            assert events[4]["event"] == "recovered" and events[4]["replayed"] == 3

    asyncio.run(main())
