"""The data source and the jobs on a PostgreSQL log (a real server the tests start), read through the
``LogStore`` interface like any other store: commit-order scans, per-channel ranges, retired epochs, and the
archive job (with its trim) while a ``hubbub serve`` process shares the database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from hubbub.client import Client
from hubbub.events import Publisher
from hubbub.log import AppendRequest, LogStore, RetentionPolicy, open_store
from hubbub.pipeline import datasource, jobs
from hubbub.pipeline.arrow import ARROW_SCHEMA
from hubbub.pipeline.datasource import HubbubBatchReader, HubbubScanPartition, _Options
from hubbub.pipeline.sources import StoreSource, connect_source, log_epochs
from tests.integration.serverproc import ServerProcess

from .conftest import fill, http_url

pytestmark = pytest.mark.spark


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[tuple[str, LogStore]]:
    st = open_store(pg_url, "", "commit", RetentionPolicy(), 0)
    try:
        fill(st, {"/chat/a": 250, "/chat/b/x": 40, "/other": 7})
        yield pg_url, st
    finally:
        st.close()


def _read_all(opts: dict[str, str]) -> tuple[list[object], pa.Table]:
    reader = HubbubBatchReader(_Options.parse(opts))
    parts = list(reader.partitions())
    batches = [b for p in parts for b in reader.read(p)]
    table = pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
    return parts, table.sort_by([("channel", "ascending"), ("seq", "ascending")])


def test_source_is_a_store_source_through_the_interface(pg_store: tuple[str, LogStore]) -> None:
    url, st = pg_store
    src = connect_source(url)
    try:
        assert isinstance(src, StoreSource) and src.store.engine == "postgres" and src.store.readonly
        page = src.read("/chat/a", None, 10, 5)
        assert page.top == 250 and page.batch.column("seq").to_pylist() == [11, 12, 13, 14, 15]
        assert page.batch.column("epoch").to_pylist() == [st.head("/chat/a").epoch] * 5
    finally:
        src.close()


def test_scan_and_index_partitions_read_the_log(
    pg_store: tuple[str, LogStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, st = pg_store
    st.append(
        [
            AppendRequest("/chat/b/x", Publisher("http", f"u{i}", "a", f"m{i}"), bytes([i, 0, 255]), c, h, t)
            for i, (c, h, t) in enumerate(
                [
                    ("application/json", {"ü": "日本"}, ("x", "y")),
                    ("text/plain", {}, ()),
                    ("a/b", {"k": ""}, ("z",)),
                ]
                * 5
            )
        ]
    )
    st.trim("/chat/a", 20)  # a hole in commit order
    a = st.head("/chat/a")
    times = [e.time_ns for e in st.read("/chat/a", 0, 1000)]
    cases: list[dict[str, str]] = [
        {},
        {"partitionSize": "37"},
        {"channels": "/chat/**"},
        {"startSeq": "30", "endSeq": "48"},
        {"startTime": str(times[10]), "endTime": str(times[200])},
        {"startingOffsets": json.dumps({"/chat/a": {"epoch": a.epoch, "seq": 100}})},
    ]
    for case in cases:
        opts = {"url": url, "partitionSize": "100", **case}
        parts, scanned = _read_all(opts)
        assert all(isinstance(p, HubbubScanPartition) for p in parts) or scanned.num_rows == 0, case
        with monkeypatch.context() as m:
            m.setattr(datasource, "_scan_partitions", lambda o, s: None)
            old_parts, indexed = _read_all(opts)
        assert not any(isinstance(p, HubbubScanPartition) for p in old_parts)
        assert scanned.equals(indexed), case
    _, everything = _read_all({"url": url})
    assert everything.num_rows == 297 + 15 - 20
    got = list(
        zip(everything.column("channel").to_pylist(), everything.column("seq").to_pylist(), strict=True)
    )
    want = [(ch, e.seq) for ch in ("/chat/a", "/chat/b/x", "/other") for e in st.read(ch, 0, 10_000)]
    assert got == sorted(want)


def test_retired_epochs_are_read_from_the_store(pg_store: tuple[str, LogStore]) -> None:
    url, st = pg_store
    old = st.head("/other").epoch
    new = st.reset_channel("/other").epoch
    fill(st, {"/other": 3})
    src = connect_source(url)
    try:
        epochs = {(ci.channel, ci.epoch): ci.top for ci in log_epochs(src, "/other") or []}
        assert epochs == {("/other", old): 7, ("/other", new): 3}
    finally:
        src.close()
    _, table = _read_all({"url": url, "channels": "/other"})
    pairs = sorted(zip(table.column("epoch").to_pylist(), table.column("seq").to_pylist(), strict=True))
    assert pairs == sorted([(old, s) for s in range(1, 8)] + [(new, s) for s in range(1, 4)])


def test_spark_read_and_archive_with_trim_beside_a_running_server(
    spark: SparkSession, tmp_path: Path, pg_url: str
) -> None:
    srv = ServerProcess(tmp_path / "server", ["--store", pg_url]).start()
    try:
        with Client.connect(http_url(srv)) as c:
            for i in range(120):
                c.publish(
                    "/room/1" if i % 3 else "/room/2", f"m{i}".encode(), headers={"n": str(i)}, tags=["t"]
                )
        cols = ["channel", "seq", "epoch", "time", "publisher_dialect", "tags", "payload"]
        from_store = spark.read.format("hubbub").option("url", pg_url).option("channels", "/room/*").load()
        over_http = (
            spark.read.format("hubbub").option("url", http_url(srv)).option("channels", "/room/*").load()
        )
        assert from_store.count() == 120
        assertDataFrameEqual(from_store.select(cols), over_http.select(cols), checkRowOrder=False)

        out = tmp_path / "archive"
        first = jobs.archive(spark, pg_url, str(out), trim=True)
        assert first["events"] == 120 and first["trimmed"] == 2
        with Client.connect(http_url(srv)) as c:
            ack = c.publish("/room/1", b"later")
            assert ack is not None and ack.seq == 81
        second = jobs.archive(spark, pg_url, str(out))
        assert second["events"] == 1
        s = jobs.stats(spark, jobs.load(spark, input_dir=str(out)), str(tmp_path / "stats"))
        assert s["events"] == 121
        # The server's log was trimmed to what is archived: only the later event is left.
        left = spark.read.format("hubbub").option("url", pg_url).load()
        assert [(r.channel, r.seq) for r in left.collect()] == [("/room/1", 81)]
    finally:
        srv.kill()
