"""Long jobs show progress (events done of the total, and their rate) when stderr is a terminal, and nothing
when it is not: ``hubbub pipeline export`` run as a real child process, its stderr a pseudo-terminal or a
pipe."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hubbub.log import SqliteLogStore

from .conftest import JVM_FLAGS, fill, spark_env

pytestmark = pytest.mark.spark

EVENTS = 100_000


def export(store: Path, out: Path, stderr_tty: bool) -> tuple[dict[str, object], str]:
    """Run the export; returns its JSON summary and everything it wrote to stderr."""
    args = [sys.executable, "-m", "hubbub", "pipeline", "export", "--store", f"sqlite:///{store}",
            "--out", str(out), "--format", "parquet",
            "--conf", f"spark.driver.extraJavaOptions={JVM_FLAGS}", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.host=127.0.0.1"]  # fmt: skip
    env = {**os.environ, **spark_env(), "COLUMNS": "200", "TERM": "xterm"}
    if not stderr_tty:
        r = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, check=False)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), r.stderr
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
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=slave, timeout=300, env=env, check=False)
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    assert proc.returncode == 0
    return json.loads(proc.stdout), b"".join(chunks).decode(errors="replace")


def test_export_shows_events_and_rate_on_a_terminal_only(tmp_path: Path) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    fill(st, {f"/p/c{i}": EVENTS // 4 for i in range(4)}, headers=False)
    st.close()
    summary, shown = export(tmp_path / "log.db", tmp_path / "tty", stderr_tty=True)
    assert summary["events"] == EVENTS
    assert "export: stage" in shown and f"/{EVENTS:,}" in shown and "events/s" in shown
    summary, quiet = export(tmp_path / "log.db", tmp_path / "pipe", stderr_tty=False)
    assert summary["events"] == EVENTS
    assert "export" not in quiet and "events/s" not in quiet
