"""A streaming query over HTTP rides out a restart of the server (kill -9, then a new process on the same
port): every event is read exactly once. How long it waits is the options ``retries`` and
``retryIntervalMs``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from hubbub.client import Client
from hubbub.log.records import SPARK_DDL
from tests.integration.serverproc import ServerProcess

pytestmark = pytest.mark.spark


def wait_for(
    cond: Callable[[], bool], what: str, timeout: float = 60.0, q: StreamingQuery | None = None
) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if q is not None and q.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}: {q.exception()}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Refuser:
    """A listener on a dead server's port that closes every connection it accepts, counting them: the
    attempts of a client that is retrying."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.close()
            self.count += 1

    def __enter__(self) -> Refuser:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def publish(url: str, lo: int, hi: int) -> None:
    with Client.connect(url) as c:
        for i in range(lo, hi):
            c.publish(f"/r/{i % 3}", f"e{i}".encode())


def read_rows(q: StreamingQuery) -> int:
    return sum(p["numInputRows"] for p in q.recentProgress)


def test_a_stream_over_http_reads_every_event_once_across_a_server_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    server = ServerProcess(tmp_path / "server").start()
    port = server.ports["http"]
    url = f"http://127.0.0.1:{port}"
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    try:
        publish(url, 0, 60)
        q = (
            spark.readStream.format("hubbub")
            .option("url", url)
            .option("channels", "/r/**")
            .load()  # the default retries: about 30 s
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        try:
            wait_for(lambda: read_rows(q) == 60, "the first 60 events", q=q)
            server.kill()
            # Down for at least 8 of the query's attempts (about 3 s with the default waits; it used to give
            # up after 5 attempts over 1.5 s), each connection closed as a dying server's would be.
            with Refuser(port) as r:
                wait_for(lambda: r.count >= 8, "the query's attempts while the server is down", q=q)
            server = ServerProcess(tmp_path / "server", extra=["--http-listen", f"127.0.0.1:{port}"]).start()
            publish(url, 60, 90)
            wait_for(lambda: read_rows(q) == 90, "the events published after the restart", q=q)
            assert q.exception() is None and q.isActive
        finally:
            q.stop()
    finally:
        server.kill()
    got = spark.read.schema(SPARK_DDL).parquet(str(out)).select("channel", "seq", "payload").collect()
    by_channel: dict[str, list[tuple[int, bytes]]] = {}
    for r in got:
        by_channel.setdefault(r.channel, []).append((r.seq, r.payload))
    for ch in range(3):
        rows = sorted(by_channel[f"/r/{ch}"])
        assert rows == [(n + 1, f"e{i}".encode()) for n, i in enumerate(range(ch, 90, 3))]  # once each
    assert len(got) == 90


def test_a_read_gives_up_after_its_retries(spark: SparkSession) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    r = spark.read.format("hubbub").option("url", f"http://127.0.0.1:{closed}")
    t = time.monotonic()
    with pytest.raises(Exception, match=r"\(3 attempts; options retries and retryIntervalMs"):
        r.option("retries", "2").option("retryIntervalMs", "50").load().count()
    assert time.monotonic() - t < 20  # not the default's 30 s
