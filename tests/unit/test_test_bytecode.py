"""The run's Python processes (xdist workers, ``hubbub serve`` children) compile each module once, not each
process again, where the environment forbids writing byte code beside the sources
(``tests/conftest.py``: :func:`share_bytecode`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import share_bytecode


def test_this_worker_and_its_children_share_compiled_code() -> None:
    """Set up by the conftest before the workers started: in this worker's environment (its children's
    too) byte code is written, beside the sources or in the shared cache."""
    assert not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX")
    assert sys.pycache_prefix == os.environ.get("PYTHONPYCACHEPREFIX")


def test_a_child_writes_its_byte_code_to_the_private_cache_only(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    cache = share_bytecode(env, tmp_path)
    assert cache == tmp_path / f"hubbub-tests-pycache-{os.getuid()}"
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == str(cache)
    assert cache.stat().st_mode & 0o777 == 0o700
    src = tmp_path / "src"
    src.mkdir()
    (src / "some_module.py").write_text("VALUE = 42\n")
    code = "import some_module, sys; print(some_module.VALUE, some_module.__cached__)"
    for _ in range(2):  # the second one reads what the first wrote
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=src, env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        assert out[0] == "42" and Path(out[1]).is_relative_to(cache) and Path(out[1]).is_file()
    assert sorted(p.name for p in src.iterdir()) == ["some_module.py"]  # no __pycache__ in the sources


def test_nothing_changes_where_byte_code_is_written_or_a_cache_is_given(tmp_path: Path) -> None:
    for env in ({}, {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/elsewhere"}):
        before = dict(env)
        assert share_bytecode(env, tmp_path) is None and env == before
    assert list(tmp_path.iterdir()) == []


def test_a_cache_directory_others_may_write_to_is_not_used(tmp_path: Path) -> None:
    """Code is loaded from the cache: one that another user could put files in is refused, and the
    processes compile from source as they would without the conftest."""
    cache = tmp_path / f"hubbub-tests-pycache-{os.getuid()}"
    cache.mkdir()
    cache.chmod(0o777)
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    assert share_bytecode(env, tmp_path) is None and env == {"PYTHONDONTWRITEBYTECODE": "1"}
