"""The jobs, through the ``hubbub pipeline`` command's functions, against a running server and its store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from hubbub.client import Client
from hubbub.pipeline import jobs
from hubbub.pipeline.archive_dir import STATE_FILE
from hubbub.pipeline.datasource import SOURCE_HEADER
from hubbub.pipeline.sources import PipelineError
from tests.integration.serverproc import ServerProcess

from .conftest import http_url, jvm_conf_args, spark_env, store_url

pytestmark = pytest.mark.spark


def publish(url: str, counts: dict[str, int], start: int = 0) -> None:
    with Client.connect(url) as c:
        for ch, n in counts.items():
            for i in range(start, start + n):
                c.publish(ch, f"{ch}:{i}".encode(), headers={"key": f"k{i % 4}"}, tags=["t"])


def test_archive_stats_audit_export_compact_retention(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    url, store = http_url(server), store_url(server)
    publish(url, {"/chat/a": 60, "/chat/b": 25, "/sys/x": 15})
    out = tmp_path / "archive"
    first = jobs.archive(spark, store, str(out))  # the embedded store of the running server, read-only
    assert first["events"] == 100 and first["channels"] == 3
    assert jobs.archive(spark, store, str(out))["events"] == 0  # idempotent
    publish(url, {"/chat/a": 7, "/new": 3}, start=60)
    assert jobs.archive(spark, store, str(out))["events"] == 10  # incremental
    state = json.loads((out / STATE_FILE).read_text())["positions"]
    # One position per (channel, epoch): channel -> {epoch: last archived seq}.
    assert {k: list(v.values()) for k, v in state.items()} == {
        "/chat/a": [67],
        "/chat/b": [25],
        "/sys/x": [15],
        "/new": [3],
    }
    roots = sorted(p.name for p in (out / "data").iterdir())
    assert roots == ["root=chat", "root=new", "root=sys"]
    archived = spark.read.parquet(str(out / "data"))
    live = spark.read.format("hubbub").option("url", url).load()
    cols = ["channel", "seq", "epoch", "time", "payload", "tags"]
    assertDataFrameEqual(archived.select(cols), live.select(cols), checkRowOrder=False)
    assert str(archived.select("date").distinct().first()[0]) == datetime.now(UTC).strftime("%Y-%m-%d")

    a = jobs.audit(spark, jobs.load(spark, input_dir=str(out)), str(tmp_path / "audit"))
    assert a["ok"] and a["events"] == 110 and a["gaps"] == 0
    # An archive with a hole and a repeat: the audit finds both.
    bad = archived.where("NOT (channel = '/chat/a' AND seq IN (10, 11))").unionByName(
        archived.where("seq = 3")
    )
    b = jobs.audit(spark, bad, str(tmp_path / "audit2"))
    assert b["gaps"] == 1 and b["duplicates"] == 4 and b["missing"] == 2
    assert pd.read_csv(tmp_path / "audit2" / "gaps.csv").to_dict("records") == [
        {"channel": "/chat/a", "epoch": next(iter(state["/chat/a"])), "gap_from": 10, "gap_to": 11}
    ]

    s = jobs.stats(spark, jobs.load(spark, url=store), str(tmp_path / "stats"))
    assert s["events"] == 110 and s["busiest"][0] == "/chat/a"
    channels = pd.read_csv(tmp_path / "stats" / "channels.csv")
    row = channels[channels.channel == "/chat/a"].iloc[0]
    # Two client sessions published to /chat/a: two publishers (the app is the session).
    assert row.events == 67 and row.publishers == 2 and row.first_seq == 1 and row.last_seq == 67
    payload_bytes = sum(len(f"/chat/a:{i}") for i in range(67))
    assert row.bytes == payload_bytes + 67 * (len("key") + 2 + len("t"))
    assert (tmp_path / "stats" / "busiest.png").stat().st_size > 1000
    assert (tmp_path / "stats" / "hourly.parquet").exists()

    e = jobs.export(spark, jobs.load(spark, url=url, channels="/chat/*"), str(tmp_path / "exp"), "jsonl")
    assert e["events"] == 92
    first_line = json.loads(next((tmp_path / "exp").glob("part-*.json")).read_text().splitlines()[0])
    assert first_line["channel"] == "/chat/a" and first_line["seq"] == 1

    c = jobs.compact(spark, jobs.load(spark, input_dir=str(out)), str(tmp_path / "compact"), "key")
    assert c["events"] == 3 * 4 + 3  # 4 keys on /chat/a, /chat/b and /sys/x; /new has 3 events, 3 keys
    latest = spark.read.parquet(str(tmp_path / "compact")).where("channel = '/chat/a'")
    assert sorted(r.seq for r in latest.collect()) == [64, 65, 66, 67]

    old = out / "data" / "root=chat" / "date=2000-01-01"
    old.mkdir()
    (old / "part-0.parquet").write_bytes(b"")
    r = jobs.retention(str(out), days=30)
    assert r["dropped"] == ["root=chat/date=2000-01-01"] and not old.exists()
    now = datetime.now(UTC) + timedelta(days=1)
    assert jobs.retention(str(out), days=30, now=now)["dropped"] == []


def wait_idempotency_window(url: str, timeout: float = 30.0) -> None:
    """Return once the server's idempotency window has passed for every key used so far: publish a probe
    with one key until the server appends it again (a key is remembered for the window after its event's
    commit, and every earlier event was committed before the probe's first one)."""
    deadline = time.monotonic() + timeout
    with Client.connect(url) as c:

        def duplicate() -> bool:
            ack = c.publish("/probe", b"p", idem="window-probe")
            assert ack is not None
            return ack.duplicate

        assert not duplicate()
        while duplicate():
            assert time.monotonic() < deadline, "the idempotency window did not pass"
            time.sleep(0.02)  # poll the condition; it is the server that decides


@pytest.mark.parametrize("server", [0.5], indirect=True)  # native.idempotency_window_s
def test_backfill_is_idempotent_after_the_idempotency_window(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    url = http_url(server)
    publish(url, {"/orig/a": 30, "/orig/b": 12})
    out = tmp_path / "archive"
    jobs.archive(spark, url, str(out))
    first = jobs.backfill(spark, str(out), url, channels="/orig/**", channel_prefix="/restored")
    assert first["published"] == 42 and first["already_present"] == 0
    wait_idempotency_window(url)
    again = jobs.backfill(spark, str(out), url, channels="/orig/**", channel_prefix="/restored")
    assert again["published"] == 0 and again["already_present"] == 42
    restored = spark.read.format("hubbub").option("url", url).option("channels", "/restored/**").load()
    assert restored.count() == 42
    assert restored.where("channel = '/restored/orig/a'").agg(F.max("seq")).first()[0] == 30
    got = restored.where("channel = '/restored/orig/a'").orderBy("seq").select("payload").collect()
    assert [r.payload for r in got] == [f"/orig/a:{i}".encode() for i in range(30)]  # in order


def test_backfill_of_a_partly_restored_archive_publishes_the_rest_with_every_field(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    """A rerun after the archive grew publishes only the new events (the target's positions are joined
    away), and what the backfill leaves unread (time, publisher) is not needed for what it publishes."""
    url = http_url(server)
    publish(url, {"/orig/a": 10, "/orig/b": 4})
    out = tmp_path / "archive"
    jobs.archive(spark, url, str(out), channels="/orig/**")
    first = jobs.backfill(spark, str(out), url, channels="/orig/**", channel_prefix="/re")
    assert (first["published"], first["already_present"]) == (14, 0)
    publish(url, {"/orig/a": 5}, start=10)
    jobs.archive(spark, url, str(out), channels="/orig/**")
    # With the progress display, which counts what is left before the write; the counts are the same.
    again = jobs.backfill(spark, str(out), url, channels="/orig/**", channel_prefix="/re", show=True)
    assert (again["published"], again["already_present"]) == (5, 14)
    with urllib.request.urlopen(f"{url}/api/v1/log/re/orig/a?limit=1000") as r:
        events = json.loads(r.read())["events"]
    assert [e["seq"] for e in events] == list(range(1, 16))
    orig = log_head(url, "/orig/a")
    for e, o in zip(events, orig["events"], strict=True):
        assert e["tags"] == o["tags"] == ["t"]
        assert e["headers"] == {**o["headers"], SOURCE_HEADER: f"/orig/a#{o['epoch']}:{o['seq']}"}
        assert e["content_type"] == o["content_type"]


@pytest.mark.parametrize("one_task", [True, False], ids=["one-task", "shuffled"])
def test_backfill_publishes_each_channel_in_order_from_files_out_of_order(
    spark: SparkSession,
    server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_task: bool,
) -> None:
    """Each channel's events spread over several files, every file holding them backwards and interleaved
    with another channel's and epoch's: the target still gets each channel's events once, in log order:
    its epochs oldest first (by time, though the older epoch's name sorts last), each in seq order. Both
    when the input is small enough for one task to read and sort, and when it is shuffled by channel (an
    input over ``ONE_TASK_BYTES``)."""
    if not one_task:
        monkeypatch.setattr(jobs, "ONE_TASK_BYTES", 0)
    decided: list[bool] = []
    real = jobs._one_task

    def recording(df: DataFrame) -> bool:
        decided.append(real(df))
        return decided[-1]

    monkeypatch.setattr(jobs, "_one_task", recording)
    url = http_url(server)
    inp = tmp_path / "export"
    # /o/a's older epoch is "zz" (times 1..40), its newer one "aa" (times 1000..1009).
    events = [("/o/a", "zz", s, s) for s in range(1, 41)]
    events += [("/o/a", "aa", s, 999 + s) for s in range(1, 11)] + [
        ("/o/b", "e3", s, s) for s in range(1, 31)
    ]
    schema = (
        "channel string, seq long, epoch string, time long, headers map<string,string>, tags array<string>, "
        "payload binary, content_type string"
    )
    for part in range(3):  # one file each, written one after another
        chunk = [e for e in events if e[2] % 3 == part][::-1]
        rows = [
            (c, s, e, t, {"k": "v"}, ["t"], f"{c}:{e}:{s}".encode(), "text/plain") for c, e, s, t in chunk
        ]
        spark.createDataFrame(rows, schema).coalesce(1).write.mode("append").parquet(str(inp))
    assert len(list(inp.glob("part-*.parquet"))) == 3
    res = jobs.backfill(spark, str(inp), url, channels="/o/**", channel_prefix="/r")
    assert (res["published"], res["already_present"], res["source_events"]) == (80, 0, 80)
    assert decided == [one_task]
    for ch in ("/o/a", "/o/b"):
        got = [e["headers"][SOURCE_HEADER] for e in log_head(url, "/r" + ch)["events"]]
        want = [f"{c}#{e}:{s}" for c, e, s, _ in events if c == ch]  # log order
        assert got == want


def test_backfill_command_on_a_local_master_with_its_own_jvm_options(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    """``hubbub pipeline backfill`` on ``local[2]`` without ``--conf spark.driver.extraJavaOptions``: the
    command picks the JVM's options itself (C1 only, ``cli.job_conf``), and publishes everything in order.
    The tests' JVM flags and class archive go in Spark's ``defaultJavaOptions``, which leave it the choice."""
    url = http_url(server)
    publish(url, {"/cli/a": 12, "/cli/b": 5})
    out = tmp_path / "archive"
    jobs.archive(spark, url, str(out), channels="/cli/**")
    r = subprocess.run(
        [sys.executable, "-m", "hubbub", "pipeline", "backfill", "--master", "local[2]", "--input", str(out),
         "--target", url, "--channels", "/cli/**", "--channel-prefix", "/bf", "--no-progress",
         *jvm_conf_args(), "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **spark_env()}, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert (res["published"], res["already_present"]) == (17, 0)
    got = [e["headers"][SOURCE_HEADER] for e in log_head(url, "/bf/cli/a")["events"]]
    assert [int(g.rsplit(":", 1)[1]) for g in got] == list(range(1, 13))


def log_head(url: str, channel: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/api/v1/log{channel}?limit=1000") as r:
        body: dict[str, Any] = json.loads(r.read())
    return body


def test_archive_trim_trims_the_hot_log_to_the_archived_position(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    url, store = http_url(server), store_url(server)
    publish(url, {"/hot/a": 40, "/hot/b": 10, "/cold/c": 5})
    out = tmp_path / "archive"
    with pytest.raises(PipelineError, match="needs the server stopped"):
        jobs.archive(spark, store, str(out), trim=True)  # the server has its store open for writing
    assert not (out / STATE_FILE).exists()

    first = jobs.archive(spark, url, str(out), channels="/hot/**", trim=True)
    assert first["events"] == 50 and first["trimmed"] == 2 and first["trim_skipped"] == []
    a, b = log_head(url, "/hot/a"), log_head(url, "/hot/b")
    assert (a["first"], a["top"], a["events"]) == (41, 40, [])
    assert (b["first"], b["top"], b["events"]) == (11, 10, [])
    assert log_head(url, "/cold/c")["first"] == 1  # outside the pattern: not archived, not trimmed

    publish(url, {"/hot/a": 6}, start=40)
    again = jobs.archive(spark, url, str(out), channels="/hot/**", trim=True)
    assert again["events"] == 6  # only the new events: nothing archived twice
    a = log_head(url, "/hot/a")
    assert (a["first"], a["top"], a["events"]) == (47, 46, [])
    assert jobs.archive(spark, url, str(out), channels="/hot/**", trim=True)["events"] == 0

    archived = spark.read.parquet(str(out / "data"))
    assert archived.count() == 56 and archived.select("channel", "seq").distinct().count() == 56
    got = archived.where("channel = '/hot/a'").orderBy("seq").select("seq", "payload").collect()
    assert [(r.seq, r.payload) for r in got] == [(i + 1, f"/hot/a:{i}".encode()) for i in range(46)]
