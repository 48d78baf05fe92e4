"""Every option of the source and the sink has a parser: a value it does not take is refused with the forms it
takes (as Kafka's connector does), never read as a default; an option of the other kind of read is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from hubbub.errors import PipelineError
from hubbub.log import SqliteLogStore
from hubbub.pipeline.datasource import _Options
from hubbub.pipeline.options import (
    SINK_OPTIONS,
    SOURCE_OPTIONS,
    Option,
    Scope,
    check_known,
    names_of,
    parse_options,
)

from .conftest import fill

pytestmark = pytest.mark.spark

DOCS = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"
POS = json.dumps({"/a": {"epoch": "e1", "seq": 3}})

# name: (a value it takes and what it is parsed to, values it refuses). Every option of both tables is
# here (checked below), so an option added without a parser test fails.
SOURCE_CASES: dict[str, tuple[tuple[str, object], tuple[str, ...]]] = {
    "url": (("sqlite:///x.db", "sqlite:///x.db"), ("", "ftp://h", "localhost:8080", "http://h:port")),
    "token": (("t0k", "t0k"), ()),
    "channels": (("/chat/**", "/chat/**"), ("chat", "/a/**/b", "")),
    "startSeq": (("5", 5), ("0", "-1", "five", "1.5", "")),
    "endSeq": (("9", 9), ("0", "x")),
    "startTime": (("2026-01-02T00:00:00Z", 1767312000 * 10**9), ("yesterday", "-5", "")),
    "endTime": (("1000", 1000), ("soon",)),
    "startingOffsets": (
        ("earliest", "earliest"),
        ("bogus", "{", "[]", '{"/a": {"epoch": "e", "seq": -1}}', '{"a": {"epoch": "e", "seq": 1}}'),
    ),
    "endingOffsets": ((POS, {"/a": {"e1": 3}}), ("earliest", "bogus", '{"/a": {"seq": 1}}')),
    "partitionSize": (("1000", 1000), ("0", "-3", "lots")),
    "minPartitions": (("4", 4), ("0", "-1", "x")),
    "maxEventsPerTrigger": (("100", 100), ("-3", "0", "1e3")),
    "failOnDataLoss": (("FALSE", False), ("maybe", "no", "0", "")),
    "retries": (("0", 0), ("-1", "many")),
    "retryIntervalMs": (("250", 250), ("0", "1s")),
}
SINK_CASES: dict[str, tuple[tuple[str, object], tuple[str, ...]]] = {
    "url": (("http://127.0.0.1:8080", "http://127.0.0.1:8080"), ("sqlite:///x.db", "127.0.0.1:8080")),
    "token": (("t", "t"), ()),
    "channel": (("/a/b", "/a/b"), ("a/b", "/a/%zz")),
    "channelPrefix": (("/restored/", "/restored"), ("restored",)),
    "idemColumn": (("key", "key"), ("", " ")),
    "sourceHeader": (("", ""), ()),
    "nativeAddress": (("127.0.0.1:7400", "127.0.0.1:7400"), ("udp://h:1", "tcp://h", "h:port")),
    "transport": (("NATIVE", "native"), ("udp", "")),
    "publishWindow": (("64", 64), ("0", "-1", "big")),
    "orderBy": (("channel, seq", ("channel", "seq")), ("", "a,,b")),
    "retries": (("3", 3), ("-1",)),
    "retryIntervalMs": (("100", 100), ("0",)),
    "checkpointLocation": (("/tmp/c", "/tmp/c"), ()),
}


@pytest.mark.parametrize(
    ("table", "cases"), [(SOURCE_OPTIONS, SOURCE_CASES), (SINK_OPTIONS, SINK_CASES)], ids=["source", "sink"]
)
def test_every_option_parses_its_forms_and_refuses_others_saying_what_it_takes(
    table: tuple[Option, ...], cases: dict[str, tuple[tuple[str, object], tuple[str, ...]]]
) -> None:
    assert {o.name for o in table} == set(cases)
    what = "source" if table is SOURCE_OPTIONS else "sink"
    for opt in table:
        (good, parsed), bads = cases[opt.name]
        assert parse_options({opt.name.lower(): good}, table, what)[opt.name] == parsed
        for bad in bads:
            with pytest.raises(PipelineError) as err:
                parse_options({opt.name.lower(): bad}, table, what)
            assert str(err.value) == f"hubbub {what}: option {opt.name} must be {opt.accepts}, not {bad!r}"
            # Spark's creation of the source (load(), save()) refuses it too, where no table takes it.
            other = SINK_OPTIONS if table is SOURCE_OPTIONS else SOURCE_OPTIONS
            if not any(o.name == opt.name for o in other):
                with pytest.raises(PipelineError, match=f"option {opt.name} must be"):
                    check_known({opt.name: bad})


def test_the_values_that_were_read_as_something_else_are_refused() -> None:
    url = "sqlite:///x.db"
    for options, message in [
        # failOnDataLoss=maybe was false (and skipped what was trimmed), -3 and 0 made a stream read nothing,
        # a batch startingOffsets that is not JSON was ignored.
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false, not 'maybe'"),
        ({"maxEventsPerTrigger": "-3"}, "maxEventsPerTrigger must be a positive integer (events), not '-3'"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be a positive integer"),
        ({"minPartitions": "0"}, "minPartitions must be a positive integer, not '0'"),
    ]:
        with pytest.raises(PipelineError, match=re.escape(message)):
            _Options.parse({"url": url, **options}, "stream")
    with pytest.raises(PipelineError, match="startingOffsets must be earliest, latest, or a JSON map"):
        _Options.parse({"url": url, "startingOffsets": "bogus"}, "batch")
    with pytest.raises(PipelineError, match="startingOffsets latest reads nothing in a batch read"):
        _Options.parse({"url": url, "startingOffsets": "latest"}, "batch")


def test_options_of_the_other_kind_of_read_and_inconsistent_ones_are_refused() -> None:
    url = "sqlite:///x.db"
    cases: list[tuple[dict[str, str], Scope, str]] = [
        ({"endTime": "5"}, "stream", "option endTime is for batch reads only"),
        ({"endingOffsets": POS}, "stream", "option endingOffsets is for batch reads only"),
        ({"startSeq": "5"}, "stream", "option startSeq is for batch reads only"),
        ({"maxEventsPerTrigger": "5"}, "batch", "option maxEventsPerTrigger is for streams only"),
        ({"failOnDataLoss": "false"}, "batch", "option failOnDataLoss is for streams only"),
        ({"startSeq": "5", "endSeq": "4"}, "batch", "endSeq 4 is before startSeq 5"),
        ({"startTime": "5", "endTime": "5"}, "batch", "endTime must be after startTime"),
        ({"startTime": "5", "startingOffsets": "latest"}, "stream", "startingOffsets or at startTime"),
        (
            {"startingOffsets": json.dumps({"/a": [{"epoch": "e1", "seq": 1}, {"epoch": "e2", "seq": 1}]})},
            "stream",
            "one position per channel (/a has several epochs)",
        ),
        ({"maxEventsPerTrigger": "5", "maxOffsetsPerTrigger": "5"}, "stream", "(the same option), not both"),
        ({"store": "sqlite:///y.db"}, "batch", "set url or store (the same option), not both"),
    ]
    for options, scope, message in cases:
        with pytest.raises(PipelineError, match=re.escape(message)):
            _Options.parse({"url": url, **options}, scope)
    # What each kind of read does take.
    o = _Options.parse({"url": url, "startingOffsets": POS, "endingOffsets": POS, "endSeq": "3"}, "batch")
    assert (o.starting, o.ending, o.end_seq) == ({"/a": {"e1": 3}}, {"/a": {"e1": 3}}, 3)
    o = _Options.parse({"url": url, "maxOffsetsPerTrigger": "7", "failOnDataLoss": "false"}, "stream")
    assert (o.max_per_trigger, o.fail_on_data_loss, o.retries, o.retry_interval_ms) == (7, False, 60, 500)


def test_every_option_is_in_the_docs_tables() -> None:
    docs = DOCS.read_text()
    for name in names_of(SOURCE_OPTIONS) + names_of(SINK_OPTIONS):
        assert re.search(rf"^\|[^|\n]*`{re.escape(name)}`", docs, re.M), name


def test_a_bad_value_is_refused_at_load(spark: SparkSession, tmp_path: Path) -> None:
    """Spark creates the source at ``load()``: a value no option takes fails there, not once a query runs
    (and for a stream, not after it has skipped what ``failOnDataLoss=maybe`` let it skip)."""
    st = SqliteLogStore(tmp_path / "log.db")
    fill(st, {"/o/a": 5})
    st.close()
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with pytest.raises(Exception, match="option failOnDataLoss must be true or false, not 'maybe'"):
        spark.readStream.format("hubbub").option("url", url).option("failOnDataLoss", "maybe").load()
    with pytest.raises(Exception, match="option minPartitions must be a positive integer, not '0'"):
        spark.read.format("hubbub").option("url", url).option("minPartitions", "0").load()
    # Where the kind of read matters, at the first action.
    df = spark.read.format("hubbub").option("url", url).option("startingOffsets", "latest").load()
    with pytest.raises(Exception, match="startingOffsets latest reads nothing in a batch read"):
        df.count()
    earliest = spark.read.format("hubbub").option("url", url).option("startingOffsets", "earliest")
    assert earliest.load().count() == 5
