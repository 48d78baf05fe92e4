"""A server process fixes glibc's mmap threshold (``hubbub.server.tune_malloc``), unless the operator set it.

Each case runs in a fresh interpreter: the setting is process-wide and glibc reads its environment once.
Whether it holds a recovery's memory is tests/integration/test_recovery_memory.py's to show.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "from hubbub.server import tune_malloc; print(tune_malloc())"


def _probe(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="glibc's mallopt")
def test_the_threshold_is_fixed_unless_the_operator_set_one() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    assert _probe(env) == "True"  # glibc took M_MMAP_THRESHOLD
    assert _probe({**env, "MALLOC_MMAP_THRESHOLD_": "131072"}) == "False"  # the operator's stands
