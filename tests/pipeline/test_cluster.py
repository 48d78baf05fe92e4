"""A real Spark standalone cluster (master + one worker from the pyspark package): the archive and backfill
jobs submitted with ``hubbub pipeline --master spark://…``, the two whose hubbub code runs in the executors
(the source's reads, the sink's publishes). The other jobs are Spark SQL over Parquet, on executors, and
pandas and matplotlib on the driver, with no code of hubbub's in between that a cluster runs otherwise than
local mode (``test_jobs.py`` checks them there); each application here costs a driver's and an executor's
JVM, some 15 CPU-s."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pyspark
import pytest

from hubbub.client import Client
from tests.integration.serverproc import ServerProcess

from . import jvm_archive
from .conftest import http_url, jvm_conf_args, spark_env, store_url

pytestmark = pytest.mark.spark


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(what)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    home = os.path.dirname(pyspark.__file__)
    env = {**os.environ, **spark_env(), "SPARK_HOME": home, "SPARK_LOG_DIR": str(tmp_path / "logs")}
    env["SPARK_DAEMON_JAVA_OPTS"] = f"{jvm_archive.BASE_FLAGS} {jvm_archive.share_options()}"
    port, ui, wui = free_port(), free_port(), free_port()
    spark_class = os.path.join(home, "bin", "spark-class")
    procs: list[subprocess.Popen[bytes]] = []
    logs = [open(tmp_path / "master.log", "wb"), open(tmp_path / "worker.log", "wb")]  # noqa: SIM115
    try:
        procs.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(ui)],
                env=env, stdout=logs[0], stderr=subprocess.STDOUT,
            )
        )  # fmt: skip

        def master_listens() -> bool:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return True

        wait_for(master_listens, 60, "master")
        procs.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                 "--host", "127.0.0.1", "--cores", "2", "--memory", "1g", "--webui-port", str(wui),
                 "--work-dir", str(tmp_path / "work")],
                env=env, stdout=logs[1], stderr=subprocess.STDOUT,
            )
        )  # fmt: skip

        def worker_alive() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                body = r.read()
            try:
                return int(json.loads(body).get("aliveworkers", 0)) >= 1
            except ValueError:  # the UI answers its HTML page until the JSON API is up
                return False

        wait_for(worker_alive, 60, "worker registration")
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in reversed(procs):  # stopped by PID
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()


def hubbub_pipeline(*args: str) -> dict[str, object]:
    # The executor's JVM (one per application, started by the worker) with the driver's flags: C1 only and
    # the serial collector, as a short job of 500 events never pays back C2's compiling, and the class
    # archive (jvm_archive); 2 shuffle partitions, as in the tests' local session, not 200 tasks of nothing
    # per shuffle.
    env = {**os.environ, **spark_env()}
    r = subprocess.run(
        [sys.executable, "-m", "hubbub", "pipeline", *args, "--no-progress",
         *jvm_conf_args(), "--conf", "spark.ui.enabled=false",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=512m",
         "--conf", "spark.sql.shuffle.partitions=2"],
        env=env, capture_output=True, timeout=240, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    out: dict[str, object] = json.loads(r.stdout.decode().strip().splitlines()[-1])
    return out


# Two jobs (archive, backfill), each starting an application on the standalone cluster (a JVM driver and an
# executor): on a busy 2-core machine that alone passes the default 120 s. A backfill run again publishes
# nothing: that is the backfill's own logic, the same on any master, and tests/pipeline/test_jobs.py checks it
# on the tests' local session (each application here costs the suite a minute of a busy machine's CPU).
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_archive_and_backfill_on_a_standalone_cluster(
    cluster: str, server: ServerProcess, tmp_path: Path
) -> None:
    with Client.connect(http_url(server)) as c:
        for i in range(500):
            c.publish(f"/cl/{i % 5}", f"event {i}".encode())
    res = hubbub_pipeline(
        "archive", "--master", cluster, "--store", store_url(server), "--out", str(tmp_path / "a")
    )
    assert res["events"] == 500 and res["channels"] == 5
    # The archive back into the running server under another prefix.
    args = ["--input", str(tmp_path / "a"), "--target", http_url(server), "--channel-prefix", "/restored"]
    bf = hubbub_pipeline("backfill", "--master", cluster, *args)
    assert bf["published"] == 500 and bf["already_present"] == 0, bf
    with urllib.request.urlopen(f"{http_url(server)}/api/v1/log/restored/cl/3?limit=1000") as r:
        body = json.load(r)
    got = [e.get("text") or base64.b64decode(e["b64"]).decode() for e in body["events"]]
    assert got == [f"event {i}" for i in range(3, 500, 5)] and body["top"] == 100  # in order, once
