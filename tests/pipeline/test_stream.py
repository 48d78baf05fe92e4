"""Streaming read: availableNow, restarts from a checkpoint, epoch changes and trimming, the round trip."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.testing import assertDataFrameEqual

from hubbub.client import Client
from hubbub.log import RetentionPolicy, SqliteLogStore
from hubbub.log.records import SPARK_DDL
from hubbub.pipeline.datasource import (
    HubbubPartition,
    HubbubStreamReader,
    _Options,
    _Range,
    _read_partition,
)
from tests.integration.serverproc import ServerProcess

from .conftest import fill, http_url

pytestmark = pytest.mark.spark


def run_once(spark: SparkSession, url: str, out: Path, ckpt: Path, **options: str) -> list[int]:
    """One availableNow run of hubbub → Parquet; returns the rows of each micro-batch."""
    r = spark.readStream.format("hubbub").option("url", url)
    for k, v in options.items():
        r = r.option(k, v)
    q = (
        r.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    if q.exception() is not None:
        raise q.exception()
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def parquet(spark: SparkSession, out: Path) -> DataFrame:
    return spark.read.schema(SPARK_DDL).parquet(str(out))


def test_available_now_and_restart_read_exactly_the_new_events(spark: SparkSession, tmp_path: Path) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    url = f"sqlite:///{tmp_path / 'log.db'}"
    fill(st, {"/s/a": 300, "/s/b": 120})
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    batches = run_once(spark, url, out, ckpt, maxEventsPerTrigger="100")
    assert sum(batches) == 420 and len(batches) >= 5 and max(batches) <= 100  # all read, in bounded steps
    fill(st, {"/s/a": 30, "/s/new": 5})
    # maxOffsetsPerTrigger: Kafka's name for the same limit.
    batches = run_once(spark, url, out, ckpt, maxOffsetsPerTrigger="20")
    assert sum(batches) == 35 and len(batches) >= 2 and max(batches) <= 20
    assert run_once(spark, url, out, ckpt) == []  # nothing new: nothing read
    df = parquet(spark, out)
    assert df.count() == 455
    assert df.select("channel", "seq").distinct().count() == 455
    exp = spark.createDataFrame([("/s/a", 330), ("/s/b", 120), ("/s/new", 5)], "channel STRING, n BIGINT")
    assertDataFrameEqual(df.groupBy("channel").agg(F.max("seq").alias("n")), exp, checkRowOrder=False)
    st.close()


def test_starting_offsets_latest_and_start_time(spark: SparkSession, tmp_path: Path) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    url = f"sqlite:///{tmp_path / 'log.db'}"
    fill(st, {"/t": 50})
    t = st.read("/t", 39, 1)[0].time_ns
    assert sum(run_once(spark, url, tmp_path / "o1", tmp_path / "c1", startTime=str(t))) == 11  # seq 40..50
    assert run_once(spark, url, tmp_path / "o2", tmp_path / "c2", startingOffsets="latest") == []
    fill(st, {"/t": 3})
    assert sum(run_once(spark, url, tmp_path / "o2", tmp_path / "c2", startingOffsets="latest")) == 3
    st.close()


def test_epoch_change_and_trim_fail_clearly_or_restart(spark: SparkSession, tmp_path: Path) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    url = f"sqlite:///{tmp_path / 'log.db'}"
    fill(st, {"/e/a": 20, "/e/b": 20})
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    assert sum(run_once(spark, url, out, ckpt)) == 40
    st.reset_channel("/e/a")
    fill(st, {"/e/a": 4})
    with pytest.raises(StreamingQueryException, match="epoch changed"):
        run_once(spark, url, out, ckpt)
    assert sum(run_once(spark, url, out, ckpt, failOnDataLoss="false")) == 4
    # Trim /e/b past the stream's position.
    fill(st, {"/e/b": 10})
    st.apply_retention(RetentionPolicy(max_age_s=1), time.time_ns() + 10**12)
    fill(st, {"/e/b": 2})
    with pytest.raises(StreamingQueryException, match="trimmed"):
        run_once(spark, url, out, ckpt)
    assert sum(run_once(spark, url, out, ckpt, failOnDataLoss="false")) == 2
    df = parquet(spark, out)
    assert df.where("channel = '/e/a'").select("epoch").distinct().count() == 2
    st.close()


def test_hubbub_to_parquet_to_hubbub_across_a_restart(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    """hubbub → Parquet (stream 1) → hubbub (stream 2, the sink), each with a checkpoint, run twice with
    new events in between: the copy holds every event exactly once, in order."""
    url = http_url(server)

    def publish(lo: int, hi: int) -> None:
        with Client.connect(url) as c:
            for i in range(lo, hi):
                c.publish(f"/in/{i % 3}", f"e{i}".encode(), headers={"i": str(i)})

    def run_both() -> None:
        run_once(spark, url, tmp_path / "lake", tmp_path / "c1", channels="/in/**")
        q = (
            spark.readStream.schema(SPARK_DDL)
            .parquet(str(tmp_path / "lake"))
            .writeStream.format("hubbub")
            .option("url", url)
            .option("channelPrefix", "/copy")
            .option("checkpointLocation", str(tmp_path / "c2"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None

    publish(0, 90)
    run_both()
    publish(90, 150)
    run_both()  # the restart
    src = spark.read.format("hubbub").option("url", url).option("channels", "/in/**").load()
    copy = spark.read.format("hubbub").option("url", url).option("channels", "/copy/**").load()
    assert copy.count() == 150
    got = copy.select(
        F.regexp_replace("channel", "^/copy", "").alias("channel"),
        "seq",
        "payload",
        F.col("headers")["i"].alias("i"),
    )
    assertDataFrameEqual(
        got, src.select("channel", "seq", "payload", F.col("headers")["i"].alias("i")), checkRowOrder=False
    )


@pytest.mark.parametrize("starting", ["earliest", "latest"])
def test_a_stream_started_after_archive_trim_is_not_data_loss(
    spark: SparkSession, server: ServerProcess, tmp_path: Path, starting: str
) -> None:
    """``archive --trim`` empties the channels it archived; a stream started after that goes on where each
    channel does, so their next events are read, not taken for channels whose first events were lost."""
    from hubbub.pipeline import jobs

    url = http_url(server)
    with Client.connect(url) as c:
        for i in range(5):
            c.publish("/t/a", f"a{i}".encode())
        c.publish("/t/b", b"b0")
    done = jobs.archive(spark, url, str(tmp_path / "archive"), channels="/t/**", trim=True)
    assert done["events"] == 6 and done["trimmed"] == 2
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    assert run_once(spark, url, out, ckpt, channels="/t/**", startingOffsets=starting) == []
    with Client.connect(url) as c:
        c.publish("/t/a", b"a5")
    assert sum(run_once(spark, url, out, ckpt, channels="/t/**", startingOffsets=starting)) == 1
    got = parquet(spark, out).select("channel", "seq", "payload").collect()
    assert [(r.channel, r.seq, r.payload) for r in got] == [("/t/a", 6, b"a5")]


def test_progress_reports_lag_in_events_and_channels(spark: SparkSession, tmp_path: Path) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    url = f"sqlite:///{tmp_path / 'log.db'}"
    fill(st, {"/l/a": 100, "/l/b": 30, "/l/c": 1})
    q = (
        spark.readStream.format("hubbub")
        .option("url", url)
        .option("maxEventsPerTrigger", "40")
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    assert len(progress) >= 4
    read = 0
    for p in progress:
        src = p["sources"][0]
        latest, end = json.loads(src["latestOffset"]), json.loads(src["endOffset"])
        behind = {ch: pos["seq"] - end[ch]["seq"] for ch, pos in latest["channels"].items()}
        assert latest["eventsBehind"] == sum(behind.values())
        assert latest["channelsBehind"] == sum(1 for b in behind.values() if b > 0)
        assert latest["eventsSkipped"] == 0
        read += p["numInputRows"]
        assert latest["eventsBehind"] == 131 - read  # what is left after this batch
    assert json.loads(progress[0]["sources"][0]["latestOffset"])["channelsBehind"] >= 1
    assert json.loads(progress[-1]["sources"][0]["latestOffset"])["eventsBehind"] == 0
    st.close()


def test_skipped_events_are_counted_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    url = f"sqlite:///{tmp_path / 'log.db'}"
    fill(st, {"/w/a": 20, "/w/b": 3})
    epoch = st.head("/w/a").epoch
    start = {"/w/a": {"epoch": epoch, "seq": 5}, "/w/b": {"epoch": st.head("/w/b").epoch, "seq": 3}}
    st.apply_retention(RetentionPolicy(max_age_s=1), time.time_ns() + 10**12)  # trims everything
    fill(st, {"/w/a": 2})  # seqs 21, 22: 6..20 are gone
    opts = _Options.parse({"url": url, "failOnDataLoss": "false"})
    caplog.set_level(logging.WARNING, logger="hubbub.pipeline")
    # Executor side: a partition planned before the trim finds its events gone.
    part = HubbubPartition((_Range("/w/a", epoch, 5, 22),), strict=False)
    assert sum(b.num_rows for b in _read_partition(opts, part)) == 2
    assert "skipping 15 events of /w/a (seqs 6..20, trimmed while reading" in caplog.text
    caplog.clear()
    # Driver side: planning from an offset behind the trim.
    reader = HubbubStreamReader(opts)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["/w/a"] == {"epoch": epoch, "seq": 22}
    assert caplog.text.count("skipping 15 events of /w/a (seqs 6..20, trimmed before they were read") == 1
    report = reader.reportLatestOffset()
    assert report is not None
    assert (report["eventsSkipped"], report["channelsSkipped"]) == (15, 1)
    assert (report["eventsBehind"], report["channelsBehind"]) == (0, 0)
    reader.latestOffset(start, ReadAllAvailable())  # the same start again (a trigger without a batch)
    assert caplog.text.count("skipping 15 events") == 1  # said once
    # A reset channel: the old epoch's rest is skipped, with a warning.
    st.reset_channel("/w/b")
    fill(st, {"/w/b": 1})
    caplog.clear()
    reader.latestOffset(end, ReadAllAvailable())
    assert "/w/b: epoch" in caplog.text and "skipped" in caplog.text
    report = reader.reportLatestOffset()
    assert report is not None and report["channelsSkipped"] == 2 and report["eventsBehind"] == 0
    st.close()


def test_a_skip_found_when_planning_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With failOnDataLoss=false, events trimmed past a stream's offset are skipped when the batch is planned
    (and said there); the batch's tasks read from after the skip, so they do not find the same events gone
    and say it again (they used to read from the offset, and the skip was logged twice)."""
    st = SqliteLogStore(tmp_path / "log.db")
    url = f"sqlite:///{tmp_path / 'log.db'}"
    fill(st, {"/w/a": 20, "/w/b": 3})
    epoch = st.head("/w/a").epoch
    start = {"/w/a": {"epoch": epoch, "seq": 5}, "/w/b": {"epoch": st.head("/w/b").epoch, "seq": 3}}
    st.apply_retention(RetentionPolicy(max_age_s=1), time.time_ns() + 10**12)  # trims everything
    fill(st, {"/w/a": 2})  # seqs 21, 22: 6..20 are gone
    caplog.set_level(logging.WARNING, logger="hubbub.pipeline")
    reader = HubbubStreamReader(_Options.parse({"url": url, "failOnDataLoss": "false"}, "stream"))
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    seqs = [s for p in parts for b in reader.read(p) for s in b.column(1).to_pylist()]
    assert seqs == [21, 22]
    assert caplog.text.count("skipping 15 events of /w/a") == 1, caplog.text
    st.close()
