"""A ``hubbub serve --workers 2`` node answers as one node whichever worker holds a connection: WearScript's
device lists and hub list, and the departures of a worker killed with -9; qpubs' ``delivered`` counts; the
admin API's connections, disconnect and overview; ``/metrics``' and guble's counters, which keep a killed
worker's counts (docs/operations.md "Workers").

Each test puts its connections on chosen workers (connecting again until the kernel gives the wanted one:
``test_workers.py``'s helpers) and checks what a connection on one worker sees of the other's. The tests
that leave the node as they found it share one (``SHARED``: one xdist worker starts it once), each under
names of its own; the tests that kill a worker start their own node."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import websocket

from .qrpcclient import QrpcClient
from .serverproc import ServerProcess
from .test_workers import _lines_on, _serving, _socket_on, _start_node, _wait_for, _workers

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="finds workers through /proc")

SHARED = pytest.mark.xdist_group("workers_shared_node")

SUBS = "subscriptions"


@pytest.fixture(scope="module")
def module_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = _start_node(tmp_path_factory.mktemp("workers_shared") / "data")
    try:
        yield srv
    finally:
        srv.kill()


@pytest.fixture
def node(module_node: ServerProcess) -> ServerProcess:
    assert module_node.alive
    return module_node


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = _start_node(tmp_path / "data")
    try:
        yield srv
    finally:
        srv.kill()


class Device:
    """A WearScript connection (binary msgpack frames) on a known worker."""

    def __init__(self, ws: websocket.WebSocket) -> None:
        self.ws = ws
        self.hub_list: list[str] = self.next()[2]  # the greeting's first frame: the hub's own list

    def send(self, *value: Any) -> None:
        self.ws.send_binary(msgpack.packb(list(value)))

    def next(self, timeout: float = 10.0) -> list[Any]:
        self.ws.settimeout(timeout)
        frame: list[Any] = msgpack.unpackb(self.ws.recv())
        return frame

    def frames_until(self, want: list[Any], mine: Callable[[list[Any]], bool]) -> list[list[Any]]:
        """The frames ``mine`` selects, up to and including ``want`` (others' traffic on the shared node
        is passed over)."""
        out: list[list[Any]] = []
        while True:
            f = self.next()
            if mine(f):
                out.append(f)
                if f == want:
                    return out

    def first(self, mine: Callable[[list[Any]], bool], n: int, within_s: float = 10.0) -> list[list[Any]]:
        """The first ``n`` frames ``mine`` selects, or those that came within ``within_s``."""
        out: list[list[Any]] = []
        deadline = time.monotonic() + within_s
        while len(out) < n and (left := deadline - time.monotonic()) > 0:
            try:
                f = self.next(left)
            except (websocket.WebSocketTimeoutException, TimeoutError):
                break
            if mine(f):
                out.append(f)
        return out

    def close(self) -> None:
        self.ws.close()


def _device_on(node: ServerProcess, worker: int) -> Device:
    """A WearScript connection served by ``worker``, its greeting's hub list read."""
    workers = _workers(node)
    for _ in range(200):
        ws = websocket.create_connection(f"ws://127.0.0.1:{node.ports['http']}/wearscript/ws", timeout=10)
        sock = ws.sock
        assert sock is not None
        if _serving(sock, workers) == worker:
            return Device(ws)
        ws.close()
    raise AssertionError(f"no connection landed on worker {worker}")


@SHARED
def test_wearscript_device_lists_are_the_nodes_on_every_worker(node: ServerProcess, space: str) -> None:
    a, b = _workers(node)
    mine = lambda f: f[0] == SUBS and str(f[1]).endswith(space)  # noqa: E731
    A = _device_on(node, a)
    B = _device_on(node, b)
    try:
        # Announced on worker a: forwarded to the connection on worker b; replaced, the new list too.
        A.send(SUBS, f"phone:{space}", ["chan", "x:y"])
        assert B.frames_until([SUBS, f"phone:{space}", ["chan", "x:y"]], mine) == [
            [SUBS, f"phone:{space}", ["chan", "x:y"]]
        ]
        B.send(SUBS, f"glass:{space}", [f"{space}:b"])
        assert A.frames_until([SUBS, f"glass:{space}", [f"{space}:b"]], mine) == [
            [SUBS, f"glass:{space}", [f"{space}:b"]]
        ]
        # A data message from worker a reaches the device on worker b by its announced list.
        A.send(f"{space}:b:z", 7)
        assert B.frames_until([f"{space}:b:z", 7], lambda f: f[0] == f"{space}:b:z") == [[f"{space}:b:z", 7]]
        # A new connection on either worker is greeted with both devices, oldest connection first.
        for w in (a, b):
            C = _device_on(node, w)
            try:
                assert C.first(mine, 2) == [
                    [SUBS, f"phone:{space}", ["chan", "x:y"]],
                    [SUBS, f"glass:{space}", [f"{space}:b"]],
                ]
            finally:
                C.close()
        # Test handler: channelsExternal lists the other worker's device; a reply reaches a listener there.
        A.send("test:server:0", "channelsExternal", f"{space}:b")
        reply = B.next()
        while reply[0] != f"{space}:b":
            reply = B.next()
        ext = reply[1]
        assert ext[f"phone:{space}"] == ["chan", "x:y"] and ext[f"glass:{space}"] == [f"{space}:b"]
        # A closes: the connection on the other worker is told its device left.
        A.close()
        assert B.frames_until([SUBS, f"phone:{space}", []], mine) == [[SUBS, f"phone:{space}", []]]
    finally:
        A.close()
        B.close()


@SHARED
def test_wearscript_hub_list_has_every_workers_subscriptions(node: ServerProcess, space: str) -> None:
    a, b = _workers(node)
    with _lines_on(node, a) as sub:
        assert sub.subscribe("s", f"/{space}/log/**")["op"] == "reply"
        # A device that connects to the other worker once the subscription is made is greeted with it: the
        # greeting asks the other workers first.
        D = _device_on(node, b)
        try:
            assert f"{space}:log" in D.hub_list, D.hub_list
            D.send(f"{space}:log:x", "v")
            ev = sub.next_push()
            assert (ev["channel"], ev["publisher"]["dialect"]) == (f"/{space}/log/x", "wearscript")
        finally:
            D.close()


def test_a_killed_workers_connections_leave_the_other_workers_lists(own_node: ServerProcess) -> None:
    """WearScript devices and guble receivers of a worker killed with -9 leave the other worker's device lists
    and rosters; the restarted worker learns the other's."""
    node = own_node
    a, b = _workers(node)
    mine = lambda f: f[0] == SUBS and f[1] != "server:0"  # noqa: E731
    A = _device_on(node, a)
    B = _device_on(node, b)
    receivers = [_receiver_on(node, a, "ua", "/room"), _receiver_on(node, b, "ub", "/room")]
    try:
        _roster_until(node, [a, b], "/room", ["ua", "ub"])
        A.send(SUBS, "phone:A", ["chan"])
        A.send(SUBS, "watch:A", ["w"])
        B.send(SUBS, "glass:B", ["g"])
        assert B.frames_until([SUBS, "watch:A", ["w"]], mine) == [
            [SUBS, "phone:A", ["chan"]],
            [SUBS, "watch:A", ["w"]],
        ]
        assert A.frames_until([SUBS, "glass:B", ["g"]], mine) == [[SUBS, "glass:B", ["g"]]]
        os.kill(a, signal.SIGKILL)
        # Its devices depart from the other worker's lists, in the order announced, as on a close.
        assert B.frames_until([SUBS, "watch:A", []], mine) == [[SUBS, "phone:A", []], [SUBS, "watch:A", []]]
        C = _device_on(node, b)
        assert C.first(mine, 1) == [[SUBS, "glass:B", ["g"]]]  # the oldest known device: A's are gone
        C.close()
        _roster_until(node, [b], "/room", ["ub"])
        # The restarted worker learns the devices of the other: its greeting lists them.
        _wait_for(lambda: len(_workers(node)) == 2 and a not in _workers(node), "the worker's restart")
        restarted = re.compile(r"worker \d restarted")
        _wait_for(lambda: restarted.search(node.log()) is not None, "its start")
        new = next(w for w in _workers(node) if w != b)
        deadline = time.monotonic() + 10
        while True:
            C = _device_on(node, new)
            known = C.first(mine, 1, 1.0)
            C.close()
            if known == [[SUBS, "glass:B", ["g"]]]:
                break
            assert not known and time.monotonic() < deadline, known  # its hello is answered at once
        _roster_until(node, [new, b], "/room", ["ub"])  # and its roster the other's receivers
    finally:
        A.close()
        B.close()
        for ws in receivers:
            ws.close()


@pytest.fixture
def space(request: pytest.FixtureRequest) -> str:
    """A name of the test's own, for its channels and devices on the shared node."""
    return "".join(c for c in request.node.name.removeprefix("test_") if c.isalnum())[:40]


async def _qrpc_on(node: ServerProcess, worker: int) -> QrpcClient:
    """A qrpc connection served by ``worker``."""
    workers = _workers(node)
    for _ in range(200):
        q = await QrpcClient.connect(node.ports["qrpc"])
        if _serving(q.writer.get_extra_info("socket"), workers) == worker:
            return q
        await q.close()
    raise AssertionError(f"no qrpc connection landed on worker {worker}")


def _http_on(node: ServerProcess, worker: int, request: str) -> socket.socket:
    """An HTTP/1.1 request sent on a connection served by ``worker``."""
    s = _socket_on(node, worker, "http")
    s.sendall(request.encode())
    return s


def _http_head(s: socket.socket) -> tuple[bytes, bytes]:
    """The response head (once the server sent it) and what came after it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _http_emit(node: ServerProcess, worker: int, topic: str, value: object) -> Any:
    body = json.dumps(value)
    s = _http_on(
        node,
        worker,
        f"POST /qpubs/emit?topic={topic} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}",
    )
    with s:
        head, rest = _http_head(s)
        assert head.startswith(b"HTTP/1.1 200"), head
        while chunk := s.recv(65536):
            rest += chunk
        return json.loads(rest)


@SHARED
def test_qpubs_delivered_counts_the_recipients_on_every_worker(node: ServerProcess, space: str) -> None:
    a, b = _workers(node)
    topic = f"{space}.d"
    # An HTTP listen on worker a; a listen and a once on worker b (qrpc).
    stream = _http_on(node, a, f"GET /qpubs/listen?topic={topic} HTTP/1.1\r\nHost: t\r\n\r\n")
    head, got = _http_head(stream)  # the head goes out once the listener is registered
    assert head.startswith(b"HTTP/1.1 200"), head

    async def main() -> None:
        qa, qb, qc = await _qrpc_on(node, a), await _qrpc_on(node, b), await _qrpc_on(node, b)
        lid, oid = qb.send("listen", {"topic": topic}), qb.send("once", {"topic": topic})
        assert await qb.call("ignore", {"topic": "__barrier__"}) == {"ok": True, "removed": 0}
        # From worker a: its HTTP stream, and worker b's listen and once.
        assert await qa.call("emit", {"topic": topic, "value": 1}) == {"ok": True, "delivered": 3}
        # From worker b (a connection listening to nothing): the once has fired.
        assert await qc.call("emit", {"topic": topic, "value": 2}) == {"ok": True, "delivered": 2}
        # An HTTP emit, on either worker.
        for i, w in ((3, a), (4, b)):
            assert await asyncio.to_thread(_http_emit, node, w, topic, i) == {"ok": True, "delivered": 2}
        assert [(await qb.next(lid))["m"]["value"] for _ in range(4)] == [1, 2, 3, 4]
        assert (await qb.next(oid))["m"]["value"] == 1
        for q in (qa, qb, qc):
            await q.close()

    try:
        asyncio.run(main())
        lines: list[bytes] = []
        buf = got
        deadline = time.monotonic() + 10
        while len(lines) < 4:
            assert time.monotonic() < deadline, lines
            *done, buf = buf.split(b"\n")
            lines += [ln for ln in done if ln.strip() and not ln.strip().isalnum()]
            if len(lines) < 4:
                buf += stream.recv(65536)
        assert [json.loads(ln)["value"] for ln in lines] == [1, 2, 3, 4]
    finally:
        stream.close()


def _native_connections(node: ServerProcess, worker: int) -> int:
    """``hubbub_connections{dialect="native"}`` as ``/metrics`` answers on a connection ``worker`` serves."""
    s = _http_on(node, worker, "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    with s:
        head, body = _http_head(s)
        assert head.startswith(b"HTTP/1.1 200"), head
        while chunk := s.recv(65536):
            body += chunk
    m = re.search(rb'^hubbub_connections\{dialect="native"\} (\S+)$', body, re.M)
    assert m is not None, body[:2000]
    return int(float(m.group(1)))


@SHARED
def test_metrics_count_every_workers_connections_from_either_worker(node: ServerProcess) -> None:
    a, b = _workers(node)
    # The connections other tests and the placing of these (closed when on the wrong worker) leave as they
    # close: counted until the server has seen them go.
    _wait_for(lambda: _native_connections(node, a) == _native_connections(node, b) == 0, "no connections")
    conns = [_lines_on(node, a) for _ in range(3)] + [_lines_on(node, b) for _ in range(2)]
    try:
        seen: list[int] = []

        def five_on_both() -> bool:
            seen[:] = [_native_connections(node, w) for w in (a, b)]
            return seen == [5, 5]

        _wait_for(five_on_both, lambda: f"5 connections seen from both workers (last: {seen})", 10.0)
    finally:
        for c in conns:
            c.close()


def _hello(s: socket.socket) -> dict[str, Any]:
    """A native TCP hello's answer (its reply, or the error of a connection refused at accept)."""
    s.sendall(b'{"op":"hello","id":1,"v":1}\n')
    buf = b""
    while b"\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    answer: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
    return answer


def _admitted_on(node: ServerProcess, worker: int) -> socket.socket:
    """A native connection ``worker`` admits (those placed on the other worker, closed, leave a moment
    later: a refusal meanwhile is tried again)."""
    deadline = time.monotonic() + 10
    while True:
        s = _socket_on(node, worker, "native")
        answer = _hello(s)
        if answer.get("op") == "reply":
            return s
        s.close()
        assert answer.get("code") == 4009 and time.monotonic() < deadline, answer


def _refused_on(node: ServerProcess, worker: int) -> None:
    s = _socket_on(node, worker, "native")
    with s:
        answer = _hello(s)
        assert answer.get("code") == 4009, answer


def test_a_connection_limit_admits_exactly_that_many_across_workers(tmp_path: Path) -> None:
    node = ServerProcess(tmp_path / "data", ["--workers", "2", "--limits-max-connections", "4"]).start(
        timeout=60.0
    )
    held: list[socket.socket] = []
    try:
        _wait_for(lambda: len(_workers(node)) == 2, "two workers")
        a, b = _workers(node)
        held += [_admitted_on(node, w) for w in (a, a, b, b)]
        # Four places, taken on both workers: neither admits a fifth connection.
        for w in (a, b, a, b):
            _refused_on(node, w)
        # A place given back on one worker is the node's: the other admits into it, and then no more.
        held.pop(0).close()
        held.append(_admitted_on(node, b))
        _refused_on(node, a)
        # A worker killed gives back its connections' places: the other worker admits into them.
        os.kill(a, signal.SIGKILL)
        held.append(_admitted_on(node, b))
        _refused_on(node, b)
    finally:
        for s in held:
            s.close()
        node.kill()


def _receiver_on(node: ServerProcess, worker: int, user: str, channel: str) -> websocket.WebSocket:
    """A guble receiver of ``channel`` as ``user``, on ``worker``."""
    workers = _workers(node)
    for _ in range(200):
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{node.ports['http']}/stream/user/{user}", timeout=10
        )
        assert ws.sock is not None
        if _serving(ws.sock, workers) == worker:
            break
        ws.close()
    else:
        raise AssertionError(f"no connection landed on worker {worker}")
    ws.send(f"+ {channel}")
    while True:
        data = ws.recv()
        if (data.decode() if isinstance(data, bytes) else data).startswith(f"#subscribed-to {channel}"):
            return ws


def _subscribers(node: ServerProcess, worker: int, channel: str) -> list[str]:
    """guble's ``/api/subscribers`` for ``channel`` as ``worker`` answers it: the users, oldest first."""
    s = _http_on(
        node, worker, f"GET /api/subscribers{channel} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    with s:
        head, body = _http_head(s)
        assert head.startswith(b"HTTP/1.1 200"), head
        while chunk := s.recv(65536):
            body += chunk
    return [m["user_id"] for m in json.loads(body)]


def _roster_until(node: ServerProcess, workers: list[int], channel: str, want: list[str]) -> None:
    """Until every one of ``workers`` lists ``want`` (a change reaches the others one hop later)."""
    seen: dict[int, list[str]] = {}

    def agreed() -> bool:
        seen.update({w: _subscribers(node, w, channel) for w in workers})
        return all(v == want for v in seen.values())

    _wait_for(agreed, f"{want} on every worker", 10.0)


@SHARED
def test_guble_subscribers_are_every_workers_receivers(node: ServerProcess, space: str) -> None:
    a, b = _workers(node)
    room = f"/{space}/room"
    receivers = [_receiver_on(node, w, f"u{i}", room) for i, w in enumerate((a, b, a))]
    try:
        _roster_until(node, [a, b], room, ["u0", "u1", "u2"])  # oldest first, whichever worker holds it
        receivers[1].send(f"- {room}")  # cancelled on worker b: gone from worker a's view too
        _roster_until(node, [a, b], room, ["u0", "u2"])
        receivers[0].close()  # closed on worker a
        _roster_until(node, [a, b], room, ["u2"])
    finally:
        for ws in receivers:
            ws.close()
    _roster_until(node, [a, b], room, [])


def _http_json(node: ServerProcess, worker: int, method: str, path: str) -> tuple[int, Any]:
    """``method path`` on a connection ``worker`` serves: the status and the JSON body."""
    s = _http_on(node, worker, f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    with s:
        head, body = _http_head(s)
        while chunk := s.recv(65536):
            body += chunk
    return int(head.split()[1]), json.loads(body)


def _admin_native(node: ServerProcess, worker: int, limit: int) -> list[dict[str, Any]]:
    """Every native connection the admin API lists through ``worker``, page by page (``limit`` a page)."""
    rows: list[dict[str, Any]] = []
    after = ""
    while True:
        status, page = _http_json(
            node, worker, "GET", f"/api/v1/admin/connections?dialect=native&limit={limit}&after={after}"
        )
        assert status == 200, page
        rows += page["connections"]
        if page["next"] is None:
            return rows
        after = page["next"]


def _not_open(node: ServerProcess, worker: int, sid: str) -> bool:
    """Whether closing connection ``sid`` through ``worker`` answers 404 (no worker holds it)."""
    return _http_json(node, worker, "DELETE", f"/api/v1/admin/connections/{sid}")[0] == 404


@SHARED
def test_admin_lists_every_workers_connections_and_closes_one_on_either_worker(node: ServerProcess) -> None:
    a, b = _workers(node)
    conns = [_lines_on(node, w) for w in (a, a, b, b)]
    port_of = {c.sock.getsockname()[1]: i for i, c in enumerate(conns)}
    try:
        for w in (a, b):
            for limit in (1, 500):  # pages of one merge the workers' connections in id order, each once
                rows = _admin_native(node, w, limit)
                ids = [r["id"] for r in rows]
                assert ids == sorted(set(ids)), ids
                mine = {port_of[p]: r for r in rows if (p := int(r["peer"].rsplit(":", 1)[1])) in port_of}
                assert sorted(mine) == [0, 1, 2, 3], rows
        held_by = {i: mine[i]["worker"] for i in mine}
        assert held_by[0] == held_by[1] != held_by[2] == held_by[3], held_by
        # Each worker closes a connection the other holds: its client sees the end of its socket.
        for asked, i in ((a, 2), (b, 0)):
            sid = mine[i]["id"]
            assert _http_json(node, asked, "DELETE", f"/api/v1/admin/connections/{sid}") == (
                200,
                {"closed": sid, "dialect": "native"},
            )
            with pytest.raises(ConnectionError):
                while True:
                    conns[i].recv()
            _wait_for(functools.partial(_not_open, node, asked, sid), "the connection's end")
        for i in (1, 3):  # the others are left open
            assert conns[i].subscribe("s", "/adminlists/**")["op"] == "reply"
    finally:
        for c in conns:
            c.close()


def _scrape(node: ServerProcess, worker: int) -> dict[str, float]:
    """``/metrics`` as ``worker`` answers it: each series (name and labels as exposed) to its value."""
    s = _http_on(node, worker, "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    with s:
        head, body = _http_head(s)
        assert head.startswith(b"HTTP/1.1 200"), head
        while chunk := s.recv(65536):
            body += chunk
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


#: The series a test of the node's counters follows (its deltas are the same whichever worker answers).
_COUNTED = (
    'hubbub_events_published_total{dialect="native"}',
    'hubbub_deliveries_total{dialect="native"}',
    'hubbub_bad_input_total{dialect="native"}',
    "hubbub_publish_ack_seconds_count",
    'hubbub_limit_refusals_total{dialect="native",limit="max_frame"}',
)


@SHARED
def test_metrics_counters_are_the_nodes_from_either_worker(node: ServerProcess, space: str) -> None:
    """Events published on both workers, delivered to a subscriber on each, bad input on both and a refusal
    by a limit on one: a scrape of either worker counts them all (the sums of every worker's counters), and
    so does guble's ``/admin/metrics``."""
    a, b = _workers(node)

    def figures() -> dict[int, list[float]]:
        got = {w: _scrape(node, w) for w in (a, b)}
        return {w: [got[w].get(k, 0.0) for k in _COUNTED] for w in (a, b)}

    def guble_incoming(w: int) -> int:
        status, counters = _http_json(node, w, "GET", "/admin/metrics")
        assert status == 200, counters
        return int(counters["router.total_messages_incoming"])

    deadline = time.monotonic() + 10
    while (before := figures())[a] != before[b]:  # the counts of the tests before reach both scrapes
        assert time.monotonic() < deadline, before
        time.sleep(0.02)
    incoming = guble_incoming(a)
    subs = [_lines_on(node, w) for w in (a, b)]
    pubs = [_lines_on(node, w) for w in (a, a, b)]
    bad, big = _lines_on(node, b), _lines_on(node, a)
    try:
        for s in subs:
            assert s.subscribe("s", f"/{space}/**")["op"] == "reply"
        for i, p in enumerate(pubs):
            assert p.publish(f"/{space}/c", str(i))["op"] == "reply"
        for s in subs:  # every event reached the subscriber on each worker, in order
            assert [s.next_push()["text"] for _ in range(3)] == ["0", "1", "2"]
        bad.sock.sendall(b"not json\n")
        assert bad.recv()["op"] == "error"
        # A frame over limits.max_frame (1 MiB) on worker a: bad input, and a refusal by the limit (the
        # connection may close before it was all sent).
        with contextlib.suppress(OSError):
            big.sock.sendall(b"x" * ((1 << 20) + 2))
        want = [v + d for v, d in zip(before[a], (3, 6, 2, 3, 1), strict=True)]
        deadline = time.monotonic() + 10
        while (seen := figures()) != {a: want, b: want}:  # the last counts reach the scrape a moment later
            assert time.monotonic() < deadline, (want, seen)
            time.sleep(0.02)
        assert guble_incoming(a) == guble_incoming(b) == incoming + 3
    finally:
        for c in (*subs, *pubs, bad, big):
            c.close()


def test_a_killed_workers_counters_stay_in_the_nodes_sums(own_node: ServerProcess) -> None:
    """A worker killed with -9 takes its counters with it; the node's sums keep them as last scraped, from
    the surviving worker and from the one started in its place (a fall would be a counter reset)."""
    node = own_node
    a, b = _workers(node)
    published = 'hubbub_events_published_total{dialect="native"}'
    pubs = [_lines_on(node, w) for w in (a, a, a, b, b)]
    try:
        for i, p in enumerate(pubs):
            assert p.publish(f"/killed/{i}", "x")["op"] == "reply"
        _wait_for(lambda: [_scrape(node, w)[published] for w in (a, b)] == [5, 5], "5 published on both")
    finally:
        for p in pubs:
            p.close()
    os.kill(a, signal.SIGKILL)
    _wait_for(lambda: len(_workers(node)) == 2 and a not in _workers(node), "the worker's restart")
    restarted = re.compile(r"worker \d restarted")
    _wait_for(lambda: restarted.search(node.log()) is not None, "its start")
    new = next(w for w in _workers(node) if w != b)
    with _lines_on(node, new) as p:
        assert p.publish("/killed/new", "x")["op"] == "reply"
    for w in (b, new, b):
        assert _scrape(node, w)[published] == 6, w


def _overview_connections(node: ServerProcess, worker: int) -> tuple[int, int | None]:
    """The admin overview's connection total through ``worker``, and its latest sample's (None before one)."""
    status, o = _http_json(node, worker, "GET", "/api/v1/admin/overview")
    assert status == 200, o
    samples = o["history"]["samples"]
    return o["connections"]["total"], samples[-1][3] if samples else None


@SHARED
def test_the_admin_overviews_history_is_the_nodes_from_either_worker(node: ServerProcess) -> None:
    """The overview's traffic history (sampled every 2 s by each worker) adds every worker's samples: its
    latest sample counts the connections of both workers, as the overview's total does."""
    a, b = _workers(node)
    conns = [_lines_on(node, b) for _ in range(3)]
    try:
        for w in (a, b):
            deadline = time.monotonic() + 10
            while not ((seen := _overview_connections(node, w))[0] >= 3 and seen[0] == seen[1]):
                assert time.monotonic() < deadline, (w, seen)
                time.sleep(0.05)  # the next sample, 2 s at most
    finally:
        for c in conns:
            c.close()
