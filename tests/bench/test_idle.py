"""bench/idle.py: how the idle-memory scenario sizes a run beyond one process's RLIMIT_NOFILE and one source
address's ephemeral ports (workers, holders, loopback source addresses), and that a node is measured as one
server (every process of it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))


@pytest.mark.usefixtures("bench")
def test_a_node_gets_enough_workers_for_each_to_stay_under_its_fd_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import idle

    monkeypatch.setattr(idle, "raise_nofile", lambda: 20_000)
    assert idle.node_workers(50_000) == 3  # 50,000 x 1.15 skew / 19,488 fds
    assert idle.node_workers(10_000) == 2  # a node is at least 2 workers
    monkeypatch.setattr(idle, "raise_nofile", lambda: 1 << 20)
    assert idle.node_workers(50_000) == 2


@pytest.mark.usefixtures("bench")
def test_a_run_the_machine_cannot_hold_is_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import idle

    monkeypatch.setattr(idle, "raise_nofile", lambda: 20_000)
    monkeypatch.setattr(idle, "_available_memory", lambda: 1 << 30)
    assert idle.node_skip(50_000) == "50,000 connections need 3.1 GiB of memory, 1.0 GiB available"
    monkeypatch.setattr(idle, "_available_memory", lambda: 8 << 30)
    assert idle.node_skip(50_000) is None
    monkeypatch.setattr(idle, "raise_nofile", lambda: 4_096)
    assert idle.node_skip(50_000) == "RLIMIT_NOFILE hard 4096: 50,000 connections need 17 workers"


@pytest.mark.usefixtures("bench")
def test_holders_connect_from_their_own_loopback_address() -> None:
    from proto import _connect

    with socket.create_server(("127.0.0.1", 0)) as ls:
        port = ls.getsockname()[1]
        with _connect(port, "127.0.0.2") as c, _connect(port) as d:
            a, _ = ls.accept()
            b, _ = ls.accept()
            with a, b:
                assert {a.getpeername()[0], b.getpeername()[0]} == {"127.0.0.2", "127.0.0.1"}
                assert c.getsockname()[0] == "127.0.0.2" and d.getsockname()[0] == "127.0.0.1"


@pytest.mark.usefixtures("bench")
def test_a_servers_memory_is_the_sum_over_its_processes() -> None:
    from procs import Server

    # A parent that forks a child which allocates 64 MiB and touches it: the server's RSS includes it.
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    b = b'x' * (64 << 20); print('ok', flush=True); time.sleep(60)\n"
        "else:\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    srv = Server("test", proc, str(ROOT / "nonexistent-tmp"), {})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
        deadline = time.monotonic() + 10
        while len(srv.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        child = srv.pids()[1]
        with open(f"/proc/{proc.pid}/status") as f:
            own = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) * 1024
        assert srv.rss() - own >= 64 << 20, (srv.rss(), own, child)
        assert srv.pss() >= 64 << 20
    finally:
        for pid in srv.pids()[1:]:
            os.kill(pid, 9)
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
