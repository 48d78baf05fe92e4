"""``hubbub pipeline retention`` drops an archive's old date partitions without Spark: it imports no pyspark
(about half a CPU-second at start for a job that only deletes files), so it also runs without the ``spark``
extra. Its refusals are tested with the other jobs' in tests/pipeline/test_cli_exits.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

_SRC = str(Path(__file__).resolve().parents[2] / "src")

#: Runs the command line in process, then reports its exit status and the Spark stack's modules it imported.
_RUN = textwrap.dedent("""
    import contextlib, io, json, sys
    from hubbub.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(sys.argv[1:])
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j", "pyarrow", "pandas"))
    print(json.dumps({"rc": rc, "out": out.getvalue(), "imported": heavy}))
""")


def test_retention_drops_old_partitions_without_importing_spark(tmp_path: Path) -> None:
    today = datetime.now(UTC).date()
    old, kept = (today - timedelta(days=40)).isoformat(), today.isoformat()
    archive = tmp_path / "archive"
    for day in (old, kept):
        part = archive / "data" / "root=a" / f"date={day}"
        part.mkdir(parents=True)
        (part / "part-0.parquet").write_bytes(b"")
    state = {"version": 2, "positions": {}, "pending": None}
    (archive / "_hubbub_archive.json").write_text(json.dumps(state))
    env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, "pipeline", "retention", "--out", str(archive), "--days", "30"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["rc"] == 0, proc.stderr
    assert json.loads(got["out"]) == {
        "job": "retention",
        "cutoff": (today - timedelta(days=30)).isoformat(),
        "dropped": [f"root=a/date={old}"],
    }
    assert [p.name for p in (archive / "data" / "root=a").iterdir()] == [f"date={kept}"]
    assert got["imported"] == []
