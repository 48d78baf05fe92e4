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

Values, errors and the event codec live in :mod:`hubbub.client._wire`, the transports in
:mod:`hubbub.client._transport` and :class:`Subscription` in :mod:`hubbub.client.subscription`; everything
public is re-exported here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from hubbub import __version__
from hubbub.client._transport import (
    WS_PATH,  # noqa: F401 - still importable from here
    _Conn,
    _parse_url,
    _TcpTransport,
    _Transport,
    _WsTransport,
)
from hubbub.client._wire import (
    _FINAL_CODES,
    CannotConnect,
    ClientClosed,
    ClientConnectionError,
    ClientStatistics,
    ConnectionLost,
    Gap,
    PublishAck,
    SubscriptionStatistics,
    _dumps,
    _loads,
    _position,
    error_from_frame,
    event_as_dict,
    event_from_dict,
)
from hubbub.client.consumer import Consumer
from hubbub.client.subscription import Subscription
from hubbub.errors import BadFrame, FrameTooLarge, HubbubError
from hubbub.events import Position

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
DEFAULT_CLIENT_NAME = f"hubbub-py/{__version__}"
_MAX_ID = (1 << 31) - 1


@dataclass(eq=False)
class _Pending:
    id: int
    frame: dict[str, Any]
    future: asyncio.Future[dict[str, Any]]
    on_reply: Callable[[dict[str, Any]], None] | None = None
    retry: bool = False  # publish with an idempotency key: resend after a reconnect


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
        self._disconnected = asyncio.Event()  # set while no connection is usable
        self._disconnected.set()
        self._final: HubbubError | None = None  # set once the client will never connect again
        self._closing = False
        self._supervisor: asyncio.Task[None] | None = None
        self._pending: dict[int, _Pending] = {}
        self._retry: list[_Pending] = []
        self._subs: dict[str, Subscription] = {}
        self._consumers: dict[str, Consumer] = {}
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

    async def wait_disconnected(self) -> None:
        """Wait until the client has no usable connection (at once when it has none): its connection was
        lost, or the client is closed. It reconnects by itself meanwhile when it may."""
        await self._disconnected.wait()

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

    def consume(self, name: str, pattern: str | None = None, **options: Any) -> Consumer:
        """A durable consumer (:mod:`hubbub.client.consumer`); without a pattern, an existing one only."""
        self._check_open()
        return Consumer(self, name, {"pattern": pattern, **options})

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
        self._disconnected.clear()

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
        await asyncio.gather(
            *(self._subscribe_on(sub, conn) for sub in list(self._subs.values())),
            *(c._open_on(conn) for c in list(self._consumers.values())),
        )

    def _on_disconnect(self, conn: _Conn) -> HubbubError | None:
        """Fail or park what was in flight. Returns the final error when the client must not reconnect."""
        self._conn = None
        self._connected.clear()
        self._disconnected.set()
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
        for sub in [*self._subs.values(), *self._consumers.values()]:
            sub._end(error)  # type: ignore[attr-defined]  # both have _end
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
        elif op in ("deliver", "consumer_closed") and (c := self._consumers.get(frame.get("consumer"))):  # type: ignore[arg-type]
            c._on_frame(conn, frame)
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
