"""The fork server of a multi-worker node: worker processes forked from a process that has imported hubbub.

A worker process started from scratch (``python -m …``) spends about half a second of CPU starting an
interpreter and importing hubbub, aiohttp and every dialect before it does anything of its own; the node's
own work to start a worker (a :class:`~hubbub.server.Server` on the parent's ports) is about 10 ms. The
parent has imported all of it already, but it cannot fork a worker itself once it runs threads (the log
owner's, the supervisor's): a thread holding a lock at the moment of ``fork`` leaves it held forever in the
child. So the parent forks, first thing, while it has one thread, a **fork server**: a process that does
nothing but fork a worker on request, report each worker's exit, and pass on signals to its workers. A
worker forked from it starts with every module imported (sharing their memory with the fork server until
it writes to it), on the first restart as on the first start.

The guarantees of a node's worker processes hold as before (docs/architecture.md "Workers"):

* **No thread before fork.** :meth:`ForkServer.start` refuses to fork when the calling process runs more
  than one thread, and the fork server never starts one; it waits on its socket and ``SIGCHLD`` with
  ``select``.
* **A worker's crash costs only its connections.** The fork server reaps it and reports its exit status;
  the parent restarts it through the fork server, as the first time.
* **Everything dies with the parent.** The fork server and each worker set ``PR_SET_PDEATHSIG`` (``SIGKILL``)
  on their own parent (Linux), and exit at once if it is gone already; the fork server also exits when the
  parent's end of its socket closes (its workers then die with it). If the fork server itself dies, its
  workers die with it: the parent is told (``on_lost``), and stops the node.
* **Signals.** ``SIGINT``, ``SIGTERM`` and ``SIGHUP`` sent to the whole process group (a terminal's
  Ctrl-C, a service manager stopping every process of the node) do not stop the fork server, which must
  outlive its workers' graceful stop; a worker is forked with the dispositions the parent had. The parent
  signals a worker through the fork server (:meth:`ForkedProcess.send_signal`), which signals only a child
  it has not reaped yet, so a worker's process id, reused after its exit, is never signalled by mistake.

A fork server may also run in a process started for it (:func:`serve`, with the parent's side on the other
end of a socket: :meth:`ForkServer.attach`), such as a test harness's launcher of whole nodes.

The parent and the fork server talk over one Unix stream socket. Each message is a header
(:data:`_HEAD`: kind, token, value, length) and ``length`` bytes. The parent sends ``SPAWN`` (the payload
for the worker; the descriptors it gets, passed with the header as ``SCM_RIGHTS``, as many as ``value``)
and ``SIGNAL`` (``value``: the signal); the fork server sends ``SPAWNED`` (``value``: the process id) and
``EXITED`` (``value``: the exit status as :attr:`subprocess.Popen.returncode` gives it: the code, or the
negative signal number). ``token`` names a worker process between them.

Concurrency contract: :meth:`ForkServer.start` is called while the process has one thread;
:meth:`ForkServer.spawn`, :meth:`ForkServer.close` and :meth:`ForkedProcess.send_signal` from any thread
(sends are serialised); a reader thread of the parent receives the fork server's messages and completes
the :class:`ForkedProcess` handles, which any thread may wait on.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = ["ForkServer", "ForkServerLost", "ForkedProcess", "die_with_parent", "serve"]

log = logging.getLogger("hubbub.workers")

#: A message's header: kind, token, value, length of the bytes that follow.
_HEAD: Final = struct.Struct("!BIiI")
_SPAWN, _SIGNAL, _SPAWNED, _EXITED = 1, 2, 3, 4
#: The most descriptors one worker is given.
MAX_FDS: Final = 16
#: Seconds :meth:`ForkServer.close` waits for the fork server to exit before it kills it.
CLOSE_TIMEOUT_S: Final = 5.0
#: Seconds :meth:`ForkServer.spawn` waits for the fork server to say it forked: a fork server run in a
#: process of its own (:func:`serve`) reads no request before its imports are done, which takes seconds on a
#: loaded machine (the node's own fork server, forked, answers in milliseconds).
SPAWN_TIMEOUT_S: Final = 60.0
#: The signals that must not stop the fork server (module docstring).
_SHIELDED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: A worker's code: called in the forked worker process with the payload and descriptors of its ``SPAWN``.
#: Its return ends the process with status 0; ``SystemExit`` with its code (as the interpreter does); any
#: other exception with status 1, its traceback on standard error.
ChildMain = Callable[[bytes, list[int]], object]


class ForkServerLost(OSError):
    """The fork server is gone: no worker can be started through it."""


def die_with_parent(parent: int) -> None:
    """Be killed when the parent process dies (Linux ``PR_SET_PDEATHSIG``), or exit now if it already has
    (``parent`` is the parent's process id, read before; elsewhere than Linux only the check is made)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _read_exact(sock: socket.socket, n: int, start: bytes = b"") -> bytes | None:
    """``n`` bytes from ``sock`` (``start`` already read), or None at the end of the stream."""
    buf = bytearray(start)
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class ForkedProcess:
    """A worker process forked by the fork server: a subset of :class:`subprocess.Popen`'s interface
    (``pid``, ``returncode``, ``send_signal``, ``kill``, ``wait``). Thread-safe."""

    def __init__(self, server: ForkServer, token: int) -> None:
        self._server = server
        self.token = token
        #: The process id, once the fork server said (None before, or if the fork failed).
        self.pid: int | None = None
        #: The exit status once it exited: its code, or the negative number of the signal that ended it.
        self.returncode: int | None = None
        self._done = threading.Event()
        self._spawned = threading.Event()

    def send_signal(self, sig: int) -> None:
        """Signal the process, if it still runs (the fork server signals only a child it has not reaped)."""
        if self.returncode is None:
            self._server._send(_SIGNAL, self.token, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status once the process exited, or None if it still runs after ``timeout`` seconds."""
        self._done.wait(timeout)
        return self.returncode

    def _forked(self, pid: int) -> None:
        self.pid = pid
        self._spawned.set()

    def _exited(self, status: int) -> None:
        self.returncode = status
        self._done.set()
        self._spawned.set()

    def __repr__(self) -> str:
        return f"<ForkedProcess token={self.token} pid={self.pid} returncode={self.returncode}>"


class ForkServer:
    """The parent's side of the fork server (module docstring): :meth:`start` forks it (to run
    ``child_main`` in each worker), or :meth:`attach` talks to one that runs in a process of its own
    (:func:`serve`); :meth:`spawn` has it fork a worker. ``on_lost`` is called (on the reader thread) if the
    fork server ends while this side is open: its workers are gone then and none can be started."""

    def __init__(
        self, child_main: ChildMain | None = None, on_lost: Callable[[], None] | None = None
    ) -> None:
        self._child_main = child_main
        self._on_lost = on_lost
        self._sock: socket.socket | None = None
        self._pid: int | None = None
        self._send_lock = threading.Lock()
        self._procs: dict[int, ForkedProcess] = {}
        self._tokens = 0
        self._closing = False
        self._gone = False
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        """The fork server's process id (None before :meth:`start`)."""
        return self._pid

    def start(self) -> None:
        """Fork the fork server, to run ``child_main``. The calling process must run one thread only (raises
        RuntimeError)."""
        _one_thread()
        if self._child_main is None:
            raise ValueError("start() needs the workers' child_main")
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # what is buffered must not be written twice
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the fork server; its behaviour is tested through the parent
            status = 1
            try:
                here.close()
                die_with_parent(parent)
                serve(there, self._child_main)
                status = 0
            except BaseException:
                with contextlib.suppress(Exception):
                    traceback.print_exc()
            finally:
                os._exit(status)
        there.close()
        self._pid = pid
        self.attach(here)

    def attach(self, sock: socket.socket) -> None:
        """Talk to the fork server at the other end of ``sock`` (a Unix stream socket): the one :meth:`start`
        forked, or one that :func:`serve` runs in a process the caller started (and reaps itself)."""
        self._sock = sock
        self._reader = threading.Thread(target=self._read, name="hubbub-fork-server", daemon=True)
        self._reader.start()

    def spawn(self, payload: bytes, fds: Sequence[int] = ()) -> ForkedProcess:
        """Have the fork server fork a worker that runs ``child_main(payload, fds)`` (the descriptors are
        duplicated into it; the caller keeps and closes its own), once it did: the handle has its ``pid``, or
        its ``returncode`` if no process could be forked. Raises :class:`ForkServerLost` if the fork server
        is gone or does not answer."""
        if len(fds) > MAX_FDS:
            raise ValueError(f"at most {MAX_FDS} descriptors per worker")
        with self._send_lock:
            if self._sock is None or self._closing or self._gone:
                raise ForkServerLost("the fork server is not running")
            self._tokens += 1
            proc = self._procs[self._tokens] = ForkedProcess(self, self._tokens)
            head = _HEAD.pack(_SPAWN, proc.token, len(fds), len(payload))
            try:
                sent = socket.send_fds(self._sock, [head], list(fds)) if fds else self._sock.send(head)
                self._sock.sendall(head[sent:] + payload)
            except OSError as exc:
                del self._procs[proc.token]
                raise ForkServerLost(f"the fork server is gone: {exc}") from exc
        if not proc._spawned.wait(SPAWN_TIMEOUT_S) or (proc.pid is None and self._gone):
            raise ForkServerLost("the fork server did not fork the worker")
        return proc

    def _send(self, kind: int, token: int, value: int) -> None:
        with self._send_lock:
            if self._sock is None or self._closing:
                return
            with contextlib.suppress(OSError):  # gone: the reader thread tells
                self._sock.sendall(_HEAD.pack(kind, token, value, 0))

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            while (head := _read_exact(sock, _HEAD.size)) is not None:
                kind, token, value, _ = _HEAD.unpack(head)
                proc = self._procs.get(token)
                if proc is None:
                    continue
                if kind == _SPAWNED:
                    proc._forked(value)
                elif kind == _EXITED:
                    del self._procs[token]
                    proc._exited(value)
        except OSError:
            pass
        with self._send_lock:
            self._gone = True
            procs = list(self._procs.values())
            self._procs.clear()
        if not self._closing:
            log.error("the workers' fork server ended; its workers are gone")
            if self._on_lost is not None:
                self._on_lost()  # first: a worker's exit below must not be taken for a crash to restart
        for proc in procs:  # killed by PR_SET_PDEATHSIG with the fork server
            proc._exited(-signal.SIGKILL)

    def close(self) -> None:
        """End the fork server (its workers, if any still run, die with it) and reap it if :meth:`start`
        forked it."""
        with self._send_lock:
            if self._sock is None or self._closing:
                return
            self._closing = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)
        # The fork server reads the end of the stream and exits, which ends the reader's stream in turn.
        if self._reader is not None:
            self._reader.join(CLOSE_TIMEOUT_S)
        if self._pid is not None:
            if self._reader is not None and self._reader.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
        if self._reader is not None:
            self._reader.join(CLOSE_TIMEOUT_S)
        self._sock.close()


def _one_thread() -> None:
    if threading.active_count() != 1:
        raise RuntimeError(
            f"a fork server must run in a process before any thread starts ({threading.active_count()} run)"
        )


def serve(sock: socket.socket, child_main: ChildMain) -> None:
    """Be a fork server in this process, on ``sock`` (the other end: a :class:`ForkServer`'s
    :meth:`~ForkServer.attach`), until that end closes; each worker forked runs ``child_main``. The process
    must run one thread (raises RuntimeError) and starts none while it serves. A process started to be a
    fork server (a test harness's, say) calls it; :meth:`ForkServer.start` forks one that does."""
    _one_thread()
    _Server(sock, child_main).run()


class _Server:
    """The fork server process's loop: one thread, ``select`` over the parent's socket and a pipe that
    ``SIGCHLD`` wakes."""

    def __init__(self, sock: socket.socket, child_main: ChildMain) -> None:
        self._sock = sock
        self._child_main = child_main
        self._children: dict[int, int] = {}  # pid → token
        self._tokens: dict[int, int] = {}  # token → pid
        self._pid = os.getpid()

    def run(self) -> None:
        dispositions: dict[int, Any] = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SHIELDED}
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda sig, frame: None)  # a handler, so that the wake-up fd is written
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        # What the workers inherit is never collected again in the fork server: freezing it keeps the
        # collector from writing to those pages here (the workers freeze their own at start: server.tune_gc).
        gc.freeze()
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in sel.select():
                    if key.fileobj == wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_r, 512)
                    elif not self._request(dispositions, (sel, wake_r, wake_w)):
                        return
                self._reap()
        finally:
            sel.close()

    def _request(self, dispositions: dict[int, Any], own: tuple[selectors.BaseSelector, int, int]) -> bool:
        """Handle one message of the parent's; False at the end of its stream."""
        data, fds, _, _ = socket.recv_fds(self._sock, _HEAD.size, MAX_FDS)
        head = _read_exact(self._sock, _HEAD.size, data) if data else None
        if head is None:
            for fd in fds:
                os.close(fd)
            return False
        kind, token, value, length = _HEAD.unpack(head)
        payload = _read_exact(self._sock, length) if length else b""
        if payload is None:
            return False
        if kind == _SPAWN:
            try:
                pid = os.fork()
                if pid == 0:  # pragma: no cover - runs in the worker
                    self._child(payload, fds, dispositions, own)
                self._children[pid] = token
                self._tokens[token] = pid
                self._sock.sendall(_HEAD.pack(_SPAWNED, token, pid, 0))
            except OSError as exc:  # no process could be forked: the parent sees the worker exit at once
                print(f"hubbub: the fork server could not fork a worker: {exc}", file=sys.stderr)
                self._sock.sendall(_HEAD.pack(_EXITED, token, 1, 0))
            finally:
                for fd in fds:
                    os.close(fd)
        elif kind == _SIGNAL:
            child = self._tokens.get(token)
            if child is not None:  # not reaped yet, so the id is still this child's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, value)
        return True

    def _reap(self) -> None:
        """Report every child that exited."""
        while self._children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            token = self._children.pop(pid, None)
            if token is not None:
                del self._tokens[token]
                self._sock.sendall(_HEAD.pack(_EXITED, token, os.waitstatus_to_exitcode(status), 0))

    def _child(
        self,
        payload: bytes,
        fds: list[int],
        dispositions: dict[int, Any],
        own: tuple[selectors.BaseSelector, int, int],
    ) -> None:  # pragma: no cover - runs in the worker
        """The worker process, just forked: drop the fork server's state, run the worker's code, exit."""
        status = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for sig, disposition in dispositions.items():
                signal.signal(sig, disposition)
            sel, wake_r, wake_w = own
            sel.close()
            os.close(wake_r)
            os.close(wake_w)
            self._sock.close()
            die_with_parent(self._pid)
            self._child_main(payload, fds)
            status = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(status)
