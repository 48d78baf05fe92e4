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

Requests, results and events, the bulk of the traffic, travel as **runs** of plain values
(:func:`pack_requests`, :func:`pack_results`, :func:`pack_events` and their inverses): a connection's
publishes to one channel are one tuple of what they share and the list of their payloads, a commit's new
events of one channel and publisher the same with their first seq and time (a commit's events have
consecutive ones), their results the first seq and time and how many; what does not fit a run (headers, tags,
an idempotency key, a journal, a duplicate) travels alone. Pickling the values themselves (slotted
dataclasses, through ``__getstate__``) cost some 10-20 µs per event each way; a tuple per event, 3.1 µs per
event for the three (packing, pickling, unpickling and unpacking, 500 small publishes of one connection);
the runs 1.9 µs, in messages a tenth of the size, mostly the values' construction, which the node needs.
A new event's result is its position only: the worker has the rest in its request.

Concurrency contract: :func:`send` under the caller's lock (one writer per socket at a time); a
:class:`FrameReader` or :class:`FrameBuffer` is used by one thread.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Final

from hubbub.events import Event, Publisher
from hubbub.log.appended import Committed, RunAppended
from hubbub.log.base import AppendRequest, AppendResult, AppendRun, EventRun

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
    "unpack_appends",
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


def pack_requests(batch: Sequence[AppendRequest | AppendRun]) -> list[tuple[Any, ...]]:
    """``batch`` as runs: ``(channel, dialect, user, app, msg_id, content_type, headers, tags, idem,
    payloads)``, one per stretch of requests of one channel, publisher and content type without headers,
    tags or idempotency key (a connection's publishes, mostly; an :class:`AppendRun` is one already), else
    one per request."""
    out: list[tuple[Any, ...]] = []
    payloads: list[bytes] | None = None
    ch: str | None = None
    pub: Publisher | None = None
    ctype: str | None = None
    for r in batch:
        if isinstance(r, AppendRun):
            # A copy: the requests after it may join it, and the run's list is the caller's.
            ch, pub, ctype, payloads = r.channel, r.publisher, r.content_type, list(r.payloads)
            out.append((ch, pub.dialect, pub.user, pub.app, pub.msg_id, ctype, None, (), "", payloads))
        elif r.headers or r.tags or r.idem:
            p = r.publisher
            h = r.headers
            out.append(
                (r.channel, p.dialect, p.user, p.app, p.msg_id, r.content_type, dict(h) if h else None,
                 tuple(r.tags), r.idem, [r.payload])
            )  # fmt: skip
            payloads = None
        elif payloads is not None and r.publisher is pub and r.channel == ch and r.content_type == ctype:
            payloads.append(r.payload)
        else:
            ch, pub, ctype = r.channel, r.publisher, r.content_type
            payloads = [r.payload]
            out.append((ch, pub.dialect, pub.user, pub.app, pub.msg_id, ctype, None, (), "", payloads))
    return out


def unpack_requests(items: list[tuple[Any, ...]], pubs: Publishers) -> list[AppendRequest]:
    get = pubs.get
    out: list[AppendRequest] = []
    for ch, d, u, a, m, ctype, h, tags, idem, payloads in items:
        pub = get(d, u, a, m)
        if h is None and not tags and not idem:
            out += [AppendRequest(ch, pub, payload, ctype) for payload in payloads]
        else:
            out += [AppendRequest(ch, pub, payload, ctype, h or {}, tags, idem) for payload in payloads]
    return out


def unpack_appends(
    items: list[tuple[Any, ...]], pubs: Publishers
) -> tuple[list[AppendRequest | AppendRun], int]:
    """:func:`unpack_requests` for a store that takes runs (``EventLog.takes_runs``): each run of plain
    requests (no headers, tags or key) as one :class:`AppendRun`; and the number of events (of results)."""
    get = pubs.get
    out: list[AppendRequest | AppendRun] = []
    events = 0
    for ch, d, u, a, m, ctype, h, tags, idem, payloads in items:
        if not payloads:  # (never sent: a run is never empty)
            continue
        pub = get(d, u, a, m)
        events += len(payloads)
        if h is None and not tags and not idem:
            out.append(AppendRun(ch, pub, ctype, payloads))
        else:
            out += [AppendRequest(ch, pub, payload, ctype, h or {}, tags, idem) for payload in payloads]
    return out, events


def _event(e: Event) -> tuple[Any, ...]:
    p = e.publisher
    h = e.headers
    return (
        e.channel, e.epoch, e.time_ns, e.seq, p.dialect, p.user, p.app, p.msg_id, e.content_type,
        dict(h) if h else None, e.tags, [e.payload],
    )  # fmt: skip


def pack_events(events: Sequence[Event | EventRun]) -> list[tuple[Any, ...]]:
    """``events`` as runs: ``(channel, epoch, time_ns, seq, dialect, user, app, msg_id, content_type,
    headers, tags, payloads)``, the ``i``-th payload's event at ``seq + i`` and ``time_ns + i``: one per
    stretch of a commit's events of one channel and publisher without headers or tags (a commit's events
    have consecutive times), else one per event. An :class:`EventRun` given (a run the store answered as one:
    consecutive seqs and times) is one such stretch as it is."""
    out: list[tuple[Any, ...]] = []
    payloads: list[bytes] | None = None
    first: Event | None = None
    for e in events:
        if type(e) is EventRun:
            out.append((*_event(e.proto)[:-1], [p for _, p in e.rows]))
            payloads = None
            continue
        assert type(e) is Event
        if e.headers or e.tags:
            out.append(_event(e))
            payloads = None
            continue
        if payloads is not None and first is not None:
            n = len(payloads)
            if (
                e.seq == first.seq + n
                and e.time_ns == first.time_ns + n
                and e.publisher is first.publisher
                and e.channel == first.channel
                and e.epoch == first.epoch
                and e.content_type == first.content_type
            ):
                payloads.append(e.payload)
                continue
        first = e
        row = _event(e)
        payloads = row[-1]
        out.append(row)
    return out


def unpack_events(items: list[tuple[Any, ...]], pubs: Publishers) -> list[Event]:
    get = pubs.get
    out: list[Event] = []
    for ch, epoch, t, seq, d, u, a, m, ctype, h, tags, payloads in items:
        pub = get(d, u, a, m)
        if h is None and not tags:
            out += [Event(ch, seq + i, epoch, t + i, pub, p, ctype, {}) for i, p in enumerate(payloads)]
        else:
            out += [
                Event(ch, seq + i, epoch, t + i, pub, p, ctype, h or {}, tags) for i, p in enumerate(payloads)
            ]
    return out


def pack_results(results: Sequence[Committed]) -> list[Any]:
    """An append's results for the worker that sent its requests, in order: new events as their positions
    and times only (the rest is the requests', which the worker has), ``(seq, epoch, time_ns, n)`` for
    ``n`` of them at consecutive seqs and times without journal items (a ``RunAppended``'s places in one go),
    ``(seq, epoch, time_ns, journal)`` for one with; a duplicate whole (``(event, journal)``: the
    original's, not the request's)."""
    out: list[Any] = []
    run: list[Any] | None = None  # the open run: [seq, epoch, time_ns, n]
    i, end = 0, len(results)
    while i < end:
        r = results[i]
        if isinstance(r, RunAppended):  # a run answered as one: its consecutive seqs and times, as one
            p, k = r.run.proto, len(r)
            run = [p.seq, p.epoch, p.time_ns, k]
            out.append(run)
            i += k
            continue
        i += 1
        e = r.event
        if r.duplicate:
            out.append((_event(e), r.journal))
            run = None
        elif r.journal:
            out.append((e.seq, e.epoch, e.time_ns, r.journal))
            run = None
        elif (
            run is not None
            and e.seq == run[0] + run[3]
            and e.time_ns == run[2] + run[3]
            and e.epoch == run[1]
        ):
            run[3] += 1
        else:
            run = [e.seq, e.epoch, e.time_ns, 1]
            out.append(run)
    return out


def _answered(batch: Sequence[AppendRequest | AppendRun]) -> Iterator[tuple[Any, ...]]:
    """What a new event of each request of ``batch`` takes from it, per event: ``(channel, publisher,
    payload, content_type, headers, tags)`` (a run's for each of its payloads)."""
    for r in batch:
        if isinstance(r, AppendRun):
            ch, pub, ctype = r.channel, r.publisher, r.content_type
            for p in r.payloads:
                yield ch, pub, p, ctype, None, ()
        else:
            yield r.channel, r.publisher, r.payload, r.content_type, r.headers, r.tags


def unpack_results(
    items: list[Any], batch: Sequence[AppendRequest | AppendRun], pubs: Publishers
) -> list[AppendResult]:
    """:func:`pack_results`'s results of ``batch`` (the requests they answer, in order; a run's one per
    event) as values again. Raises ``ValueError`` when they do not answer every event once."""
    out: list[AppendResult] = []
    add = out.append
    reqs = _answered(batch)
    answered = 0
    for item in items:
        if len(item) == 2:
            (ch, epoch, t, seq, d, u, a, m, ctype, h, tags, (payload,)), journal = item
            answered += 1
            if next(reqs, None) is None:
                break
            ev = Event(ch, seq, epoch, t, pubs.get(d, u, a, m), payload, ctype, h or {}, tags)
            add(AppendResult(ev, True, journal))
            continue
        seq, epoch, t, n = item
        journal = ()
        if type(n) is not int:
            journal, n = n, 1
        answered += n
        for i, (ch, pub, payload, ctype, h, tags) in zip(range(n), reqs, strict=False):
            ev = Event(ch, seq + i, epoch, t + i, pub, payload, ctype, dict(h) if h else {}, tuple(tags))
            add(AppendResult(ev, False, journal))
    expected = sum(len(r.payloads) if isinstance(r, AppendRun) else 1 for r in batch)
    if answered != expected or len(out) != answered:
        raise ValueError(f"{answered} results for {expected} requests")  # (a run: one per event)
    return out
