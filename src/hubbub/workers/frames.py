"""The messages between a multi-worker node's log owner and its workers, over one Unix socket per worker.

Each message is a 4-byte big-endian length and a pickle. The socket is a ``socketpair`` the parent made
and handed to its own child process: nothing else can connect to it, so pickle's power (any value, any
class of the two processes' common code) is not exposed to anything outside the node.

A worker sends ``("call", rid, method, args, kwargs)``: one call of a :class:`~hubbub.log.base.LogStore`
method, run on the owner's writer thread in the order sent; an append is ``("append", rid, requests)``.
The owner sends:

* ``("ret", rid, value)`` or ``("err", rid, (class, args, state))`` for a call (an append's value is its
  results; an error travels as its
  class and state: hubbub's errors take other arguments than ``args``, so they are rebuilt without
  ``__init__``, :func:`rebuild_error`);
* ``("events", [(worker, [event, ...]), ...])``: one commit's new events, grouped by the worker that
  published them, in commit order, encoded once for every worker (each leaves out its own, which its
  ``append`` returned);
* ``("tops", [(channel, epoch, top), ...])``: instead of events a worker fell too far behind to be sent:
  it reads them from the log.

Requests, results and events, the bulk of the traffic, travel as plain tuples (:func:`pack_requests`,
:func:`pack_results`, :func:`pack_events` and their inverses): pickling the values themselves (slotted
dataclasses, through ``__getstate__``) cost some 10-20 µs per event each way, the tuples about 1 µs to pack
and 2-4 µs to unpack into values again. A new event's result is its position only: the worker has the rest
in its request.

Concurrency contract: :func:`send` under the caller's lock (one writer per socket at a time); a
:class:`FrameReader` or :class:`FrameBuffer` is used by one thread.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any, Final

from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult

__all__ = [
    "MAX_FRAME",
    "FrameBuffer",
    "FrameReader",
    "Publishers",
    "encode",
    "error_state",
    "pack_events",
    "pack_requests",
    "pack_results",
    "rebuild_error",
    "send",
    "unpack_events",
    "unpack_requests",
    "unpack_results",
]

#: The largest message (a commit's events for every worker at most; a million-event commit of small events
#: is some 100 MiB).
MAX_FRAME: Final = 1 << 30

_LEN: Final = struct.Struct(">I")


def encode(obj: Any) -> bytes:
    """``obj`` as one message (its length and pickle)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


def send(sock: socket.socket, lock: threading.Lock, data: bytes) -> None:
    """Send one :func:`encode`\\ d message whole (blocking); raises ``OSError`` when the peer is gone."""
    with lock:
        sock.sendall(data)


class FrameReader:
    """Reads whole messages from a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def _fill(self, n: int) -> bool:
        while len(self._buf) < n:
            chunk = self._sock.recv(max(1 << 16, n - len(self._buf)))
            if not chunk:
                return False
            self._buf += chunk
        return True

    def read(self) -> Any:
        """The next message, or ``None`` at the end of the stream (the peer closed or died). Raises
        ``OSError`` for a broken socket and ``ValueError`` for a message over :data:`MAX_FRAME`."""
        if not self._fill(4):
            return None
        (n,) = _LEN.unpack_from(self._buf)
        if n > MAX_FRAME:
            raise ValueError(f"a message of {n} bytes")
        if not self._fill(4 + n):
            return None
        data = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        return pickle.loads(data)


class FrameBuffer:
    """Whole messages out of bytes read without waiting (a socket's reader that does not block on it):
    :meth:`feed` keeps a message's start until the rest comes."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages ``data`` completes, in order. Raises ``ValueError`` for a message over
        :data:`MAX_FRAME`, and whatever unpickling raises for a malformed one (the connection is then beyond
        use)."""
        buf = self._buf
        buf += data
        out = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > MAX_FRAME:
                raise ValueError(f"a message of {n} bytes")
            if end - pos - 4 < n:
                break
            out.append(pickle.loads(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        if pos:
            del buf[:pos]
        return out


def error_state(exc: BaseException) -> tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]:
    """What travels of an exception: its class, ``args`` and attributes."""
    return type(exc), exc.args, dict(getattr(exc, "__dict__", {}))


def rebuild_error(state: tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]) -> BaseException:
    """The exception :func:`error_state` described, made without calling its ``__init__``."""
    cls, args, attrs = state
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


class Publishers:
    """The :class:`Publisher` values a process unpacked, by their fields: one object per publisher, not one
    per event (a connection publishes as one publisher). Bounded: cleared past :data:`PUBLISHERS_KEPT`. Used
    by one thread."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str, str, str], Publisher] = {}

    def get(self, dialect: str, user: str, app: str, msg_id: str) -> Publisher:
        key = (dialect, user, app, msg_id)
        p = self._known.get(key)
        if p is None:
            if len(self._known) >= PUBLISHERS_KEPT:
                self._known.clear()
            p = self._known[key] = Publisher(dialect, user, app, msg_id)
        return p


#: Publishers a :class:`Publishers` keeps (a publisher with a message id per event would fill it).
PUBLISHERS_KEPT: Final = 4096


def pack_requests(batch: Sequence[AppendRequest]) -> list[tuple[Any, ...]]:
    out = []
    for r in batch:
        p = r.publisher
        h = r.headers
        out.append(
            (
                r.channel,
                p.dialect,
                p.user,
                p.app,
                p.msg_id,
                r.payload,
                r.content_type,
                dict(h) if h else None,
                r.tags,
                r.idem,
            )
        )
    return out


def unpack_requests(items: list[tuple[Any, ...]], pubs: Publishers) -> list[AppendRequest]:
    get = pubs.get
    return [
        AppendRequest(ch, get(d, u, a, m), payload, ctype, h or {}, tags, idem)
        for ch, d, u, a, m, payload, ctype, h, tags, idem in items
    ]


def _event(e: Event) -> tuple[Any, ...]:
    p = e.publisher
    h = e.headers
    return (
        e.channel, e.seq, e.epoch, e.time_ns, p.dialect, p.user, p.app, p.msg_id, e.payload, e.content_type,
        dict(h) if h else None, e.tags,
    )  # fmt: skip


def pack_events(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    return [_event(e) for e in events]


def unpack_events(items: list[tuple[Any, ...]], pubs: Publishers) -> list[Event]:
    get = pubs.get
    return [
        Event(ch, seq, epoch, t, get(d, u, a, m), payload, ctype, h or {}, tags)
        for ch, seq, epoch, t, d, u, a, m, payload, ctype, h, tags in items
    ]


def pack_results(results: Sequence[AppendResult]) -> list[tuple[Any, ...]]:
    """An append's results for the worker that sent its requests: a new event as its position and time
    only (``(seq, epoch, time_ns, journal)``: the rest is the request's, which the worker has), a duplicate
    whole (``(event, journal)``: the original's, not the request's)."""
    return [
        (_event(r.event), r.journal)
        if r.duplicate
        else (r.event.seq, r.event.epoch, r.event.time_ns, r.journal)
        for r in results
    ]


def unpack_results(
    items: list[tuple[Any, ...]], batch: Sequence[AppendRequest], pubs: Publishers
) -> list[AppendResult]:
    """:func:`pack_results`'s results of ``batch`` (the requests they answer, in order) as values again."""
    out = []
    for item, req in zip(items, batch, strict=True):
        if len(item) == 4:
            seq, epoch, t, journal = item
            h = req.headers
            ev = Event(
                req.channel,
                seq,
                epoch,
                t,
                req.publisher,
                req.payload,
                req.content_type,
                dict(h) if h else {},
                tuple(req.tags),
            )
            out.append(AppendResult(ev, False, journal))
        else:
            (ch, seq, epoch, t, d, u, a, m, payload, ctype, h, tags), journal = item
            ev = Event(ch, seq, epoch, t, pubs.get(d, u, a, m), payload, ctype, h or {}, tags)
            out.append(AppendResult(ev, True, journal))
    return out
