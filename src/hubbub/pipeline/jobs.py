"""The pipeline's jobs: archive, stats, audit, retention, compact, export and backfill (docs/pipeline.md).
Retention, which needs no Spark, lives in :mod:`hubbub.pipeline.archive_dir` with the archive directory's
layout and lock, and is re-exported here.

Each job takes a :class:`~pyspark.sql.SparkSession` (see :func:`make_session`) and returns a JSON-able
summary; ``hubbub pipeline <job>`` (:mod:`hubbub.pipeline.cli`) wraps them. Inputs are the ``hubbub`` data
source (a running server or a store) or Parquet (an archive or an export).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import urllib.parse
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from hubbub.channels import parse_pattern
from hubbub.errors import PipelineError, StorageError, TrimEpochGone, TrimOutOfRange
from hubbub.log import LogStore, RetentionPolicy, open_store
from hubbub.pipeline.archive_dir import DATA_DIR, STAGING_DIR, STATE_FILE, out_lock, retention
from hubbub.pipeline.datasource import SOURCE_HEADER, HubbubDataSource, position_key
from hubbub.pipeline.options import parse_time
from hubbub.pipeline.progress import Progress, progress
from hubbub.pipeline.sources import connect_source, log_epochs

__all__ = [
    "Progress",
    "archive",
    "audit",
    "backfill",
    "compact",
    "export",
    "load",
    "make_session",
    "out_lock",
    "pattern_filter",
    "progress",
    "retention",
    "stats",
    "trim_archived",
]

#: The size of an event as retention counts it (hubbub.log.records.event_size), in Spark SQL.
SIZE_SQL = (
    "octet_length(payload)"
    " + aggregate(map_keys(headers), 0L, (a, k) -> a + octet_length(k))"
    " + aggregate(map_values(headers), 0L, (a, v) -> a + octet_length(v))"
    " + aggregate(tags, 0L, (a, t) -> a + octet_length(t))"
)


def make_session(master: str = "local[2]", app: str = "hubbub-pipeline", **conf: str) -> SparkSession:
    """A SparkSession for the jobs: UTC session time zone, the ``hubbub`` source registered."""
    b = SparkSession.builder.master(master).appName(app).config("spark.sql.session.timeZone", "UTC")
    b = b.config("spark.ui.showConsoleProgress", "false")
    # Running tasks report their records with each heartbeat: often enough for the progress display.
    b = b.config("spark.executor.heartbeatInterval", "2s")
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.dataSource.register(HubbubDataSource)
    return spark


def pattern_filter(pattern: str) -> Column:
    """A Spark condition on ``channel`` equal to the native pattern's match (native.md §4)."""
    pat = parse_pattern(pattern)
    parts = [r"[^/]*" if p is None else re.escape(p) for p in pat.parts]
    if pat.subtree:
        regex = "^/" + "/".join(parts) + "(/.*)?$" if parts else "^/.*$"
    else:
        regex = "^/" + "/".join(parts) + "$"
    return F.col("channel").rlike(regex)


def load(
    spark: SparkSession,
    *,
    url: str = "",
    input_dir: str = "",
    channels: str = "/**",
    token: str = "",
    start_time: str = "",
    end_time: str = "",
) -> DataFrame:
    """The log as a DataFrame of the record schema: from ``url`` (server or store) or Parquet ``input_dir``
    (an archive's directory, or Parquet export)."""
    if url:
        r = spark.read.format("hubbub").option("url", url).option("channels", channels)
        if token:
            r = r.option("token", token)
        if start_time:
            r = r.option("startTime", start_time)
        if end_time:
            r = r.option("endTime", end_time)
        return r.load()
    if not input_dir:
        raise PipelineError("give a source: --url, --store or --input")
    path = Path(input_dir)
    if (path / DATA_DIR).is_dir():
        path = path / DATA_DIR
    df = spark.read.parquet(str(path)).where(pattern_filter(channels))
    lo, hi = _time_bound(start_time), _time_bound(end_time)
    if lo is not None:
        df = df.where(F.col("time") >= lo)
    if hi is not None:
        df = df.where(F.col("time") < hi)
    return df


def _time_bound(value: str) -> int | None:
    """``--from``/``--to`` in ns (an integer or ISO-8601, UTC when no zone), ``None`` when not given."""
    if not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise PipelineError(f"not a time (ns since the Unix epoch, or ISO-8601): {value!r}") from None


def _ts_micros(col: str = "time") -> Column:
    return F.timestamp_micros(F.floor(F.col(col) / 1000))


# -- archive --------------------------------------------------------------------------------------------

#: The archive's state file format. Version 2 keeps a position per (channel, epoch); version 1 (one epoch per
#: channel, ``{channel: {"epoch": E, "seq": S}}``) is read and rewritten as version 2.
STATE_VERSION = 2

#: Archived positions: channel -> epoch -> the last archived seq of that epoch.
Positions = dict[str, dict[str, int]]


def _positions_from(version: int, raw: dict[str, Any]) -> Positions:
    if version == 1:
        return {ch: {str(p["epoch"]): int(p["seq"])} for ch, p in raw.items()}
    return {ch: {str(e): int(s) for e, s in eps.items()} for ch, eps in raw.items()}


def _load_state(out: Path) -> dict[str, Any]:
    f = out / STATE_FILE
    if not f.exists():
        return {"version": STATE_VERSION, "positions": {}, "pending": None}
    state = json.loads(f.read_text())
    version = int(state.get("version", 1))
    if version not in (1, STATE_VERSION):
        raise PipelineError(f"{f}: archive state version {version}, this hubbub reads 1 and {STATE_VERSION}")
    pending = state.get("pending")
    return {
        "version": STATE_VERSION,
        "positions": _positions_from(version, state.get("positions") or {}),
        "pending": pending
        and {"run": pending["run"], "positions": _positions_from(version, pending["positions"])},
    }


def _save_state(out: Path, positions: Positions, pending: dict[str, Any] | None = None) -> None:
    state = {"version": STATE_VERSION, "positions": positions, "pending": pending}
    tmp = out / (STATE_FILE + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / STATE_FILE)


def _offsets(positions: Positions) -> str:
    """Positions as the data source's batch offsets: each channel a list of ``{"epoch", "seq"}``."""
    return json.dumps(
        {ch: [{"epoch": e, "seq": s} for e, s in sorted(eps.items())] for ch, eps in positions.items()}
    )


def _publish_staged(out: Path, run: str) -> int:
    """Move a run's staged Parquet files into the archive (idempotent: what is moved stays moved)."""
    staging = out / STAGING_DIR / run
    moved = 0
    if staging.is_dir():
        for f in sorted(staging.rglob("*.parquet")):
            rel = f.parent.relative_to(staging)
            dest = out / DATA_DIR / rel
            dest.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest / f"{run}-{f.name}")
            moved += 1
        shutil.rmtree(staging)
    return moved


def trim_archived(url: str, positions: Positions, token: str = "") -> dict[str, Any]:
    """Trim a running server's log up to the archived ``positions``, ``{channel: {epoch: seq}}``: every
    (channel, epoch), current or retired, through ``POST /api/v1/trim/<channel>?seq=S&epoch=E`` (native.md
    "Admin"), one call each. Idempotent for what still holds events, so a retry or a rerun is harmless; the
    events of an epoch after its archived seq stay. Returns ``trimmed`` (how many epochs the server trimmed)
    and ``skipped``: the positions (``channel#epoch:seq``) whose epoch holds no events any more (409: trimmed
    to nothing, or gone with retention or with a ``durability = none`` restart), and ``gone``: their
    ``(channel, epoch)`` pairs."""
    from hubbub.pipeline.sources import _channel_path, _error_text, _Http

    conn = _Http(url, token)
    trimmed = 0
    skipped: list[str] = []
    gone: list[tuple[str, str]] = []
    try:
        for channel, eps in sorted(positions.items()):
            for epoch, seq in sorted(eps.items()):
                query = urllib.parse.urlencode({"seq": int(seq), "epoch": epoch})
                status, data = conn.request("POST", f"/api/v1/trim/{_channel_path(channel)}?{query}")
                if status == 409:  # TrimEpochGone
                    skipped.append(position_key(channel, epoch, seq))
                    gone.append((channel, epoch))
                elif status == 400:  # TrimOutOfRange: seq was checked to be >= 0 here, so beyond the top
                    raise _beyond_top(channel, epoch, seq, _error_text(status, data))
                elif status != 200:
                    raise PipelineError(f"trim {channel} epoch {epoch}: {_error_text(status, data)}")
                else:
                    trimmed += 1
    finally:
        conn.close()
    return {"trimmed": trimmed, "skipped": skipped, "gone": gone}


def _beyond_top(channel: str, epoch: str, seq: int, why: str) -> PipelineError:
    """The error for an archived position beyond its epoch's top in the log: that log is not the one the
    archive was made from (a store restored from an older backup, or another server's), and trimming it
    up to the archive's positions would not mean "what is archived"."""
    return PipelineError(
        f"trim {channel} epoch {epoch}: the archive holds it up to seq {seq}, beyond the top of that epoch "
        f"in the log ({why}); is this the log the archive was made from? Nothing more was trimmed"
    )


def _open_for_trim(url: str) -> LogStore:
    """The store at ``url`` opened as its writer, to trim it: this takes the store's lock, so it fails while
    a server (or anything else) has the file open for writing, and nothing else writes it until closed.
    ``fsync``: each trim is synced, and should this process die before closing the store, the server's next
    start does not take it for a writer that may have lost commits (docs/log.md, ``ahead``)."""
    try:
        return open_store(url, "", "fsync", RetentionPolicy(), 0)
    except StorageError as exc:
        raise PipelineError(
            f"--trim with --store opens the store for writing, which needs the server stopped ({exc}); "
            "while it runs, trim through it with --url http://host:port"
        ) from exc
    except ValueError as exc:
        raise PipelineError(str(exc)) from exc


def _trim_store(store: LogStore, positions: Positions) -> dict[str, Any]:
    """Trim every archived (channel, epoch), current or retired, up to its archived seq."""
    trimmed = 0
    skipped: list[str] = []
    gone: list[tuple[str, str]] = []
    for channel, eps in sorted(positions.items()):
        for epoch, seq in sorted(eps.items()):
            try:
                store.trim(channel, seq, epoch=epoch)
            except TrimEpochGone:  # that epoch holds no events any more (trimmed, or gone with retention)
                skipped.append(position_key(channel, epoch, seq))
                gone.append((channel, epoch))
                continue
            except TrimOutOfRange as exc:
                raise _beyond_top(channel, epoch, seq, str(exc)) from exc
            trimmed += 1
    return {"trimmed": trimmed, "skipped": skipped, "gone": gone}


def _forget(outp: Path, gone: list[tuple[str, str]]) -> None:
    """Drop the archived positions of epochs that no longer exist in the log (a trim found none of their
    events: a retired epoch is deleted with its last event). Safe: nothing can be added to such an epoch, and
    epochs are never renamed or reused. Left alone while a run is pending (it rewrites the file itself)."""
    state = _load_state(outp)
    if state["pending"] is not None:
        return
    positions: Positions = state["positions"]
    changed = False
    for channel, epoch in gone:
        eps = positions.get(channel)
        if eps is not None and epoch in eps:
            del eps[epoch]
            changed = True
            if not eps:
                del positions[channel]
    if changed:
        _save_state(outp, positions)


def archive(
    spark: SparkSession,
    url: str,
    out: str,
    channels: str = "/**",
    token: str = "",
    show: bool = False,
    trim: bool = False,
) -> dict[str, Any]:
    """Archive the log to Parquet under ``out/data/root=<first segment>/date=<UTC day>/``, sorted by
    (channel, time) within files. Incremental and idempotent: ``out/_hubbub_archive.json`` keeps the archived
    position of every (channel, epoch), and a run is staged first and then moved in under a write-ahead
    record, so a crash at any point neither loses nor duplicates events on the next run.

    From a store, every epoch is archived, current and retired (docs/log.md "Epochs"): the events a channel
    got after the last run and before a new epoch are archived by the next run, once. A server's HTTP API
    shows current epochs only: their positions are kept, so a later run from the store archives the rest.

    ``trim``: once the run is committed, trim what is archived of every channel matching ``channels``, every
    archived epoch, current and retired: through a server (``http://…``) with its trim API, or from a store
    (``sqlite:///…``, ``postgresql://…``) opened as a writer (a SQLite file is refused while a server has it
    open; a PostgreSQL log is shared, and trims take its log lock as any writer does)."""
    http = url.startswith(("http://", "https://"))
    outp = Path(out)
    with out_lock(outp, "archive"):
        return _archive_locked(spark, url, outp, channels, token, show, trim, http)


def _archive_locked(
    spark: SparkSession,
    url: str,
    outp: Path,
    channels: str,
    token: str,
    show: bool,
    trim: bool,
    http: bool,
) -> dict[str, Any]:
    writer = _open_for_trim(url) if trim and not http else None  # first: fail before any work
    try:
        result = _archive_run(spark, url, outp, channels, token, show)
        if trim:  # only now: every position in the state file is committed to the archive
            pat = parse_pattern(channels)
            positions: Positions = result.pop("_positions")
            todo = {ch: eps for ch, eps in positions.items() if pat.matches(ch)}
            done = _trim_store(writer, todo) if writer is not None else trim_archived(url, todo, token)
            result["trimmed"] = done["trimmed"]
            result["trim_skipped"] = done["skipped"]
            _forget(outp, done["gone"])
    finally:
        if writer is not None:
            writer.close()
    result.pop("_positions", None)
    return result


def _archive_run(
    spark: SparkSession, url: str, outp: Path, channels: str, token: str, show: bool
) -> dict[str, Any]:
    """One archive run (see :func:`archive`); the result also holds the committed positions
    (``_positions``)."""
    state = _load_state(outp)
    pending = state.get("pending")
    if pending:  # a run crashed after staging: roll it forward
        _publish_staged(outp, pending["run"])
        _save_state(outp, pending["positions"])
        state["positions"] = pending["positions"]
    shutil.rmtree(outp / STAGING_DIR, ignore_errors=True)  # staged but never recorded: discard
    positions: Positions = state["positions"]
    run = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    staging = outp / STAGING_DIR / run
    t0 = time.perf_counter()
    # The run's end, decided here: each matching (channel, epoch) up to its top now (endingOffsets), so the
    # new positions are known without reading the output back. A store shows every epoch holding events,
    # current and retired; a server its channels' current epochs. What an epoch loses before it is read
    # (trimmed) is gone from the log anyway: its position still moves to this end.
    # Not the per-process cached source: the driver needs it once, and closes it (its connection or store).
    with contextlib.closing(connect_source(url, token)) as src:
        held = log_epochs(src, channels)
        listed = held if held is not None else src.channels(channels)
    ends: Positions = {}
    planned = 0  # at most this many events (fewer if some are trimmed before they are read)
    for ci in listed:
        done = positions.get(ci.channel, {}).get(ci.epoch, 0)
        if done < ci.top:
            ends.setdefault(ci.channel, {})[ci.epoch] = ci.top
            planned += ci.top - max(done, ci.first - 1)
    events = 0
    if ends:
        r = spark.read.format("hubbub").option("url", url).option("channels", channels)
        if token:
            r = r.option("token", token)
        df = r.option("startingOffsets", _offsets(positions)).option("endingOffsets", _offsets(ends)).load()
        # Built-in expressions only (no Python per row): the first segment, and the UTC day as a DATE (the
        # directory is date=YYYY-MM-DD as for a string, and Spark reads it back as a DATE either way).
        root = F.substring_index(F.substring(F.col("channel"), 2, 1 << 30), "/", 1)
        day = F.date_from_unix_date(F.floor(F.col("time") / (86400 * 10**9)).cast("int"))
        counted = Observation("archive")
        df = (
            df.withColumn("root", F.when(root == "", F.lit("_")).otherwise(root))
            .withColumn("date", day)
            .observe(counted, F.count(F.lit(1)).alias("events"))
            # Each file sorted by (channel, time): (channel, seq) within an epoch, and a channel's epochs one
            # after the other. The source's partitions are ranges of the log, so sorting inside them needs
            # no shuffle, and the writer's own sort by (root, date) is this sort's prefix.
            .sortWithinPartitions("root", "date", "channel", "time")
        )
        with progress(spark, "archive", show, total=planned):
            df.write.partitionBy("root", "date").parquet(str(staging))
        events = int(counted.get["events"])
    new = {ch: dict(eps) for ch, eps in positions.items()}
    for ch, eps in ends.items():
        new.setdefault(ch, {}).update(eps)
    if held is not None:
        # A store shows every epoch that holds events: forget the matching channels' other epochs (trimmed
        # or aged out to nothing). Safe: an epoch without events is never read again from before its first,
        # and a new epoch has a new name.
        pat = parse_pattern(channels)
        holding = {(ci.channel, ci.epoch) for ci in held}
        for ch in [c for c in new if pat.matches(c)]:
            kept = {e: s for e, s in new[ch].items() if (ch, e) in holding}
            if kept:
                new[ch] = kept
            else:
                del new[ch]
    _save_state(outp, positions, {"run": run, "positions": new})
    files = _publish_staged(outp, run)
    _save_state(outp, new)
    shutil.rmtree(outp / STAGING_DIR, ignore_errors=True)
    dt = time.perf_counter() - t0
    return {
        "job": "archive",
        "events": events,
        "channels": len(ends),
        "epochs": sum(len(eps) for eps in ends.values()),
        "files": files,
        "seconds": round(dt, 3),
        "events_per_s": round(events / dt) if dt > 0 else 0,
        "positions": sum(len(eps) for eps in new.values()),
        "_positions": new,
    }


# -- stats ----------------------------------------------------------------------------------------------


def stats(spark: SparkSession, df: DataFrame, out: str, top: int = 5, show: bool = False) -> dict[str, Any]:
    """Per channel: events, bytes, publishers, first and last event; events per hour; a PNG chart of the
    ``top`` busiest channels over time. Writes Parquet and CSV under ``out``."""
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    ev = df.withColumn("size", F.expr(SIZE_SQL)).withColumn("ts", _ts_micros())
    per_channel = ev.groupBy("channel").agg(
        F.count("*").alias("events"),
        F.sum("size").alias("bytes"),
        F.countDistinct("publisher_dialect", "publisher_user", "publisher_app").alias("publishers"),
        F.min("ts").alias("first_time"),
        F.max("ts").alias("last_time"),
        F.min("seq").alias("first_seq"),
        F.max("seq").alias("last_seq"),
    )
    hourly = ev.groupBy("channel", F.date_trunc("hour", "ts").alias("hour")).agg(
        F.count("*").alias("events"), F.sum("size").alias("bytes")
    )
    with progress(spark, "stats", show):
        pc = per_channel.orderBy(F.desc("events"), "channel").toPandas()
        hr = hourly.orderBy("channel", "hour").toPandas()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(pc, preserve_index=False), outp / "channels.parquet")
    pq.write_table(pa.Table.from_pandas(hr, preserve_index=False), outp / "hourly.parquet")
    pc.to_csv(outp / "channels.csv", index=False)
    hr.to_csv(outp / "hourly.csv", index=False)
    busiest = list(pc["channel"][:top])
    _chart(hr, busiest, outp / "busiest.png")
    return {
        "job": "stats",
        "channels": len(pc),
        "events": int(pc["events"].sum()) if len(pc) else 0,
        "bytes": int(pc["bytes"].sum()) if len(pc) else 0,
        "busiest": busiest,
        "out": str(outp),
    }


def _chart(hourly: Any, channels: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for ch in channels:
        rows = hourly[hourly["channel"] == ch]
        ax.plot(rows["hour"], rows["events"], marker="o", label=ch)
    ax.set_title(f"Busiest {len(channels)} channels: events per hour (UTC)")
    ax.set_xlabel("hour")
    ax.set_ylabel("events")
    if channels:
        ax.legend(loc="upper left", fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- audit ----------------------------------------------------------------------------------------------


def audit(spark: SparkSession, df: DataFrame, out: str, show: bool = False) -> dict[str, Any]:
    """Sequence gaps and duplicates per (channel, epoch). Writes ``audit.csv``/``gaps.csv`` (and Parquet)."""
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    keyed = df.select("channel", "epoch", "seq")
    summary = keyed.groupBy("channel", "epoch").agg(
        F.count("*").alias("events"),
        F.countDistinct("seq").alias("distinct_seqs"),
        F.min("seq").alias("first_seq"),
        F.max("seq").alias("last_seq"),
    )
    summary = summary.withColumn("duplicates", F.col("events") - F.col("distinct_seqs")).withColumn(
        "missing", F.col("last_seq") - F.col("first_seq") + 1 - F.col("distinct_seqs")
    )
    w = Window.partitionBy("channel", "epoch").orderBy("seq")
    gaps = (
        keyed.distinct()
        .withColumn("prev", F.lag("seq").over(w))
        .where(F.col("seq") - F.col("prev") > 1)
        .select("channel", "epoch", (F.col("prev") + 1).alias("gap_from"), (F.col("seq") - 1).alias("gap_to"))
    )
    with progress(spark, "audit", show):
        s = summary.orderBy("channel", "epoch").toPandas()
        g = gaps.orderBy("channel", "epoch", "gap_from").toPandas()
    s.to_csv(outp / "audit.csv", index=False)
    g.to_csv(outp / "gaps.csv", index=False)
    s.to_parquet(outp / "audit.parquet", index=False)
    return {
        "job": "audit",
        "channels": int(s["channel"].nunique()) if len(s) else 0,
        "events": int(s["events"].sum()) if len(s) else 0,
        "duplicates": int(s["duplicates"].sum()) if len(s) else 0,
        "missing": int(s["missing"].sum()) if len(s) else 0,
        "gaps": len(g),
        "ok": bool(len(g) == 0 and (len(s) == 0 or int(s["duplicates"].sum()) == 0)),
    }


# -- compact, export -------------------------------------------------------------------------------------


def compact(
    spark: SparkSession, df: DataFrame, out: str, key_header: str, show: bool = False
) -> dict[str, Any]:
    """Keep the latest event (highest time) per (channel, key), the key taken from header ``key_header``;
    events without the header are dropped. Parquet under ``out``, sorted by (channel, seq)."""
    keyed = df.withColumn("key", F.col("headers").getItem(key_header)).where(F.col("key").isNotNull())
    w = Window.partitionBy("channel", "key").orderBy(F.desc("time"))
    latest = keyed.withColumn("_rn", F.row_number().over(w)).where("_rn = 1").drop("_rn", "key")
    with progress(spark, "compact", show):
        latest.orderBy("channel", "seq").write.mode("overwrite").parquet(out)
        n = spark.read.parquet(out).count()
    return {"job": "compact", "events": n, "key_header": key_header, "out": out}


def export(
    spark: SparkSession, df: DataFrame, out: str, fmt: str = "jsonl", show: bool = False
) -> dict[str, Any]:
    """Write the events as JSON lines (payload base64, as Spark writes binary) or Parquet, sorted."""
    ordered = df.orderBy("channel", "epoch", "seq")
    # The total for the progress display costs a pass over the input: only when it is shown.
    with progress(spark, "export", show, total=df.count() if show else None):
        if fmt == "jsonl":
            ordered.write.mode("overwrite").json(out)
            n = spark.read.json(out).count()
        elif fmt == "parquet":
            ordered.write.mode("overwrite").parquet(out)
            n = spark.read.parquet(out).count()
        else:
            raise PipelineError(f"export format must be jsonl or parquet, not {fmt!r}")
    return {"job": "export", "format": fmt, "events": n, "out": out}


# -- backfill -------------------------------------------------------------------------------------------


#: The columns the sink reads (docs/pipeline.md "Sink"), in the record schema's order.
_SINK_COLUMNS = ("channel", "seq", "epoch", "headers", "tags", "payload", "content_type")


def _position(df: DataFrame) -> Column:
    return F.concat(F.col("channel"), F.lit("#"), F.col("epoch"), F.lit(":"), F.col("seq").cast("string"))


#: The largest input (bytes of local Parquet files) that :func:`backfill` reads and sorts in one task.
ONE_TASK_BYTES = 128 << 20


def _one_task(df: DataFrame) -> bool:
    """Whether ``df``'s input is local files of at most :data:`ONE_TASK_BYTES` in all, small enough for one
    task to read and order: then no shuffle is needed to keep each channel in one partition. A shuffle by
    channel lets several tasks publish at once, but they publish to one server, which appends at its own
    pace; its map stage has to finish (reading and writing out every event) before the first publish, and
    in a short job its code is not compiled yet: on a 2-core machine a 200k-event backfill spent a quarter
    less of the JVM's CPU without it. Above the limit, or for files elsewhere (not ``file:``), the read is
    spread over tasks as Spark splits it, and Spark sorts each (its sort streams from disk, where the sink's
    order takes rows at random from its file)."""
    total = 0
    for f in df.inputFiles():
        u = urllib.parse.urlparse(f)
        if u.scheme not in ("", "file"):
            return False
        try:
            total += os.stat(urllib.parse.unquote(u.path)).st_size
        except OSError:
            return False
        if total > ONE_TASK_BYTES:
            return False
    return True


def backfill(
    spark: SparkSession,
    input_dir: str,
    url: str,
    channels: str = "/**",
    channel_prefix: str = "",
    token: str = "",
    show: bool = False,
    *,
    native_address: str = "",
) -> dict[str, Any]:
    """Publish archived or exported events into a running server through the sink (pipelined over one
    native connection per task: ``native_address``, the sink's ``nativeAddress``, or the WebSocket route of
    ``url``; HTTP when the server offers neither).

    Idempotent however much later it reruns: every published event carries its source position in header
    ``hubbub-source`` (and as its idempotency key, which covers task retries inside the server's window);
    before publishing, the events whose position the target already holds are skipped.

    Only the columns the sink reads are read (Parquet reads no others, and Spark hands no others to the
    sink's Python workers). The target's positions are read once (cached), and only when a target channel
    matching the pattern holds events: a first run into a fresh target reads nothing of it (one listing
    request) and joins nothing. The events read and left to publish are counted as the write goes
    (observed metrics), not by passes of their own, except that a progress display counts what is left first.

    Order: each channel's events go to one partition and are published in log order, whatever order the
    input's files are read in: its epochs oldest first (by the events' times; an input without a ``time``
    column, by epoch name), each epoch's events in seq order. An input of local files of at most
    :data:`ONE_TASK_BYTES` is read by one task, without a shuffle (see :func:`_one_task`), and ordered by the
    sink (its ``orderBy``: Arrow in the task's Python worker, cheaper in a short job than Spark's sort, whose
    code the JVM has yet to compile); a larger one, or one elsewhere, is shuffled by channel into several
    partitions, each sorted by Spark."""
    src = load(spark, input_dir=input_dir, channels=channels)
    # A channel's epochs go oldest first: by the events' log time where the input has it (an archive does;
    # the log's times only grow, so within a channel time order is epoch after epoch, each in seq order),
    # else by epoch name (an input without times). Epoch names are random, not ordered by age.
    by_time = "time" in src.columns
    src = src.select(*[c for c in _SINK_COLUMNS if c in src.columns], *(["time"] if by_time else []))
    prefix = channel_prefix.rstrip("/")
    target_pattern = (prefix + channels) if prefix else channels
    t0 = time.perf_counter()
    # The target's positions: only when some matching channel of the target holds events (a fresh target,
    # the common first run, has none: its listing, one request, spares a Spark job over the target).
    with contextlib.closing(connect_source(url, token)) as target:
        holding = bool(target.channels(target_pattern))
    present = (
        spark.read.format("hubbub")
        .option("url", url)
        .option("channels", target_pattern)
        .option("token", token)
        .load()
        .select(F.col("headers").getItem(SOURCE_HEADER).alias("pos"))
        .where(F.col("pos").isNotNull())
        .distinct()
        .cache()
        if holding
        else None
    )
    try:
        joined = present is not None and present.count() > 0
        # The events read and those left to publish are counted as the write goes (no pass of their own),
        # unless a progress display needs the total first.
        read, left = Observation("backfill read"), Observation("backfill left")
        todo = src.observe(read, F.count(F.lit(1)).alias("n"))
        if joined:
            assert present is not None
            todo = todo.withColumn("pos", _position(todo)).join(present, on="pos", how="left_anti")
            todo = todo.drop("pos").observe(left, F.count(F.lit(1)).alias("n"))
        order = ("channel", "time", "epoch", "seq") if by_time else ("channel", "epoch", "seq")
        one = _one_task(src)
        if one:
            todo = todo.coalesce(1)
        else:
            todo = todo.repartition(4, "channel").sortWithinPartitions(*order)
            if by_time:
                todo = todo.drop("time")  # a projection: the sort's order stays
        w = todo.write.format("hubbub").option("url", url).mode("append")
        if one:
            w = w.option("orderBy", ",".join(order))
        if prefix:
            w = w.option("channelPrefix", prefix)
        if token:
            w = w.option("token", token)
        if native_address:
            w = w.option("nativeAddress", native_address)
        with progress(spark, "backfill", show) as shown:
            if show:
                shown.total = todo.count()
            w.save()
        total = int(read.get["n"])
        pending = int(left.get["n"]) if joined else total
    finally:
        if present is not None:
            present.unpersist()
    return {
        "job": "backfill",
        "source_events": total,
        "already_present": total - pending,
        "published": pending,
        "seconds": round(time.perf_counter() - t0, 3),
    }
