"""Crash test: a real process changing the mist token registry is killed with SIGKILL mid-write.

The child registers tokens and sets tags in a loop and prints the number of each change once its method
has returned. The parent waits for a random number of those lines, kills the child with -9 (it is then
almost always inside the next write), and reopens the registry: it must load (never a torn file), hold
every change the child reported (and any it finished before the kill whose line was still in the pipe),
and at most the change that was in flight. Five rounds run on the same
data directory, each child continuing from what survived.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hubbub.auth.mist_registry import REGISTRY_FILE, MistTokenRegistry

CHILD = textwrap.dedent(
    """
    import sys
    from hubbub.auth.mist_registry import MistTokenRegistry

    reg = MistTokenRegistry.in_data_dir(sys.argv[1])
    i = len(reg)
    if i >= 2:  # a crash between the last register and its set_tags: finish that change first
        reg.set_tags(f"t{i - 2}", [f"b{i - 2}"])
    while True:
        reg.register(f"t{i}", [f"a{i}"])
        if i:
            reg.set_tags(f"t{i - 1}", [f"b{i - 1}"])
        print(i, flush=True)
        i += 1
    """
)


def _expected(n: int) -> dict[str, frozenset[str]]:
    """The registry after changes 0..n-1 completed: t{i} has a{i}, and every t{i} but the last has b{i}."""
    out = {f"t{i}": frozenset({f"a{i}", f"b{i}"}) for i in range(n)}
    if n:
        out[f"t{n - 1}"] = frozenset({f"a{n - 1}"})
    return out


def test_kill_9_never_loses_an_acknowledged_change_or_tears_the_file(tmp_path: Path) -> None:
    rng = random.Random(20261125)
    env = dict(os.environ)
    env["PYTHONPATH"] = (
        str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    )
    done = 0
    for _round in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
        )
        assert proc.stdout is not None
        wanted = rng.randrange(5, 40)
        last = -1
        try:
            for _ in range(wanted):
                line = proc.stdout.readline()
                assert line, "the child stopped early"
                last = int(line)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        acknowledged = last + 1
        assert acknowledged == done + wanted
        reg = MistTokenRegistry(tmp_path / REGISTRY_FILE)  # loads: the file is whole
        got = reg.tokens()
        # The child may have finished more changes than the parent read before the kill (its lines wait in
        # the pipe), so the registry holds some prefix of changes 0..k-1 with k >= acknowledged, plus at
        # most the in-flight iteration: token k-1 registered before the set_tags that completes token k-2.
        assert len(got) >= acknowledged, f"lost: {len(got)} tokens after {acknowledged} acknowledged changes"
        k = len(got)
        allowed = [_expected(k), {**_expected(k - 1), f"t{k - 1}": frozenset({f"a{k - 1}"})}]
        assert got in allowed, sorted(set(got) ^ set(allowed[0]))
        assert all(got[f"t{i}"] == frozenset({f"a{i}", f"b{i}"}) for i in range(acknowledged - 1))
        assert not list(tmp_path.glob(f"{REGISTRY_FILE}.tmp-*"))  # cleaned at load
        done = len(got)  # the next child continues from what survived
