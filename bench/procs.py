"""Servers under test: hubbub and its peers, started on free loopback ports in temp dirs, stopped by PID.

CPU time and RSS are read from ``/proc/<pid>/stat`` and ``/proc/<pid>/status``. Every server is started with
RLIMIT_NOFILE raised to its hard limit so that 10k connections fit.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from proto import Spec, nats_request

__all__ = [
    "Server",
    "available",
    "children",
    "descendants",
    "free_port",
    "install_peers",
    "raise_nofile",
    "start",
]

_TICK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]

#: The peer binaries, looked up on PATH and in the Debian locations.
BINARIES = {"nats": "nats-server", "mosquitto": "mosquitto", "redis": "redis-server"}


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def which(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for d in ("/usr/sbin", "/usr/bin", "/sbin") if os.path.exists(p := f"{d}/{name}")), None
    )


def available(peer: str) -> str | None:
    """The binary for ``peer`` (``nats``, ``mosquitto``, ``redis``), or None when it is not installed."""
    return which(BINARIES[peer])


#: The Debian packages that provide :data:`BINARIES`.
PACKAGES = {"nats": "nats-server", "mosquitto": "mosquitto", "redis": "redis-server"}


def install_peers(peers: list[str], log: Callable[[str], None]) -> str | None:
    """Install the missing ``peers`` with ``apt-get``; None when done, else why not (the caller skips them).

    Only as root on a machine with ``apt-get``: the bench never asks for a password. The packages' own
    services are not needed (the bench starts its servers itself on free loopback ports)."""
    missing = [p for p in peers if available(p) is None]
    if not missing:
        return None
    pkgs = [PACKAGES[p] for p in missing]
    hint = f"not installed (apt-get install {' '.join(pkgs)})"
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return hint
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log(f"installing {' '.join(pkgs)} with apt-get")

    def apt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["apt-get", *args], env=env, capture_output=True, text=True, timeout=900, check=False
        )

    done = apt("install", "-y", "-qq", *pkgs)
    if done.returncode != 0:  # often a stale package index: update once and retry
        apt("update", "-qq")
        done = apt("install", "-y", "-qq", *pkgs)
    if done.returncode != 0:
        log(f"apt-get failed: {done.stderr.strip()[-500:]}")
        return f"{hint}: apt-get failed"
    return None if all(available(p) for p in missing) else hint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout}s")


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a multi-worker hubbub's workers)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid``, children first (a multi-worker hubbub's fork server and, below it,
    its workers)."""
    out = children(pid)
    for child in list(out):
        out += descendants(child)
    return out


def _status_kb(pid: int, key: str, name: str = "status") -> int:
    """The kB figure of line ``key`` of ``/proc/<pid>/<name>``; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Server:
    """One running server process and the temp dir it owns."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], tmp: str, specs: dict[str, Spec]) -> None:
        self.name = name
        self.proc = proc
        self.tmp = tmp
        self.specs = specs

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server so far: its process and its worker processes (a
        multi-worker hubbub, ``--workers``: the fork server and the workers it forked)."""
        return sum(_cpu_s(pid) for pid in (self.pid, *descendants(self.pid)))

    def pids(self) -> list[int]:
        """The server's process and every process below it (a multi-worker hubbub's fork server and
        workers; a single process has none)."""
        return [self.pid, *descendants(self.pid)]

    def rss(self) -> int:
        """Resident bytes of the server: the sum over :meth:`pids` (a node of several workers is measured
        as one server). Pages the workers share with the process they were forked from count once in each;
        a difference of two readings counts only what was allocated between them."""
        return sum(_status_kb(pid, "VmRSS:") for pid in self.pids()) * 1024

    def pss(self) -> int:
        """Proportional set size of the server over :meth:`pids` (``/proc/<pid>/smaps_rollup``): each shared
        page divided among the processes that map it, so pages copied on write after a fork count too."""
        return sum(_status_kb(pid, "Pss:", "smaps_rollup") for pid in self.pids()) * 1024

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _popen(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=raise_nofile,  # noqa: PLW1509 - the driver starts servers before any thread
            start_new_session=True,
        )


def _hubbub(
    extra: list[str],
    data_dir: str | None = None,
    src: str | None = None,
    prefix: Sequence[str] = (),
    timeout: float = 30.0,
) -> Server:
    """``hubbub serve`` of ``src`` (this checkout's by default) with ``extra`` flags, run under ``prefix``
    (a tool's command line, such as valgrind's), given ``timeout`` s to start."""
    tmp = tempfile.mkdtemp(prefix="hubbub-bench-")
    data = data_dir or os.path.join(tmp, "data")
    log = Path(tmp) / "server.log"
    tree = Path(src or ROOT / "src")
    # A tree from before the MQTT dialect does not know its flag (comparing trees, bisecting).
    mqtt = ["--mqtt-tcp-listen", "127.0.0.1:0"] if (tree / "hubbub/transports/mqtt.py").exists() else []
    cmd = [
        *prefix, sys.executable, "-m", "hubbub", "serve",
        "--data-dir", data,
        "--http-listen", "127.0.0.1:0",
        "--native-tcp-listen", "127.0.0.1:0",
        "--qpubs-qrpc-listen", "127.0.0.1:0",
        "--mist-tcp-listen", "127.0.0.1:0",
        *mqtt,
        "--log-format", "json",
        "--log-level", "info",
        "--limits-send-queue", "65536",
        "--limits-send-queue-bytes", str(256 << 20),
        *extra,
    ]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    proc = _popen(cmd, log, env)
    srv = Server("hubbub", proc, tmp, {})
    ports: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    try:
        started = False  # the server's "hubbub <version> started": every worker listens then
        while time.monotonic() < deadline and not started:
            if proc.poll() is not None:
                raise RuntimeError(f"hubbub exited with {proc.returncode}: {log.read_text()[-2000:]}")
            for line in log.read_text(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                msg = rec.get("message")
                if msg == "listening":
                    ports[rec["listener"]] = int(rec["address"].rsplit(":", 1)[1])
                elif isinstance(msg, str) and msg.startswith("hubbub ") and msg.endswith(" started"):
                    started = True
            time.sleep(0.05)
        if not {"http", "native"} <= ports.keys():
            raise RuntimeError(f"hubbub did not start: {log.read_text()[-2000:]}")
    except BaseException:
        srv.stop()
        raise
    srv.specs = {
        "hubbub": Spec("hubbub", ports["native"], ports["http"]),
        "hubbub-ws": Spec("hubbub-ws", ports["native"], ports["http"]),
        "hubbub-json": Spec("hubbub-json", ports["native"], ports["http"]),
        "hubbub-wsjson": Spec("hubbub-wsjson", ports["native"], ports["http"]),
    }
    if "mqtt" in ports:  # hubbub's MQTT dialect, driven as Mosquitto is (``--peers``)
        srv.specs["hubbub-mqtt0"] = Spec("mqtt0", ports["mqtt"])
        srv.specs["hubbub-mqtt1"] = Spec("mqtt1", ports["mqtt"])
    return srv


def start(
    target: str,
    durability: str = "commit",
    data_dir: str | None = None,
    src: str | None = None,
    workers: int = 1,
    connections: int = 0,
) -> Server:
    """Start ``target``: ``hubbub`` (memory store, durability none), ``hubbub-<durability>`` (SQLite),
    ``nats``, ``js`` (JetStream, file storage, stream ``B`` on ``js.>``), ``mosquitto``, ``redis`` or
    ``redis-aof-<fsync|commit|none>`` (append-only file with appendfsync always/everysec/no). A hubbub
    server runs the package in ``src`` (default this checkout's ``src``: another one compares two trees), on
    ``workers`` worker processes (``--workers``). ``connections``: the clients a peer must admit at once
    (Redis's ``--maxclients``, 15,000 unless more; hubbub, NATS and Mosquitto have no lower default cap).
    Every server gets RLIMIT_NOFILE at its hard limit."""
    procs = ["--workers", str(workers)] if workers != 1 else []  # an older tree (src) may not know it
    if target == "hubbub":
        return _hubbub(["--store", "memory", "--durability", "none", *procs], src=src)
    if target.startswith("hubbub-"):
        return _hubbub(["--durability", target.split("-", 1)[1], *procs], data_dir, src)
    tmp = tempfile.mkdtemp(prefix=f"bench-{target}-")
    port = free_port()
    log = Path(tmp) / "server.log"
    srv: Server | None = None
    try:
        if target in ("nats", "js"):
            exe = available("nats")
            assert exe
            cmd = [exe, "-a", "127.0.0.1", "-p", str(port)]
            if target == "js":
                cmd += ["-js", "-sd", tmp]
            srv = Server(target, _popen(cmd, log), tmp, {target: Spec(target, port)})
            _wait_port(port, srv.proc)
            if target == "js":
                srv.specs["nats"] = Spec("nats", port)
                nats_request(
                    Spec("js", port),
                    "$JS.API.STREAM.CREATE.B",
                    {"name": "B", "subjects": ["js.>"], "storage": "file", "max_msgs": -1, "max_bytes": -1},
                )
            return srv
        if target == "mosquitto":
            exe = available("mosquitto")
            assert exe
            conf = Path(tmp) / "mosquitto.conf"
            conf.write_text(
                f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                "max_inflight_messages 0\nmax_queued_messages 0\nmax_queued_bytes 0\n"
                f"log_dest file {tmp}/mosquitto.log\n"
            )
            srv = Server(target, _popen([exe, "-c", str(conf)], log), tmp, {})
            srv.specs = {"mqtt0": Spec("mqtt0", port), "mqtt1": Spec("mqtt1", port)}
            _wait_port(port, srv.proc)
            return srv
        if target.startswith("redis"):
            exe = available("redis")
            assert exe
            cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", ""]
            cmd += ["--maxclients", str(max(15_000, connections + 100))]
            cmd += ["--protected-mode", "no", "--daemonize", "no"]
            if target.startswith("redis-aof-"):
                mode = {"fsync": "always", "commit": "everysec", "none": "no"}[target.rsplit("-", 1)[1]]
                cmd += ["--appendonly", "yes", "--appendfsync", mode]
            else:
                cmd += ["--appendonly", "no"]
            srv = Server(target, _popen(cmd, log), tmp, {})
            srv.specs = {"redis": Spec("redis", port), "xredis": Spec("xredis", port)}
            _wait_port(port, srv.proc)
            return srv
    except BaseException:
        if srv is not None:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    raise ValueError(f"unknown target {target!r}")
