"""The log owner of a multi-worker node: the one process that writes the log, for every worker.

A SQLite log has one writer (``log/sqlite``: one writer connection, an exclusive lock on the file). A node
of several worker processes therefore keeps its store in one place, the parent process, and the workers
call it (:class:`~hubbub.workers.remote.RemoteLogStore`): :class:`LogOwner` runs their calls on one thread,
in the order each worker sent them, with **group commit across workers**: the appends waiting from every
worker when the thread is free go to the store as one ``append`` (one transaction), and each worker gets its
own results back. A commit's new events are then sent to every other worker, encoded once
(``frames``), so that each delivers every worker's events (``workers/relay.py``). Reads do not come here
when the log is a file the workers can read themselves (SQLite in WAL mode: ``hello`` names it).

A worker has two sockets to the owner. On the first, its calls come in, read by the owner's thread itself
(it waits on every worker's calls socket at once, and takes what each sent without blocking), which sends
each reply as soon as the call is done: the worker's calling thread waits on that socket for it (one call at
a time), so no other thread of either process wakes in between. On the second go the other workers' events:
the owner's thread sends a commit's as far as the socket takes them at once, and a sender thread per worker
the rest, from an outbox, which is bounded
(:data:`OUTBOX_BYTES` of events): past that, a worker that does not read is sent, once it catches up, the
tops of the channels it missed instead of their events, and it reads them from the log (the cluster's answer
to a node that could not follow Redis). A worker that does not read a reply within
:data:`REPLY_TIMEOUT_S` is cut off.

Notices: a worker's ``notice`` call (short messages between the workers, such as MQTT's takeover of a client
id) is queued for every other worker on its second socket, in order with the events. When a worker's
connection ends (it exited or was killed), every other worker is sent the notice ``notices.gone`` with its
index (``core/notices.py``), so that what they mirror of its connections (rosters, device lists) goes.

Sync: a worker's ``sync`` call queues a ``("sync", [token])`` marker for that worker itself, on its second
socket behind every commit's events queued for it so far: once its relay reads the marker, it has every event
committed before the call (``WorkerRelay.barrier``, which a subscription waits on before it is registered).

Durable consumers: the store's ``consumer_hold`` is answered here, one holder among the workers at a time,
released when its worker's connection ends (a worker that died), as a PostgreSQL session's lock is.

Concurrency contract: :meth:`connect`, :meth:`start`, :meth:`close` and :meth:`statistics` are called from
any one thread (the parent's supervisor); everything else runs on the owner's threads.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import selectors
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from hubbub.core.notices import GONE
from hubbub.errors import StorageError
from hubbub.events import Event
from hubbub.log.appended import Committed, RunAppended, RunAppender, answers_runs
from hubbub.log.base import AppendRequest, AppendRun, EventRun, LogStore

from .frames import (
    FrameBuffer,
    Publishers,
    encode,
    error_state,
    pack_events,
    pack_results,
    send,
    unpack_appends,
    unpack_requests,
)

__all__ = ["OUTBOX_BYTES", "LogOwner"]

log = logging.getLogger("hubbub.workers")

#: Bytes of other workers' events queued for one worker beyond which it gets their channels' tops instead.
OUTBOX_BYTES: Final = 64 << 20
#: Seconds a worker may take to read a reply before it is cut off (it always waits for its replies).
REPLY_TIMEOUT_S: Final = 10
#: Bytes the owner's thread reads from a worker's calls socket at a time.
READ_CHUNK: Final = 1 << 16
#: The most append calls one commit merges (each a worker's batch of up to ``commit_batch`` publishes).
MAX_MERGED: Final = 64

#: The store methods a worker may call (the writer's, the journal's; and reads, for an engine the workers
#: cannot read themselves). ``close`` is the owner's alone.
CALLS: Final = frozenset(
    {
        "trim", "reset_channel", "new_epochs_on_open", "commits_may_be_lost", "apply_retention",
        "consumer_create", "consumer_delete", "consumer_settle", "consumers", "consumer_items",
        "consumer_hold", "stats", "retired_epochs", "head", "heads", "read", "read_runs", "read_last",
        "channels", "top_time", "log_mark", "log_seek", "read_log", "count_log", "log_census", "read_rows",
        "scan_plan", "scan_columns", "state_get", "state_list", "state_write", "notice", "sync",
    }
)  # fmt: skip

_GONE: Final = object()


@dataclass(eq=False)
class _Link:
    """One worker's connection: ``calls`` (its calls in, their replies out, sent by the owner's thread, with
    a send timeout) and ``sock`` (other workers' events out, from an outbox, by a sender thread)."""

    worker: int
    calls: socket.socket
    sock: socket.socket
    lock: threading.Lock = field(default_factory=threading.Lock)
    cond: threading.Condition = field(default_factory=threading.Condition)
    #: Messages to send, each with whether it is events (counted in ``queued``) or a reply.
    outbox: collections.deque[tuple[bytes, bool]] = field(default_factory=collections.deque)
    queued: int = 0
    #: Channels whose events were left out while the outbox was full: channel -> (epoch, top).
    tops: dict[str, tuple[str, int]] = field(default_factory=dict)
    closed: bool = False
    #: The sender thread is sending a message it took from the outbox (the owner's thread must not send).
    sending: bool = False
    #: The calls read so far (the owner's thread's).
    frames: FrameBuffer = field(default_factory=FrameBuffer)

    def reply(self, data: bytes) -> None:
        """Send a call's reply (on the owner's thread). The worker's calling thread waits for it, reading;
        one that does not take it within :data:`REPLY_TIMEOUT_S` is cut off (it stops when it sees its
        connection end), rather than holding up every other worker's commits."""
        try:
            self.calls.sendall(data)
        except OSError as exc:  # gone, or not reading
            if not self.closed:
                log.warning("worker %d: its reply could not be sent (%s): disconnected", self.worker, exc)
            self.close()

    def offer_events(self, data: bytes, events: Sequence[Sequence[Event | EventRun]]) -> bool:
        """Queue a commit's events (``events``: the other workers' groups of them, in commit order), or note
        their tops when the outbox is full (or was, and has not drained since); False when noted as tops."""
        with self.cond:
            if not self.tops and self.queued + len(data) <= OUTBOX_BYTES:
                self._queue(data)
                return True
            for group in events:
                for ev in group:  # an event, or a run of them (``new_events``)
                    if isinstance(ev, EventRun):
                        self.tops[ev.proto.channel] = (ev.proto.epoch, ev.last_seq)
                    else:
                        self.tops[ev.channel] = (ev.epoch, ev.seq)
            self.cond.notify()
            return False

    def offer_notice(self, data: bytes) -> bool:
        """Queue a notice, counted in the outbox's bound as events are; False (dropped) past it: the worker
        is not reading."""
        with self.cond:
            if self.queued + len(data) > OUTBOX_BYTES:
                return False
            self._queue(data)
            return True

    def _queue(self, data: bytes) -> None:
        """Send ``data`` now as far as the socket takes it without waiting, when nothing is queued before
        it and the sender thread is not sending; the rest (all of it otherwise) goes to the outbox, for the
        sender thread. Under ``cond``. A commit's events then usually reach a worker that reads without
        waking the sender thread (a thread switch per commit and worker, and the GIL hand-offs around it)."""
        if not self.outbox and not self.sending and not self.closed:
            try:
                sent = self.sock.send(data, socket.MSG_DONTWAIT)
            except OSError:  # full (BlockingIOError), or gone: the sender thread finds out which
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        self.outbox.append((data, True))
        self.queued += len(data)
        self.cond.notify()

    def next(self) -> bytes | None:
        """The next message to send (waiting for one); None once closed."""
        with self.cond:
            self.sending = False
            while not self.outbox and not self.tops and not self.closed:
                self.cond.wait()
            if self.closed:
                return None
            self.sending = True
            if self.outbox:
                data, events = self.outbox.popleft()
                if events:
                    self.queued -= len(data)
                return data
            tops, self.tops = self.tops, {}
            return encode(("tops", [(ch, ep, top) for ch, (ep, top) in tops.items()]))

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
        for sock in (self.calls, self.sock):
            with contextlib.suppress(OSError):  # a socket its worker closed already
                sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        """Close the sockets (once its reader thread has seen the end: :meth:`LogOwner._gone`)."""
        self.close()
        for sock in (self.calls, self.sock):
            sock.close()


class LogOwner:
    """See the module docstring. ``reads_path``: the file workers read the log from themselves (None:
    they call the owner for reads too)."""

    def __init__(
        self,
        store: LogStore,
        reads_path: str | None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._store = store
        self._runs = answers_runs(store)
        self._reads_path = reads_path
        #: Every worker's calls socket (the owner's thread's), and a socket that wakes it (a new worker, the
        #: end).
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        self._links: dict[int, _Link] = {}
        #: Connected, not yet waited on by the owner's thread (under ``_links_lock``).
        self._joining: list[_Link] = []
        self._links_lock = threading.Lock()
        #: consumer id -> (the holding worker's connection, holds taken)
        self._holds: dict[int, tuple[_Link, int]] = {}
        #: Called (on the owner's thread) if the thread fails: nothing can be committed any more.
        self._on_failure = on_failure
        self._publishers = Publishers()  # the owner's thread's
        self._thread = threading.Thread(target=self._run, name="hubbub-log-owner", daemon=True)
        self.failed: BaseException | None = None
        # statistics
        self.commits = 0
        self.appended = 0
        self.calls = 0
        self.tops_sent = 0

    def start(self) -> None:
        self._thread.start()

    def connect(self, worker: int, calls: socket.socket, events: socket.socket) -> None:
        """Serve worker ``worker`` on ``calls`` and ``events`` (the owner's ends of its two socketpairs),
        replacing the connection of an earlier process of the same index (one that died)."""
        # A kernel send timeout, not Python's (which would make the socket non-blocking for its reader too).
        calls.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", REPLY_TIMEOUT_S, 0))
        link = _Link(worker, calls, events)
        with self._links_lock:
            old = self._links.get(worker)
            self._links[worker] = link
            self._joining.append(link)
        if old is not None:
            old.close()
        hello = {
            "engine": self._store.engine,
            "path": self._reads_path,
            "inline_append_max": self._store.inline_append_max,
            "inline_append_max_bytes": self._store.inline_append_max_bytes,
        }
        link.reply(encode(("hello", hello)))
        threading.Thread(
            target=self._send_loop, args=(link,), name=f"hubbub-owner-send-{worker}", daemon=True
        ).start()
        self._wake()

    def close(self) -> None:
        """Finish the calls read, stop the thread, close every connection (the store stays open: its
        opener closes it)."""
        self._stopping = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join()
        with self._links_lock:
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: it wakes anyway
            self._wake_w.send(b"\0", socket.MSG_DONTWAIT)

    # -- the worker's sender threads ----------------------------------------------------------------------

    def _send_loop(self, link: _Link) -> None:
        while (data := link.next()) is not None:
            try:
                send(link.sock, link.lock, data)
            except OSError:
                link.close()  # the reader sees the end too, and lets the worker's holds go
                return

    # -- the owner's thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        """Wait for calls on every worker's socket; take everything each sent, and run it in rounds of at
        most :data:`MAX_MERGED` calls (a round's appends are one commit)."""
        select = self._selector.select
        while not self._stopping:
            todo: list[tuple[_Link, Any]] = []
            for key, _ in select():
                link = key.data
                if link is None:
                    self._woken()
                else:
                    self._receive(link, todo)
            try:
                for i in range(0, len(todo), MAX_MERGED):
                    self._round(todo[i : i + MAX_MERGED])
            except BaseException as exc:  # a failure no call could be told of: the node must stop
                self.failed = exc
                log.exception("log owner failed")
                if self._on_failure is not None:
                    self._on_failure(exc)
                raise

    def _woken(self) -> None:
        """Wait on the sockets of the workers connected since."""
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._links_lock:
            joining, self._joining = self._joining, []
        for link in joining:
            self._selector.register(link.calls, selectors.EVENT_READ, link)

    def _receive(self, link: _Link, todo: list[tuple[_Link, Any]]) -> None:
        """Add the calls ``link`` sent to ``todo``, reading what its socket holds without waiting; at its end
        (or a failure: a message over the limit, one that does not unpickle), ``_GONE`` after them."""
        sock = link.calls
        gone = False
        try:
            while True:
                try:
                    data = sock.recv(READ_CHUNK, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                if not data:
                    gone = True
                    break
                todo += [(link, msg) for msg in link.frames.feed(data)]
                if len(data) < READ_CHUNK:
                    break
        except Exception as exc:
            log.warning("worker %d: its connection to the log owner failed: %s", link.worker, exc)
            gone = True
        if gone:
            self._selector.unregister(sock)
            todo.append((link, _GONE))

    def _round(self, todo: list[tuple[_Link, Any]]) -> None:
        # Each append: its worker's link, request id, requests (runs among them for a store that takes them:
        # no request object per event) and number of events.
        appends: list[tuple[_Link, int, Sequence[AppendRequest | AppendRun], int]] = []
        for link, msg in todo:
            if msg is _GONE:
                self._flush(appends)
                self._gone(link)
                continue
            if msg[0] == "append":
                if self._store.takes_runs:
                    reqs, n = unpack_appends(msg[2], self._publishers)
                    appends.append((link, msg[1], reqs, n))
                else:
                    plain = unpack_requests(msg[2], self._publishers)
                    appends.append((link, msg[1], plain, len(plain)))
                continue
            _, rid, method, args, kwargs = msg
            self._flush(appends)
            self._call(link, rid, method, args, kwargs)
        self._flush(appends)

    def _flush(self, appends: list[tuple[_Link, int, Sequence[AppendRequest | AppendRun], int]]) -> None:
        """One commit of every append waiting: results to each caller, the new events to every other
        worker."""
        if not appends:
            return
        batch = [r for _, _, reqs, _ in appends for r in reqs]
        try:
            # Runs only when the store takes them (_round); answered as runs when it can (log/appended.py).
            if self._runs:
                results = cast("RunAppender", self._store).append_runs(batch)
            else:
                results = cast("list[Committed]", self._store.append(cast("list[AppendRequest]", batch)))
        except Exception as exc:  # every caller gets the error (the store rolled back)
            state = error_state(_plain(exc))
            for link, rid, _, _ in appends:
                link.reply(encode(("err", rid, state)))
            appends.clear()
            return
        self.commits += 1
        self.appended += len(results)
        groups: list[tuple[int, list[Any]]] = []
        i = 0
        for link, rid, _, n in appends:
            mine = results[i : i + n]
            i += n
            link.reply(encode(("ret", rid, pack_results(mine))))
            new = new_events(mine)
            if new:
                groups.append((link.worker, new))
        appends.clear()
        if not groups:
            return
        data = encode(("events", [(w, pack_events(evs)) for w, evs in groups]))  # once, for every worker
        with self._links_lock:
            links = list(self._links.values())
        for link in links:
            others = [evs for w, evs in groups if w != link.worker]
            if others and not link.offer_events(data, others):
                self.tops_sent += 1

    def _call(self, link: _Link, rid: int, method: str, args: Any, kwargs: Any) -> None:
        self.calls += 1
        try:
            if method not in CALLS:
                raise StorageError(f"not a store call: {method}")
            if method == "consumer_hold":
                value: Any = self._hold(link, *args, **kwargs)
            elif method == "notice":
                self._notice(link, *args)
                value = None
            elif method == "sync":  # False: not queued (the worker is not reading), nothing to wait for
                value = link.offer_notice(encode(("sync", [int(args[0])])))
            else:
                value = getattr(self._store, method)(*args, **kwargs)
            data = encode(("ret", rid, value))
        except Exception as exc:
            data = encode(("err", rid, error_state(_plain(exc))))
        link.reply(data)

    def _hold(self, link: _Link, consumer_id: int, take: bool = True) -> bool:
        """``consumer_hold`` among the workers: held by one worker's connection at a time (a process, not an
        index: a restarted worker's holds are its own)."""
        held = self._holds.get(consumer_id)
        if take:
            if held is None or held[0] is link:
                self._holds[consumer_id] = (link, 1 if held is None else held[1] + 1)
                return True
            return False
        if held is not None and held[0] is link:
            if held[1] <= 1:
                del self._holds[consumer_id]
            else:
                self._holds[consumer_id] = (link, held[1] - 1)
        return True

    def _notice(self, link: _Link | None, topic: str, data: bytes) -> None:
        """A worker's notice (``RemoteLogStore.notice``; ``link`` None: the owner's own) to every other
        worker, behind what is queued for each."""
        msg = encode(("notice", [str(topic), bytes(data)]))
        with self._links_lock:
            links = [other for other in self._links.values() if other is not link]
        for other in links:
            if not other.offer_notice(msg):
                log.warning("worker %d: a notice was dropped (its outbox is full)", other.worker)

    def _gone(self, link: _Link) -> None:
        """A worker's connection ended: its holds go, it is sent nothing more, and the others are told."""
        link.release()
        with self._links_lock:
            current = self._links.get(link.worker) is link
            if current:
                del self._links[link.worker]
        self._holds = {c: h for c, h in self._holds.items() if h[0] is not link}
        if current:  # (a replaced connection's successor has said hello already: the peers know it)
            self._notice(None, GONE, str(link.worker).encode())

    def statistics(self) -> dict[str, int]:
        return {
            "commits": self.commits,
            "appended": self.appended,
            "calls": self.calls,
            "tops_sent": self.tops_sent,
            "workers": len(self._links),
        }


def _plain(exc: BaseException) -> BaseException:
    """``exc`` as it can travel: hubbub's errors and the standard ones as they are, anything else (an
    engine's driver error) as a :class:`StorageError` naming its type."""
    if isinstance(exc, StorageError) or type(exc).__module__ in ("builtins", "hubbub.errors"):
        return exc
    return StorageError(f"{type(exc).__name__}: {exc}")


def new_events(results: Sequence[Committed]) -> list[Event | EventRun]:
    """The new events of an append's results, in order: a run answered as one (``RunAppended``) as its
    :class:`EventRun`, for :func:`~.frames.pack_events` to send as it is."""
    out: list[Event | EventRun] = []
    i, end = 0, len(results)
    while i < end:
        r = results[i]
        if isinstance(r, RunAppended):
            out.append(r.run)
            i += len(r)
            continue
        i += 1
        if not r.duplicate:
            out.append(r.event)
    return out
