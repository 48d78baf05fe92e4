"""Run a real ``hubbub serve`` process for tests: free loopback ports, a temporary data directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerProcess"]


@dataclass
class ServerProcess:
    data_dir: Path
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)
    log_path: Path | None = None

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-{time.monotonic_ns()}.log"
        cmd = [
            sys.executable, "-m", "hubbub", "serve",
            "--data-dir", str(self.data_dir),
            "--http-listen", "127.0.0.1:0",
            "--native-tcp-listen", "127.0.0.1:0",
            "--log-format", "json",
            *self.extra,
        ]  # fmt: skip
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2] / "src")
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout
        self.ports = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            for line in self.log().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("message") == "listening":
                    self.ports[rec["listener"]] = int(rec["address"].rsplit(":", 1)[1])
            if {"http", "native"} <= self.ports.keys():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not start within {timeout}s:\n{self.log()}")

    def log(self) -> str:
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
