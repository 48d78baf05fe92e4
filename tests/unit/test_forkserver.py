"""The workers' fork server (``hubbub/workers/forkserver.py``): a worker forked on request runs its code with
its payload and descriptors, its exit status comes back as ``Popen`` gives it, signals reach it through the
fork server, the fork server survives the signals a process group gets, and everything dies with the
parent (or with the fork server).

Each scenario runs in a fresh interpreter (``_scenario``): a fork server must be forked while its process
runs one thread, and the test process (an xdist worker) runs several."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="Linux fork")

_SRC = str(Path(__file__).resolve().parents[2] / "src")

_PRELUDE = """
import json, os, signal, sys, threading, time
from hubbub.workers.forkserver import ForkServer, ForkServerLost

# Python's own SIGINT handler (KeyboardInterrupt), which a worker must keep: an interpreter started with
# SIGINT ignored keeps it ignored, and a test run started in the background of a non-interactive shell
# (``.ci/run &``, nohup) hands it to every process it starts.
signal.signal(signal.SIGINT, signal.default_int_handler)

def out(**kw):
    print(json.dumps(kw), flush=True)

def child(payload, fds):
    # What the child is asked to do, by its payload.
    what = payload.decode()
    if what.startswith("echo"):
        os.write(fds[0], (what + " " + str(os.getppid())).encode())
        os.close(fds[0])
    elif what == "exit3":
        raise SystemExit(3)
    elif what == "raise":
        raise ValueError("boom")
    elif what == "wait":
        os.write(fds[0], b"up")
        os.close(fds[0])
        while True:
            time.sleep(1)  # until a signal ends it
"""


def _scenario(
    code: str, timeout: float = 30.0, args: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(code), *(args or [])],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _records(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    merged: dict[str, Any] = {}
    for line in result.stdout.splitlines():
        merged.update(json.loads(line))
    return merged


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """Wait until process ``pid`` is gone or a zombie."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)  # polling a process the kernel ends
    return False


def test_a_worker_runs_its_code_with_its_payload_and_descriptors_and_its_status_comes_back() -> None:
    got = _records(
        _scenario("""
        fs = ForkServer(child)
        fs.start()
        r, w = os.pipe()
        p = fs.spawn(b"echo hello", [w])
        os.close(w)  # the worker has its own copy
        data = os.read(r, 100).decode()
        out(echo=data, server=fs.pid, status=p.wait(10), pid=p.pid)
        out(exit3=fs.spawn(b"exit3").wait(10), raised=fs.spawn(b"raise").wait(10))
        fs.close()
        out(reaped=not os.path.exists(f"/proc/{fs.pid}"))
        """)
    )
    text, parent = got["echo"].rsplit(" ", 1)
    assert text == "echo hello"
    assert int(parent) == got["server"], "the worker is the fork server's child"
    assert got["status"] == 0 and isinstance(got["pid"], int)
    assert got["exit3"] == 3
    assert got["raised"] == 1
    assert got["reaped"], "close() leaves no zombie"


def test_the_traceback_of_a_worker_that_raised_goes_to_standard_error() -> None:
    result = _scenario("""
        fs = ForkServer(child)
        fs.start()
        out(raised=fs.spawn(b"raise").wait(10))
        fs.close()
        """)
    assert _records(result)["raised"] == 1
    assert "ValueError: boom" in result.stderr


def test_signals_reach_a_running_worker_and_wait_times_out_while_it_runs() -> None:
    got = _records(
        _scenario("""
        fs = ForkServer(child)
        fs.start()
        r, w = os.pipe()
        p = fs.spawn(b"wait", [w])
        os.close(w)
        os.read(r, 2)
        out(running=p.wait(0.05))
        p.send_signal(signal.SIGTERM)
        out(terminated=p.wait(10))
        r, w = os.pipe()
        q = fs.spawn(b"wait", [w])
        os.close(w)
        os.read(r, 2)
        q.kill()
        out(killed=q.wait(10))
        q.send_signal(signal.SIGTERM)  # exited: nothing is sent, whoever has its id now
        fs.close()
        """)
    )
    assert got["running"] is None
    assert got["terminated"] == -signal.SIGTERM
    assert got["killed"] == -signal.SIGKILL


def test_the_fork_server_survives_the_signals_a_process_group_gets() -> None:
    """Ctrl-C, a hang-up or a service manager's SIGTERM to every process of the node must not end the fork
    server (its workers would die before they stop gracefully); the workers keep the parent's dispositions."""
    got = _records(
        _scenario("""
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the parent's, which its workers inherit
        fs = ForkServer(child)
        fs.start()
        r, w = os.pipe()
        p = fs.spawn(b"wait", [w])
        os.close(w)
        os.read(r, 2)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(fs.pid, sig)
        p.send_signal(signal.SIGHUP)  # ignored, as in the parent
        out(after_signals=p.wait(0.2))
        p.send_signal(signal.SIGINT)  # the parent's KeyboardInterrupt: status 1 with a traceback
        out(interrupted=p.wait(10))
        r, w = os.pipe()
        fs.spawn(b"echo again", [w])
        os.close(w)
        out(echo=os.read(r, 100).decode().split()[0])
        fs.close()
        """)
    )
    assert got["after_signals"] is None
    assert got["interrupted"] == 1
    assert got["echo"] == "echo"


def test_a_fork_server_that_dies_is_reported_and_takes_its_workers() -> None:
    got = _records(
        _scenario("""
        lost = threading.Event()
        fs = ForkServer(child, lost.set)
        fs.start()
        r, w = os.pipe()
        p = fs.spawn(b"wait", [w])
        os.close(w)
        os.read(r, 2)
        out(worker=p.pid)
        os.kill(fs.pid, signal.SIGKILL)
        out(lost=lost.wait(10), status=p.wait(10))
        try:
            fs.spawn(b"echo")
        except ForkServerLost:
            out(refused=True)
        fs.close()
        """)
    )
    assert got["lost"] is True
    assert got["status"] == -signal.SIGKILL
    assert got["refused"] is True
    assert _gone(got["worker"]), "the worker outlived its fork server"


def test_the_fork_server_and_its_workers_die_with_the_parent() -> None:
    env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    code = _PRELUDE + textwrap.dedent("""
        fs = ForkServer(child)
        fs.start()
        r, w = os.pipe()
        p = fs.spawn(b"wait", [w])
        os.close(w)
        os.read(r, 2)
        out(server=fs.pid, worker=p.pid)
        time.sleep(60)  # until the test kills this process
        """)
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) as parent:
        try:
            assert parent.stdout is not None
            got = json.loads(parent.stdout.readline())
            parent.kill()
        finally:
            parent.kill()
            parent.wait(10)
    assert _gone(got["server"]), "the fork server outlived the parent"
    assert _gone(got["worker"]), "the worker outlived the parent"


def test_the_fork_server_is_not_forked_from_a_process_running_threads() -> None:
    got = _records(
        _scenario("""
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            ForkServer(child).start()
        except RuntimeError as exc:
            out(refused=str(exc))
        stop.set()
        t.join()
        """)
    )
    assert "before any thread starts" in got["refused"]


def test_a_fork_server_run_in_a_process_of_its_own_serves_a_parent_that_attaches() -> None:
    """``serve`` in a process started for it (a test harness's launcher), ``attach`` on the other side: the
    same requests and reports; it ends when the parent's end closes, and the parent reaps it."""
    got = _records(
        _scenario(
            """
        import socket, subprocess
        here, there = socket.socketpair()
        code = sys.argv[1] + "\\nfrom hubbub.workers.forkserver import serve\\nimport socket\\n"
        code += f"serve(socket.socket(fileno={there.fileno()}), child)"
        server = subprocess.Popen([sys.executable, "-c", code], pass_fds=[there.fileno()])
        there.close()
        fs = ForkServer()
        fs.attach(here)
        r, w = os.pipe()
        p = fs.spawn(b"echo attached", [w])
        os.close(w)
        out(echo=os.read(r, 100).decode(), server=server.pid, status=p.wait(10))
        fs.close()
        out(server_status=server.wait(10))
        """,
            args=[_PRELUDE],
        )
    )
    text, parent = got["echo"].rsplit(" ", 1)
    assert text == "echo attached" and int(parent) == got["server"]
    assert got["status"] == 0
    assert got["server_status"] == 0


def test_a_spawn_waits_for_a_fork_server_still_starting() -> None:
    """A fork server in a process of its own reads no request before its imports are done: seconds on a
    loaded machine (more than five at a load of 13 with four test processes starting theirs at once)."""
    got = _records(
        _scenario(
            """
        import socket, subprocess
        here, there = socket.socketpair()
        code = sys.argv[1] + "\\nimport socket\\nfrom hubbub.workers.forkserver import serve\\n"
        code += f"time.sleep(5.5)\\nserve(socket.socket(fileno={there.fileno()}), child)"
        server = subprocess.Popen([sys.executable, "-c", code], pass_fds=[there.fileno()])
        there.close()
        fs = ForkServer()
        fs.attach(here)
        r, w = os.pipe()
        p = fs.spawn(b"echo late", [w])
        os.close(w)
        out(echo=os.read(r, 100).decode().split()[1], status=p.wait(10))
        fs.close()
        server.wait(10)
        """,
            args=[_PRELUDE],
        )
    )
    assert got == {"echo": "late", "status": 0}
