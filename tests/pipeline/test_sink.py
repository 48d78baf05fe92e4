"""The sink: publishes rows idempotently, so a retried write never publishes twice."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from hubbub.pipeline.datasource import SOURCE_HEADER
from hubbub.pipeline.sources import HttpPublisher
from tests.hypothesis_budget import examples
from tests.integration.serverproc import ServerProcess

from .conftest import http_url

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("server", [600], indirect=True, ids=["window600"])
def test_batch_write_is_idempotent(spark: SparkSession, server: ServerProcess) -> None:
    url = http_url(server)
    rows = [("/src/a", "ep000001", i, f"p{i}".encode(), {"h": "v"}, ["x"]) for i in range(1, 41)]
    df = spark.createDataFrame(
        rows,
        "channel STRING, epoch STRING, seq BIGINT, payload BINARY, headers MAP<STRING,STRING>, "
        "tags ARRAY<STRING>",
    ).repartition(3)
    df.write.format("hubbub").option("url", url).option("channelPrefix", "/dst").mode("append").save()
    # A rerun (what a retried task does) publishes nothing new: the server answers duplicate.
    df.write.format("hubbub").option("url", url).option("channelPrefix", "/dst").mode("append").save()
    out = spark.read.format("hubbub").option("url", url).option("channels", "/dst/**").load()
    assert out.count() == 40
    row = out.where("publisher_msg_id = '/src/a#ep000001:7'").first()
    assert row.channel == "/dst/src/a" and row.payload == b"p7" and row.tags == ["x"]
    assert row.headers == {"h": "v", SOURCE_HEADER: "/src/a#ep000001:7"}


@pytest.mark.parametrize("server", [600], indirect=True, ids=["window600"])
def test_idem_column_and_fixed_channel(spark: SparkSession, server: ServerProcess) -> None:
    url = http_url(server)
    df = spark.createDataFrame([(f"k{i % 5}", f"v{i}") for i in range(20)], "key STRING, payload STRING")
    w = df.write.format("hubbub").option("url", url).option("channel", "/fixed").option("idemColumn", "key")
    w.mode("append").save()
    assert spark.read.format("hubbub").option("url", url).option("channels", "/fixed").load().count() == 5
    with pytest.raises(Exception, match="idempotency key"):
        spark.createDataFrame([("x",)], "payload STRING").write.format("hubbub").option("url", url).option(
            "channel", "/fixed"
        ).mode("append").save()


def test_any_unicode_header_value_round_trips(spark: SparkSession, server: ServerProcess) -> None:
    # Values beyond latin-1 go as UTF-8 header fields; what no HTTP header field can carry (line breaks,
    # leading or trailing blanks, control characters, upper-case or non-token names) goes as a native frame.
    url = http_url(server)
    values = {
        1: {"lang": "日本語 ✓ ünïcödé 🎉"},
        2: {"greek": "αβγ", "plain": "ascii"},
        3: {"multi": "line one\nline two", "pad": "  padded  "},
        4: {"ctl": "a\x00b\x1f\x7f", "empty": ""},
        5: {"Upper Case Name": "€", "emoji-🎉": "\u2028"},
    }
    rows = [("/src/u", "ep000001", i, f"p{i}".encode(), h) for i, h in values.items()]
    df = spark.createDataFrame(
        rows, "channel STRING, epoch STRING, seq BIGINT, payload BINARY, headers MAP<STRING,STRING>"
    ).repartition(2)
    df.write.format("hubbub").option("url", url).option("channelPrefix", "/uni").mode("append").save()
    out = spark.read.format("hubbub").option("url", url).option("channels", "/uni/**").load().collect()
    assert len(out) == len(values)
    got = {int(r.publisher_msg_id.rsplit(":", 1)[1]): (r.payload, r.headers) for r in out}
    for i, h in values.items():
        assert got[i] == (f"p{i}".encode(), {**h, SOURCE_HEADER: f"/src/u#ep000001:{i}"})


@pytest.mark.parametrize("headers", [{"k": "ünïcödé ✓"}, {"k": "two\nlines"}], ids=["http", "native"])
def test_publisher_is_idempotent_on_both_paths(server: ServerProcess, headers: dict[str, str]) -> None:
    pub = HttpPublisher(http_url(server))
    try:
        first = pub.publish("/idem/x", b"p", idem="key-1", headers=headers, tags=["t"])
        again = pub.publish("/idem/x", b"p", idem="key-1", headers=headers, tags=["t"])
    finally:
        pub.close()
    assert (first.seq, first.duplicate) == (1, False)
    assert (again.seq, again.epoch, again.duplicate) == (1, first.epoch, True)


def _native(server: ServerProcess) -> str:
    return f"tcp://127.0.0.1:{server.ports['native']}"


def _positions(spark: SparkSession, url: str, pattern: str) -> list[tuple[str, int, str]]:
    out = spark.read.format("hubbub").option("url", url).option("channels", pattern).load()
    return [(r.channel, r.seq, r.headers[SOURCE_HEADER]) for r in out.orderBy("channel", "seq").collect()]


@pytest.mark.parametrize("server", [600], indirect=True, ids=["window600"])
def test_native_sink_rerun_after_a_refused_row_publishes_nothing_twice(
    spark: SparkSession, server: ServerProcess
) -> None:
    url = http_url(server)
    bad = "/src/" + "x" * 2000  # over limits.max_channel_bytes: the server refuses that one publish
    rows = [("/src/a" if i != 30 else bad, "ep000001", i, f"p{i}".encode()) for i in range(1, 61)]
    df = spark.createDataFrame(rows, "channel STRING, epoch STRING, seq BIGINT, payload BINARY").repartition(
        1
    )
    w = df.write.format("hubbub").option("url", url).option("channelPrefix", "/dst")
    w = w.option("nativeAddress", _native(server)).option("transport", "native").option("publishWindow", "8")
    with pytest.raises(Exception, match=r"publishing to /dst/src/x+: 4004"):  # the row's channel and error
        w.mode("append").save()
    before = _positions(spark, url, "/dst/**")
    assert before  # the task published rows before it failed
    # The rerun (what a retried task does, with the bad row fixed): every row once, none twice.
    fixed = df.where(f"channel != '{bad}'")
    fixed.write.format("hubbub").option("url", url).option("channelPrefix", "/dst").option(
        "nativeAddress", _native(server)
    ).mode("append").save()
    after = _positions(spark, url, "/dst/**")
    assert len(after) == 59 and len({p for _, _, p in after}) == 59
    assert [s for _, s, _ in after] == list(range(1, 60))  # no hole, no duplicate append
    assert after[: len(before)] == before


@pytest.mark.parametrize("server", [600], indirect=True, ids=["window600"])
def test_keys_are_the_same_over_http_and_native(spark: SparkSession, server: ServerProcess) -> None:
    url = http_url(server)
    rows = [("/src/k", "ep000002", i, f"p{i}", ["t"]) for i in range(1, 26)]
    df = spark.createDataFrame(
        rows, "channel STRING, epoch STRING, seq BIGINT, payload STRING, tags ARRAY<STRING>"
    )
    df.write.format("hubbub").option("url", url).option("transport", "http").mode("append").save()
    first = _positions(spark, url, "/src/k")
    # Native over the WebSocket route of url (no nativeAddress), then over TCP: all duplicates.
    df.repartition(3).write.format("hubbub").option("url", url).mode("append").save()
    df.write.format("hubbub").option("url", url).option("nativeAddress", _native(server)).mode(
        "append"
    ).save()
    assert _positions(spark, url, "/src/k") == first and len(first) == 25
    out = spark.read.format("hubbub").option("url", url).option("channels", "/src/k").load()
    assert {(r.payload, tuple(r.tags)) for r in out.collect()} == {
        (f"p{i}".encode(), ("t",)) for i in range(1, 26)
    }


def test_native_sink_options_fail_clearly(spark: SparkSession, server: ServerProcess) -> None:
    url = http_url(server)
    df = spark.createDataFrame(
        [("/src/o", "e", 1, b"p")], "channel STRING, epoch STRING, seq BIGINT, payload BINARY"
    )
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    # A nativeAddress nobody listens on: no silent fallback to HTTP.
    with pytest.raises(Exception, match=f"127.0.0.1:{closed}"):
        df.write.format("hubbub").option("url", url).option(
            "nativeAddress", f"tcp://127.0.0.1:{closed}"
        ).mode("append").save()
    with pytest.raises(Exception, match="transport must be one of auto, native, http"):
        df.write.format("hubbub").option("url", url).option("transport", "udp").mode("append").save()
    with pytest.raises(Exception, match="publishWindow must be a positive integer"):
        df.write.format("hubbub").option("url", url).option("publishWindow", "0").mode("append").save()
    assert _positions(spark, url, "/src/**") == []


def test_modes_that_would_replace_the_target_are_refused(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    """The sink appends to a log: ``mode("overwrite")`` and a streaming ``outputMode("complete")`` ask for the
    target's contents to be replaced, and are refused before anything is published (overwrite used to
    append)."""
    url = http_url(server)
    df = spark.createDataFrame(
        [("/src/m", "e", 1, b"p")], "channel STRING, epoch STRING, seq BIGINT, payload BINARY"
    )
    with pytest.raises(Exception, match=r'mode\("overwrite"\) would replace what the server holds'):
        df.write.format("hubbub").option("url", url).mode("overwrite").save()
    assert _positions(spark, url, "/src/**") == []
    counts = (
        spark.readStream.format("rate").option("rowsPerSecond", "10").load()
        .selectExpr("'/src/c' AS channel", "count(*) AS seq", "cast(count(*) AS STRING) AS payload")
    )  # fmt: skip
    with pytest.raises(Exception, match=r'outputMode\("complete"\) would replace'):
        q = (
            counts.writeStream.format("hubbub").option("url", url).option("idemColumn", "payload")
            .option("checkpointLocation", str(tmp_path / "ckpt")).outputMode("complete").start()
        )  # fmt: skip
        try:
            q.awaitTermination(60)
        finally:
            q.stop()
    assert _positions(spark, url, "/src/**") == []
    df.write.format("hubbub").option("url", url).mode("append").save()
    assert [(c, s) for c, s, _ in _positions(spark, url, "/src/**")] == [("/src/m", 1)]


def test_order_by_publishes_each_task_s_rows_in_that_order(
    spark: SparkSession, server: ServerProcess
) -> None:
    """``orderBy``: a task's rows, handed over shuffled (two channels' events interleaved, seqs at random),
    are published in the columns' order; a column that is missing, or that cannot be ordered, fails the
    write before anything is published."""
    url = http_url(server)
    rows = [(ch, "e", s, f"{ch}:{s}".encode()) for ch in ("/src/b", "/src/a") for s in range(1, 151)]
    random.Random(7).shuffle(rows)
    df = spark.createDataFrame(rows, "channel STRING, epoch STRING, seq BIGINT, payload BINARY").coalesce(1)
    w = df.write.format("hubbub").option("url", url).option("channelPrefix", "/ord")
    for bad, why in (
        ("seq,sequence", "orderBy column 'sequence' is not a column"),
        ("tags", r"'tags' cannot be ordered \(array<string>\)"),
    ):
        with pytest.raises(Exception, match=why):
            df.withColumn("tags", F.array(F.lit("t"))).write.format("hubbub").option("url", url).option(
                "orderBy", bad
            ).mode("append").save()
    w.option("orderBy", "channel, seq").mode("append").save()
    got = _positions(spark, url, "/ord/**")
    want = [(f"/ord{ch}", s, f"{ch}#e:{s}") for ch in ("/src/a", "/src/b") for s in range(1, 151)]
    assert got == want


# -- ordering a task's rows (no Spark) --------------------------------------------------------------------


@settings(max_examples=examples(60), deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["/a", "/b", "/ü", ""])),
            st.one_of(st.none(), st.integers(-3, 3)),
        ),
        max_size=120,
    ),
    batch=st.integers(1, 50),
    out_rows=st.integers(1, 40),
    memory=st.sampled_from([0, 1 << 12, None]),
)
def test_ordered_rows_are_spark_s_order_in_memory_or_through_a_file(
    rows: list[tuple[str | None, int | None]], batch: int, out_rows: int, memory: int | None
) -> None:
    """:func:`ordered` gives every row once, in Spark's ascending order (nulls first), in batches of at
    most ``rows``, whether the rows stay in memory or go through a file (a budget of 0 bytes)."""
    from hubbub.pipeline.sink import ordered

    table = pa.table(
        {
            "c": pa.array([r[0] for r in rows], pa.string()),
            "s": pa.array([r[1] for r in rows], pa.int64()),
            "i": pa.array(range(len(rows)), pa.int64()),
        }
    )
    out = list(ordered(table.to_batches(max_chunksize=batch), ("c", "s"), rows=out_rows, memory=memory))
    assert all(0 < b.num_rows <= out_rows for b in out)
    got = [(r["c"], r["s"], r["i"]) for b in out for r in b.to_pylist()]
    assert sorted(r[2] for r in got) == list(range(len(rows)))

    def spark_key(r: tuple[str | None, int | None, int]) -> tuple[Any, ...]:
        c, s, _ = r
        return (c is not None, (c or "").encode(), s is not None, s or 0)

    assert [spark_key(r) for r in got] == sorted(spark_key(r) for r in got)


def test_ordered_rows_over_the_memory_budget_go_through_a_file_in_spark_s_local_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the budget the rows are written to a file in the worker's Spark local directory (the first of
    ``SPARK_LOCAL_DIRS``), which is there while the ordered rows are read and gone after; under it, no
    file."""
    from hubbub.pipeline.sink import ordered

    local = tmp_path / "spark-local"
    local.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{local},{tmp_path / 'other'}")
    table = pa.table({"seq": pa.array(range(1000, 0, -1), pa.int64()), "payload": [b"x" * 100] * 1000})
    batches = table.to_batches(max_chunksize=100)
    small = ordered(batches, ("seq",), rows=300, memory=1 << 30)
    assert next(small).column(0).to_pylist() == list(range(1, 301))
    assert list(local.iterdir()) == []
    big = ordered(batches, ("seq",), rows=300, memory=table.nbytes // 2)
    assert next(big).column(0).to_pylist() == list(range(1, 301))
    (spilled,) = local.iterdir()
    assert spilled.name.startswith("hubbub-sink-") and spilled.stat().st_size > table.nbytes
    assert [b.column(0)[0].as_py() for b in big] == [301, 601, 901]
    assert list(local.iterdir()) == []


# -- rows of Arrow batches (no Spark): the columnar path gives exactly the rows of the per-row rules ---------


def _batch(n: int = 7) -> pa.RecordBatch:
    hdrs: list[list[tuple[str, str]] | None] = [
        [("k", "v")],
        [],
        None,
        [(":pseudo", "x"), ("a", "ü"), (SOURCE_HEADER, "old")],
        [("k", "v"), ("k2", "v2")],
        [],
        [("z", "")],
    ]
    tags: list[list[str] | None] = [["t"], [], None, ["a", "b"], [], ["x"], []]
    return pa.RecordBatch.from_pydict(
        {
            "channel": pa.array(["/a", "/", "/b/c", "/a", "/ü", "/" + "x" * 130, "/a"][:n]),
            "seq": pa.array([1, 2, 3, 4, 5, 6, 7][:n], pa.int64()),
            "epoch": pa.array(["e1", "e2", "e1", "e1", "e3", "e1", "e1"][:n]),
            "time": pa.array(list(range(n)), pa.int64()),
            "headers": pa.array(hdrs[:n], pa.map_(pa.string(), pa.string())),
            "tags": pa.array(tags[:n], pa.list_(pa.string())),
            "payload": pa.array([b"p%d" % i for i in range(n)], pa.binary()),
            "content_type": pa.array(["text/plain", None, "a/b", "", "x/y", "text/plain", "c/d"][:n]),
        }
    )


def _per_row(p: Any, batch: pa.RecordBatch) -> Any:
    """What the per-row rules (``_Publishing._row``) make of a batch, as the sink's columns."""
    from hubbub.pipeline.sink import _columns

    d = batch.to_pydict()
    n = batch.num_rows
    return _columns(
        map(
            p._row,
            d.get("channel", [None] * n),
            d.get("epoch", [None] * n),
            d.get("seq", [None] * n),
            d[p.idem_column] if p.idem_column else [None] * n,
            d["payload"],
            d.get("headers", [None] * n),
            d.get("tags", [None] * n),
            d.get("content_type", [None] * n),
        )
    )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"channelPrefix": "/sink/"},
        {"channel": "/fixed", "channelPrefix": "/p"},
        {"sourceHeader": ""},
        {"sourceHeader": "src"},
    ],
)
@pytest.mark.parametrize(
    "shape", ["whole", "sliced", "no headers or tags", "string payload", "null seq", "large channel"]
)
def test_rows_of_arrow_batches_match_the_per_row_rules(options: dict[str, str], shape: str) -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    from hubbub.pipeline.sink import _Publishing

    batch = _batch()
    if shape == "sliced":
        batch = batch.slice(2, 4)
    elif shape == "no headers or tags":
        batch = batch.drop_columns(["headers", "tags"])
    elif shape == "string payload":
        batch = batch.set_column(6, "payload", pa.array([f"s{i}" for i in range(7)]))
    elif shape == "null seq":
        batch = batch.set_column(1, "seq", pa.array([1, None, 3, 4, 5, 6, 7], pa.int64()))
    elif shape == "large channel":
        batch = batch.set_column(0, "channel", batch.column(0).cast(pa.large_string()))
    schema = StructType([StructField(name, StringType()) for name in batch.schema.names])
    p = _Publishing({"url": "http://127.0.0.1:1", **options}, schema)
    got = p._rows_of_batch(batch)
    assert got == _per_row(p, batch)
    # A position over 128 characters becomes its SHA-256 (the same key on every transport).
    assert any(k.startswith("sha256:") for k in got[2])


def test_rows_of_spark_rows_match_the_arrow_path() -> None:
    """A streaming write on a PySpark without the Arrow stream writer gets Rows: the same rows, in chunks."""
    from pyspark.sql import Row
    from pyspark.sql.types import StringType, StructField, StructType

    from hubbub.pipeline.sink import _Publishing

    batch = _batch()
    schema = StructType([StructField(name, StringType()) for name in batch.schema.names])
    p = _Publishing({"url": "http://127.0.0.1:1", "channelPrefix": "/s"}, schema)
    d = batch.to_pydict()
    rows = [
        Row(**{k: (dict(v) if k == "headers" and v is not None else v) for k, v in zip(d, vals, strict=True)})
        for vals in zip(*d.values(), strict=True)
    ]
    chunks = list(p.rows_of_rows(rows, chunk=3))
    assert [len(c[0]) for c in chunks] == [3, 3, 1]
    merged = tuple([x for c in chunks for x in c[i]] for i in range(6))
    assert merged == p._rows_of_batch(batch)
