"""The composition root of a multi-worker node (``server.workers``, docs/operations.md "Workers").

``hubbub serve --workers N`` runs one parent process and N worker processes:

* The **parent** holds the data directory's lock and opens the log store; its
  :class:`~hubbub.workers.owner.LogOwner` commits every worker's publishes (group commit across workers) and
  sends each commit's events to the other workers, encoded once. It reserves every listener's port (a socket
  bound with ``SO_REUSEPORT`` and never listening: a port 0 becomes a fixed port for the workers, kept while
  the node runs, so a restarted worker binds it again). It starts the workers, each with one end of two
  socketpairs (its connection to the owner: calls, events) and a pipe on which it says it started; once
  every worker has (each logged its ``listening`` records), it logs ``hubbub <version> started``. It
  restarts a worker that dies (with backoff), and on SIGTERM or SIGINT stops every worker gracefully (each
  closes its connections and commits what it queued), then closes the store. SIGHUP goes to every worker.
  The workers are forked by the node's fork server (``workers/forkserver.py``), which the parent forks
  first, before it opens anything or starts a thread: a worker starts with hubbub imported, in some 10 ms
  of CPU where a new interpreter took half a second, at the node's start and at every restart.
* A **worker** is a whole :class:`~hubbub.server.Server` (every dialect) whose store is the owner's
  (:class:`~hubbub.workers.remote.RemoteLogStore`: writes through the owner, reads from the log's file) and
  whose relay (:class:`~hubbub.workers.relay.WorkerRelay`) delivers every worker's events in order. Its
  listeners bind the parent's ports with ``SO_REUSEPORT`` (``transports/accept.py`` ``share_ports``): the
  kernel spreads connections over the workers. It dies with its parent, the fork server, which dies with
  the node's parent (``PR_SET_PDEATHSIG``, and the owner's sockets ending).

On a cluster (a PostgreSQL store with ``cluster.broker``) the parent is no log owner: each worker is a whole
:class:`~hubbub.server.Server` with its own store and broker, a member of the cluster whose id is the node's
with ``/w<i>`` (:func:`member_config`), and the parent (which opened the store once at start, to create or
migrate its schema) holds the data directory and the ports and supervises as above (docs/cluster.md "Nodes of
several workers").

Links up to other servers (``upstream``, ``wearscript.upstream``) run in worker 0 only: the other workers
deliver what they bring, and worker 0 sees every worker's events to send up.

Concurrency contract: the parent runs on plain threads (no event loop): its main thread handles signals
and the workers' exits from one queue; one thread per worker waits for its start and its exit; the fork
server's reader thread records the workers' exits. :meth:`WorkerNode.run` must be called while the process
runs one thread (the fork server is forked then).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import types
import typing
from typing import Any, Final

from hubbub import __version__
from hubbub.config import Config, Section, parse_listen, worker_member_id
from hubbub.errors import StorageError
from hubbub.log import open_store
from hubbub.log.base import RetentionPolicy
from hubbub.log.sqlite import SqliteLogStore
from hubbub.server import federation_node_id, lock_data_dir, run, store_place
from hubbub.workers import admission
from hubbub.workers.forkserver import ForkedProcess, ForkServer
from hubbub.workers.owner import LogOwner

__all__ = ["WorkerNode", "run_workers", "worker_count", "worker_main"]

log = logging.getLogger("hubbub.server")

#: Seconds every worker may take to start.
START_TIMEOUT_S: Final = 60.0
#: Seconds the workers may take to stop gracefully before they are killed.
STOP_TIMEOUT_S: Final = 30.0
#: A restarted worker's backoff: from the first, doubled per quick death, up to the last.
RESTART_BACKOFF_S: Final = (0.1, 5.0)
#: A worker that ran this long before dying is restarted without backoff.
HEALTHY_AFTER_S: Final = 10.0


def worker_count(cfg: Config) -> int:
    """``server.workers``, with 0 as one worker per core this process may use."""
    if cfg.server.workers:
        return cfg.server.workers
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _listeners(cfg: Config) -> list[tuple[Section, str, str]]:
    """Every listener the configuration turns on: its section, field and dotted key (the fields made by
    :func:`~hubbub.config.listen_field`, of sections that are enabled, with an address)."""
    out = []
    for section in cfg.sections():
        if getattr(section, "enabled", True) is False:
            continue
        for f in dataclasses.fields(typing.cast(Any, section)):
            if "listen" in f.metadata and getattr(section, f.name):
                key = f"{section.SECTION}.{f.name}" if section.SECTION else f.name
                out.append((section, f.name, key))
    return out


def reserve_ports(cfg: Config) -> tuple[Config, list[socket.socket], dict[str, str]]:
    """Bind every enabled listener's address with ``SO_REUSEPORT`` (port 0: the kernel picks one); returns
    the configuration with those ports, the sockets (to keep open while the node runs) and each listener's
    address by key."""
    changed: dict[int, tuple[Section, dict[str, str]]] = {}
    socks: list[socket.socket] = []
    addresses: dict[str, str] = {}
    try:
        for section, name, key in _listeners(cfg):
            host, port = parse_listen(getattr(section, name), key)
            host = host.strip("[]")
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, _, _, _, addr = infos[0]
            s = socket.socket(family, socket.SOCK_STREAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(addr)
            bound = s.getsockname()[1]
            address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
            changed.setdefault(id(section), (section, {}))[1][name] = address
            addresses[key] = address
    except BaseException:
        for s in socks:
            s.close()
        raise
    return _replaced(cfg, [(sec, values) for sec, values in changed.values()]), socks, addresses


def _replaced(cfg: Config, changes: list[tuple[Section, dict[str, Any]]]) -> Config:
    """``cfg`` with fields of some of its sections replaced."""
    top: dict[str, Any] = {}
    dialects = dict(cfg.dialects)
    for section, values in changes:
        new = dataclasses.replace(typing.cast(Any, section), **values)
        if section.SECTION in dialects and dialects[section.SECTION] is section:
            dialects[section.SECTION] = new
            continue
        for f in dataclasses.fields(cfg):
            if getattr(cfg, f.name) is section:
                top[f.name] = new
    return dataclasses.replace(cfg, **top, dialects=types.MappingProxyType(dialects))


def member_config(cfg: Config, index: int) -> Config:
    """``cfg`` for worker ``index`` of a cluster node: a member of the cluster whose id is the node's with
    ``/w<index>`` (the same for a restarted worker, which takes its predecessor's place in the rosters at
    once)."""
    return _replaced(cfg, [(cfg.cluster, {"node_id": worker_member_id(cfg.cluster.node_id, index)})])


def _without_links(cfg: Config) -> Config:
    """``cfg`` for a worker other than worker 0: no link up to another server (``upstream``,
    ``wearscript.upstream``)."""
    changes: list[tuple[Section, dict[str, Any]]] = [(cfg.federation, {"upstream": ()})]
    ws = cfg.dialects.get("wearscript")
    if ws is not None and getattr(ws, "upstream", None):
        changes.append((ws, {"upstream": ""}))
    return _replaced(cfg, changes)


@dataclasses.dataclass(eq=False)
class _Worker:
    index: int
    proc: ForkedProcess
    started_at: float
    ready: bool = False


class WorkerNode:
    """The parent process of a multi-worker node (module docstring)."""

    def __init__(self, config: Config, workers: int) -> None:
        self.config = config
        self.n = workers
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._workers: dict[int, _Worker] = {}
        self._owner: LogOwner | None = None
        self._forks = ForkServer(worker_main, lambda: self._events.put(("failed", "fork-server")))
        self._stopping = False
        self._backoff: dict[int, float] = {}
        self.restarts = 0
        #: The workers' shared connection counts (workers/admission.py), when a connection limit is set.
        lim = config.limits
        limited = lim.max_connections or lim.max_connections_per_ip
        self._admission = admission.create(workers) if limited else -1

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit status (1: the workers could not start, or the owner or
        the fork server failed)."""
        self._forks.start()  # first: while this process runs one thread and holds nothing it must not share
        try:
            return self._run_with_forks()
        finally:
            self._forks.close()

    def _run_with_forks(self) -> int:
        cfg = self.config
        st = cfg.storage
        # A cluster node (a broker: its store is PostgreSQL, and PostgreSQL has a broker with workers,
        # ServerConfig.validate): each worker a member of the cluster, with no log owner.
        members = bool(cfg.cluster.broker)
        lock = lock_data_dir(st.data_dir) if st.store != "memory" else -1
        r = cfg.retention
        try:
            try:
                store = open_store(
                    st.store,
                    st.data_dir,
                    st.durability,
                    RetentionPolicy(r.max_age_s, r.max_events, r.max_bytes, r.max_total_bytes),
                    cfg.native.idempotency_window_s,
                )
            except StorageError as exc:
                raise StorageError(f"cannot open the log ({store_place(cfg)}): {exc}") from None
            try:
                if st.durability == "none":  # once for the node, whichever of its workers restarts later
                    store.new_epochs_on_open()
                if members:  # opened to create or migrate the schema, or say why it cannot: the workers' own
                    store.close()
                    return self._serve(None, store.engine)
                return self._serve(store, store.engine)
            finally:
                store.close()
        finally:
            if lock >= 0:
                os.close(lock)

    def _serve(self, store: Any, engine: str) -> int:
        """Run the workers on ``store`` (its :class:`LogOwner` their writer and relay), or, with ``None``,
        as members of the cluster (each its own store and broker)."""
        owner = None
        if store is not None:
            path = str(store.path) if isinstance(store, SqliteLogStore) else None
            owner = self._owner = LogOwner(store, path, lambda exc: self._events.put(("failed", "log-owner")))
            owner.start()
        cfg, reserved, addresses = reserve_ports(self.config)
        # One federation id for the node, made here once: workers making it at once would each keep their own.
        cfg = self.config = _replaced(cfg, [(cfg.federation, {"node_id": federation_node_id(cfg)})])
        if owner is None:  # one cluster node id, each worker a member under it (member_config)
            from hubbub.cluster.broker import default_node_id

            cfg = self.config = _replaced(
                cfg, [(cfg.cluster, {"node_id": cfg.cluster.node_id or default_node_id()})]
            )
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        try:
            for i in range(self.n):
                self._spawn(i)
            if not self._wait_started():
                log.error("the workers did not start; stopping")
                self._stop_workers()
                return 1
            # Each worker logged its listeners ("listening"), on these ports.
            shared = ", ".join(f"{key} {address}" for key, address in addresses.items())
            log.info("%d workers share %s", self.n, shared, extra={"workers": self.n})
            log.info(
                "hubbub %s started",
                __version__,
                extra={
                    "store": engine,
                    "durability": cfg.storage.durability,
                    "data_dir": cfg.storage.data_dir,
                    "workers": self.n,
                },
            )
            failed = self._supervise()
            log.info("shutting down" if failed is None else f"shutting down: {failed} failed")
            self._stop_workers()
            return 0 if failed is None else 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if owner is not None:
                owner.close()
            for s in reserved:
                s.close()
            if self._admission >= 0:
                os.close(self._admission)
            log.info(
                "hubbub stopped", extra={"restarts": self.restarts, **(owner.statistics() if owner else {})}
            )

    def _on_signal(self, sig: int, frame: object) -> None:
        self._events.put(("signal", sig))  # SimpleQueue.put is reentrant: safe in a signal handler

    # -- workers ----------------------------------------------------------------------------------------

    def _spawn(self, index: int) -> None:
        owner = self._owner
        ready_r, ready_w = os.pipe()
        cfg = self.config
        if index > 0:  # links up run in worker 0 only
            cfg = _without_links(cfg)
        ends: list[socket.socket] = []
        if owner is not None:
            calls, calls_w = socket.socketpair()
            events, events_w = socket.socketpair()
            ends = [calls_w, events_w]
            # Before the worker runs: it receives every commit from now on.
            owner.connect(index, calls, events)
        else:
            cfg = member_config(cfg, index)
        # A member's worker gets its ready pipe alone; the owner's its two sockets, then the pipe.
        fds = (*(e.fileno() for e in ends), ready_w)
        # A plain dict of the dialects' sections: a mappingproxy does not pickle.
        # The shared connection counts' descriptor was made before the fork server: every worker has it.
        plain = dataclasses.replace(cfg, dialects=dict(cfg.dialects))
        payload = pickle.dumps((index, plain, self._admission, self.n))
        try:
            proc = self._forks.spawn(payload, fds)
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            for e in ends:
                e.close()
            os.close(ready_w)
        w = self._workers[index] = _Worker(index, proc, time.monotonic())
        threading.Thread(
            target=self._watch, args=(w, ready_r), name=f"hubbub-worker-{index}", daemon=True
        ).start()

    def _watch(self, w: _Worker, ready_r: int) -> None:
        with os.fdopen(ready_r, "rb") as ready:
            if ready.read(1):
                self._events.put(("ready", w))
        w.proc.wait()
        self._events.put(("exit", w))

    def _wait_started(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(w.ready for w in self._workers.values()):
            try:
                kind, what = self._events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                return False
            if kind == "ready":
                what.ready = True
            elif kind in ("exit", "failed") or (kind == "signal" and what != signal.SIGHUP):
                return False
        return True

    def _supervise(self) -> str | None:
        """Handle signals and the workers' exits until asked to stop (None) or until the log owner or the
        fork server fails (``"workers: log-owner"``, ``"workers: fork-server"``)."""
        while True:
            kind, what = self._events.get()
            if kind == "failed":
                return f"workers: {what}"
            if kind == "signal":
                if what == signal.SIGHUP:
                    for each in self._workers.values():
                        with contextlib.suppress(ProcessLookupError):
                            each.proc.send_signal(signal.SIGHUP)
                    continue
                return None
            if kind == "exit":
                w: _Worker = what
                if self._admission >= 0:  # its connections are gone: so are their places
                    admission.clear_region(self._admission, w.index)
                if self._workers.get(w.index) is w and not self._stopping:
                    self._restart(w)
            elif kind == "ready":
                what.ready = True
                log.info("worker %d restarted", what.index, extra={"worker": what.index})
            elif kind == "restart":
                self._spawn(what)

    def _restart(self, w: _Worker) -> None:
        self.restarts += 1
        ran = time.monotonic() - w.started_at
        lo, hi = RESTART_BACKOFF_S
        delay = 0.0 if ran >= HEALTHY_AFTER_S else self._backoff.get(w.index, lo)
        self._backoff[w.index] = lo if ran >= HEALTHY_AFTER_S else min(max(delay, lo) * 2, hi)
        log.error(
            "worker %d exited with status %s; restarting it in %.1f s",
            w.index,
            w.proc.returncode,
            delay,
            extra={"worker": w.index, "status": w.proc.returncode},
        )
        if delay <= 0:
            self._spawn(w.index)
        else:
            threading.Timer(delay, self._events.put, args=(("restart", w.index),)).start()

    def _stop_workers(self) -> None:
        """SIGTERM to every worker, and wait for them (killed past :data:`STOP_TIMEOUT_S`)."""
        self._stopping = True
        for w in self._workers.values():
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for w in self._workers.values():
            if w.proc.wait(max(deadline - time.monotonic(), 0.1)) is None:
                log.error("worker %d did not stop within %.0f s: killed", w.index, STOP_TIMEOUT_S)
                w.proc.kill()
                w.proc.wait()


def run_workers(config: Config) -> None:
    """``hubbub serve`` with ``server.workers`` other than 1: a :class:`WorkerNode` until SIGTERM or SIGINT;
    exits with status 1 when the workers could not start."""
    if WorkerNode(config, worker_count(config)).run():
        raise SystemExit(1)


# -- the worker process ---------------------------------------------------------------------------------


def worker_main(payload: bytes, fds: list[int]) -> None:
    """A worker process, forked by the node's fork server (``workers/forkserver.py``): ``fds`` are its two
    sockets to the owner (calls, events), on a node with a log owner, and its ready pipe; ``payload`` its
    index, configuration, the descriptor of the shared connection counts (-1: no connection limit; made
    before the fork server, so every worker has it: ``workers/admission.py``) and the number of workers,
    pickled."""
    from hubbub.logs import setup_logging
    from hubbub.transports.accept import share_ports
    from hubbub.workers.admission import SharedAdmission
    from hubbub.workers.remote import RemoteLogStore

    *owner_fds, ready_fd = fds
    index, cfg, admission_fd, workers = pickle.loads(payload)
    cfg = dataclasses.replace(cfg, dialects=types.MappingProxyType(dict(cfg.dialects)))
    setup_logging(cfg.logging.level, cfg.logging.format)
    share_ports()
    store = None
    if owner_fds:  # else a cluster member: its own store and broker (member_config)
        calls_fd, events_fd = owner_fds
        store = RemoteLogStore(socket.socket(fileno=calls_fd), socket.socket(fileno=events_fd), index)

    def started() -> None:
        os.write(ready_fd, b"R")
        os.close(ready_fd)

    shared = None
    if admission_fd >= 0:  # the node's connection limits, counted with the other workers
        lim = cfg.limits
        shared = SharedAdmission(
            admission_fd, workers, index, lim.max_connections, lim.max_connections_per_ip
        )
    try:
        run(cfg, worker=store, member=index if store is None else None, started=started, admission=shared)
    except (OSError, StorageError) as exc:
        print(f"hubbub serve: worker {index}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
