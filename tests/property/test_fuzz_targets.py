"""The fuzz targets of ``fuzz/atheris_targets.py`` in CI: each target replays its whole corpus (the
``regression-*`` inputs are the crashes found so far), then takes ``RUNS`` more inputs, coverage-guided
under atheris when it is installed, else from hypothesis with a fixed seed (the same inputs on every run).
New inputs go to a scratch directory. A smoke check: every seed and ``RUNS`` inputs are accepted or
rejected with a documented error; the fuzzing proper is the long run.

Under atheris each target runs in a child process (libFuzzer owns its process and exits with it); the
hypothesis fallback runs in the test's own process, with the script's own :func:`run_target`: a child of
its own cost each target an interpreter's start and the imports of hubbub and hypothesis, three quarters
of its CPU (about 1 s of 1.3 s).

The long run (10 minutes per target) is ``python fuzz/atheris_targets.py all --seconds 600 --work DIR``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fuzz" / "atheris_targets.py"
#: Inputs past the corpus per target, a budget in work rather than in seconds: the same CPU on an idle and on
#: a loaded machine (about a second per target with the interpreter's start).
RUNS = 500
#: With atheris, libFuzzer's time limit besides ``RUNS`` (whichever comes first).
SECONDS = 3


def target_names() -> list[str]:
    """The names in the script's ``TARGETS`` table, read from its text (importing it would set atheris up
    in this process): a new target runs here without being listed twice."""
    text = SCRIPT.read_text(encoding="utf-8")
    block = text.split("TARGETS: dict[str, Callable[[bytes], None]] = {", 1)[1].split("}", 1)[0]
    return [line.split(":", 1)[0].strip().strip('"') for line in block.strip().splitlines()]


TARGETS = target_names()
#: libFuzzer is there: each target in a child process, as ``fuzz/atheris_targets.py all`` runs them.
ATHERIS = importlib.util.find_spec("atheris") is not None


@functools.cache
def script() -> ModuleType:
    """``fuzz/atheris_targets.py`` imported in this process (without atheris only: it would set atheris up
    here), once per worker."""
    spec = importlib.util.spec_from_file_location("atheris_targets", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.atheris is None
    return module


def test_targets_have_corpus() -> None:
    assert len(TARGETS) >= 8, TARGETS
    for name in TARGETS:
        assert any((ROOT / "fuzz" / "corpus" / name).iterdir()), f"{name} has no corpus"


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not ATHERIS:
        assert script().run_target(target, SECONDS, tmp_path / "work", RUNS) == 0
        out = capsys.readouterr().out
        assert f"{target}: corpus " in out and f"(no atheris): {RUNS} inputs, no failure" in out, out[-2000:]
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    budget = ["--seconds", str(SECONDS), "--runs", str(RUNS)]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), target, *budget, "--work", str(tmp_path / "work")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # libFuzzer's summary (atheris) or the fallback's line: the target really ran, on the whole budget.
    assert "Done " in out or f"(no atheris): {RUNS} inputs, no failure" in out, out[-2000:]
