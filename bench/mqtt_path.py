"""MQTT fan-out through hubbub: deliveries per second at QoS 0, 1 and 2.

    PYTHONPATH=src python bench/mqtt_path.py [--events 5000] [--subscribers 50] [--store memory|sqlite]

Against a fresh ``hubbub serve`` process on loopback (``--store memory`` runs it with ``--durability none``,
``sqlite`` with the default commit durability): ``--subscribers`` MQTT connections subscribe to ``bench/#``
at the QoS of the run and acknowledge every delivery (PUBACK; PUBREC and PUBCOMP at QoS 2) as a client does;
one MQTT publisher pipelines ``--events`` publishes to ``bench/x`` at that QoS, as fast as the socket takes
them (its acknowledgements are read, not waited for). Deliveries/s = deliveries / (first publish sent → last
delivery read by every subscriber); every event is committed before it is delivered. The driver runs in this
process on the same machine; the server's CPU time is printed beside each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from procs import Server, _hubbub

from hubbub.dialects import mqtt_codec as c


def start(store: str) -> tuple[Server, int]:
    base = ["--store", "memory", "--durability", "none"] if store == "memory" else []
    srv = _hubbub(base)
    for line in (Path(srv.tmp) / "server.log").read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("message") == "listening" and rec.get("listener") == "mqtt":
            return srv, int(rec["address"].rsplit(":", 1)[1])
    srv.stop()
    raise RuntimeError("no mqtt listener")


async def connect(port: int, cid: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, c.PacketReader]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(c.encode_connect(cid, keepalive=0))
    packets = c.PacketReader(1 << 24)
    while (p := packets.next()) is None:
        packets.feed(await reader.read(65536))
    assert p == c.Connack(False, 0), p
    return reader, writer, packets


async def subscriber(port: int, i: int, qos: int, n: int, ready: asyncio.Event, go: list[int]) -> float:
    reader, writer, packets = await connect(port, f"sub{i}")
    writer.write(c.encode_subscribe(1, [("bench/#", qos)]))
    got = 0
    subscribed = False
    while got < n:
        while (p := packets.next()) is not None:
            if isinstance(p, c.Suback):
                subscribed = True
                go[0] += 1
                if go[0] == go[1]:
                    ready.set()
            elif isinstance(p, c.PublishPacket):
                got += 1
                if p.qos == 1:
                    writer.write(c.encode_ack(c.PUBACK, p.packet_id))
                elif p.qos == 2:
                    writer.write(c.encode_ack(c.PUBREC, p.packet_id))
            elif isinstance(p, c.Ack) and p.kind == c.PUBREL:
                writer.write(c.encode_ack(c.PUBCOMP, p.packet_id))
        if got >= n:
            break
        data = await reader.read(1 << 16)
        assert data and (subscribed or got == 0), "subscriber closed"
        packets.feed(data)
    writer.close()
    return time.perf_counter()


async def run(port: int, qos: int, n: int, subs: int) -> tuple[float, float]:
    ready = asyncio.Event()
    go = [0, subs]
    tasks = [asyncio.ensure_future(subscriber(port, i, qos, n, ready, go)) for i in range(subs)]
    await asyncio.wait_for(ready.wait(), 60)
    reader, writer, packets = await connect(port, "pub")

    async def drain_acks() -> None:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            packets.feed(data)
            while (p := packets.next()) is not None:
                if isinstance(p, c.Ack) and p.kind == c.PUBREC:
                    writer.write(c.encode_ack(c.PUBREL, p.packet_id))

    acks = asyncio.ensure_future(drain_acks())
    t0 = time.perf_counter()
    for i in range(n):
        writer.write(c.encode_publish("bench/x", b"x" * 64, qos, False, False, i % 65535 + 1))
        if i % 256 == 255:
            await writer.drain()
    ends = await asyncio.wait_for(asyncio.gather(*tasks), 600)
    acks.cancel()
    writer.close()
    elapsed = max(ends) - t0
    return n * subs / elapsed, elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--subscribers", type=int, default=50)
    ap.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    args = ap.parse_args()
    for qos in (0, 1, 2):
        srv, port = start(args.store)
        try:
            cpu0 = srv.cpu_s()
            rate, elapsed = asyncio.run(run(port, qos, args.events, args.subscribers))
            cpu = srv.cpu_s() - cpu0
        finally:
            srv.stop()
        n = args.events * args.subscribers
        print(
            f"mqtt qos {qos}: {rate:,.0f} deliveries/s ({args.events} events x {args.subscribers} "
            f"subscribers in {elapsed:.2f} s; server CPU {cpu:.2f} s, {cpu / n * 1e6:.1f} us per delivery)"
        )


if __name__ == "__main__":
    main()
