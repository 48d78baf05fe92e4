"""A class-data-sharing archive of the classes Spark's JVMs load, made once and mapped by every JVM of the
Spark tests after it: the driver of each test session, of each ``hubbub pipeline`` child, the standalone
cluster's master, worker and executors.

A Spark JVM spends most of its start-up loading and verifying some ten thousand classes from 280 jars;
mapped from an archive (JDK 17's dynamic AppCDS, ``-XX:ArchiveClassesAtExit``), a local session's start,
small job and stop took 7.3 CPU-s where it took 12.5, in half the wall time (load 15, 2 cores). The archive
is made by a process of its own (``python -m tests.pipeline.jvm_archive PATH``), started when the first
Spark test is collected, next to the tests and never waited for: a JVM started before it is ready starts
as before, without it (:func:`share_options` looks at each start). It is kept in this user's temporary
directory between runs, named by what it depends on (the Java binary, pyspark's version and the JVM flags):
another JDK or Spark makes a new one. A JVM whose class path or collector differs from the archive's, or
that finds it broken, ignores it silently (``-Xshare:auto``, its log off): sharing is a saving, never a
condition of a test.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark

__all__ = ["BASE_FLAGS", "archive_path", "share_options", "spark_conf", "start_making", "stop_making"]

#: The JVM flags of every Spark JVM of the tests: C1 only and the serial collector (a test's JVM lives for
#: seconds to minutes; C2's compiling and G1's threads never pay back). The archive is made with them: a
#: JVM on another collector cannot map it.
BASE_FLAGS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"

#: Silent when the archive cannot be mapped: a JVM writes its warnings to stdout, where the pipeline
#: commands print their JSON result.
_QUIET = "-Xlog:cds=off,cds+dynamic=off"

_maker: subprocess.Popen[bytes] | None = None


def archive_path() -> Path | None:
    """Where the archive of this Java and this pyspark is (made or not), or None when there is no private
    directory for it (code is loaded from it: only a directory of ours that nobody else may write to will
    do) or no Java."""
    java = shutil.which("java")
    if java is None:
        return None
    real = os.path.realpath(java)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}\0{st.st_mtime_ns}\0{st.st_size}\0{BASE_FLAGS}".encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"hubbub-tests-jvm-{os.getuid()}"
    try:
        cache.mkdir(mode=0o700, exist_ok=True)
        cst = cache.lstat()
    except OSError:
        return None
    if not cache.is_dir() or cst.st_uid != os.getuid() or cst.st_mode & 0o022 or " " in str(cache):
        return None
    return cache / f"spark-{pyspark.__version__}-{key}.jsa"


def share_options() -> str:
    """The JVM options that map the archive, or "" while it is not made (a missing archive would turn off
    the JDK's own class sharing too)."""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {_QUIET}"


def spark_conf() -> dict[str, str]:
    """Spark settings that put :data:`BASE_FLAGS` and :func:`share_options` on the driver's and the
    executors' JVMs: the ``defaultJavaOptions``, which Spark puts before the ``extraJavaOptions`` a test or
    a command sets (``hubbub pipeline backfill`` picks its driver's own when none are given)."""
    flags = f"{BASE_FLAGS} {share_options()}".strip()
    return {"spark.driver.defaultJavaOptions": flags, "spark.executor.defaultJavaOptions": flags}


def start_making() -> None:
    """Start making the archive in the background unless it is made, or being made by another process (a
    lock on it): called in each xdist worker; one makes it."""
    global _maker
    path = archive_path()
    if _maker is not None or path is None or path.is_file() or _locked(path):
        return
    with contextlib.suppress(OSError):
        _maker = subprocess.Popen(
            [sys.executable, "-m", "tests.pipeline.jvm_archive", str(path)],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own group: stopped with its JVM (stop_making)
        )  # fmt: skip


def stop_making() -> None:
    """Stop the maker this process started, with its JVM, if it is still at work (the run ends first): the
    next run makes the archive again."""
    global _maker
    path = archive_path()
    if _maker is not None and _maker.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(_maker.pid, signal.SIGKILL)
        _maker.wait()
        if path is not None:  # what it left half written
            tmp = _tmp(path, _maker.pid)
            tmp.unlink(missing_ok=True)
            shutil.rmtree(f"{tmp}.parquet", ignore_errors=True)
    _maker = None


def _tmp(path: Path, pid: int) -> Path:
    return path.with_name(f"{path.name}.{pid}.tmp")


def _locked(path: Path) -> bool:
    """Whether a maker holds the archive's lock (spares starting a Python that would find it so)."""
    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases it
    return False


def _make(path: Path) -> None:
    """Run a small job that loads what the tests' jobs load (SQL, shuffle, Parquet, Arrow to Python workers)
    on a JVM that writes its classes to the archive when it exits; wait for it, then put the archive in
    place at once (a JVM never sees it half written)."""
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another process is making it
    if path.is_file():
        return
    tmp = _tmp(path, os.getpid())
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("hubbub-tests-jvm-archive")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", f"{BASE_FLAGS} -XX:ArchiveClassesAtExit={tmp} {_QUIET}")
        .getOrCreate()
    )
    df = spark.range(1000).selectExpr("id % 7 AS k", "id", "cast(id AS string) AS s")
    out = str(tmp) + ".parquet"
    df.groupBy("k").count().write.mode("overwrite").parquet(out)
    spark.read.parquet(out).mapInArrow(lambda batches: batches, "k long, count long").collect()
    spark.stop()
    gateway = SparkContext._gateway
    assert gateway is not None
    gateway.proc.stdin.close()  # the JVM exits on its standard input's end, writing the archive
    gateway.proc.wait()
    shutil.rmtree(out, ignore_errors=True)
    if tmp.is_file():
        os.replace(tmp, path)


if __name__ == "__main__":
    _make(Path(sys.argv[1]))
