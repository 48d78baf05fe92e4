"""Fixtures of the Spark tests: one local SparkSession per run, real servers, real stores.

The whole directory is skipped when pyspark (the ``spark`` extra) or Java is missing, so the core suite runs
on a machine without Java; CI installs the extra and runs them (``.ci/run``).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

if shutil.which("java") is None:
    pytest.skip("the Spark tests need Java (17 or 21)", allow_module_level=True)
pytest.importorskip("pyspark", reason="the Spark tests need the spark extra")
pytest.importorskip("pyarrow", reason="the Spark tests need the spark extra")

from pyspark.sql import SparkSession

from hubbub.events import Publisher
from hubbub.log import AppendRequest, LogStore
from tests.integration.serverproc import ServerProcess

SRC = str(Path(__file__).resolve().parents[2] / "src")
JVM_FLAGS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def spark_env() -> dict[str, str]:
    """What Spark's JVM and Python workers need: this interpreter, loopback, hubbub on the path."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test on the session's SparkSession runs on one worker (``--dist loadgroup``): each worker with a
    test of its own would start a JVM of its own, for seconds of CPU and some hundreds of MiB."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.update(spark_env())
    session = (
        SparkSession.builder.master("local[2]")
        .appName("hubbub-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", JVM_FLAGS)
        .config("spark.executor.extraJavaOptions", JVM_FLAGS)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    # No spark.dataSource.register here: format("hubbub") must resolve through pyspark_hubbub.
    yield session
    session.stop()


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    # A short idempotency window (2 s, native.idempotency_window_s) by default; a test may ask for another
    # (indirect parametrization): shorter for one that waits for it to pass, longer for one that relies on
    # duplicates being recognised across Spark jobs, so a slow machine does not make it flaky.
    window = str(getattr(request, "param", 2))
    proc = ServerProcess(tmp_path / "server", extra=["--native-idempotency-window-s", window]).start()
    try:
        yield proc
    finally:
        proc.terminate()


def http_url(proc: ServerProcess) -> str:
    return f"http://127.0.0.1:{proc.ports['http']}"


def store_url(proc: ServerProcess) -> str:
    return f"sqlite:///{proc.data_dir / 'hubbub.db'}"


PUB = Publisher("native", "tester", "app1", "")


def fill(store: LogStore, channels: dict[str, int], headers: bool = True) -> None:
    """Append ``n`` events to each channel, in batches, with a few headers and tags."""
    batch: list[AppendRequest] = []
    for ch, n in channels.items():
        for i in range(n):
            batch.append(
                AppendRequest(
                    ch,
                    PUB,
                    f"{ch} {i}".encode(),
                    "text/plain",
                    {"key": f"k{i % 3}"} if headers and i % 2 == 0 else {},
                    ("even",) if i % 2 == 0 else (),
                )
            )
            if len(batch) == 1000:
                store.append(batch)
                batch = []
    if batch:
        store.append(batch)
