"""Measure the data pipeline (docs/pipeline.md): source read, archive, Parquet read, streaming latency.

    PYTHONPATH=src PYSPARK_PYTHON=$(which python) SPARK_LOCAL_IP=127.0.0.1 \
        python bench/pipeline_bench.py --events 1000000 --dir /tmp/hubbub-bench

Builds a SQLite log of N events (10 channels, 100-byte payloads, a third with a header; ``--payloads mixed``:
64 B to 32 KiB, 887 B on average, see ``payloads.MIXED``), then times each step in ``local[2]``, each rate
also in MB/s of payload (``*_mb_per_s``); streaming latency runs a real server and a streaming query with the
default trigger. Prints one JSON object. ``archive_cpu_s`` is the CPU time of the whole process tree (this
driver, Spark's JVM, the Python workers) during the archive, which a busy machine distorts less than the rate.
``--only-archive`` runs the archive alone, first in a fresh session as ``hubbub pipeline archive`` does;
``--only-sink`` runs the sink and backfill scenarios alone: ``sink_events_per_s`` writes ``--sink-events``
events of the log (10 channels, ``minPartitions`` 2) to a real server with ``format("hubbub")`` over
``--sink-transport`` (``native``: one pipelined native connection per task, to the native TCP listener;
``http``: one POST per row, the old path), ``backfill_events_per_s`` runs ``jobs.backfill`` of an archive of
those events into another fresh server (its target read included; ``backfill_cpu_us_per_event`` as for the
sink); ``--backfill-command`` then runs the same backfill as ``hubbub pipeline backfill`` does, a command of
its own with its own Spark session (a fresh JVM, C1 only), into a third fresh server:
``backfill_command_events_per_s`` from the job's own ``seconds``, ``backfill_command_wall_s`` the whole
command, JVM start included;
``--server-durability`` sets those servers' ``durability`` (``fsync``: each commit waits for the disk);
``--sink-select`` has the sink scenario write only the columns the sink reads (``jobs._SINK_COLUMNS``,
what ``backfill`` writes) instead of the whole record; ``--conf K=V`` passes Spark settings (to compare
them). ``--figure PNG`` draws measured against target from one or more such JSON outputs
(``--results FILE …``; their median) without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from payloads import payload_sizes
from pyspark.sql import SparkSession

from hubbub.events import Publisher
from hubbub.log import AppendRequest, SqliteLogStore
from hubbub.pipeline import jobs


def build(path: Path, n: int, kind: str = "fixed") -> None:
    st = SqliteLogStore(path)
    pub = Publisher("native", "u", "app", "")
    sizes = payload_sizes(n, kind)
    # Mixed: each payload a slice of 1 MiB of random bytes at a random place, so payloads differ and do not
    # compress (as many real ones, already compressed or encrypted, do not); fixed: as before, all alike.
    rnd = random.Random(2)
    blob = rnd.randbytes((1 << 20) + 32768) if kind == "mixed" else b"x" * 100
    offsets = [rnd.randrange(1 << 20) if kind == "mixed" else 0 for _ in range(n)]
    for b in range(n // 1000):
        st.append(
            [
                AppendRequest(
                    f"/bench/c{i % 10}",
                    pub,
                    blob[offsets[b * 1000 + i] : offsets[b * 1000 + i] + sizes[b * 1000 + i]],
                    "text/plain",
                    {"k": "v"} if i % 3 == 0 else {},
                )
                for i in range(1000)
            ]
        )
    st.close()


def tree_cpu_s(split: bool = False) -> Any:
    """CPU seconds (user + system, with reaped children) of this process and all its descendants (/proc);
    with ``split``, by kind: ``{"jvm": …, "server": …, "python": …}`` (the server: a ``hubbub serve`` child;
    python: this driver and Spark's Python workers)."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    kinds: dict[int, str] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        parent[int(d)] = int(fields[1])
        ticks[int(d)] = sum(int(x) for x in fields[11:15])
        if split:
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            kinds[int(d)] = "jvm" if cmd[0].endswith(b"java") else "server" if b"serve" in cmd else "python"
    me = os.getpid()

    def mine(pid: int) -> bool:
        while pid > 1:
            if pid == me:
                return True
            pid = parent.get(pid, 0)
        return False

    hz = os.sysconf("SC_CLK_TCK")
    if split:
        out: dict[str, float] = {"jvm": 0.0, "server": 0.0, "python": 0.0}
        for pid, t in ticks.items():
            if mine(pid):
                out[kinds.get(pid, "python")] += t / hz
        return out
    return sum(t for pid, t in ticks.items() if mine(pid)) / hz


def timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


TARGETS = {
    "source_read_events_per_s": ("source read\n(store, local[2])", 500_000),
    "archive_events_per_s": ("archive", 200_000),
    "parquet_read_events_per_s": ("Parquet read", 1_000_000),
}


def figure(results: list[Path], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(r.read_text()) for r in results]
    keys = list(TARGETS)
    measured = [statistics.median(run[k] for run in runs) for k in keys]
    xs = range(len(keys))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.bar([x - 0.2 for x in xs], measured, 0.4, label=f"measured (median of {len(runs)})")
    ax.bar([x + 0.2 for x in xs], [TARGETS[k][1] for k in keys], 0.4, label="target")
    ax.set_xticks(list(xs), [TARGETS[k][0] for k in keys])
    ax.set_yscale("log")
    ax.set_ylabel("events/s (log)")
    ax.set_title(f"hubbub pipeline, {runs[0]['events'] // 1_000_000}M events, 2-core machine, local[2]")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/hubbub-bench")
    ap.add_argument(
        "--payloads",
        choices=("fixed", "mixed"),
        default="fixed",
        help="payload sizes of the log built in --dir: fixed, 100 bytes; mixed, 64 B to 32 KiB, 887 B on "
        "average (MIXED). A --dir keeps the log it has: use one per kind",
    )
    ap.add_argument("--figure", type=Path, help="draw this PNG from --results instead of measuring")
    ap.add_argument("--results", type=Path, nargs="*", default=[])
    ap.add_argument("--only-archive", action="store_true", help="run the archive alone, first in the session")
    ap.add_argument("--only-sink", action="store_true", help="run the sink and backfill scenarios alone")
    ap.add_argument("--sink-events", type=int, default=200_000, help="events the sink scenario writes")
    ap.add_argument("--sink-transport", choices=("native", "http"), default="native")
    ap.add_argument(
        "--server-durability",
        choices=("commit", "fsync", "none"),
        default="commit",
        help="the durability of the sink's and backfill's servers (default commit, the server's default)",
    )
    ap.add_argument(
        "--sink-select",
        action="store_true",
        help="the sink scenario writes only the columns the sink reads (as backfill does), not every column",
    )
    ap.add_argument(
        "--backfill-command",
        action="store_true",
        help="with --only-sink: also time the backfill as the hubbub pipeline backfill command, a fresh JVM",
    )
    ap.add_argument("--conf", action="append", default=[], metavar="K=V", help="a Spark setting (repeatable)")
    ap.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="K=V",
        help="an option of the sink's write, e.g. publishWindow=4096 (repeatable)",
    )
    ap.add_argument(
        "--sink-warmup",
        type=int,
        default=100,
        metavar="N",
        help="rows the untimed warm-up write sends first (default 100: the Python workers start); "
        "some 100000 also warm Spark's JIT, so the timed write measures the steady rate",
    )
    args = ap.parse_args()
    if args.figure:
        figure(args.results, args.figure)
        return
    d = Path(args.dir)
    db = d / "log.db"
    if not db.exists():
        d.mkdir(parents=True, exist_ok=True)
        build(db, args.events, args.payloads)
    url = f"sqlite:///{db}"
    conf = dict(kv.split("=", 1) for kv in args.conf)
    spark = jobs.make_session("local[2]", **{"spark.ui.enabled": "false", **conf})
    spark.sparkContext.setLogLevel("ERROR")
    # Bytes per event as the figures count them: the payload (headers are a few bytes here).
    mean = sum(payload_sizes(args.events, args.payloads)) / max(1, args.events)
    out: dict[str, object] = {
        "events": args.events,
        "payloads": args.payloads,
        "payload_mean_bytes": round(mean),
    }
    out["conf"] = conf
    try:
        run(args, spark, url, d, out)
    finally:
        spark.stop()
    # MB/s (10^6 payload bytes a second) beside every rate.
    for key in [k for k in out if k.endswith("_events_per_s")]:
        out[key.replace("_events_per_s", "_mb_per_s")] = round(float(out[key]) * mean / 1e6, 2)  # type: ignore[arg-type]
    print(json.dumps(out))


def run(args: argparse.Namespace, spark: SparkSession, url: str, d: Path, out: dict[str, object]) -> None:
    if args.only_sink:
        opts = dict(kv.split("=", 1) for kv in args.sink_option)
        sink(
            spark,
            url,
            d,
            out,
            args.sink_events,
            args.sink_transport,
            args.sink_select,
            opts,
            args.sink_warmup,
            args.server_durability,
        )
        if args.backfill_command and args.sink_transport == "native":
            spark.stop()  # the command starts a JVM of its own
            backfill_command(d, out)
        return
    if args.only_archive:
        archive(spark, url, d, out)
        return
    df = spark.read.format("hubbub").option("url", url).load()
    df.selectExpr("count(*)").collect()  # warm up the Python workers
    read_s = min(timed(lambda: df.selectExpr("count(*)", "sum(length(payload))").collect()) for _ in range(2))
    out["source_read_events_per_s"] = round(args.events / read_s)
    archive(spark, url, d, out)
    pq = spark.read.parquet(str(d / "archive" / "data"))
    pq.selectExpr("count(*)").collect()
    pq_s = min(timed(lambda: pq.selectExpr("count(*)", "sum(length(payload))").collect()) for _ in range(3))
    out["parquet_read_events_per_s"] = round(args.events / pq_s)
    out["streaming_latency_ms"] = latency(spark, d)
    sink(spark, url, d, out, args.sink_events, "native")


def archive(spark: SparkSession, url: str, d: Path, out: dict[str, object]) -> None:
    shutil.rmtree(d / "archive", ignore_errors=True)
    cpu = tree_cpu_s(split=True)
    res = jobs.archive(spark, url, str(d / "archive"))
    after = tree_cpu_s(split=True)
    out["archive_cpu_s"] = round(sum(after.values()) - sum(cpu.values()), 2)
    out["archive_cpu_s_by_process"] = {k: round(after[k] - cpu[k], 2) for k in after}  # jvm, python
    out["archive_events_per_s"] = res["events_per_s"]


def sink(
    spark: SparkSession,
    url: str,
    d: Path,
    out: dict[str, object],
    n: int,
    transport: str,
    select: bool = False,
    options: dict[str, str] | None = None,
    warmup: int = 100,
    durability: str = "commit",
) -> None:
    """Sink and backfill into fresh real servers (see the module docstring); ``options`` go to the sink's
    write as they are."""
    from tests.integration.serverproc import ServerProcess

    per = max(1, n // 10)
    n = per * 10
    df = (
        spark.read.format("hubbub").option("url", url).option("endSeq", per).option("minPartitions", 2).load()
    )
    if select:
        df = df.select(*jobs._SINK_COLUMNS)
        out["sink_select"] = True
    df.cache().count()  # the rows are in memory: the write is what is timed
    out["sink_events"] = n
    out["sink_transport"] = transport
    shutil.rmtree(d / "sink-server", ignore_errors=True)  # a fresh log: no event is a duplicate
    out["server_durability"] = durability
    srv = ServerProcess(d / "sink-server", extra=["--durability", durability]).start()
    try:
        target = f"http://127.0.0.1:{srv.ports['http']}"
        w = df.write.format("hubbub").option("url", target).option("channelPrefix", "/sink")
        w = w.option("transport", transport)
        for k, v in (options or {}).items():
            w = w.option(k, v)
        out["sink_options"] = options or {}
        if transport == "native":
            w = w.option("nativeAddress", f"tcp://127.0.0.1:{srv.ports['native']}")
        # Warm up outside the timed write: Spark's Python workers start and import the sink (and with a
        # large --sink-warmup, the JVM compiles its hot paths).
        out["sink_warmup"] = warmup
        warm = df.limit(warmup).write.format("hubbub").option("url", target).option("channelPrefix", "/warm")
        warm.option("transport", transport).mode("append").save()
        cpu = tree_cpu_s(split=True)
        t = timed(lambda: w.mode("append").save())
        out["sink_events_per_s"] = round(n / t)
        after = tree_cpu_s(split=True)
        # CPU µs per event: Spark's JVM, the Python side (workers: rows, the publisher), the server.
        out["sink_cpu_us_per_event"] = {k: round((after[k] - cpu[k]) / n * 1e6, 1) for k in after}
    finally:
        srv.terminate()
    df.unpersist()
    if transport != "native":
        return
    arch = d / "sink-archive"
    shutil.rmtree(arch, ignore_errors=True)
    df.write.parquet(str(arch / "data"))
    shutil.rmtree(d / "backfill-server", ignore_errors=True)
    srv = ServerProcess(d / "backfill-server", extra=["--durability", durability]).start()
    try:
        target = f"http://127.0.0.1:{srv.ports['http']}"
        cpu = tree_cpu_s(split=True)
        res = jobs.backfill(
            spark, str(arch / "data"), target, native_address=f"tcp://127.0.0.1:{srv.ports['native']}"
        )
        after = tree_cpu_s(split=True)
        done = max(1, int(res["published"]))
        out["backfill_cpu_us_per_event"] = {k: round((after[k] - cpu[k]) / done * 1e6, 1) for k in after}
        out["backfill_events"] = res["published"]
        out["backfill_seconds"] = res["seconds"]
        out["backfill_events_per_s"] = round(int(res["published"]) / float(res["seconds"]))
    finally:
        srv.terminate()


def backfill_command(d: Path, out: dict[str, object]) -> None:
    """``hubbub pipeline backfill`` of the sink scenario's archive into a fresh server, as a user runs it."""
    from tests.integration.serverproc import ServerProcess

    shutil.rmtree(d / "command-server", ignore_errors=True)
    srv = ServerProcess(d / "command-server").start()
    try:
        cmd = [
            sys.executable, "-m", "hubbub", "pipeline", "backfill", "--master", "local[2]",
            "--input", str(d / "sink-archive" / "data"),
            "--target", f"http://127.0.0.1:{srv.ports['http']}",
            "--native-address", f"tcp://127.0.0.1:{srv.ports['native']}",
            "--no-progress", "--conf", "spark.ui.enabled=false",
        ]  # fmt: skip
        src = str(Path(__file__).resolve().parents[1] / "src")
        env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"hubbub pipeline backfill failed ({r.returncode}):\n{r.stderr[-2000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        out["backfill_command_events"] = res["published"]
        out["backfill_command_seconds"] = res["seconds"]
        out["backfill_command_events_per_s"] = round(int(res["published"]) / float(res["seconds"]))
        out["backfill_command_wall_s"] = round(wall, 2)
    finally:
        srv.terminate()


def latency(spark: object, d: Path) -> dict[str, float]:
    from tests.integration.serverproc import ServerProcess

    from hubbub.client import Client

    srv = ServerProcess(d / "server").start()
    url = f"http://127.0.0.1:{srv.ports['http']}"
    lat: list[float] = []
    try:
        with Client.connect(url) as c:
            c.publish("/lat/warm", b"w")

            def on_batch(batch: object, _id: int) -> None:
                now = time.time_ns()
                for row in batch.select("time").collect():  # type: ignore[attr-defined]
                    lat.append((now - row.time) / 1e6)

            q = (
                spark.readStream.format("hubbub")  # type: ignore[attr-defined]
                .option("url", url)
                .option("channels", "/lat/**")
                .option("startingOffsets", "latest")
                .load()
                .writeStream.foreachBatch(on_batch)
                .start()
            )
            time.sleep(5)
            stop = threading.Event()
            for i in range(40):
                c.publish(f"/lat/{i % 2}", str(i).encode())
                stop.wait(0.25)
            time.sleep(3)
            q.stop()
    finally:
        srv.terminate()
    lat.sort()
    return {
        "n": len(lat),
        "p50": round(statistics.median(lat), 1),
        "p90": round(lat[int(len(lat) * 0.9) - 1], 1),
        "max": round(lat[-1], 1),
    }


if __name__ == "__main__":
    main()
