"""Long jobs show progress (events done of the total, and their rate) when stderr is a terminal:
``hubbub pipeline export`` run as a real child process, its stderr a pseudo-terminal.

Not run with its stderr a pipe too (a JVM of its own, some 13 CPU-s): that run could not fail. The display
is rich's, drawn transient, and rich draws nothing on a stream that is not a terminal but the newline it
ends with, whether the command turns it on or not; what the command's gate (``--no-progress``, or stderr not
a terminal) decides beyond that is whether the export counts its input first, which no output shows."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hubbub.log import SqliteLogStore
from hubbub.pipeline.progress import Stage, job_progress

from .conftest import fill, jvm_conf_args, spark_env

#: The export's own JVM: 40-90 s in a CI run, 194 s at a load of 15 on 2 cores (the Spark tests' 300 s is near
#: at a load of 20). These bound a hang only: the child's first, so that its output is still reported.
EXPORT_TIMEOUT_S = 540
pytestmark = [pytest.mark.spark, pytest.mark.timeout(EXPORT_TIMEOUT_S + 60)]

EVENTS = 100_000


def export(store: Path, out: Path) -> tuple[dict[str, object], str]:
    """Run the export, its stderr a terminal; returns its JSON summary and everything it wrote there."""
    args = [sys.executable, "-m", "hubbub", "pipeline", "export", "--store", f"sqlite:///{store}",
            "--out", str(out), "--format", "parquet",
            *jvm_conf_args(), "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.host=127.0.0.1"]  # fmt: skip
    env = {**os.environ, **spark_env(), "COLUMNS": "200", "TERM": "xterm"}
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # a terminal that is not read blocks its writer
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child's side is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            args, stdout=subprocess.PIPE, stderr=slave, timeout=EXPORT_TIMEOUT_S, env=env, check=False
        )
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    assert proc.returncode == 0
    return json.loads(proc.stdout), b"".join(chunks).decode(errors="replace")


def test_export_shows_events_and_rate_on_a_terminal(tmp_path: Path) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    fill(st, {f"/p/c{i}": EVENTS // 4 for i in range(4)}, headers=False)
    st.close()
    summary, shown = export(tmp_path / "log.db", tmp_path / "tty")
    assert summary["events"] == EVENTS
    assert "export: stage" in shown and f"/{EVENTS:,}" in shown and "events/s" in shown
    # The whole job's progress: its stages one after the other, and a share that does not start again at 0
    # with each stage (the export samples its input, sorts, writes and counts: several Spark jobs).
    seen = [(int(k), int(n), int(pc)) for k, n, pc in re.findall(r"stage (\d+) of (\d+) · (\d+)%", shown)]
    assert seen and max(k for k, _, _ in seen) >= 2, seen
    assert [k for k, _, _ in seen] == sorted(k for k, _, _ in seen), seen
    assert all(pc > 0 for k, _, pc in seen if k > 1), seen


def test_the_job_s_progress_goes_on_from_stage_to_stage() -> None:
    """A stage's end and the next one's start do not take the job back to 0: each stage is a share of it."""
    total = 100

    def share(*stages: Stage) -> float:
        return job_progress(stages, total).fraction

    one = [
        share(Stage(1, "ACTIVE", 50, 0, 1), Stage(2, "PENDING", 0, 0, 2)),
        share(Stage(1, "COMPLETE", 100, 1, 1), Stage(2, "PENDING", 0, 0, 2)),
        share(Stage(1, "COMPLETE", 100, 1, 1), Stage(2, "ACTIVE", 0, 0, 2)),
        share(Stage(1, "COMPLETE", 100, 1, 1), Stage(2, "ACTIVE", 60, 1, 2)),
        share(Stage(1, "COMPLETE", 100, 1, 1), Stage(2, "COMPLETE", 100, 2, 2)),
    ]
    assert one == [0.25, 0.5, 0.5, 0.8, 1.0]
    # A skipped stage (its output was there already) is no share; without a total, tasks count.
    p = job_progress([Stage(1, "SKIPPED", 0, 0, 4), Stage(2, "ACTIVE", 0, 1, 4)], None)
    assert (p.fraction, p.stage, p.stages) == (0.25, 1, 1)
    # One still pending below a running one is skipped too (Spark says so only when the job ends).
    p = job_progress(
        [Stage(1, "COMPLETE", 9, 1, 1), Stage(2, "PENDING", 0, 0, 1), Stage(3, "ACTIVE", 0, 0, 1)], 9
    )
    assert (p.fraction, p.stage, p.stages) == (0.5, 2, 2)
