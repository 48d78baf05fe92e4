"""The tests' node launcher (``tests/nodelauncher.py``): a command forked from it runs ``hubbub`` with the
arguments and environment given, its output and exit status as from ``python -m hubbub``."""

from __future__ import annotations

import os
import sys

import pytest

from hubbub import __version__
from tests.nodelauncher import launcher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forks with PR_SET_PDEATHSIG")


def test_a_launched_command_gets_its_arguments_environment_output_and_status() -> None:
    proc = launcher().popen(["--version"], dict(os.environ))
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read().decode()
    assert proc.wait(30) == 0
    assert __version__ in out
    # The environment is the one given, not the launcher's: the configuration reads it.
    bad = launcher().popen(["serve", "--data-dir", "/nonexistent/x"], {"HUBBUB_DURABILITY": "nope"})
    assert bad.stdout is not None
    with bad.stdout:
        err = bad.stdout.read().decode()
    assert bad.wait(30) == 2, err
    assert "durability" in err
