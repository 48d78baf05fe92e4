"""Smoke test of ``bench/ws_libs.py --quick`` for aiohttp, the one library hubbub always has.

It asserts that every scenario gives a positive number, nothing about speed. The script's servers and
connections are on 127.0.0.1 only, and each server exits when the script's stdin pipe to it closes, so
nothing outlives the run even when the timeout kills it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_quick_ws_libs_aiohttp(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    raw, report = tmp_path / "rows.json", tmp_path / "WS_LIBS.md"
    cmd = [sys.executable, str(ROOT / "bench" / "ws_libs.py"), "--quick", "--libs", "aiohttp"]
    proc = subprocess.run(
        [*cmd, "--json", str(raw), "--out", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = json.loads(raw.read_text())
    assert {r["library"] for r in rows} == {"aiohttp"}
    kinds = {r["scenario"] for r in rows}
    assert len(kinds) == 6, kinds  # 4 send scenarios, ingest, idle memory
    for r in rows:
        assert r["value"] > 0 and r["low"] > 0, r
        if r["unit"] != "bytes/conn":
            assert r["server_cpu"] > 0 and r["driver_cpu"] >= 0, r
    text = report.read_text()
    assert "| scenario |" in text and "## Conclusion" in text
