"""A worker's log: :class:`RemoteLogStore`, the node's one store as a worker process sees it.

Writes (appends, trims, epochs, retention, the consumers' journals, the state maps) are calls to the
:class:`~hubbub.workers.owner.LogOwner` in the parent process, over the worker's calls socket (``frames``):
the calling thread sends its call and reads the reply itself (one call at a time on the socket), so the
worker's writer thread still commits one group at a time, and the owner merges the groups of every worker
into one commit. Reads go straight to the log's file
where the owner names one (SQLite in WAL mode: a read-only connection per thread, each read one snapshot,
concurrent with the owner's writer), else to the owner too.

A second socket brings the other workers' committed events (and, for a worker that fell behind, their
channels' tops) and their notices (:meth:`RemoteLogStore.notice`), read by the worker's event loop from
:meth:`RemoteLogStore.listen` on (without blocking, as they come), which hands them to the worker's relay
(``workers/relay.py``), which delivers them in order. What arrives before the relay listens waits in the
socket and the owner's outbox (past its bound, the owner sends the channels' tops instead). A thread of its
own read them before: its every wake-up, and its GIL hand-offs with the loop, cost more than the reading.

``shared`` is true: other processes write this log too, so the durable consumers read their journals for
what other workers committed (``core/consumers.py``), and hold a consumer through the owner
(``consumer_hold``).

Concurrency contract: every store method may be called from any thread (they block on the owner): core
calls ``append`` on the event loop for a batch within the owner's store's ``inline_append_max`` (a round trip
to the owner, whose commit waits on no fsync then), else on its writer thread; :meth:`listen`'s callbacks
run on the event loop that called it. When the owner goes away (the parent died), every call waiting or made
later raises :class:`StorageError` and ``on_lost`` is called once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hubbub.errors import StorageError
from hubbub.events import Event
from hubbub.log.base import (
    AppendRequest,
    AppendResult,
    AppendRun,
    ChannelInfo,
    EventRun,
    LogMark,
    LogPage,
    LogStore,
    RetentionPolicy,
    Row,
    ScanColumns,
    ScanPlan,
    StateWrite,
    StoreStats,
)
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalItem, Retry
from hubbub.log.sqlite import SqliteLogStore

from .frames import (
    FrameBuffer,
    FrameReader,
    Publishers,
    encode,
    pack_requests,
    rebuild_error,
    unpack_events,
    unpack_results,
)

__all__ = ["Broadcast", "RemoteLogStore"]

log = logging.getLogger("hubbub.workers")

#: What the owner sends besides replies: ``("events", [(worker, [Event, ...]), ...])``,
#: ``("tops", [(channel, epoch, top), ...])``, ``("notice", [topic, data])`` or ``("sync", [token])``.
Broadcast = tuple[str, list[Any]]


class RemoteLogStore(LogStore):
    """See the module docstring. ``calls`` and ``events``: the worker's ends of its two socketpairs with the
    owner (calls and their replies; the other workers' events); ``worker`` its index (its own events in a
    broadcast are left out: its ``append`` returned them)."""

    shared = True
    # A connection's run goes to the owner as one item of the append (``frames.pack_requests``).
    takes_runs = True

    def __init__(self, calls: socket.socket, events: socket.socket, worker: int) -> None:
        self.worker = worker
        self._calls = calls
        self._events = events
        #: Held for a call and its reply: one call at a time, the caller reads its own reply.
        self._call_lock = threading.Lock()
        self._replies = FrameReader(calls)
        hello = self._replies.read()
        if not (isinstance(hello, tuple) and hello[0] == "hello"):
            raise StorageError("the log owner did not greet this worker")
        info: dict[str, Any] = hello[1]
        self.engine = str(info["engine"])
        # The owner's store's: an append small enough for its loop is a round trip to the owner, whose
        # commit is that store's (no fsync); the worker's loop sends it and waits for the reply itself, as
        # a single process's loop commits such an append, without the hand-offs to its writer thread and
        # back (two thread wake-ups per commit, each waiting for a core on a busy machine).
        self.inline_append_max = int(info.get("inline_append_max", 0))
        self.inline_append_max_bytes = int(info.get("inline_append_max_bytes", 0))
        path = info.get("path")
        #: Where this worker reads the log itself (None: through the owner).
        self._reads: LogStore | None = SqliteLogStore(path, readonly=True) if path else None
        self._ids = itertools.count(1)
        #: Publishers of unpacked results (the writer thread's: appends) and broadcasts (the reader thread's).
        self._publishers = Publishers()
        self._broadcast_publishers = Publishers()
        self._lost = False
        self._closed = False
        self._frames = FrameBuffer()
        self._fd = events.fileno()
        #: The loop reading the events socket (:meth:`listen` to :meth:`unlisten`), and whom it tells.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: Callable[[Broadcast], None] | None = None
        self._on_lost: Callable[[], None] | None = None

    def listen(self, on_broadcast: Callable[[Broadcast], None], on_lost: Callable[[], None]) -> None:
        """Read the events socket on the running loop from now on: every broadcast to ``on_broadcast`` (the
        ones sent before first), and ``on_lost()`` once when the owner goes away. Both on the loop."""
        self._listener, self._on_lost = on_broadcast, on_lost
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable)

    def unlisten(self) -> None:
        """Stop reading the events socket (on the loop that listens)."""
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)

    #: Bytes read from the events socket at a time.
    READ_CHUNK = 1 << 18

    def _readable(self) -> None:
        """What the events socket holds, as broadcasts, until it would block; its end (or a message that
        does not decode) is the owner's loss."""
        listener = self._listener
        try:
            while True:
                try:
                    data = self._events.recv(self.READ_CHUNK, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return
                if not data:
                    break
                for kind, items in self._frames.feed(data):
                    if kind == "events":
                        pubs = self._broadcast_publishers
                        items = [(w, unpack_events(evs, pubs)) for w, evs in items if w != self.worker]  # noqa: PLW2901
                    if listener is not None and self._loop is not None:
                        listener((kind, items))
                if len(data) < self.READ_CHUNK:
                    return
        except Exception as exc:
            if not self._closed:
                log.warning("worker %d: the connection to the log owner failed: %s", self.worker, exc)
        self.unlisten()
        self._lost = True
        on_lost = self._on_lost
        if on_lost is not None and not self._closed:
            on_lost()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._send(("call", method, args, kwargs))

    def _send(self, msg: tuple[Any, ...]) -> Any:
        """Send ``msg`` with a request id after its kind, and read the owner's answer (blocking)."""
        with self._call_lock:
            if self._lost or self._closed:
                raise StorageError("the log owner is gone")
            rid = next(self._ids)
            try:
                self._calls.sendall(encode((msg[0], rid, *msg[1:])))
                reply = self._replies.read()
            except (OSError, ValueError):
                reply = None
            if reply is None or reply[1] != rid:
                self._lost = True  # the events socket ends too: the relay hears of it there
                raise StorageError("the log owner is gone")
        if reply[0] == "err":
            raise rebuild_error(reply[2])
        return reply[2]

    def _read(self, method: str, *args: Any, **kwargs: Any) -> Any:
        reads = self._reads
        if reads is None:
            return self._call(method, *args, **kwargs)
        return getattr(reads, method)(*args, **kwargs)

    # -- writes: the owner's ----------------------------------------------------------------------------

    def append(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult]:
        packed = self._send(("append", pack_requests(batch)))
        return unpack_results(packed, batch, self._publishers)

    def trim(self, channel: str, up_to_seq: int, *, epoch: str | None = None) -> ChannelInfo:
        out: ChannelInfo = self._call("trim", channel, up_to_seq, epoch=epoch)
        return out

    def reset_channel(self, channel: str) -> ChannelInfo:
        out: ChannelInfo = self._call("reset_channel", channel)
        return out

    def new_epochs_on_open(self) -> None:
        self._call("new_epochs_on_open")

    def commits_may_be_lost(self, channel: str, epoch: str) -> bool:
        return bool(self._call("commits_may_be_lost", channel, epoch))

    def apply_retention(self, policy: RetentionPolicy, now_ns: int) -> int:
        return int(self._call("apply_retention", policy, now_ns))

    def consumer_create(self, spec: ConsumerSpec) -> tuple[ConsumerInfo, bool]:
        out: tuple[ConsumerInfo, bool] = self._call("consumer_create", spec)
        return out

    def consumer_delete(self, name: str, consumer_id: int | None = None) -> bool:
        return bool(self._call("consumer_delete", name, consumer_id))

    def consumer_settle(
        self, acked: Sequence[tuple[int, Sequence[int]]], retried: Sequence[Retry] = ()
    ) -> None:
        self._call("consumer_settle", [(c, list(p)) for c, p in acked], list(retried))

    def consumer_hold(self, consumer_id: int, take: bool = True) -> bool:
        return bool(self._call("consumer_hold", consumer_id, take))

    def state_write(self, ns: str, key: str, value: str | None, how: StateWrite) -> int | None:
        out: int | None = self._call("state_write", ns, key, value, how)
        return out

    def notice(self, topic: str, data: bytes) -> None:
        """Send a notice to every other worker (``workers/relay.py``): the owner queues it for each, after
        the events queued for it before."""
        self._call("notice", topic, data)

    def sync(self, token: int) -> bool:
        """Have the owner queue ``("sync", [token])`` on this worker's events socket, behind everything
        committed so far (``WorkerRelay.barrier``); False when it did not (this worker is not reading it)."""
        return bool(self._call("sync", token))

    # -- reads: the file's, else the owner's ------------------------------------------------------------

    def consumers(self) -> list[ConsumerInfo]:
        out: list[ConsumerInfo] = self._read("consumers")
        return out

    def consumer_items(self, consumer_id: int, after_pos: int = 0, limit: int = 1000) -> list[JournalItem]:
        out: list[JournalItem] = self._read("consumer_items", consumer_id, after_pos, limit)
        return out

    def stats(self) -> StoreStats:
        out: StoreStats = self._read("stats")
        return out

    def state_get(self, ns: str, key: str) -> tuple[str | None, int] | None:
        out: tuple[str | None, int] | None = self._read("state_get", ns, key)
        return out

    def state_list(self, ns: str, prefix: str = "") -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = self._read("state_list", ns, prefix)
        return out

    def retired_epochs(self, channel: str) -> list[ChannelInfo]:
        out: list[ChannelInfo] = self._read("retired_epochs", channel)
        return out

    def head(self, channel: str) -> ChannelInfo:
        out: ChannelInfo = self._read("head", channel)
        return out

    def heads(self, channels: Iterable[str]) -> dict[str, ChannelInfo]:
        out: dict[str, ChannelInfo] = self._read("heads", list(channels))
        return out

    def read(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        epoch: str | None = None,
    ) -> list[Event]:
        out: list[Event] = self._read("read", channel, after_seq, limit, from_time, to_time, epoch=epoch)
        return out

    def read_runs(
        self, channel: str, after_seq: int, up_to_seq: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[EventRun]:
        out: list[EventRun] = self._read(
            "read_runs", channel, after_seq, up_to_seq, limit, max_bytes=max_bytes
        )
        return out

    def read_last(self, channel: str, n: int) -> list[Event]:
        out: list[Event] = self._read("read_last", channel, n)
        return out

    def channels(
        self, after: str = "", limit: int = 1000, prefix: str = "", *, include_empty: bool = False
    ) -> list[ChannelInfo]:
        out: list[ChannelInfo] = self._read("channels", after, limit, prefix, include_empty=include_empty)
        return out

    def top_time(self) -> int:
        return int(self._read("top_time"))

    def log_mark(self) -> LogMark:
        out: LogMark = self._read("log_mark")
        return out

    def log_seek(self, time_ns: int) -> int:
        return int(self._read("log_seek", time_ns))

    def read_log(
        self,
        after_pos: int,
        mark: LogMark,
        limit: int = 1000,
        prefix: str = "",
        *,
        reverse: bool = False,
        max_bytes: int | None = None,
    ) -> LogPage:
        out: LogPage = self._read(
            "read_log", after_pos, mark, limit, prefix, reverse=reverse, max_bytes=max_bytes
        )
        return out

    def count_log(
        self,
        after_pos: int,
        mark: LogMark,
        prefix: str = "",
        *,
        from_time: int = 0,
        channel: str | None = None,
    ) -> tuple[int, int]:
        out: tuple[int, int] = self._read(
            "count_log", after_pos, mark, prefix, from_time=from_time, channel=channel
        )
        return out

    def log_census(
        self, after_pos: int, mark: LogMark, prefix: str = "", *, from_time: int = 0
    ) -> dict[str, tuple[str, int, int]]:
        out: dict[str, tuple[str, int, int]] = self._read(
            "log_census", after_pos, mark, prefix, from_time=from_time
        )
        return out

    def read_rows(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        compact_text: bool = False,
        epoch: str | None = None,
    ) -> tuple[str, list[Row]]:
        out: tuple[str, list[Row]] = self._read(
            "read_rows", channel, after_seq, limit, from_time, to_time, compact_text=compact_text, epoch=epoch
        )
        return out

    def scan_plan(self, size: int, from_time: int | None = None, to_time: int | None = None) -> ScanPlan:
        out: ScanPlan = self._read("scan_plan", size, from_time, to_time)
        return out

    def scan_columns(
        self,
        lo_pos: int,
        hi_pos: int,
        *,
        max_time: int,
        bounds: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[ScanColumns]:
        out: list[ScanColumns] = self._read("scan_columns", lo_pos, hi_pos, max_time=max_time, bounds=bounds)
        return out

    def close(self) -> None:
        """Close the reads and the connection (the owner keeps the store). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._reads is not None:
            self._reads.close()
        loop = self._loop
        if loop is not None:  # still listening (the relay stops first, on its loop)
            try:
                on_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                self.unlisten()
            else:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing reads any more
                    loop.call_soon_threadsafe(self.unlisten)
        for sock in (self._calls, self._events):
            with contextlib.suppress(OSError):  # the owner closed it first
                sock.shutdown(socket.SHUT_RDWR)
        self._calls.close()
        self._events.close()
