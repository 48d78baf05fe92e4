"""The sink: publishes rows idempotently, so a retried write never publishes twice."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from hubbub.pipeline.datasource import SOURCE_HEADER
from tests.integration.serverproc import ServerProcess

from .conftest import http_url

pytestmark = pytest.mark.spark


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
