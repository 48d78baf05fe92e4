"""The asyncio client for the native protocol (native.md), over WebSocket (JSON) or raw TCP (JSON lines).

::

    async with AsyncClient.connect("ws://127.0.0.1:8080") as client:
        ack = await client.publish("/chat/room", "hi")
        async with client.subscribe("/chat/**", last=10) as sub:
            async for item in sub:
                if isinstance(item, Gap):
                    ...  # the server could not recover item.channel: events were lost
                else:
                    print(item.channel, item.seq, item.payload)

Concurrency contract: an :class:`AsyncClient` and its subscriptions belong to the event loop they were
created on and are used from that loop only. One supervisor task per client owns the connection: it runs
the reader, reconnects when the connection drops, and resumes every live subscription from the last
position it delivered.

Backpressure policy: each subscription has a bounded queue (``max_queue`` events and gaps). When a queue is
full the reader waits for the consumer and stops reading the socket, so the server's per-connection queue
fills up instead of ours, and a consumer that stays too slow is eventually disconnected by the server
(error 4302), after which the client reconnects and recovers from the log. Because one socket carries
everything, a full subscription also holds back publish acknowledgements on the same client: consume your
subscriptions, or publish and subscribe on separate clients when a subscriber may lag.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import random
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import orjson

from hubbub import __version__
from hubbub.errors import (
    AuthError,
    BadChannel,
    BadFrame,
    BadRequest,
    FrameTooLarge,
    HubbubError,
    LimitExceeded,
    ProtocolError,
    ShuttingDown,
    StorageError,
    SubscriptionError,
    UnknownOp,
    is_fatal,
    is_temporary,
)
from hubbub.events import Event, Position, Publisher

__all__ = [
    "AsyncClient",
    "CannotConnect",
    "ClientClosed",
    "ClientConnectionError",
    "ClientStatistics",
    "ConnectionLost",
    "Gap",
    "PublishAck",
    "Subscription",
    "SubscriptionStatistics",
    "error_from_frame",
    "event_as_dict",
    "event_from_dict",
]

log = logging.getLogger("hubbub.client")

SUBPROTOCOL = "hubbub.v1.json"
WS_PATH = "/ws/hubbub"
DEFAULT_CLIENT_NAME = f"hubbub-py/{__version__}"
_MAX_ID = (1 << 31) - 1


# -- values ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishAck:
    """The server's acknowledgement of a publish: where the event was committed.

    ``time`` is the commit time in nanoseconds. ``duplicate`` is true when the idempotency key had been seen
    within the server's window and the event was not appended again (the position is the original one).
    """

    channel: str
    seq: int
    epoch: str
    time: int
    duplicate: bool = False

    @property
    def position(self) -> Position:
        return Position(self.seq, self.epoch)


@dataclass(frozen=True, slots=True)
class Gap:
    """A subscription could not be recovered for ``channel``: events after ``since`` up to ``position`` are
    lost to this subscriber (``reason``: ``epoch`` the log restarted, ``trimmed`` retention removed them,
    ``ahead`` the server lost commits). The stream for that channel continues after ``position``.

    Subscriptions yield these alongside :class:`~hubbub.events.Event` values, so a gap is never silent.
    """

    channel: str
    since: Position
    position: Position
    reason: str


@dataclass(frozen=True, slots=True)
class SubscriptionStatistics:
    id: str
    pattern: str
    active: bool
    queued: int
    max_queue: int
    received: int
    duplicates_dropped: int
    gaps: int
    replayed: int
    subscribes: int


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    url: str
    connected: bool
    connects: int
    disconnects: int
    frames_sent: int
    frames_received: int
    events_received: int
    pending_requests: int
    retry_queue: int
    subscriptions: int
    queued: int
    unmatched_errors: int
    last_error: str


# -- errors ---------------------------------------------------------------------------------------------


class ClientConnectionError(HubbubError, ConnectionError):
    """The client has no usable connection. Also a :class:`ConnectionError`. Temporary (code 4300)."""

    code = 4300


class CannotConnect(ClientConnectionError):
    """The server could not be reached, or refused the WebSocket upgrade."""


class ConnectionLost(ClientConnectionError):
    """The connection dropped while a request was in flight (its outcome is unknown), or for good."""


class ClientClosed(ClientConnectionError):
    """The client was closed."""


_FINAL_CODES = frozenset(c for c in range(4000, 4400) if is_fatal(c) and not is_temporary(c))


def error_from_frame(frame: Mapping[str, Any]) -> HubbubError:
    """The :mod:`hubbub.errors` exception for a native ``error`` frame (or an HTTP ``error`` object)."""
    try:
        code = int(frame.get("code", 4300))
    except (TypeError, ValueError):
        code = 4300
    detail = frame.get("detail") or ""
    if not isinstance(detail, str):
        detail = str(detail)
    rid = frame.get("id")
    request_id = rid if isinstance(rid, int) else None
    exact: dict[int, type[HubbubError]] = {
        4000: BadFrame,
        4001: BadRequest,
        4002: UnknownOp,
        4003: FrameTooLarge,
        4004: BadChannel,
        4007: LimitExceeded,
        4301: StorageError,
        4303: ShuttingDown,
    }
    cls: type[HubbubError]
    if code in exact:
        cls = exact[code]
    elif code in (4005, 4006) or 4000 <= code < 4100:
        cls = ProtocolError
    elif 4100 <= code < 4200:
        cls = AuthError
    elif 4200 <= code < 4300:
        cls = SubscriptionError
    else:
        cls = HubbubError
    return cls(detail, code=code, request_id=request_id)


# -- JSON -----------------------------------------------------------------------------------------------

# orjson turns integers beyond 64 bits into floats; the standard library keeps them exact. Event times are
# 19 digits, so a run of 20 digits is the cheap sign that a frame needs the exact parser.
_BIG_INT = re.compile(r"\d{20}")
_BIG_INT_B = re.compile(rb"\d{20}")


def _loads(raw: str | bytes) -> Any:
    big = _BIG_INT.search(raw) if isinstance(raw, str) else _BIG_INT_B.search(raw)
    if big is not None:
        return json.loads(raw)
    return orjson.loads(raw)


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        # Integers over 64 bits: the standard library can encode them exactly.
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _is_json_type(content_type: str) -> bool:
    base = content_type.split(";", 1)[0].strip().lower()
    return base == "application/json" or base.endswith("+json")


def _position(obj: Any) -> Position:
    if not isinstance(obj, Mapping):
        return Position(0, "")
    return Position(int(obj.get("seq", 0)), str(obj.get("epoch", "")))


def event_from_dict(obj: Mapping[str, Any]) -> Event:
    """Decode a native JSON event object (an ``event`` push, or an HTTP log/stream event) into an Event.

    The payload comes from ``json`` (re-encoded as compact JSON, so byte-exactness of JSON payloads is not
    preserved by the JSON transport), ``text`` (UTF-8), ``b64`` or ``payload``.
    """
    if "json" in obj:
        payload = _dumps(obj["json"])
    elif "text" in obj:
        payload = str(obj["text"]).encode()
    elif "b64" in obj:
        payload = base64.b64decode(str(obj["b64"]))
    elif "payload" in obj:
        p = obj["payload"]
        payload = p if isinstance(p, bytes) else str(p).encode()
    else:
        payload = b""
    pub = obj.get("publisher")
    publisher = (
        Publisher(
            str(pub.get("dialect", "")),
            str(pub.get("user", "")),
            str(pub.get("app", "")),
            str(pub.get("msg_id", "")),
        )
        if isinstance(pub, Mapping)
        else Publisher("")
    )
    headers = obj.get("headers")
    tags = obj.get("tags")
    return Event(
        channel=str(obj.get("channel", "")),
        seq=int(obj.get("seq", 0)),
        epoch=str(obj.get("epoch", "")),
        time_ns=int(obj.get("time", 0)),
        publisher=publisher,
        payload=payload,
        content_type=str(obj.get("content_type", "")),
        headers={str(k): str(v) for k, v in headers.items()} if isinstance(headers, Mapping) else {},
        tags=tuple(str(t) for t in tags) if isinstance(tags, list) else (),
    )


def event_as_dict(event: Event) -> dict[str, Any]:
    """The native JSON event object for an Event (native.md §3.5, without ``op`` and ``subs``)."""
    p = event.publisher
    out: dict[str, Any] = {
        "channel": event.channel,
        "seq": event.seq,
        "epoch": event.epoch,
        "time": str(event.time_ns),
        "publisher": {"dialect": p.dialect, "user": p.user, "app": p.app, "msg_id": p.msg_id},
        "headers": event.user_headers,
        "tags": list(event.tags),
        "content_type": event.content_type,
    }
    if _is_json_type(event.content_type):
        try:
            out["json"] = _loads(event.payload)
            return out
        except ValueError:
            pass
    try:
        out["text"] = event.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["b64"] = base64.b64encode(event.payload).decode()
    return out


# -- transports -----------------------------------------------------------------------------------------


class _Transport(Protocol):
    close_code: int | None

    async def send(self, data: bytes) -> None: ...

    async def recv(self) -> str | bytes | None:
        """The next frame, or None once the connection is closed."""
        ...

    async def close(self) -> None: ...


class _WsTransport:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.close_code: int | None = None

    async def send(self, data: bytes) -> None:
        await self.ws.send_str(data.decode())

    async def recv(self) -> str | bytes | None:
        while True:
            msg = await self.ws.receive()
            if msg.type == aiohttp.WSMsgType.TEXT:
                return str(msg.data)
            if msg.type == aiohttp.WSMsgType.BINARY:
                return bytes(msg.data)
            if msg.type in (aiohttp.WSMsgType.PING, aiohttp.WSMsgType.PONG):
                continue
            self.close_code = self.ws.close_code
            return None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()


class _TcpTransport:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.close_code: int | None = None

    async def send(self, data: bytes) -> None:
        self.writer.write(data + b"\n")
        await self.writer.drain()

    async def recv(self) -> str | bytes | None:
        while True:
            try:
                line = await self.reader.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                return None
            except asyncio.LimitOverrunError:
                # A line over the bound: the stream cannot be resynchronised, so the connection ends.
                log.warning("native TCP line over the client's max_frame; dropping the connection")
                return None
            line = line.rstrip(b"\r\n")
            if line:
                return line

    async def close(self) -> None:
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)
        except TimeoutError:
            self.writer.transport.abort()  # a peer that does not read must not hold up the reconnect
        except Exception:
            pass


@dataclass(eq=False)
class _Conn:
    """One live connection after a successful hello."""

    transport: _Transport
    session: str
    ping_interval: float
    max_frame: int
    error: HubbubError | None = None  # the fatal error the server pushed before closing, if any


@dataclass(eq=False)
class _Pending:
    id: int
    frame: dict[str, Any]
    future: asyncio.Future[dict[str, Any]]
    on_reply: Callable[[dict[str, Any]], None] | None = None
    retry: bool = False  # publish with an idempotency key: resend after a reconnect


def _parse_url(url: str) -> tuple[str, str, str, int]:
    """(kind, url, host, port): kind is ``ws`` or ``tcp``; ``url`` is the WebSocket URL for ``ws``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "tcp":
        if not parts.hostname or parts.port is None:
            raise ValueError(f"tcp URL needs a host and a port: {url!r}")
        return "tcp", url, parts.hostname, parts.port
    if scheme in ("ws", "http"):
        ws_scheme = "ws"
    elif scheme in ("wss", "https"):
        ws_scheme = "wss"
    else:
        raise ValueError(
            f"unsupported URL scheme {parts.scheme!r} (use ws://, wss://, http://, https:// or tcp://)"
        )
    if not parts.hostname:
        raise ValueError(f"URL needs a host: {url!r}")
    path = parts.path if parts.path not in ("", "/") else WS_PATH
    query = f"?{parts.query}" if parts.query else ""
    port = parts.port or (443 if ws_scheme == "wss" else 80)
    return "ws", f"{ws_scheme}://{parts.netloc}{path}{query}", parts.hostname, port


# -- subscriptions --------------------------------------------------------------------------------------


class Subscription:
    """One subscription: an async iterator of :class:`~hubbub.events.Event` and :class:`Gap` values.

    Created by :meth:`AsyncClient.subscribe`. ``await sub`` (or ``async with sub``, or the first iteration)
    sends the subscribe request and returns once the server confirmed it: events committed after that are
    delivered. Iteration yields what is queued, then ends (``StopAsyncIteration``) after :meth:`unsubscribe`
    or :meth:`AsyncClient.close`, or raises the error that ended the subscription (for example a failed
    resubscription after a reconnect, or :class:`ConnectionLost` when reconnecting is off).

    ``positions`` is the last position delivered per channel. After a reconnect the subscription resumes
    from it; events at or before it are dropped if the server sends them again.
    """

    def __init__(
        self,
        client: AsyncClient,
        sub_id: str,
        *,
        pattern: str,
        tags: tuple[str, ...],
        since: Position | Mapping[str, Position] | None,
        last: int | None,
        from_time: int | None,
        max_queue: int,
    ) -> None:
        self._client = client
        self.id = sub_id
        self.pattern = pattern
        self.tags = tags
        self._orig_since = since
        self._orig_last = last
        self._orig_from_time = from_time
        self.max_queue = max_queue
        self._queue: deque[Event | Gap] = deque()
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._not_full.set()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._started = False
        self._closed = False
        self._error: BaseException | None = None
        self._conn: _Conn | None = None  # the connection this subscription was (or is being) sent on
        self._active = False
        # Resume state (see _request_fields).
        self._sent: dict[str, Any] | None = None
        self._replay_requested = False
        self._complete = False
        self._seen_since_sent = False
        self._exact: bool | None = isinstance(since, Position) or None
        self._exact_pos: Position | None = since if isinstance(since, Position) else None
        self._positions: dict[str, Position] = dict(since) if isinstance(since, Mapping) else {}
        self._last_time = 0
        self._top_time = 0
        # Statistics.
        self._received = 0
        self._dups = 0
        self._gaps = 0
        self._replayed = 0
        self._subscribes = 0

    # -- public -----------------------------------------------------------------------------------------

    @property
    def positions(self) -> dict[str, Position]:
        """The last delivered position per channel (a copy)."""
        return dict(self._positions)

    @property
    def position(self) -> Position | None:
        """For an exact channel: the position the stream has reached (None before the first reply)."""
        return self._exact_pos if self._exact else None

    @property
    def active(self) -> bool:
        return self._active and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> Subscription:
        """Send the subscribe request (once) and wait for the server to confirm it."""
        if not self._started:
            self._started = True
            await self._client._start_subscription(self)
        await asyncio.shield(self._ready)
        return self

    def __await__(self) -> Generator[Any, None, Subscription]:
        return self.start().__await__()

    async def __aenter__(self) -> Subscription:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.unsubscribe()

    def __aiter__(self) -> AsyncIterator[Event | Gap]:
        return self

    async def __anext__(self) -> Event | Gap:
        if not self._closed and (not self._started or not self._ready.done()):
            await self.start()
        while True:
            if self._queue:
                item = self._queue.popleft()
                self._not_full.set()
                if not self._queue:
                    self._not_empty.clear()
                return item
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            await self._not_empty.wait()

    async def get(self, timeout: float | None = None) -> Event | Gap | None:  # noqa: ASYNC109 - a convenience
        """The next item, waiting at most ``timeout`` seconds (``TimeoutError``); None once ended normally."""
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except StopAsyncIteration:
            return None

    async def unsubscribe(self) -> None:
        """Stop the subscription: queued items are discarded and iteration ends. Idempotent."""
        if self._closed:
            return
        was_active = self._active
        self._queue.clear()
        self._end(None)
        if was_active:
            await self._client._unsubscribe(self)

    aclose = unsubscribe

    def statistics(self) -> SubscriptionStatistics:
        return SubscriptionStatistics(
            id=self.id,
            pattern=self.pattern,
            active=self.active,
            queued=len(self._queue),
            max_queue=self.max_queue,
            received=self._received,
            duplicates_dropped=self._dups,
            gaps=self._gaps,
            replayed=self._replayed,
            subscribes=self._subscribes,
        )

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.pattern!r} active={self.active}>"

    # -- client side (called from the client's reader, on the event loop) ------------------------------

    def _request_fields(self) -> dict[str, Any]:
        """The replay fields of the next subscribe request.

        First time: the caller's options. Afterwards (a resume): if the previous request's replay had not
        started delivering anything, the same fields again; otherwise the exact channel's last position, or
        for a pattern the map of every channel seen plus ``from_time`` just after the newest event seen (or,
        once live, after the snapshot's newest event), so channels never seen are recovered as well. Event
        times are unique and increase in commit order, so nothing is skipped or repeated.
        """
        if self._sent is None:
            fields: dict[str, Any] = {}
            since = self._orig_since
            if isinstance(since, Position):
                fields["since"] = {"seq": since.seq, "epoch": since.epoch}
            elif since is not None:
                fields["since"] = {ch: {"seq": p.seq, "epoch": p.epoch} for ch, p in since.items()}
            if self._orig_last is not None:
                fields["last"] = self._orig_last
            if self._orig_from_time is not None:
                fields["from_time"] = self._orig_from_time
            return fields
        if not self._complete and not self._seen_since_sent:
            return dict(self._sent)
        if self._exact:
            if self._exact_pos is None:
                return dict(self._sent)
            return {"since": {"seq": self._exact_pos.seq, "epoch": self._exact_pos.epoch}}
        base = max(self._last_time, self._top_time) if self._complete else self._last_time
        fields = {"from_time": base + 1}
        if self._positions:
            fields["since"] = {ch: {"seq": p.seq, "epoch": p.epoch} for ch, p in self._positions.items()}
        return fields

    def _on_sent(self, fields: dict[str, Any]) -> None:
        self._sent = fields
        self._replay_requested = bool(fields.keys() & {"since", "last", "from_time"})
        self._complete = False
        self._seen_since_sent = False
        self._subscribes += 1

    def _on_reply(self, frame: dict[str, Any]) -> None:
        if "position" in frame:
            self._exact = True
            if not self._replay_requested:
                self._exact_pos = _position(frame["position"])
                self._complete = True
        else:
            self._exact = False
            with contextlib.suppress(TypeError, ValueError):
                self._top_time = int(frame.get("top_time", 0))
            if not self._replay_requested:
                self._complete = True
        self._active = True

    def _on_recovered(self, frame: dict[str, Any]) -> None:
        self._complete = True
        with contextlib.suppress(TypeError, ValueError):
            self._replayed += int(frame.get("replayed", 0))
        if self._exact and "position" in frame:
            self._exact_pos = _position(frame["position"])

    async def _deliver_gap(self, gap: Gap) -> None:
        self._gaps += 1
        self._positions[gap.channel] = gap.position
        if self._exact:
            self._exact_pos = gap.position
            self._complete = True  # an exact channel gets a gap and no replay
        await self._put(gap)

    async def _deliver(self, event: Event) -> None:
        last = self._exact_pos if self._exact else self._positions.get(event.channel)
        if last is not None and last.epoch == event.epoch and event.seq <= last.seq:
            self._dups += 1
            return
        pos = Position(event.seq, event.epoch)
        self._positions[event.channel] = pos
        if self._exact:
            self._exact_pos = pos
        self._last_time = max(self._last_time, event.time_ns)
        self._seen_since_sent = True
        self._received += 1
        await self._put(event)

    async def _put(self, item: Event | Gap) -> None:
        # Backpressure: wait for the consumer (the reader stops reading the socket meanwhile).
        while len(self._queue) >= self.max_queue and not self._closed:
            self._not_full.clear()
            await self._not_full.wait()
        if self._closed:
            return
        self._queue.append(item)
        self._not_empty.set()

    def _set_ready(self) -> None:
        if not self._ready.done():
            self._ready.set_result(None)

    def _end(self, error: BaseException | None) -> None:
        """Terminal: iteration drains the queue, then stops (or raises ``error``)."""
        if self._closed:
            return
        self._closed = True
        self._active = False
        self._error = error
        if not self._ready.done():
            if error is not None:
                self._ready.set_exception(error)
                # Retrieved here so an unobserved failure is not reported as "never retrieved".
                self._ready.exception()
            else:
                self._ready.set_exception(ClientClosed("subscription closed"))
                self._ready.exception()
        self._not_empty.set()
        self._not_full.set()
        self._client._subs.pop(self.id, None)


# -- the client -----------------------------------------------------------------------------------------


class _Connect:
    """What :meth:`AsyncClient.connect` returns: ``await`` it, or use it as ``async with``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self._open().__await__()

    async def _open(self) -> AsyncClient:
        await self._client._open()
        return self._client

    async def __aenter__(self) -> AsyncClient:
        return await self._open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._client.close()


class AsyncClient:
    """A native-protocol client. Create with :meth:`connect`; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        client_name: str = DEFAULT_CLIENT_NAME,
        reconnect: bool = True,
        batch: bool = True,
        echo: bool = True,
        max_queue: int = 4096,
        max_frame: int = 64 << 20,
        connect_timeout: float = 10.0,
        reconnect_min_delay: float = 0.1,
        reconnect_max_delay: float = 5.0,
        reconnect_timeout: float | None = None,
    ) -> None:
        self.url = url
        self._kind, self._ws_url, self._host, self._port = _parse_url(url)
        self._token = token
        self._client_name = client_name
        self._reconnect = reconnect
        self._batch = batch
        self._echo = echo
        self._max_queue = max_queue
        self._max_frame = max_frame
        self._connect_timeout = connect_timeout
        self._min_delay = reconnect_min_delay
        self._max_delay = reconnect_max_delay
        self._reconnect_timeout = reconnect_timeout
        self._http: aiohttp.ClientSession | None = None
        self._conn: _Conn | None = None
        self._connected = asyncio.Event()  # set while a connection is usable, and once terminal
        self._final: HubbubError | None = None  # set once the client will never connect again
        self._closing = False
        self._supervisor: asyncio.Task[None] | None = None
        self._pending: dict[int, _Pending] = {}
        self._retry: list[_Pending] = []
        self._subs: dict[str, Subscription] = {}
        self._next_id = 0
        self._next_sub = 0
        self._stats = {"connects": 0, "disconnects": 0, "sent": 0, "received": 0, "events": 0, "unmatched": 0}
        self._last_error = ""

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        token: str | None = None,
        client_name: str = DEFAULT_CLIENT_NAME,
        reconnect: bool = True,
        batch: bool = True,
        **options: Any,
    ) -> _Connect:
        """Connect and say hello: ``await AsyncClient.connect(url)``, or use it with ``async with``.

        ``url``: ``ws://host:port`` (path ``/ws/hubbub`` when none is given; ``http://`` counts as ``ws://``,
        ``https://`` as ``wss://``) or ``tcp://host:port`` (native JSON lines). The first connection is not
        retried: failure raises :class:`CannotConnect` or the server's error. Further ``options`` are the
        keyword arguments of the constructor (``echo``, ``max_queue``, ``max_frame``, ``connect_timeout``,
        ``reconnect_min_delay``, ``reconnect_max_delay``, ``reconnect_timeout``).
        """
        return _Connect(
            cls(url, token=token, client_name=client_name, reconnect=reconnect, batch=batch, **options)
        )

    async def __aenter__(self) -> AsyncClient:
        if self._supervisor is None and self._final is None:
            await self._open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._conn is not None

    @property
    def session(self) -> str:
        """The server's session id of the current connection ("" while disconnected)."""
        return self._conn.session if self._conn else ""

    # -- public API -------------------------------------------------------------------------------------

    async def publish(
        self,
        channel: str,
        data: Any,
        *,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        tags: Iterable[str] | None = None,
        idem: str | None = None,
        ack: bool = True,
    ) -> PublishAck | None:
        """Publish ``data`` to ``channel``: bytes go as ``b64``, ``str`` as ``text``, anything else as JSON.

        With ``ack`` (the default) returns once the server acknowledged the commit. Without it, returns once
        the frame is written and returns None; errors for it are then only logged and counted. A publish in
        flight when the connection drops raises :class:`ConnectionLost` (it may or may not have been
        committed), unless it carries ``idem``: then it is sent again after the reconnect and the server
        deduplicates it (such retries are resent first, before any newer publish). While disconnected,
        publishes wait for the reconnect. Publishes are written in the order they are called (also when
        started as concurrent tasks), so one channel's events get seqs in that order.
        """
        frame: dict[str, Any] = {"op": "publish", "channel": channel}
        if isinstance(data, bytes | bytearray | memoryview):
            frame["b64"] = base64.b64encode(bytes(data)).decode()
        elif isinstance(data, str):
            frame["text"] = data
        else:
            frame["json"] = data
        if content_type is not None:
            frame["content_type"] = content_type
        if headers:
            frame["headers"] = dict(headers)
        if tags is not None:
            tag_list = list(tags)
            if tag_list:
                frame["tags"] = tag_list
        if idem is not None:
            frame["idem"] = idem
        frame["ack"] = ack
        if not ack:
            conn = await self._wait_connected()
            frame["id"] = self._new_id()
            await self._send(conn, frame)
            return None
        reply = await self._request(frame, retry=idem is not None)
        return PublishAck(
            channel=str(reply.get("channel", channel)),
            seq=int(reply.get("seq", 0)),
            epoch=str(reply.get("epoch", "")),
            time=int(reply.get("time", 0)),
            duplicate=bool(reply.get("duplicate", False)),
        )

    def subscribe(
        self,
        pattern: str,
        *,
        tags: Iterable[str] | None = None,
        since: Position | Mapping[str, Position] | None = None,
        last: int | None = None,
        from_time: int | None = None,
        max_queue: int | None = None,
    ) -> Subscription:
        """A subscription to a channel or pattern; ``await`` it, ``async with`` it, or iterate it.

        Call it from a coroutine on the client's loop. Nothing is sent until the subscription is started.

        ``since``: a Position for an exact channel, or a map channel → Position for a pattern (recover from
        there, native.md §6); ``last``: replay the last N events; ``from_time``: replay events at or after
        this time (ns). The server allows one of them (``from_time`` may accompany a ``since`` map).
        """
        self._check_open()
        self._next_sub += 1
        return Subscription(
            self,
            f"s{self._next_sub}",
            pattern=pattern,
            tags=tuple(tags) if tags is not None else (),
            since=since,
            last=last,
            from_time=from_time,
            max_queue=max_queue if max_queue is not None else self._max_queue,
        )

    def subscriptions(self) -> list[Subscription]:
        return list(self._subs.values())

    async def ping(self) -> None:
        """A round trip to the server (``ping`` with an id, answered by ``pong``)."""
        await self._request({"op": "ping"}, reply_op="pong")

    def statistics(self) -> ClientStatistics:
        s = self._stats
        return ClientStatistics(
            url=self.url,
            connected=self.connected,
            connects=s["connects"],
            disconnects=s["disconnects"],
            frames_sent=s["sent"],
            frames_received=s["received"],
            events_received=s["events"],
            pending_requests=len(self._pending),
            retry_queue=len(self._retry),
            subscriptions=len(self._subs),
            queued=sum(len(sub._queue) for sub in self._subs.values()),
            unmatched_errors=s["unmatched"],
            last_error=self._last_error,
        )

    async def close(self) -> None:
        """Close the connection and end every subscription and pending request. Idempotent."""
        if self._closing:
            if self._supervisor is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._supervisor)
            return
        self._closing = True
        if self._final is None:
            self._final = ClientClosed("client closed")
        sup = self._supervisor
        if sup is not None and not sup.done():
            sup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sup
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.transport.close()
        self._terminate(None)
        if self._http is not None:
            await self._http.close()
            self._http = None

    # -- connection -------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._final is not None:
            raise self._final

    def _new_id(self) -> int:
        while True:
            self._next_id = self._next_id + 1 if self._next_id < _MAX_ID else 1
            if self._next_id not in self._pending:
                return self._next_id

    async def _open(self) -> None:
        """The first connection (no retries), then start the supervisor."""
        self._check_open()
        if self._supervisor is not None:
            return
        try:
            conn = await self._connect_once()
        except BaseException:
            await self.close()
            raise
        self._set_connected(conn)
        self._supervisor = asyncio.create_task(self._supervise(conn), name=f"hubbub-client {self.url}")

    async def _connect_once(self) -> _Conn:
        """Open a transport and complete the hello. Raises CannotConnect, or the server's hello error."""
        transport: _Transport
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._kind == "tcp":
                    reader, writer = await asyncio.open_connection(
                        self._host, self._port, limit=self._max_frame
                    )
                    transport = _TcpTransport(reader, writer)
                else:
                    if self._http is None:
                        self._http = aiohttp.ClientSession()
                    headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
                    ws = await self._http.ws_connect(
                        self._ws_url,
                        protocols=(SUBPROTOCOL,),
                        headers=headers,
                        max_msg_size=self._max_frame,
                        autoping=True,
                        compress=0,
                        # A dead peer must not hold up the reconnect for aiohttp's default 10 s.
                        timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=2.0),
                    )
                    if ws.protocol != SUBPROTOCOL:
                        await ws.close()
                        raise CannotConnect(f"{self.url}: server did not accept subprotocol {SUBPROTOCOL}")
                    transport = _WsTransport(ws)
        except aiohttp.WSServerHandshakeError as exc:
            msg = f"{self.url}: WebSocket upgrade refused ({exc.status} {exc.message})"
            raise CannotConnect(msg) from exc
        except (OSError, aiohttp.ClientError) as exc:
            raise CannotConnect(f"{self.url}: {exc}") from exc
        except TimeoutError as exc:
            raise CannotConnect(f"{self.url}: timed out") from exc
        try:
            async with asyncio.timeout(self._connect_timeout):
                return await self._hello(transport)
        except BaseException as exc:
            await transport.close()
            if isinstance(exc, TimeoutError):
                raise CannotConnect(f"{self.url}: no hello reply") from exc
            raise

    async def _hello(self, transport: _Transport) -> _Conn:
        hid = self._new_id()
        hello: dict[str, Any] = {"op": "hello", "id": hid, "v": 1, "client": self._client_name}
        if self._token:
            hello["token"] = self._token
        hello["echo"] = self._echo
        hello["batch"] = self._batch
        try:
            await transport.send(_dumps(hello))
            self._stats["sent"] += 1
            while True:
                raw = await transport.recv()
                if raw is None:
                    raise CannotConnect(f"{self.url}: connection closed during hello")
                frame = _loads(raw)
                is_batch = isinstance(frame, dict) and frame.get("op") == "batch"
                frames = frame.get("frames", []) if is_batch else [frame]
                for f in frames:
                    if not isinstance(f, dict):
                        continue
                    if f.get("op") == "error":
                        raise error_from_frame(f)
                    if f.get("op") == "reply" and f.get("id") == hid:
                        limits = f.get("limits") or {}
                        return _Conn(
                            transport,
                            session=str(f.get("session", "")),
                            ping_interval=float(f.get("ping_interval", 25)),
                            max_frame=int(limits.get("max_frame", 1 << 20)),
                        )
        except (OSError, aiohttp.ClientError) as exc:
            raise CannotConnect(f"{self.url}: {exc}") from exc
        except ValueError as exc:
            raise CannotConnect(f"{self.url}: bad hello reply") from exc

    def _set_connected(self, conn: _Conn) -> None:
        self._conn = conn
        self._stats["connects"] += 1
        self._connected.set()

    async def _wait_connected(self) -> _Conn:
        while True:
            self._check_open()
            if self._conn is not None:
                return self._conn
            await self._connected.wait()

    async def _supervise(self, conn: _Conn) -> None:
        """Owns the connection: read until it drops, then reconnect and resume, until closed or final."""
        first = True
        try:
            while True:
                reader = asyncio.create_task(self._read_loop(conn), name="hubbub-client reader")
                # The resume runs beside the reader (its requests need replies), and is cancelled when the
                # connection ends: whatever it had not finished is redone on the next connection.
                resume = (
                    None if first else asyncio.create_task(self._resume(conn), name="hubbub-client resume")
                )
                try:
                    await reader
                finally:
                    for task in (reader, resume):
                        if task is not None and not task.done():
                            task.cancel()
                        if task is not None:
                            with contextlib.suppress(asyncio.CancelledError):
                                await task
                first = False
                final = self._on_disconnect(conn)
                if final is not None or self._closing:
                    self._terminate(final)
                    return
                new = await self._reconnect_loop()
                if new is None:
                    return
                conn = new
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave callers waiting forever
            log.exception("hubbub client supervisor failed")
            self._terminate(ConnectionLost(f"client failed: {exc!r}"))

    async def _reconnect_loop(self) -> _Conn | None:
        loop = asyncio.get_running_loop()
        deadline = None if self._reconnect_timeout is None else loop.time() + self._reconnect_timeout
        attempt = 0
        while True:
            delay = min(self._max_delay, self._min_delay * (2**attempt))
            await asyncio.sleep(random.uniform(delay / 2, delay))  # jitter spreads a herd of clients
            attempt += 1
            try:
                return await self._connect_once()
            except HubbubError as exc:
                self._last_error = str(exc)
                if exc.code in _FINAL_CODES:
                    self._terminate(exc)
                    return None
                log.debug("reconnect to %s failed: %s", self.url, exc)
            if deadline is not None and loop.time() >= deadline:
                msg = f"{self.url}: could not reconnect within {self._reconnect_timeout}s"
                self._terminate(ConnectionLost(msg))
                return None

    async def _resume(self, conn: _Conn) -> None:
        """After a reconnect: resend idempotent publishes (before anything new), then resubscribe."""
        retry = [e for e in self._retry if not e.future.done()]
        self._retry = []
        # Register all first: if the connection drops midway, _on_disconnect parks them all again.
        for entry in retry:
            entry.id = self._new_id()
            entry.frame["id"] = entry.id
            self._pending[entry.id] = entry
        for entry in retry:
            try:
                await self._send(conn, entry.frame)
            except ClientConnectionError:
                return
            except HubbubError as exc:  # e.g. the new server's max_frame is smaller
                self._pending.pop(entry.id, None)
                if not entry.future.done():
                    entry.future.set_exception(exc)
        self._set_connected(conn)
        await asyncio.gather(*(self._subscribe_on(sub, conn) for sub in list(self._subs.values())))

    def _on_disconnect(self, conn: _Conn) -> HubbubError | None:
        """Fail or park what was in flight. Returns the final error when the client must not reconnect."""
        self._conn = None
        self._connected.clear()
        self._stats["disconnects"] += 1
        err = conn.error
        if err is None and conn.transport.close_code in _FINAL_CODES:
            err = error_from_frame({"code": conn.transport.close_code})
        if err is not None:
            self._last_error = f"{err.code} {err.message}"
        final: HubbubError | None = None
        if err is not None and err.code in _FINAL_CODES:
            final = err
        elif not self._reconnect:
            final = ConnectionLost(f"{self.url}: connection closed")
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if entry.future.done():
                continue
            if entry.retry and final is None:
                self._retry.append(entry)
            else:
                entry.future.set_exception(final or ConnectionLost(f"{self.url}: connection lost"))
        self._retry.sort(key=lambda e: e.id)
        return final

    def _terminate(self, error: HubbubError | None) -> None:
        """Nothing will connect again: fail everything still waiting and end the subscriptions."""
        if self._final is None:
            self._final = error or ClientClosed("client closed")
        final = self._final
        self._conn = None
        for entry in [*self._pending.values(), *self._retry]:
            if not entry.future.done():
                entry.future.set_exception(final)
        self._pending.clear()
        self._retry.clear()
        for sub in list(self._subs.values()):
            sub._end(error)
        self._connected.set()  # wake waiters; they see _final

    # -- requests ---------------------------------------------------------------------------------------

    async def _send(self, conn: _Conn, frame: dict[str, Any]) -> None:
        data = _dumps(frame)
        if len(data) > conn.max_frame:
            raise FrameTooLarge(f"frame of {len(data)} bytes over the server's max_frame {conn.max_frame}")
        try:
            await conn.transport.send(data)
        except (OSError, aiohttp.ClientError, RuntimeError) as exc:
            # The reader will see the connection end; make sure it does.
            await conn.transport.close()
            raise ConnectionLost(f"{self.url}: {exc}") from exc
        self._stats["sent"] += 1

    async def _request(
        self,
        frame: dict[str, Any],
        *,
        retry: bool = False,
        on_reply: Callable[[dict[str, Any]], None] | None = None,
        conn: _Conn | None = None,
        reply_op: str = "reply",
    ) -> dict[str, Any]:
        if conn is None:
            conn = await self._wait_connected()
        elif conn is not self._conn:
            raise ConnectionLost("connection replaced")
        entry = _Pending(self._new_id(), frame, asyncio.get_running_loop().create_future(), on_reply, retry)
        frame["id"] = entry.id
        data = _dumps(frame)
        if len(data) > conn.max_frame:
            raise FrameTooLarge(f"frame of {len(data)} bytes over the server's max_frame {conn.max_frame}")
        self._pending[entry.id] = entry
        try:
            try:
                await conn.transport.send(data)
                self._stats["sent"] += 1
            except (OSError, aiohttp.ClientError, RuntimeError):
                # The reader sees the connection end and then fails or parks this entry.
                await conn.transport.close()
            reply = await entry.future
        finally:
            # entry.id changes when a retried publish is resent after a reconnect.
            if self._pending.get(entry.id) is entry:
                del self._pending[entry.id]
            if entry in self._retry:
                self._retry.remove(entry)
        if reply.get("op", "reply") != reply_op:
            raise BadFrame(f"expected {reply_op}, got {reply.get('op')}")
        return reply

    async def _start_subscription(self, sub: Subscription) -> None:
        try:
            self._check_open()
            self._subs[sub.id] = sub
            conn = await self._wait_connected()
        except HubbubError as exc:
            sub._end(exc)
            raise
        await self._subscribe_on(sub, conn)

    async def _subscribe_on(self, sub: Subscription, conn: _Conn) -> None:
        """Send ``sub``'s subscribe request on ``conn`` unless that was done already.

        A lost connection is not an error here: the next connection's resume subscribes again.
        """
        if sub._conn is conn or sub.closed:
            return
        sub._conn = conn
        sub._active = False
        fields = sub._request_fields()
        frame: dict[str, Any] = {"op": "subscribe", "sub": sub.id, "pattern": sub.pattern}
        if sub.tags:
            frame["tags"] = list(sub.tags)
        frame.update(fields)

        def on_reply(reply: dict[str, Any]) -> None:
            # Runs in the reader, before any later frame (gaps, replay) is dispatched.
            sub._on_reply(reply)

        sub._on_sent(fields)
        try:
            await self._request(frame, on_reply=on_reply, conn=conn)
        except ClientConnectionError:
            if self._final is not None:
                sub._end(self._final)
            return
        except HubbubError as exc:
            sub._end(exc)
            return
        if sub.closed:
            # Unsubscribed while the request was in flight.
            with contextlib.suppress(HubbubError):
                await self._request({"op": "unsubscribe", "sub": sub.id}, conn=conn)
            return
        sub._set_ready()

    async def _unsubscribe(self, sub: Subscription) -> None:
        conn = self._conn
        if conn is None or sub._conn is not conn or not sub._ready.done():
            return
        # 4201 (already gone on the server) and a lost connection both mean it is gone.
        with contextlib.suppress(HubbubError):
            await self._request({"op": "unsubscribe", "sub": sub.id}, conn=conn)

    # -- reading ----------------------------------------------------------------------------------------

    async def _read_loop(self, conn: _Conn) -> None:
        # The server pings after ping_interval of silence; hearing nothing for much longer means the
        # connection is dead even if TCP has not noticed.
        idle = 2 * conn.ping_interval + 5
        try:
            while True:
                try:
                    async with asyncio.timeout(idle):
                        raw = await conn.transport.recv()
                except TimeoutError:
                    log.info("hubbub connection to %s silent for %.0fs; reconnecting", self.url, idle)
                    break
                if raw is None:
                    break
                self._stats["received"] += 1
                try:
                    frame = _loads(raw)
                except ValueError:
                    log.warning("ignoring a frame that is not JSON from %s", self.url)
                    continue
                if isinstance(frame, dict):
                    await self._dispatch(conn, frame)
        except (OSError, aiohttp.ClientError) as exc:
            log.debug("hubbub connection to %s failed: %s", self.url, exc)
        finally:
            await conn.transport.close()

    async def _dispatch(self, conn: _Conn, frame: dict[str, Any]) -> None:
        op = frame.get("op")
        if op == "event":
            subs = frame.get("subs")
            if not isinstance(subs, list):
                return
            event = event_from_dict(frame)
            self._stats["events"] += 1
            for sid in subs:
                sub = self._subs.get(sid) if isinstance(sid, str) else None
                if sub is not None and sub._conn is conn:
                    await sub._deliver(event)
        elif op in ("reply", "pong") and "id" in frame:
            entry = self._pending.pop(frame["id"], None) if isinstance(frame["id"], int) else None
            if entry is not None and not entry.future.done():
                if entry.on_reply is not None:
                    entry.on_reply(frame)
                entry.future.set_result(frame)
        elif op == "batch":
            frames = frame.get("frames")
            if isinstance(frames, list):
                for f in frames:
                    if isinstance(f, dict):
                        await self._dispatch(conn, f)
        elif op == "gap":
            sub = self._subs.get(str(frame.get("sub")))
            if sub is not None and sub._conn is conn:
                await sub._deliver_gap(
                    Gap(
                        channel=str(frame.get("channel", "")),
                        since=_position(frame.get("since")),
                        position=_position(frame.get("position")),
                        reason=str(frame.get("reason", "")),
                    )
                )
        elif op == "recovered":
            sub = self._subs.get(str(frame.get("sub")))
            if sub is not None and sub._conn is conn:
                sub._on_recovered(frame)
        elif op == "ping":
            pong: dict[str, Any] = {"op": "pong"}
            if "id" in frame:
                pong["id"] = frame["id"]
            with contextlib.suppress(HubbubError):
                await self._send(conn, pong)
        elif op == "error":
            err = error_from_frame(frame)
            rid = frame.get("id")
            entry = self._pending.pop(rid, None) if isinstance(rid, int) else None
            if entry is not None and not entry.future.done():
                entry.future.set_exception(err)
            elif rid is not None:
                self._stats["unmatched"] += 1
                self._last_error = f"{err.code} {err.message}"
                log.warning("hubbub server error for request %s: %s %s", rid, err.code, err)
            if err.fatal:
                conn.error = err
        # Unknown ops are ignored (native.md §10).
