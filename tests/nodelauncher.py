"""``hubbub serve`` processes for tests, forked from a launcher that has imported hubbub once.

A ``hubbub serve`` started with ``python -m hubbub`` spends about half a second of CPU on the interpreter
and its imports before it does anything of its own (a 2-worker node's parent: 0.5 s of its 0.7 s; its
workers are forked, ``hubbub/workers/forkserver.py``). Tests that start a fresh node for each of many
cases (the conformance vectors against a 2-worker node, ``tests/conformance/test_vectors.py``) start them
here instead: :func:`launcher` runs one process per test process (``python -m tests.nodelauncher``) that
imports what a node imports and then serves as a fork server (``hubbub.workers.forkserver.serve``); each
node is forked from it and runs ``hubbub.cli.main`` with its arguments and environment, its output on a
pipe, exactly as the command does after its imports. Each node is a fresh process on its own data
directory, as with ``python -m hubbub``.

:meth:`NodeLauncher.popen` returns a :class:`LaunchedProcess`, the subset of ``subprocess.Popen`` that
``tests/integration/serverproc.py`` uses (``ServerProcess(..., launcher=launcher())``). The launcher ends
with the test process (the end of its socket), and the nodes still running with it (``PR_SET_PDEATHSIG``).

Concurrency contract: :func:`launcher` and :meth:`NodeLauncher.popen` may be called from any thread.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from hubbub.workers.forkserver import ForkedProcess, ForkServer

__all__ = ["LaunchedProcess", "NodeLauncher", "launcher"]

_REPO = Path(__file__).resolve().parents[1]


class LaunchedProcess:
    """A node forked by the launcher, as ``subprocess.Popen`` shows a process: ``pid``, ``stdout`` (its
    standard output and error, binary), ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, proc: ForkedProcess, stdout: IO[bytes], args: Sequence[str]) -> None:
        self._proc = proc
        self.stdout: IO[bytes] | None = stdout
        self.args = list(args)
        assert proc.pid is not None or proc.returncode is not None
        self.pid = proc.pid if proc.pid is not None else -1

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        return self._proc.returncode

    def wait(self, timeout: float | None = None) -> int:
        status = self._proc.wait(timeout)
        if status is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return status

    def send_signal(self, sig: int) -> None:
        self._proc.send_signal(sig)

    def kill(self) -> None:
        self._proc.kill()


class NodeLauncher:
    """The test process's side of the launcher (module docstring), started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._forks: ForkServer | None = None

    def popen(self, argv: Sequence[str], env: Mapping[str, str]) -> LaunchedProcess:
        """Fork a node running ``hubbub <argv>`` with ``env`` as its environment."""
        forks = self._started()
        r, w = os.pipe()
        try:
            proc = forks.spawn(json.dumps([list(argv), dict(env)]).encode(), [w])
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        return LaunchedProcess(proc, os.fdopen(r, "rb"), ["hubbub", *argv])

    def _started(self) -> ForkServer:
        with self._lock:
            if self._forks is None:
                here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                env = dict(os.environ)
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(_REPO / "src"), str(_REPO), *filter(None, [env.get("PYTHONPATH")])]
                )
                with there:
                    self._proc = subprocess.Popen(
                        [sys.executable, "-m", "tests.nodelauncher", str(there.fileno())],
                        pass_fds=[there.fileno()],
                        env=env,
                        cwd=os.getcwd(),
                    )
                forks = ForkServer()
                forks.attach(here)
                self._forks = forks
                atexit.register(self.close)
            return self._forks

    def close(self) -> None:
        """End the launcher (and any node still running from it)."""
        with self._lock:
            forks, self._forks = self._forks, None
            proc, self._proc = self._proc, None
        if forks is not None:
            forks.close()
        if proc is not None:
            proc.wait(10)


_LAUNCHER = NodeLauncher()


def launcher() -> NodeLauncher:
    """This test process's launcher."""
    return _LAUNCHER


def _node(payload: bytes, fds: list[int]) -> None:
    """A node, just forked in the launcher: ``hubbub <argv>`` with its environment, its output on
    ``fds[0]``."""
    argv, env = json.loads(payload)
    (out,) = fds
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.environ.clear()
    os.environ.update(env)
    from hubbub.cli import main

    raise SystemExit(main(argv))


def _main(fd: int) -> None:
    # What every node imports, once: each node forked from here starts with them.
    import hubbub.cli
    import hubbub.server
    import hubbub.server_workers
    from hubbub.workers.forkserver import serve

    hubbub.cli.build_parser()  # imports the subcommands' modules too
    # No PR_SET_PDEATHSIG here: it follows the thread that started this process, which may be a passing
    # one (asyncio.to_thread). The end of the socket, when the test process exits or dies, ends this one.
    serve(socket.socket(fileno=fd), _node)


if __name__ == "__main__":
    _main(int(sys.argv[1]))
