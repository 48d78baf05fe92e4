"""A recovery far behind holds bounded memory on the server whatever its length (a real ``hubbub serve``).

The backlog (60 MiB of payloads: 60,000 events of 1 KiB over 50 channels) is appended straight to the store
before the server starts. A native TCP subscriber resumes ``/**`` from every channel's first event, takes
the first events of the replay, then stops reading until the server has nothing left to do: the socket
buffers and the session's queue (``limits.send_queue`` of 64 frames) are full, and every page the replay
may read ahead is read. A server that held the replay whole, or read pages ahead without pacing on the
queue, would hold the 60 MiB of payloads at that point, twice over once encoded. Then the subscriber reads
the rest, each event checked (channel, seq, payload, in commit order), and the server's peak RSS
(``VmHWM``) must stay within 64 MiB of its RSS before the subscription: the bound the 1,000,000-event
recovery of ``bench/wide_recovery.py --server-process`` is held to, here in a few seconds.

The same with large events (150 MiB of payloads: 300 events of 512 KiB over 5 channels): a page of the
replay is bounded in bytes (``SCAN_PAGE_BYTES``) as well as in events, so the two pages in flight hold a
few MiB, not 2048 events each (the whole backlog here); and so is a page of one exact channel's replay
(``REPLAY_PAGE_BYTES``), 150 MiB of 512 KiB events on one channel resumed by name. These two allow 96 MiB
(``LARGE_BOUND_KIB``: what glibc's arenas keep of large payloads).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import orjson

from hubbub.events import Publisher
from hubbub.log import DB_FILENAME, AppendRequest, SqliteLogStore

from .serverproc import ServerProcess

CHANNELS = 50
BEHIND = 60_000
SIZE = 1024
#: What the server's RSS may grow by during the recovery.
BOUND_KIB = 64 * 1024
#: The same with events of 512 KiB. glibc maps its first large blocks, then raises its mmap threshold to the
#: size of each mapped block freed, so later payloads come from the arena of the reader thread that read
#: them, and an arena keeps freed pages for its next allocations: the growth is +28 to +34 MiB or +61 MiB
#: by which reader threads' arenas kept pages (bimodal, the same tree, at rest), and reached +77 MiB at a
#: load of 9. A fixed 256 KiB threshold held it at +28 to +34 MiB every run, but cost 1→1 publishes of 1 KiB
#: a third of their rate and replay a fifth (every large read and encoding then mapped), so the server keeps
#: glibc's default. The defect this guards against, a replay held whole, grew it by over 300 MiB.
LARGE_BOUND_KIB = 96 * 1024
WAIT = 60.0


def status_kib(pid: int, field: str) -> int:
    """``field`` (VmRSS, VmHWM) of process ``pid`` in KiB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def busy(pid: int) -> tuple[int, bool]:
    """The process's CPU ticks so far, and whether any of its threads is running or runnable."""
    ticks, running = 0, False
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended meanwhile
        running = running or fields[0] == "R"
        ticks += int(fields[11]) + int(fields[12])
    return ticks, running


def wait_idle(pid: int, timeout: float = WAIT) -> None:
    """Wait until the server has nothing to do: no thread runnable and no CPU spent, over 0.3 s."""
    deadline = time.monotonic() + timeout
    last, quiet = -1, 0
    while quiet < 6:
        assert time.monotonic() < deadline, "the server never went idle"
        ticks, running = busy(pid)
        quiet = quiet + 1 if ticks == last and not running else 0
        last = ticks
        time.sleep(0.05)


class Lines:
    """JSON lines from a blocking socket, read only when asked (so the server holds the rest)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def next(self) -> dict[str, object]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the server closed the connection"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        msg: dict[str, object] = orjson.loads(line)
        return msg


def test_server_rss_stays_bounded_during_a_long_recovery(tmp_path: Path) -> None:
    recover(tmp_path, CHANNELS, BEHIND, SIZE)


def test_server_rss_stays_bounded_during_a_recovery_of_large_events(tmp_path: Path) -> None:
    recover(tmp_path, 5, 300, 512 << 10, bound=LARGE_BOUND_KIB)


def test_server_rss_stays_bounded_during_a_recovery_of_large_events_on_one_channel(tmp_path: Path) -> None:
    recover(tmp_path, 1, 300, 512 << 10, exact=True, bound=LARGE_BOUND_KIB)


def recover(
    tmp_path: Path, channels: int, behind: int, size: int, *, exact: bool = False, bound: int = BOUND_KIB
) -> None:
    """``behind`` events of ``size`` bytes over ``channels`` channels, replayed to a subscriber that stalls
    after 100 (module docstring): every event arrives, and the server's RSS grows by less than the bound.
    ``exact``: the subscriber resumes the one channel itself, not ``/**`` (the exact channel's replay)."""
    data = tmp_path / "data"
    data.mkdir()
    store = SqliteLogStore(data / DB_FILENAME)
    pub = Publisher("native", "", "bulk", "")
    filler = "x" * (size - 8)
    try:
        firsts = store.append(
            [AppendRequest(f"/m/c{i:02d}", pub, b"0", "text/plain") for i in range(channels)]
        )
        since = {r.event.channel: {"seq": r.event.seq, "epoch": r.event.epoch} for r in firsts}
        want: list[tuple[str, int, str]] = []
        step = min(5000, max(1, (16 << 20) // size))
        for start in range(0, behind, step):
            batch = [
                AppendRequest(f"/m/c{i % channels:02d}", pub, b"%08d%s" % (i, filler.encode()), "text/plain")
                for i in range(start, min(start + step, behind))
            ]
            want += [(r.event.channel, r.event.seq, r.event.payload.decode()) for r in store.append(batch)]
    finally:
        store.close()

    srv = ServerProcess(
        data, ["--limits-send-queue", "64", "--limits-send-queue-bytes", str(max(256 << 10, 4 * size))]
    ).start()
    assert srv.proc is not None
    pid = srv.proc.pid
    try:
        with socket.create_connection(("127.0.0.1", srv.ports["native"]), timeout=WAIT) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            lines = Lines(sock)
            sock.sendall(b'{"op":"hello","id":1,"v":1}\n')
            assert lines.next()["op"] == "reply"
            wait_idle(pid)
            before = status_kib(pid, "VmRSS")
            sub = {"op": "subscribe", "id": 2, "sub": "s", "pattern": "/**", "since": since}
            if exact:
                ((channel, position),) = since.items()
                sub.update(pattern=channel, since=position)
            sock.sendall(orjson.dumps(sub) + b"\n")
            reply = lines.next()
            assert reply["op"] == "reply" and reply["id"] == 2, reply
            got: list[tuple[str, int, str]] = []

            def take(n: int) -> None:
                while len(got) < n:
                    msg = lines.next()
                    assert msg["op"] == "event", msg
                    seq = msg["seq"]
                    assert isinstance(seq, int), msg
                    got.append((str(msg["channel"]), seq, str(msg["text"])))

            take(100)
            wait_idle(pid)  # the server has read ahead all it may while the subscriber reads nothing
            stalled = status_kib(pid, "VmRSS")
            take(behind)
            end = lines.next()
            assert end["op"] == "recovered" and end["replayed"] == behind, end
        peak = status_kib(pid, "VmHWM")
    finally:
        srv.terminate()
    assert got == want  # every event once, in commit order (so each channel in seq order)
    growth = peak - before
    assert growth < bound, (
        f"server RSS {before // 1024} MiB before, {stalled // 1024} MiB with the subscriber stalled, "
        f"peak {peak // 1024} MiB: +{growth // 1024} MiB for {behind * size >> 20} MiB replayed"
    )
