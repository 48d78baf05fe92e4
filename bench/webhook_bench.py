"""Webhook deliveries per second to a local receiver, and the server's CPU per delivery.

PYTHONPATH=src python bench/webhook_bench.py [--events 3000] [--hooks 8] [--workers 8] [--payload 100]

A ``hubbub serve`` process has ``--hooks`` webhooks on one pattern, all pointing at a receiver in this
process (aiohttp, 127.0.0.1). The receiver holds every request until all ``--events`` events are published
and journaled (so publishing is not measured), then answers 200 at once; the figures run from that moment
to the last of ``events * hooks`` deliveries: deliveries per second, and the server process's CPU seconds
(user + system, /proc) divided by the deliveries. Each hook delivers in order, one request at a time, so
``--hooks`` (up to ``--workers``) is the concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from procs import _cpu_s, _hubbub


async def run(a: argparse.Namespace) -> None:
    got = 0
    done = asyncio.Event()
    gate = asyncio.Event()
    total = a.events * a.hooks

    async def hook(request: web.Request) -> web.Response:
        nonlocal got
        await request.read()
        await gate.wait()
        got += 1
        if got >= total:
            done.set()
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}/hook"
    hooks = {f"h{i}": {"url": url, "pattern": "/bench/**", "secret": "s"} for i in range(a.hooks)}
    conf = Path(tempfile.mkdtemp(prefix="hubbub-webhook-bench-")) / "hubbub.toml"
    conf.write_text(f"[webhooks]\nworkers = {a.workers}\ntimeout_s = 600\n")
    srv = _hubbub(["--config", str(conf), "--webhooks-hooks", json.dumps(hooks)])
    try:
        http = srv.specs["hubbub"].http_port
        payload = b"x" * a.payload
        async with aiohttp.ClientSession() as s:
            sem = asyncio.Semaphore(32)

            async def publish(i: int) -> None:
                url = f"http://127.0.0.1:{http}/api/v1/publish/bench/c{i % 10}"
                async with sem, s.post(url, data=payload) as r:
                    assert r.status == 200, await r.text()

            await asyncio.gather(*(publish(i) for i in range(a.events)))
        cpu0, t0 = _cpu_s(srv.pid), time.perf_counter()
        gate.set()
        await asyncio.wait_for(done.wait(), 600)
        cpu1, t1 = _cpu_s(srv.pid), time.perf_counter()
    finally:
        srv.stop()
        await runner.cleanup()
    secs = t1 - t0
    print(
        f"webhooks: {total} deliveries ({a.events} events x {a.hooks} hooks, {a.payload} B, "
        f"workers {a.workers}) in {secs:.2f} s: {total / secs:,.0f} deliveries/s, "
        f"server CPU {(cpu1 - cpu0) / total * 1e6:,.0f} us per delivery "
        f"(load {os.getloadavg()[0]:.1f})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--hooks", type=int, default=8)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--payload", type=int, default=100)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
