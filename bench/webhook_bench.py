"""Push connector deliveries per second to a local receiver, and the server's CPU per delivery.

PYTHONPATH=src python bench/webhook_bench.py [--target webhook|apns] [--events 3000] [--hooks 8]
[--workers 8] [--payload 100]

A ``hubbub serve`` process pushes every one of ``--events`` events (on ten channels) to ``--hooks``
destinations, all served by a receiver in this process on 127.0.0.1:

* ``webhook``: that many webhooks on one pattern, all pointing at an aiohttp receiver answering 200;
* ``apns``: guble's APNs connector (provider tokens) with that many devices subscribed over guble's REST
  ``/apns/`` routes, pushing over HTTP/2 and TLS to the test suite's local APNs server
  (``tests/integration/apns_server.py``, which checks every push's path, topic and provider token).

The receiver holds every request until all events are published and journaled (so publishing is not
measured), then answers at once; the figures run from that moment to the last of ``events * hooks``
deliveries: deliveries per second, and the server process's CPU seconds (user + system, /proc) divided by
the deliveries (the receiver's, this process's, beside it: the figures hold while it is not the
bottleneck). Each destination delivers in order, one request at a time, so ``--hooks`` (up to
``--workers``) is the concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web
from procs import Server, _cpu_s, _hubbub

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.apns_server import KEY_ID, TEAM_ID, TOPIC, ApnsServer

#: The server under test (its destinations set up, the receiver holding their requests), the receiver's
#: gate (set: it answers) and a wait for the last of the deliveries.
Held = tuple[Server, asyncio.Event, Callable[[], Awaitable[object]]]
Target = Callable[[argparse.Namespace, Path], AbstractAsyncContextManager[Held]]


@asynccontextmanager
async def webhook(a: argparse.Namespace, tmp: Path) -> AsyncIterator[Held]:
    got = 0
    done = asyncio.Event()
    gate = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        nonlocal got
        await request.read()
        await gate.wait()
        got += 1
        if got >= a.events * a.hooks:
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
    conf = tmp / "hubbub.toml"
    conf.write_text(f"[webhooks]\nworkers = {a.workers}\ntimeout_s = 600\n")
    srv = _hubbub(["--config", str(conf), "--webhooks-hooks", json.dumps(hooks)])
    try:
        yield srv, gate, done.wait
    finally:
        srv.stop()
        await runner.cleanup()


@asynccontextmanager
async def apns(a: argparse.Namespace, tmp: Path) -> AsyncIterator[Held]:
    gate = asyncio.Event()
    receiver = await ApnsServer(tmp, hold=gate).start()
    total = a.events * a.hooks
    srv = _hubbub([
        "--guble-enabled", "true",
        "--guble-apns", "true",
        "--guble-apns-app-topic", TOPIC,
        "--guble-apns-endpoint", receiver.base,
        "--guble-apns-ca-file", str(receiver.ca_file),
        "--guble-apns-key-file", str(receiver.key_file()),
        "--guble-apns-key-id", KEY_ID,
        "--guble-apns-team-id", TEAM_ID,
        "--guble-apns-workers", str(a.workers),
        "--guble-apns-max-retry-s", "600",
    ])  # fmt: skip
    try:
        http = srv.specs["hubbub"].http_port
        async with aiohttp.ClientSession() as s:
            for i in range(a.hooks):  # a device's subscription is the topic's subtree, as /bench/**
                async with s.post(f"http://127.0.0.1:{http}/apns/d{i}/u{i}/bench") as r:
                    assert r.status == 200, await r.text()
        yield srv, gate, lambda: receiver.wait(lambda: len(receiver.delivered) >= total, 600)
    finally:
        srv.stop()
        await receiver.stop()


TARGETS: dict[str, Target] = {"webhook": webhook, "apns": apns}


def payload(target: str, size: int) -> bytes:
    """``size`` bytes: an APNs payload (a JSON object, sent as it is) for ``apns``, else ``x`` * size."""
    if target != "apns":
        return b"x" * size
    empty = orjson.dumps({"aps": {"alert": ""}})
    return orjson.dumps({"aps": {"alert": "x" * max(0, size - len(empty))}})


async def run(a: argparse.Namespace) -> None:
    total = a.events * a.hooks
    tmp = Path(tempfile.mkdtemp(prefix=f"hubbub-{a.target}-bench-"))
    async with TARGETS[a.target](a, tmp) as (srv, gate, delivered):
        http = srv.specs["hubbub"].http_port
        body = payload(a.target, a.payload)
        async with aiohttp.ClientSession() as s:
            sem = asyncio.Semaphore(32)

            async def publish(i: int) -> None:
                url = f"http://127.0.0.1:{http}/api/v1/publish/bench/c{i % 10}"
                async with sem, s.post(url, data=body) as r:
                    assert r.status == 200, await r.text()

            await asyncio.gather(*(publish(i) for i in range(a.events)))
            cpu0, own0, t0 = _cpu_s(srv.pid), time.process_time(), time.perf_counter()
            gate.set()
            await asyncio.wait_for(delivered(), 600)
            cpu1, own1, t1 = _cpu_s(srv.pid), time.process_time(), time.perf_counter()
            async with s.get(f"http://127.0.0.1:{http}/metrics") as r:
                metrics = await r.text()
    # A push tried again (a timeout while held) would count twice: the figures hold with none.
    retries = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("hubbub_connector_retries_total")
    )
    secs = t1 - t0
    print(
        f"{a.target}: {total} deliveries ({a.events} events x {a.hooks} destinations, {len(body)} B, "
        f"workers {a.workers}) in {secs:.2f} s: {total / secs:,.0f} deliveries/s, "
        f"server CPU {(cpu1 - cpu0) / total * 1e6:,.0f} us per delivery "
        f"(receiver {(own1 - own0) / total * 1e6:,.0f} us; {retries:.0f} retries; "
        f"load {os.getloadavg()[0]:.1f})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=sorted(TARGETS), default="webhook")
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--hooks", type=int, default=8, help="webhooks, or APNs devices")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--payload", type=int, default=100)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
