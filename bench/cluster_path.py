"""Cross-node delivery figures: events/s and commit-to-delivery latency, one node against a cluster.

Starts its own PostgreSQL (initdb in a temporary directory) and Redis, then for each setup real ``hubbub
serve`` processes on free loopback ports, and drives them over raw TCP (JSON lines): one publisher on node 1
pipelines ``--count`` publishes with acks, in windows; subscribers read every event and take, per event, the
time from its commit (the event's ``time``, assigned by the log) to its arrival. Every process shares this
machine's cores, so the figures compare setups with each other, not with a real cluster.

    python bench/cluster_path.py --count 20000 --size 100

It also reports the CPU time each process spent per event (each node, PostgreSQL's processes together,
Redis): the per-event costs of the scaling model in docs/cluster.md.

Setups: ``sqlite`` (one node, the embedded log), ``postgres`` (one node on PostgreSQL), ``2 nodes`` (publisher
on node 1, subscriber on node 2), ``3 nodes`` (publisher on node 1, subscribers on nodes 2 and 3), and, for
comparison in the same run, NATS JetStream (``nats-server -js``, file storage): one server with two push
consumers, and three routed servers (publisher on server 1, a push consumer on each of servers 2 and 3) with
the stream at one replica and at three; the publisher pipelines acknowledged publishes (``PUB`` with a reply
inbox) the same way; the latency is from the stream's store time (in each delivery's ack subject) to arrival.
Skipped, with a note, when ``nats-server`` is not installed (``apt-get install nats-server``).

``--workers N`` adds ``2 nodes of N workers`` (publisher on node 1, subscriber on node 2, each node ``serve
--workers N``, every worker a member of the cluster; a node's CPU is its parent's and its workers').

Then a light-load pass (``--light N``, default 1000; 0 skips it): every setup again with each publish waiting
for its ack before the next, for the latency of the hop itself, without queues.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # procs and proto import each other by their bare names

from procs import Server, _popen, _wait_port, available, free_port, start  # noqa: E402
from proto import Spec, ack_marker, count_stream, nats_request, open_pub, pub_frames  # noqa: E402
from tests.integration.serverproc import ServerProcess  # noqa: E402
from tests.pgserver import PgServer  # noqa: E402
from tests.redisserver import RedisServer  # noqa: E402

CHANNEL = "/bench/cluster"
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (``/proc/<pid>/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and its children (PostgreSQL's postmaster and its backends)."""
    total = cpu_s(root)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == root:
                total += cpu_s(int(d.name))
    return total


class Lines:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(b'{"op":"hello","id":1,"v":1}\n')
        self.lines()

    def lines(self) -> list[bytes]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        head, _, self.buf = self.buf.rpartition(b"\n")
        return head.split(b"\n")


class Subscriber(threading.Thread):
    def __init__(self, port: int, count: int, channel: str = CHANNEL) -> None:
        super().__init__(daemon=True)
        self.conn = Lines(port)
        self.conn.sock.sendall(f'{{"op":"subscribe","id":2,"sub":"s","pattern":"{channel}"}}\n'.encode())
        self.conn.lines()
        self.count = count
        self.latencies: list[int] = []
        self.last_seq = 0
        self.in_order = True
        self.done = threading.Event()

    def run(self) -> None:
        lat = self.latencies
        while len(lat) < self.count:
            lines = self.conn.lines()
            now = time.time_ns()
            for line in lines:
                ev = json.loads(line)
                if ev.get("op") != "event":
                    continue
                lat.append(now - int(ev["time"]))
                self.in_order &= ev["seq"] == self.last_seq + 1
                self.last_seq = ev["seq"]
        self.done.set()


def publish(port: int, count: int, size: int, window: int = 1000, channel: str = CHANNEL) -> None:
    c = Lines(port)
    text = "x" * size

    def frame(i: int) -> str:
        return f'{{"op":"publish","id":{i + 10},"channel":"{channel}","text":"{text}","ack":true}}\n'

    sent = acked = 0
    while acked < count:
        if sent - acked < window and sent < count:
            n = min(window, count - sent)
            c.sock.sendall("".join(frame(sent + i) for i in range(n)).encode())
            sent += n
        for line in c.lines():
            acked += line.count(b'"op":"reply"')
    c.sock.close()


class JsSubscriber(threading.Thread):
    """A JetStream push consumer (no acks) on ``subject``, over a raw socket: per delivery, the time from the
    stream's store time (the ack subject's timestamp token) to arrival, and whether stream seqs run 1, 2, …"""

    def __init__(self, spec: Spec, subject: str, count: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", spec.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        dlv = f"dlv.{threading.get_ident()}.{time.monotonic_ns()}"
        self.sock.sendall(
            b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB %s 1\r\nPING\r\n' % dlv.encode()
        )
        self.buf = b""
        while b"PONG\r\n" not in self.buf:
            self.buf += self.sock.recv(1 << 16)
        self.buf = self.buf.split(b"PONG\r\n", 1)[1]
        cfg = {
            "deliver_subject": dlv,
            "ack_policy": "none",
            "deliver_policy": "new",
            "filter_subject": subject,
        }
        nats_request(spec, "$JS.API.CONSUMER.CREATE.B", {"stream_name": "B", "config": cfg})
        self.count = count
        self.latencies: list[int] = []
        self.last_seq = 0
        self.in_order = True
        self.done = threading.Event()

    def run(self) -> None:
        lat = self.latencies
        buf = self.buf
        while len(lat) < self.count:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                break
            now = time.time_ns()
            buf += chunk
            i = 0
            while True:
                end = buf.find(b"\r\n", i)
                if end < 0:
                    break
                head = buf[i:end]
                if head.startswith(b"MSG "):
                    parts = head.split()
                    size = int(parts[-1])
                    if end + 2 + size + 2 > len(buf):
                        break
                    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending> (9 tokens), or
                    # with domain and account hash first (12 or more): the timestamp is 2nd after cseq.
                    tok = parts[3].split(b".")
                    k = 5 if len(tok) == 9 else 7
                    seq, ts = int(tok[k]), int(tok[k + 2])
                    lat.append(now - ts)
                    self.in_order &= seq == self.last_seq + 1
                    self.last_seq = seq
                    i = end + 2 + size + 2
                elif head == b"PING":
                    self.sock.sendall(b"PONG\r\n")
                    i = end + 2
                else:
                    i = end + 2
            buf = buf[i:]
        self.done.set()


def js_publish(spec: Spec, subject: str, count: int, size: int, window: int = 1000) -> None:
    """``count`` acknowledged publishes in windows of ``window``, as :func:`publish` does for hubbub."""
    c = open_pub(spec)
    marker = ack_marker(spec)
    payload = b"x" * size
    sent = acked = 0
    tail = b""
    while acked < count:
        if sent - acked < window and sent < count:
            n = min(window, count - sent)
            c.sock.sendall(pub_frames(spec, subject, payload, n, True))
            sent += n
        chunk = c.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("JetStream closed the publisher")
        n, tail = count_stream(chunk, tail, marker)
        acked += n
    c.close()


def run_js(count: int, size: int, n_subs: int = 2, window: int = 1000) -> dict[str, object]:
    """JetStream (one ``nats-server -js``, file storage, stream ``B`` on ``js.>``): publisher and ``n_subs``
    push consumers, as in :func:`run_setup`."""
    srv = start("js")
    try:
        spec = srv.specs["js"]
        subject = "js.bench"
        subs = [JsSubscriber(spec, subject, count) for _ in range(n_subs)]
        for s in subs:
            s.start()
        pid = srv.proc.pid
        before = cpu_s(pid)
        t0 = time.perf_counter()
        js_publish(spec, subject, count, size, window)
        for s in subs:
            s.done.wait(300)
        dt = time.perf_counter() - t0
        cpu = round((cpu_s(pid) - before) / count * 1e6, 1)
    finally:
        srv.stop()
    lat = sorted(x for s in subs for x in s.latencies)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6

    return {
        "events": count,
        "setup": f"JetStream, 1 server, file storage ({n_subs} push consumers){_one_at_a_time(window)}",
        "events_per_s": round(count / dt),
        "p50_ms": round(pct(0.50), 2),
        "p99_ms": round(pct(0.99), 2),
        "in_order_once": all(s.in_order and s.last_seq == count for s in subs),
        "cpu_us_per_event": {"nats-server": cpu},
    }


def start_js_cluster(replicas: int) -> list[Server]:
    """Three ``nats-server -js`` routed into one JetStream cluster, and stream ``B`` on ``js.>`` with
    ``replicas`` replicas (file storage), created once the cluster has a meta leader."""
    exe = available("nats")
    assert exe is not None
    ports = [free_port() for _ in range(3)]
    routes = [free_port() for _ in range(3)]
    route_urls = ",".join(f"nats://127.0.0.1:{r}" for r in routes)
    servers: list[Server] = []
    try:
        for i in range(3):
            tmp = tempfile.mkdtemp(prefix=f"bench-jsc{i}-")
            cmd = [exe, "-a", "127.0.0.1", "-p", str(ports[i]), "-js", "-sd", tmp, "-n", f"n{i + 1}"]
            cmd += [
                "--cluster_name",
                "bench",
                "--cluster",
                f"nats://127.0.0.1:{routes[i]}",
                "--routes",
                route_urls,
            ]
            proc = _popen(cmd, Path(tmp) / "server.log")
            servers.append(Server(f"js{i + 1}", proc, tmp, {"js": Spec("js", ports[i])}))
        for srv, port in zip(servers, ports, strict=True):
            _wait_port(port, srv.proc)
        cfg = {"name": "B", "subjects": ["js.>"], "storage": "file", "num_replicas": replicas}
        deadline = time.monotonic() + 60
        while True:
            try:
                nats_request(servers[0].specs["js"], "$JS.API.STREAM.CREATE.B", cfg)
                return servers
            except (RuntimeError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.25)  # no meta leader yet: the cluster is still forming
    except BaseException:
        for srv in servers:
            srv.stop()
        raise


def run_js_cluster(count: int, size: int, replicas: int, window: int = 1000) -> dict[str, object]:
    """JetStream on three servers: publisher on server 1, a push consumer on each of servers 2 and 3."""
    servers = start_js_cluster(replicas)
    try:
        subject = "js.bench"
        subs = [JsSubscriber(srv.specs["js"], subject, count) for srv in servers[1:]]
        for sub in subs:
            sub.start()
        pids = {f"nats {i + 1}": srv.proc.pid for i, srv in enumerate(servers)}
        before = {k: cpu_s(p) for k, p in pids.items()}
        t0 = time.perf_counter()
        js_publish(servers[0].specs["js"], subject, count, size, window)
        for sub in subs:
            sub.done.wait(300)
        dt = time.perf_counter() - t0
        cpu = {k: round((cpu_s(p) - before[k]) / count * 1e6, 1) for k, p in pids.items()}
    finally:
        for srv in servers:
            srv.stop()
    lat = sorted(x for sub in subs for x in sub.latencies)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6

    return {
        "events": count,
        "setup": f"JetStream, 3 servers, stream R{replicas} (1 -> 2, 3){_one_at_a_time(window)}",
        "events_per_s": round(count / dt),
        "p50_ms": round(pct(0.50), 2),
        "p99_ms": round(pct(0.99), 2),
        "in_order_once": all(sub.in_order and sub.last_seq == count for sub in subs),
        "cpu_us_per_event": cpu,
    }


def _one_at_a_time(window: int) -> str:
    return ", one at a time" if window == 1 else ""


def run_setup(
    name: str,
    nodes: list[ServerProcess],
    subs_on: list[int],
    count: int,
    size: int,
    others: dict[str, int],
    window: int = 1000,
    channel: str = CHANNEL,
) -> dict[str, object]:
    """``others``: more processes to account CPU to (name -> pid of the process or of its tree's root).
    ``window``: publishes outstanding at most (1: each waits for the previous one's ack, light load)."""
    subs = [Subscriber(nodes[i].ports["native"], count, channel) for i in subs_on]
    for s in subs:
        s.start()
    # A node's tree: its workers too, when it has them.
    others = {f"node {i + 1}": n.proc.pid for i, n in enumerate(nodes) if n.proc is not None} | others
    before = {k: tree_cpu_s(p) for k, p in others.items()}
    t0 = time.perf_counter()
    publish(nodes[0].ports["native"], count, size, window, channel)
    for s in subs:
        s.done.wait(300)
    dt = time.perf_counter() - t0
    after = {k: tree_cpu_s(p) for k, p in others.items()}
    cpu_us = {k: round((after[k] - before[k]) / count * 1e6, 1) for k in before}
    lat = sorted(x for s in subs for x in s.latencies)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6

    return {
        "setup": name + _one_at_a_time(window),
        "events": count,
        "events_per_s": round(count / dt),
        "p50_ms": round(pct(0.50), 2),
        "p99_ms": round(pct(0.99), 2),
        "in_order_once": all(s.in_order and s.last_seq == count for s in subs),
        "cpu_us_per_event": cpu_us,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--only-js", action="store_true", help="the JetStream setups alone")
    ap.add_argument(
        "--light",
        type=int,
        default=1000,
        help="events of the light-load pass (one publish at a time; 0: none)",
    )
    ap.add_argument("--workers", type=int, default=0, help="add 2 nodes of this many workers each (0: none)")
    args = ap.parse_args()
    if args.only_js:
        print(json.dumps(run_js(args.count, args.size)))
        for replicas in (1, 3):
            print(json.dumps(run_js_cluster(args.count, args.size, replicas)))
        if args.light:
            print(json.dumps(run_js(args.light, args.size, window=1)))
            print(json.dumps(run_js_cluster(args.light, args.size, 1, window=1)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp, PgServer() as pg, RedisServer() as redis:
        base = Path(tmp)

        def cluster(tag: str, n: int, workers: int = 1) -> list[ServerProcess]:
            url = pg.create_database(f"bench_{tag}")
            extra = ["--store", url, "--native-idempotency-window-s", "0", "--workers", str(workers)]
            if n > 1:
                extra += ["--broker", redis.url, "--cluster-redis-channel", f"bench.{tag}"]
            return [ServerProcess(base / f"{tag}{i}", extra).start(timeout=60.0) for i in range(n)]

        setups: list[tuple[str, list[ServerProcess], list[int]]] = []
        sqlite = [ServerProcess(base / "sqlite", ["--native-idempotency-window-s", "0"]).start()]
        setups.append(("sqlite, 1 node", sqlite, [0]))
        setups.append(("postgres, 1 node", cluster("one", 1), [0]))
        setups.append(("postgres+redis, 2 nodes (1 -> 2)", cluster("two", 2), [1]))
        setups.append(("postgres+redis, 3 nodes (1 -> 2, 3)", cluster("three", 3), [1, 2]))
        if args.workers:
            name = f"postgres+redis, 2 nodes of {args.workers} workers (1 -> 2)"
            setups.append((name, cluster("workers", 2, args.workers), [1]))
        try:
            postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
            for name, nodes, subs_on in setups:
                others = {} if name.startswith("sqlite") else {"postgres": postmaster}
                if redis.proc is not None and "redis" in name:
                    others["redis"] = redis.proc.pid
                rows.append(run_setup(name, nodes, subs_on, args.count, args.size, others))
                print(json.dumps(rows[-1]), flush=True)
            if args.light:  # cross-node latency without queues: each publish waits for its ack
                for name, nodes, subs_on in setups:
                    others = {} if name.startswith("sqlite") else {"postgres": postmaster}
                    row = run_setup(name, nodes, subs_on, args.light, args.size, others, 1, "/bench/light")
                    rows.append(row)
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            for _, nodes, _ in setups:
                for n in nodes:
                    n.kill()
    if available("nats") is not None:
        rows.append(run_js(args.count, args.size))
        print(json.dumps(rows[-1]), flush=True)
        for replicas in (1, 3):
            rows.append(run_js_cluster(args.count, args.size, replicas))
            print(json.dumps(rows[-1]), flush=True)
        if args.light:
            for row in (run_js(args.light, args.size, window=1), run_js_cluster(args.light, args.size, 1, 1)):
                rows.append(row)
                print(json.dumps(row), flush=True)
    else:
        print("JetStream skipped: nats-server not installed (apt-get install nats-server)", flush=True)
    head = f"setup (events of {args.size} B, acks)"
    print(f"\n| {head} | events | events/s | commit→delivery p50 ms | p99 ms | CPU µs per event |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cpu = r["cpu_us_per_event"]
        assert isinstance(cpu, dict)
        costs = ", ".join(f"{k} {v}" for k, v in cpu.items())
        cells = [r["setup"], r["events"], r["events_per_s"], r["p50_ms"], r["p99_ms"], costs]
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
