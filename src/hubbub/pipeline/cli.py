"""``hubbub pipeline <job>``: the pipeline's jobs on the command line (docs/pipeline.md).

This module imports neither pyspark nor the jobs until a job runs, so ``hubbub --help`` works without the
``spark`` extra; ``retention``, which only drops an archive's partitions, never imports them
(:mod:`hubbub.pipeline.archive_dir`). Every job prints its summary as one JSON line on standard output;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["BACKFILL_JVM_OPTIONS", "add_pipeline_commands", "job_conf"]

JOBS = {
    "archive": "archive the log to Parquet, partitioned by channel root and date (incremental, idempotent)",
    "stats": "per-channel counts, bytes, publishers, first/last event, events per hour; CSV, Parquet, PNG",
    "audit": "sequence gaps and duplicates per channel and epoch",
    "retention": "drop archived partitions older than N days",
    "compact": "keep the latest event per key (taken from a header)",
    "export": "JSON lines or Parquet for a channel pattern and time range",
    "backfill": "publish an archive or export into a running server, idempotently",
}


def add_pipeline_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``pipeline`` and its jobs on the ``hubbub`` command's subparsers."""
    pipe = subparsers.add_parser(
        "pipeline",
        help="data pipeline jobs on Apache Spark (needs the spark extra)",
        description="Run a data pipeline job on Spark: local mode by default, or any cluster with --master.",
    )
    jobs = pipe.add_subparsers(dest="job", metavar="JOB")
    for name, text in JOBS.items():
        p = jobs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument(
            "--master",
            default=os.environ.get("HUBBUB_SPARK_MASTER", "local[2]"),
            help="Spark master: local[N] or spark://host:port [env HUBBUB_SPARK_MASTER; default local[2]]",
        )
        p.add_argument(
            "--conf", action="append", default=[], metavar="K=V", help="a Spark setting (repeatable)"
        )
        p.add_argument("--no-progress", action="store_true", help="do not show progress on stderr")
        if name != "retention":
            src = p.add_mutually_exclusive_group(required=name in ("archive",))
            src.add_argument("--url", default="", help="a running server, http://host:port")
            src.add_argument(
                "--store", default="", help="a log store, sqlite:///ABS/PATH.db or postgresql://… (read-only)"
            )
            if name != "archive":
                src.add_argument("--input", default="", help="an archive or Parquet export directory")
            p.add_argument("--channels", default="/**", help="channel pattern (default /**)")
            p.add_argument("--token", default=os.environ.get("HUBBUB_TOKEN", ""), help="bearer token")
        if name in ("stats", "export"):
            p.add_argument("--from", dest="start_time", default="", help="start time (ns or ISO-8601, UTC)")
            p.add_argument("--to", dest="end_time", default="", help="end time, exclusive")
        if name == "backfill":
            p.add_argument("--target", required=True, help="the server to publish to, http://host:port")
            p.add_argument("--channel-prefix", default="", help="publish /a/b as PREFIX/a/b")
            p.add_argument(
                "--native-address",
                default="",
                help="the target's native TCP listener, tcp://host:port (default: the native WebSocket "
                "route on --target's port; HTTP if neither is offered)",
            )
        else:
            p.add_argument("--out", required=True, help="output directory")
        if name == "archive":
            p.add_argument(
                "--trim",
                action="store_true",
                help="then trim the log up to what is archived, every epoch (current and retired): through "
                "the server (--url), or the store itself (--store; only while no server has it open)",
            )
        if name == "retention":
            p.add_argument("--days", type=int, required=True, help="keep this many days")
        if name == "compact":
            p.add_argument("--key-header", required=True, help="header holding the key")
        if name == "export":
            p.add_argument(
                "--format",
                choices=("jsonl", "parquet"),
                default="jsonl",
                help="output format (default jsonl)",
            )
        if name == "stats":
            p.add_argument("--top", type=int, default=5, help="channels in the chart (default 5)")
        p.set_defaults(func=_run, _command=f"pipeline {name}")

    def usage(args: argparse.Namespace) -> int:
        pipe.print_help()
        return 2

    pipe.set_defaults(func=usage)


#: JVM options of a ``backfill`` in local mode unless ``--conf spark.driver.extraJavaOptions`` says otherwise:
#: the C1 compiler only. A backfill's JVM mostly converts rows once (Parquet, shuffle, sort, Arrow for the
#: sink's Python workers), so the C2 compiler's work never pays back within a job; on 2 cores it took 2 of
#: the JVM's 5 CPU seconds per 200k events, and C1 only halved the JVM's CPU per event at 200k events and cut
#: it by a fifth at 600k (docs/pipeline.md "Sink and backfill"). Not for the other jobs: a long read of the
#: ``hubbub`` source runs about a fifth slower on C1 code.
BACKFILL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def job_conf(job: str, master: str, conf: dict[str, str]) -> dict[str, str]:
    """The Spark settings a job's session starts with: ``conf`` (``--conf``), and for a ``backfill`` on a
    local master :data:`BACKFILL_JVM_OPTIONS` unless ``conf`` sets the driver's JVM options itself (in
    local mode the driver's JVM runs the tasks too)."""
    out = dict(conf)
    if job == "backfill" and master.startswith("local") and "spark.driver.extraJavaOptions" not in out:
        out["spark.driver.extraJavaOptions"] = BACKFILL_JVM_OPTIONS
    return out


def _refusal(args: argparse.Namespace) -> str:
    """What is wrong with the arguments of a Spark job ("" when nothing is): checked before pyspark is
    imported and the job's session started, so that a usage error answers at once instead of after a JVM's
    start-up (seconds of CPU). The jobs check the same again (:func:`hubbub.pipeline.jobs.load`, the
    source's options) for their callers in Python."""
    from hubbub.channels import parse_pattern
    from hubbub.errors import BadChannel
    from hubbub.pipeline.options import parse_time

    if args.job == "backfill" and not args.input:
        return "backfill reads an archive or export: give --input DIR"
    if args.job != "archive" and not (args.url or args.store or args.input):
        return "give a source: --url, --store or --input"
    try:
        parse_pattern(args.channels)
    except BadChannel as exc:
        return f"not a channel pattern: {args.channels!r} ({exc})"
    for value in (getattr(args, "start_time", ""), getattr(args, "end_time", "")):
        if value:
            try:
                parse_time(value)
            except ValueError:
                return f"not a time (ns since the Unix epoch, or ISO-8601): {value!r}"
    return ""


def _run(args: argparse.Namespace) -> int:
    from hubbub.errors import PipelineError

    if args.job == "retention":
        # Only drops files: no Spark session, so not even pyspark's import (half a CPU-second).
        from hubbub.pipeline.archive_dir import retention

        try:
            print(json.dumps(retention(args.out, args.days)))
        except PipelineError as exc:
            print(f"hubbub {args._command}: {exc}", file=sys.stderr)
            return 1
        return 0
    refused = _refusal(args)
    if refused:
        print(f"hubbub {args._command}: {refused}", file=sys.stderr)
        return 1
    try:
        from hubbub.pipeline import jobs
    except ImportError as exc:
        print(
            f"hubbub {args._command}: needs the spark extra (pip install 'hubbub[spark]'): {exc}",
            file=sys.stderr,
        )
        return 2
    conf = job_conf(args.job, args.master, dict(kv.split("=", 1) for kv in args.conf if "=" in kv))
    show = not args.no_progress and sys.stderr.isatty()
    try:
        spark = jobs.make_session(args.master, f"hubbub-{args.job}", **conf)
    except Exception as exc:  # Java missing, master unreachable
        print(f"hubbub {args._command}: cannot start Spark: {exc}", file=sys.stderr)
        return 1
    spark.sparkContext.setLogLevel("ERROR")
    url = args.url or args.store
    try:
        result: dict[str, Any]
        if args.job == "archive":
            result = jobs.archive(spark, url, args.out, args.channels, args.token, show, args.trim)
        elif args.job == "backfill":
            if not args.input:
                raise PipelineError("backfill reads an archive or export: give --input DIR")
            result = jobs.backfill(
                spark,
                args.input,
                args.target,
                args.channels,
                args.channel_prefix,
                args.token,
                show,
                native_address=args.native_address,
            )
        else:
            kw: dict[str, Any] = {}
            if args.job in ("stats", "export"):
                kw = {"start_time": args.start_time, "end_time": args.end_time}
            df = jobs.load(
                spark, url=url, input_dir=args.input, channels=args.channels, token=args.token, **kw
            )
            if args.job == "stats":
                result = jobs.stats(spark, df, args.out, args.top, show)
            elif args.job == "audit":
                result = jobs.audit(spark, df, args.out, show)
            elif args.job == "compact":
                result = jobs.compact(spark, df, args.out, args.key_header, show)
            else:
                result = jobs.export(spark, df, args.out, args.format, show)
    except PipelineError as exc:
        print(f"hubbub {args._command}: {exc}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print(json.dumps(result, default=str))
    if result.get("ok") is False:  # audit: gaps or duplicates found
        print(f"hubbub {args._command}: found gaps or duplicates (see {args.out})", file=sys.stderr)
        return 1
    return 0
