"""Run a real ``hubbub serve`` process for tests: free loopback ports, a temporary data directory; started
with ``python -m hubbub``, or forked from a launcher that has imported hubbub (``launcher``:
``tests/nodelauncher.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.nodelauncher import LaunchedProcess, NodeLauncher

__all__ = ["ServerProcess"]


@dataclass
class ServerProcess:
    data_dir: Path
    extra: list[str] = field(default_factory=list)
    #: Fork the process from this launcher instead of starting ``python -m hubbub`` (the same command,
    #: without the interpreter's start and imports).
    launcher: NodeLauncher | None = None
    proc: subprocess.Popen[bytes] | LaunchedProcess | None = None
    ports: dict[str, int] = field(default_factory=dict)
    log_path: Path | None = None
    _pump: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> ServerProcess:
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-{time.monotonic_ns()}.log"
        cmd = [
            sys.executable, "-m", "hubbub", "serve",
            "--data-dir", str(self.data_dir),
            "--http-listen", "127.0.0.1:0",
            "--native-tcp-listen", "127.0.0.1:0",
            "--qpubs-qrpc-listen", "127.0.0.1:0",
            "--mist-tcp-listen", "127.0.0.1:0",
            "--mqtt-tcp-listen", "127.0.0.1:0",
            "--log-format", "json",
            *self.extra,
        ]  # fmt: skip
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2] / "src")
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        # The server's output goes through a pipe: a thread copies it to the log file line by line, notes
        # each listener's port and announces the "started" record, so start() waits on that, not on a poll.
        if self.launcher is not None:
            self.proc = self.launcher.popen(cmd[3:], env)
        else:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        self.ports = {}
        ready = threading.Event()
        self._pump = threading.Thread(target=self._copy_output, args=(self.proc, ready), daemon=True)
        self._pump.start()
        if not ready.wait(timeout):
            self.kill()
            raise RuntimeError(f"server did not start within {timeout}s:\n{self.log()}")
        if not {"http", "native"} <= self.ports.keys():
            self.proc.wait(10)
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
        return self

    def _copy_output(self, proc: subprocess.Popen[bytes] | LaunchedProcess, ready: threading.Event) -> None:
        """Copy the process's output to the log file until it ends; set ``ready`` once the server says it
        started (every listener is up then), or at the end of the output (the process is gone)."""
        assert proc.stdout is not None and self.log_path is not None
        with proc.stdout as out, open(self.log_path, "wb") as log:
            for line in out:
                log.write(line)
                log.flush()
                if ready.is_set():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict):
                    continue
                msg = rec.get("message")
                if msg == "listening":
                    self.ports[rec["listener"]] = int(rec["address"].rsplit(":", 1)[1])
                elif isinstance(msg, str) and msg.startswith("hubbub ") and msg.endswith(" started"):
                    ready.set()  # after every listener's record (the server logs it last)
        ready.set()

    def log(self) -> str:
        if self._pump is not None and self.proc is not None and self.proc.poll() is not None:
            self._pump.join(10)  # the process is gone: its last lines are copied once the pipe ends
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)
