"""The static checks run as part of the test suite, so the one README test command covers them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: install the dev extra (pip install -e '.[dev]')")
    return found


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"


def test_ruff_lint() -> None:
    _run(_tool("ruff"), "check", "src", "tests", "fuzz", "bench")


def test_ruff_format() -> None:
    _run(_tool("ruff"), "format", "--check", "src", "tests", "fuzz", "bench")


def test_mypy_strict() -> None:
    _run(_tool("mypy"))


def test_import_layers() -> None:
    _run(_tool("lint-imports"))
