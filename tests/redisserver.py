"""A throwaway Redis server for tests: ``redis-server`` on a free port of 127.0.0.1, in a temporary directory.

No persistence (no RDB, no AOF), loopback only, protected mode on. It never uses a server that happens to be
running. :func:`missing_reason` says why none can be started (the binary is not installed); callers skip with
it, except in CI (``.ci/run`` installs ``redis-server``). :meth:`RedisServer.kill` is a real ``kill -9``;
:meth:`RedisServer.start` starts it again on the same port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["RedisServer", "missing_reason"]


def binary() -> str | None:
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.access(p, os.X_OK)), None
    )


def missing_reason() -> str | None:
    if binary() is None:
        return "redis-server not found (apt-get install redis-server)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process (see the module docstring); ``url`` is its ``redis://`` URL."""

    def __init__(self) -> None:
        exe = binary()
        if exe is None:
            raise RuntimeError(missing_reason() or "no redis-server")
        self.exe = exe
        self.dir = Path(tempfile.mkdtemp(prefix="hubbub-redis-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> RedisServer:
        for _ in range(5):
            if not self.port:
                self.port = _free_port()
            log = open(self.dir / "server.log", "ab")  # noqa: SIM115 -- handed to the child
            args = [
                self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "no", "--protected-mode", "yes", "--daemonize", "no",
            ]  # fmt: skip
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, cwd=self.dir)
            log.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if self._ping():
                    return self
                time.sleep(0.02)
            self.stop()
            if "Address already in use" in self.log():
                self.port = 0  # taken since we looked: another port
                continue
            raise RuntimeError(f"redis-server did not start:\n{self.log()}")
        raise RuntimeError(f"redis-server: no free port\n{self.log()}")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def log(self) -> str:
        try:
            return (self.dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """``kill -9``: no chance to send anything more."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        self.kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
