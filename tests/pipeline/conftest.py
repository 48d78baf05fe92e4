"""Fixtures of the Spark tests: one local SparkSession per worker (two workers share the tests that use it),
real servers, real stores.

The whole directory is skipped when pyspark (the ``spark`` extra) or Java is missing, so the core suite runs
on a machine without Java; CI installs the extra and runs them (``.ci/run``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if shutil.which("java") is None:
    pytest.skip("the Spark tests need Java (17 or 21)", allow_module_level=True)
pytest.importorskip("pyspark", reason="the Spark tests need the spark extra")
pytest.importorskip("pyarrow", reason="the Spark tests need the spark extra")

from pyspark.sql import SparkSession

from hubbub.events import Publisher
from hubbub.log import AppendRequest, LogStore
from tests.integration.serverproc import ServerProcess

from . import jvm_archive

SRC = str(Path(__file__).resolve().parents[2] / "src")


def jvm_conf_args() -> list[str]:
    """The ``--conf`` arguments that give a ``hubbub pipeline`` child's JVMs (its driver's, and on a cluster
    its executors') the tests' flags and the class archive once it is made (:mod:`.jvm_archive`)."""
    return [arg for k, v in jvm_archive.spark_conf().items() for arg in ("--conf", f"{k}={v}")]


def spark_env() -> dict[str, str]:
    """What Spark's JVM and Python workers need: this interpreter, loopback, hubbub on the path."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


#: pytest-timeout of a Spark test, instead of the suite's 120 s (pyproject.toml), unless it sets its own: a
#: Spark job pays a JVM's pace, and a test that runs the pipeline CLI as a child process starts a JVM of its
#: own, 15-18 s of start-up and job set-up before any event on an idle 2-core machine (the export of 1,000
#: events takes as long as that of 100,000), several times that on a loaded one.
SPARK_TIMEOUT_S = 300


#: The modules whose tests share the second worker's SparkSession; the others share the first's. Two groups
#: (``--dist loadgroup``), so two workers, two JVMs of about 1 GiB: one group alone is a floor for the whole
#: run (its tests one after the other), and halving it takes that floor well below the rest of the suite.
#: Chosen by ``--durations`` to take about the same time each; a new module of Spark tests may go in either.
SECOND_SESSION = frozenset(
    {"test_sink.py", "test_stream.py", "test_stream_restart.py", "test_spark_fixture.py",
     "test_jobs_epochs.py", "test_options.py"}
)  # fmt: skip


def spark_group(item: pytest.Item) -> str:
    """The xdist group of a test on the SparkSession: ``spark`` or ``spark-2`` (:data:`SECOND_SESSION`)."""
    return "spark-2" if item.path.name in SECOND_SESSION else "spark"


def _is_spark(item: pytest.Item) -> bool:
    return "spark" in getattr(item, "fixturenames", ()) or item.get_closest_marker("spark") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the session's SparkSession run on two workers (``--dist loadgroup``), each module's on
    one (:func:`spark_group`): each worker with a test of its own would start a JVM of its own, for seconds
    of CPU and some hundreds of MiB. Every Spark test (the ``spark`` marker or fixture) gets
    :data:`SPARK_TIMEOUT_S` unless it has a timeout marker.

    First of the hook's implementations: xdist's, in each worker, reads the ``xdist_group`` marks to put
    each test in its group; a mark added after it has no effect, and the tests were spread over every
    worker, each starting a session.

    With a Spark test among them, the class archive of the Spark JVMs is started too (:mod:`.jvm_archive`:
    the JVMs that start once it is made start in about half the time)."""
    if any(_is_spark(item) for item in items):
        jvm_archive.start_making()
    for item in items:
        uses_session = "spark" in getattr(item, "fixturenames", ())
        if uses_session:
            item.add_marker(pytest.mark.xdist_group(spark_group(item)))
        if (uses_session or item.get_closest_marker("spark") is not None) and item.get_closest_marker(
            "timeout"
        ) is None:
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT_S))


def pytest_sessionfinish() -> None:
    jvm_archive.stop_making()


def _new_session() -> SparkSession:
    os.environ.update(spark_env())
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("hubbub-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in jvm_archive.spark_conf().items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    # No spark.dataSource.register here: format("hubbub") must resolve through pyspark_hubbub.
    return session


#: How long a trivial query may take before the session is taken for stuck (its JVM is then killed).
HEALTH_WAIT_S = 60.0


class SparkSessions:
    """The worker's one SparkSession, handed to each test only once it answers a trivial query: a test
    interrupted inside a Spark call (its timeout) leaves this thread's Py4J connection to the JVM waiting
    for that call's answer (the next call waits behind its job, or reads its answer), or the session
    stopped, and every later test on the worker would fail with it. Such a session is dropped with its JVM
    (a query stuck for :data:`HEALTH_WAIT_S` kills the JVM, which ends the wait) and a new one started."""

    def __init__(self) -> None:
        self.session: SparkSession | None = None
        self.recreated = 0

    def healthy(self) -> SparkSession:
        session = self.session
        if session is not None:
            if _answers(session):
                return session
            self.recreated += 1
            _discard(session)
        self.session = _new_session()
        return self.session

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None


def _jvm() -> Any:
    from pyspark import SparkContext

    return SparkContext._gateway


def _answers(session: SparkSession) -> bool:
    """Whether ``session`` answers a trivial query on this thread's connection within HEALTH_WAIT_S."""
    done = threading.Event()
    gateway = _jvm()

    def watchdog() -> None:
        if not done.wait(HEALTH_WAIT_S) and gateway is not None:
            with contextlib.suppress(Exception):
                gateway.proc.kill()  # the wait for the stuck answer ends with the connection

    threading.Thread(target=watchdog, name="spark-health", daemon=True).start()
    try:
        return bool(session.range(3).count() == 3)
    except Exception:
        return False
    finally:
        done.set()


def _discard(session: SparkSession) -> None:
    """Stop ``session`` and its JVM: the connections to it cannot be trusted; the next session starts one."""
    from pyspark import SparkContext

    gateway = _jvm()
    with contextlib.suppress(Exception):
        session.stop()
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.shutdown()
        with contextlib.suppress(Exception):
            gateway.proc.kill()
            gateway.proc.wait(30)
        if gateway.proc.stdin is not None:  # the JVM watches it to exit with its parent
            gateway.proc.stdin.close()
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[SparkSessions]:
    sessions = SparkSessions()
    yield sessions
    sessions.stop()


@pytest.fixture
def spark(spark_sessions: SparkSessions) -> SparkSession:
    """The worker's SparkSession (one per worker, see :class:`SparkSessions`), checked before each test."""
    return spark_sessions.healthy()


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
