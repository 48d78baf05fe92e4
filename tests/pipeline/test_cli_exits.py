"""``hubbub pipeline`` exits non-zero on what it refuses or finds wrong: bad arguments, a directory that is
not an archive, an archive directory another run holds, an audit that finds gaps or duplicates."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hubbub.errors import PipelineError
from hubbub.pipeline import jobs
from hubbub.pipeline.archive_dir import LOCK_FILE, STATE_FILE
from hubbub.pipeline.arrow import ARROW_SCHEMA

from .conftest import jvm_conf_args, spark_env

pytestmark = pytest.mark.spark


def pipeline(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hubbub", "pipeline", *args, "--no-progress",
         *jvm_conf_args(), "--conf", "spark.ui.enabled=false",
         "--conf", "spark.driver.host=127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **spark_env(), **(env or {})},
        check=False,
    )  # fmt: skip


def archive_dir(tmp_path: Path, days: list[str]) -> Path:
    out = tmp_path / "archive"
    for day in days:
        part = out / "data" / "root=a" / f"date={day}"
        part.mkdir(parents=True)
        (part / "part-0.parquet").write_bytes(b"")
    (out / STATE_FILE).write_text(json.dumps({"version": 2, "positions": {}, "pending": None}))
    return out


def test_retention_refuses_negative_days_and_a_missing_archive(tmp_path: Path) -> None:
    today = datetime.now(UTC).date()
    days = [today.isoformat(), (today - timedelta(days=40)).isoformat()]
    out = archive_dir(tmp_path, days)
    r = pipeline("retention", "--out", str(out), "--days", "-5")
    assert r.returncode == 1 and "--days must be 0 or more" in r.stderr and r.stdout == ""
    assert sorted(p.name for p in (out / "data" / "root=a").iterdir()) == sorted(f"date={d}" for d in days)

    missing = tmp_path / "no-such-archive"
    r = pipeline("retention", "--out", str(missing), "--days", "5")
    assert r.returncode == 1 and "is not an archive" in r.stderr and not missing.exists()

    r = pipeline("retention", "--out", str(out), "--days", "30")
    assert r.returncode == 0 and json.loads(r.stdout)["dropped"] == [f"root=a/date={days[1]}"]


def test_usage_errors_are_refused_before_spark_starts(tmp_path: Path) -> None:
    """A job's arguments that cannot work are refused before a JVM is started for it: at once, instead of
    after seconds of start-up. Java is made unreachable for these runs (``JAVA_HOME`` names no directory),
    so a run that went as far as starting Spark says "cannot start Spark" instead of the refusal."""
    out = str(tmp_path / "out")
    cases = [
        (["stats", "--out", out], "give a source: --url, --store or --input"),
        (["audit", "--out", out], "give a source: --url, --store or --input"),
        (["backfill", "--target", "http://127.0.0.1:9"], "backfill reads an archive or export: give --input"),
        (["export", "--input", out, "--out", out, "--from", "yesterday"], "not a time"),
        (["export", "--input", out, "--out", out, "--to", "-1"], "not a time"),
        (["compact", "--input", out, "--out", out, "--key-header", "k", "--channels", "a/**"],
         "not a channel pattern: 'a/**'"),
    ]  # fmt: skip
    for args, message in cases:
        r = pipeline(*args, env={"JAVA_HOME": str(tmp_path / "no-java")})
        assert r.returncode == 1 and message in r.stderr and r.stdout == "", (args, r.stderr)
        assert "cannot start Spark" not in r.stderr, args
    assert not (tmp_path / "out").exists()


def test_runs_on_one_out_directory_take_turns(tmp_path: Path) -> None:
    """Another run holds the directory (its lock): archive and retention refuse at once, saying so, and
    touch nothing; once it is free they run."""
    out = archive_dir(tmp_path, ["2000-01-01"])
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"archive, pid 4242 on elsewhere, since 2026-01-01T00:00:00Z\n")
        with pytest.raises(PipelineError, match=r"in use by another run \(archive, pid 4242"):
            jobs.retention(str(out), 30)
        # The archive job is refused before it opens Spark or the source (no session is needed to see it).
        with pytest.raises(PipelineError, match="in use by another run"):
            jobs.archive(None, "sqlite:///nowhere.db", str(out))
        r = pipeline("retention", "--out", str(out), "--days", "30")
        assert r.returncode == 1 and "in use by another run (archive, pid 4242" in r.stderr
        assert (out / "data" / "root=a" / "date=2000-01-01").is_dir()
    finally:
        os.close(fd)
    assert jobs.retention(str(out), 30)["dropped"] == ["root=a/date=2000-01-01"]


def test_audit_exits_1_when_it_finds_gaps_or_duplicates(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {
            "channel": "/a",
            "seq": seq,
            "epoch": "abcdefgh",
            "time": 1_700_000_000_000_000_000 + seq,
            "publisher_dialect": "native",
            "publisher_user": "",
            "publisher_app": "",
            "publisher_msg_id": "",
            "headers": [],
            "tags": [],
            "payload": b"x",
            "content_type": "text/plain",
        }
        for seq in (1, 2, 4, 4)  # 3 missing, 4 twice
    ]
    data = tmp_path / "export"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), data / "part-0.parquet")
    r = pipeline("audit", "--input", str(data), "--out", str(tmp_path / "audit"))
    assert r.returncode == 1, r.stderr
    res = json.loads(r.stdout)
    assert res["ok"] is False and res["gaps"] == 1 and res["duplicates"] == 1
    assert "found gaps or duplicates" in r.stderr
