"""The ``hubbub`` data source, batch: from a store and from a running server, ranges, partitions."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from hubbub.client import Client
from hubbub.events import Publisher
from hubbub.log import AppendRequest, SqliteLogStore
from hubbub.log.records import RECORD_COLUMNS, SPARK_DDL, event_to_record
from hubbub.pipeline import datasource
from hubbub.pipeline.arrow import ARROW_SCHEMA, batch_from_rows
from hubbub.pipeline.datasource import HubbubBatchReader, HubbubScanPartition, _Options, _pack, _Range
from hubbub.pipeline.sources import PipelineError
from tests.integration.serverproc import ServerProcess

from .conftest import fill, http_url, store_url

pytestmark = pytest.mark.spark


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, SqliteLogStore]:
    path = tmp_path / "log.db"
    st = SqliteLogStore(path)
    fill(st, {"/chat/a": 250, "/chat/b/x": 40, "/other": 7})
    return f"sqlite:///{path}", st


def test_arrow_batch_from_compact_rows_equals_the_full_rows(tmp_path: Path) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    try:
        fill(st, {"/a": 50})
        st.append(
            [
                AppendRequest("/a", Publisher("other", "u", "app2", f"m{i}"), b"p", ctype, hdrs, tags)
                for i, (ctype, hdrs, tags) in enumerate(
                    [
                        ("application/json", {"x": "1", "y": "2"}, ("a", "b")),
                        ("text/plain", {"x": "1", "y": "2"}, ("a", "b")),
                        ("text/plain", {"é": "ü"}, ()),
                    ]
                )
            ]
        )
        for after, limit in ((0, 100), (0, 1), (10, 20), (49, 10), (51, 5)):
            epoch, full = st.read_rows("/a", after, limit)
            compact = st.read_rows("/a", after, limit, compact_text=True)[1]
            want = batch_from_rows("/a", epoch, full)
            assert batch_from_rows("/a", epoch, compact).equals(want)
            records = [event_to_record(e) for e in st.read("/a", after, limit)]
            assert want.equals(pa.RecordBatch.from_pylist(records, schema=ARROW_SCHEMA))
    finally:
        st.close()


def test_schema_is_the_record_schema(spark: SparkSession, store: tuple[str, SqliteLogStore]) -> None:
    df = spark.read.format("hubbub").option("url", store[0]).load()
    assert tuple(df.columns) == RECORD_COLUMNS
    assert df.schema == spark.createDataFrame([], SPARK_DDL).schema


def test_batch_read_from_store_matches_the_log(
    spark: SparkSession, store: tuple[str, SqliteLogStore]
) -> None:
    url, st = store
    df = spark.read.format("hubbub").option("url", url).option("channels", "/chat/**").load()
    expected = []
    for ch in ("/chat/a", "/chat/b/x"):
        for e in st.read(ch, 0, 10_000):
            expected.append(
                (e.channel, e.seq, e.epoch, e.time_ns, dict(e.headers), list(e.tags), bytes(e.payload))
            )
    exp = spark.createDataFrame(
        expected,
        "channel STRING, seq BIGINT, epoch STRING, time BIGINT, headers MAP<STRING,STRING>, "
        "tags ARRAY<STRING>, payload BINARY",
    )
    got = df.select("channel", "seq", "epoch", "time", "headers", "tags", "payload")
    assertDataFrameEqual(got, exp, checkRowOrder=False)
    assert df.where("publisher_user != 'tester' OR content_type != 'text/plain'").count() == 0


def test_ranges_and_partitions(spark: SparkSession, store: tuple[str, SqliteLogStore]) -> None:
    url, st = store

    def r() -> DataFrameReader:  # a reader keeps its options: a fresh one each time
        return spark.read.format("hubbub").option("url", url)

    df = r().option("channels", "/chat/a").option("startSeq", "11").option("endSeq", "120").load()
    assert [row.seq for row in df.orderBy("seq").collect()] == list(range(11, 121))
    mid = st.read("/chat/a", 99, 1)[0].time_ns
    late = r().option("channels", "/chat/a").option("startTime", str(mid)).load()
    assert late.agg(F.min("seq")).first()[0] == 100
    assert late.count() == 151
    # A store read of most of the log: commit-order (pos) ranges of partitionSize events, one table scan each.
    parts = HubbubBatchReader(_Options.parse({"url": url, "partitionSize": "100"})).partitions()
    assert all(isinstance(p, HubbubScanPartition) for p in parts)
    assert [(p.lo, p.hi, p.bounds) for p in parts] == [(1, 101, None), (101, 201, None), (201, 298, None)]
    # A read of a small part of it goes through the (channel, seq) index instead: seq ranges of channels.
    few = {"url": url, "partitionSize": "5", "channels": "/other"}
    parts = HubbubBatchReader(_Options.parse(few)).partitions()
    assert [[(x.channel, x.after, x.hi) for x in p.ranges] for p in parts] == [
        [("/other", 0, 5)],
        [("/other", 5, 7)],
    ]
    # Small channels share a partition; big ones are split by seq range.
    ranges = [_Range("/chat/a", "e", 0, 250), _Range("/chat/b/x", "e", 0, 40), _Range("/other", "e", 0, 7)]
    assert [[(x.channel, x.after, x.hi) for x in p.ranges] for p in _pack(ranges, 100)] == [
        [("/chat/a", 0, 100)],
        [("/chat/a", 100, 200)],
        [("/chat/a", 200, 250), ("/chat/b/x", 0, 40), ("/other", 0, 7)],
    ]
    split = r().option("partitionSize", "100").load()
    assert split.rdd.getNumPartitions() == 3
    assert split.count() == 297
    offsets = json.dumps({"/chat/a": {"epoch": st.head("/chat/a").epoch, "seq": 245}})
    assert r().option("channels", "/chat/a").option("startingOffsets", offsets).load().count() == 5


def _read_all(opts: dict[str, str]) -> tuple[list[object], pa.Table]:
    reader = HubbubBatchReader(_Options.parse(opts))
    parts = list(reader.partitions())
    batches = [b for p in parts for b in reader.read(p)]
    table = pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
    return parts, table.sort_by([("channel", "ascending"), ("seq", "ascending")])


def test_scan_partitions_read_what_the_index_path_reads(
    store: tuple[str, SqliteLogStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, st = store
    st.append(
        [
            AppendRequest(
                "/chat/b/x", Publisher("http", f"u{i}", "a", f"m{i}"), bytes([i, 0, 255]), ctype, h, t
            )
            for i, (ctype, h, t) in enumerate(
                [
                    ("application/json", {"ü": "日本"}, ("x", "y")),
                    ("text/plain", {}, ()),
                    ("a/b", {"k": ""}, ("z",)),
                ]
                * 5
            )
        ]
    )
    st.trim("/chat/a", 20)  # a hole in pos order
    a, b = st.head("/chat/a"), st.head("/chat/b/x")
    times = [e.time_ns for e in st.read("/chat/a", 0, 1000)]
    cases: list[dict[str, str]] = [
        {},
        {"partitionSize": "37"},
        {"channels": "/chat/**"},
        {"startSeq": "30", "endSeq": "48"},
        {"startTime": str(times[10]), "endTime": str(times[200])},
        {
            "startingOffsets": json.dumps(
                {"/chat/a": {"epoch": a.epoch, "seq": 100}, "/other": {"epoch": "x", "seq": 3}}
            )
        },
        {
            "endingOffsets": json.dumps(
                {"/chat/a": {"epoch": a.epoch, "seq": 240}, "/chat/b/x": {"epoch": b.epoch, "seq": 50}}
            )
        },
        {"endingOffsets": json.dumps({"/chat/a": {"epoch": "other", "seq": 240}})},
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
    assert _read_all({"url": url})[1].num_rows == 297 + 15 - 20


def test_batch_read_from_running_server(spark: SparkSession, server: ServerProcess) -> None:
    with Client.connect(http_url(server)) as c:
        for i in range(1200):
            c.publish("/room/1" if i % 4 else "/room/2", f"m{i}".encode(), headers={"n": str(i)}, tags=["t"])
    over_http = (
        spark.read.format("hubbub").option("url", http_url(server)).option("channels", "/room/*").load()
    )
    from_store = (
        spark.read.format("hubbub").option("url", store_url(server)).option("channels", "/room/*").load()
    )
    assert over_http.count() == 1200
    # The HTTP API shows user headers only; the store also holds pseudo-headers, if any.
    cols = ["channel", "seq", "epoch", "time", "publisher_dialect", "publisher_app", "tags", "payload"]
    assertDataFrameEqual(over_http.select(cols), from_store.select(cols), checkRowOrder=False)
    row = over_http.where("channel = '/room/2' AND seq = 1").first()
    assert row.payload == b"m0" and row.headers == {"n": "0"}


def test_batch_read_from_store_includes_retired_epochs(store: tuple[str, SqliteLogStore]) -> None:
    """A new epoch deletes nothing: a batch read of a store gets the old epochs' events too, each under its
    own epoch, for a big read (a scan) and a small one alike; endingOffsets (the archive's) name current
    epochs."""
    url, st = store
    old = st.head("/other").epoch
    st.reset_channel("/other")
    fill(st, {"/other": 3})
    new = st.head("/other").epoch

    def keys(opts: dict[str, str]) -> list[tuple[str, str, int]]:
        table = _read_all({"url": url, **opts})[1]
        cols = [table.column(c).to_pylist() for c in ("channel", "epoch", "seq")]
        return sorted(zip(*cols, strict=True))

    other = sorted([("/other", old, s) for s in range(1, 8)] + [("/other", new, s) for s in range(1, 4)])
    everything = keys({})
    assert len(everything) == 300 and [k for k in everything if k[0] == "/other"] == other
    assert keys({"channels": "/other", "partitionSize": "5"}) == other
    ending = json.dumps({"/other": {"epoch": new, "seq": 2}})
    assert keys({"channels": "/other", "endingOffsets": ending}) == [("/other", new, 1), ("/other", new, 2)]
    starting = json.dumps({"/other": {"epoch": old, "seq": 5}})
    assert keys({"channels": "/other", "startingOffsets": starting}) == [
        k for k in other if k[1] == new or k[2] > 5
    ]


def test_batch_offsets_name_several_epochs_of_a_channel(store: tuple[str, SqliteLogStore]) -> None:
    """Batch ``startingOffsets``/``endingOffsets`` may give a channel a list of positions, one per epoch
    (the archive's form): each applies to its own epoch only."""
    url, st = store
    old = st.head("/other").epoch
    st.reset_channel("/other")
    fill(st, {"/other": 4})
    new = st.head("/other").epoch

    def keys(opts: dict[str, str]) -> list[tuple[str, str, int]]:
        table = _read_all({"url": url, "channels": "/other", **opts})[1]
        cols = [table.column(c).to_pylist() for c in ("channel", "epoch", "seq")]
        return sorted(zip(*cols, strict=True))

    ending = json.dumps({"/other": [{"epoch": old, "seq": 6}, {"epoch": new, "seq": 1}]})
    assert keys({"endingOffsets": ending}) == sorted(
        [("/other", old, s) for s in range(1, 7)] + [("/other", new, 1)]
    )
    starting = json.dumps({"/other": [{"epoch": old, "seq": 6}, {"epoch": new, "seq": 2}]})
    assert keys({"startingOffsets": starting}) == sorted(
        [("/other", old, 7), ("/other", new, 3), ("/other", new, 4)]
    )
    both = {"startingOffsets": starting, "endingOffsets": ending}
    assert keys(both) == []
    for bad in ({"/other": [{"epoch": old}]}, {"/other": [{"epoch": old, "seq": True}]}, [1]):
        with pytest.raises(PipelineError, match="option endingOffsets must be latest, or a JSON map"):
            keys({"endingOffsets": json.dumps(bad)})


def test_unknown_options_and_a_different_schema_are_refused(
    spark: SparkSession, store: tuple[str, SqliteLogStore]
) -> None:
    """A typo or an option of another source is refused at load(), saying what to use, instead of being
    ignored; a user schema must be the record schema, refused when the query is planned (Spark does not ask a
    Python source at load() when given a schema) with what to do, not failing once the query runs."""
    url, _ = store

    def load(**options: str) -> int:
        r = spark.read.format("hubbub").option("url", url)
        for k, v in options.items():
            r = r.option(k, v)
        count: int = r.load().count()
        return count

    with pytest.raises(Exception, match=r"unknown option 'startseqq'; did you mean startSeq\?") as err:
        spark.read.format("hubbub").option("url", url).option("startSeqq", "5").load()  # no action
    assert "valid options: source: url, store, path, token, channels, startSeq" in str(err.value)
    with pytest.raises(Exception, match="Kafka option: for hubbub use channels"):
        load(subscribe="chat")
    assert load(startSeq="241", channels="/chat/a") == 10  # the valid ones still work
    # Kafka's names of the same meaning are accepted: minPartitions splits the read further.
    df = spark.read.format("hubbub").option("url", url).option("minPartitions", "6").load()
    assert df.rdd.getNumPartitions() >= 6 and df.count() == 297
    few = (
        spark.read.format("hubbub")
        .option("url", url)
        .option("channels", "/other")
        .option("minPartitions", "3")
    )
    assert few.load().rdd.getNumPartitions() == 3 and few.load().count() == 7

    wrong = spark.read.format("hubbub").schema("channel STRING, seq BIGINT").option("url", url).load()
    with pytest.raises(Exception, match="record schema and cannot be changed"):
        wrong.count()
    same = spark.read.format("hubbub").schema(SPARK_DDL).option("url", url).load()
    assert same.count() == 297  # the record schema itself is fine

    rows = spark.createDataFrame([("/x", 1, b"p")], "channel STRING, seq BIGINT, payload BINARY")
    with pytest.raises(Exception, match="hubbub: unknown option 'channelprefx'; did you mean channelPrefix"):
        rows.write.format("hubbub").option("url", "http://127.0.0.1:1").option("channelPrefx", "/c").mode(
            "append"
        ).save()
