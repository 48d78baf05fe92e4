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

This module is the I/O shell: the wire (hello, request ids and replies, subscriptions' positions, framing)
is :class:`~hubbub.client.protocol.ClientProtocol`'s, one per connection; opening a connection is
:class:`~hubbub.client._transport.Connector`'s, requests in flight and their retries are
:class:`~hubbub.client.requests.Requests`'s. Values, errors and the event codec live in
:mod:`hubbub.client._wire`, :class:`Subscription` in :mod:`hubbub.client.subscription`; everything public
is re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Generator, Iterable, Mapping
from types import TracebackType
from typing import Any

import aiohttp

from hubbub.client._transport import (
    DEFAULT_CLIENT_NAME,
    SUBPROTOCOL,  # noqa: F401 - still importable from here
    WS_PATH,  # noqa: F401 - still importable from here
    Connector,
    _Conn,
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
    error_from_frame,
    event_as_dict,
    event_from_dict,
)
from hubbub.client.consumer import Consumer
from hubbub.client.protocol import (
    BadInput,
    ClientEvent,
    ConsumerFrame,
    Delivered,
    GapNotice,
    Refused,
    Replied,
    ServerError,
    publish_frame,
)
from hubbub.client.requests import Requests, _Pending
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
        self._connector = Connector(
            url,
            token=token,
            client_name=client_name,
            echo=echo,
            batch=batch,
            max_frame=max_frame,
            timeout=connect_timeout,
        )
        self._reconnect = reconnect
        self._max_queue = max_queue
        self._min_delay = reconnect_min_delay
        self._max_delay = reconnect_max_delay
        self._reconnect_timeout = reconnect_timeout
        self._conn: _Conn | None = None
        self._connected = asyncio.Event()  # set while a connection is usable, and once terminal
        self._disconnected = asyncio.Event()  # set while no connection is usable
        self._disconnected.set()
        self._final: HubbubError | None = None  # set once the client will never connect again
        self._closing = False
        self._supervisor: asyncio.Task[None] | None = None
        self._subs: dict[str, Subscription] = {}
        self._consumers: dict[str, Consumer] = {}
        self._next_sub = 0
        self._stats = {"connects": 0, "disconnects": 0, "sent": 0, "received": 0, "events": 0, "unmatched": 0}
        self._requests = Requests(url, self._stats)
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
        frame = publish_frame(
            channel, data, content_type=content_type, headers=headers, tags=tags, idem=idem, ack=ack
        )
        # What _wait_connected answers, one await less on the hot path.
        conn = self._conn if self._final is None else None
        if conn is None:
            conn = await self._wait_connected()
        if not ack:
            frame["id"] = conn.proto.next_id()
            await self._requests.send(conn, conn.proto.encode(frame))
            return None
        reply = await self._requests.call(conn, frame, retry=idem is not None)
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
            pending_requests=len(self._conn.proto.pending) if self._conn is not None else 0,
            retry_queue=len(self._requests.retry),
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
        conn = self._conn
        if conn is not None:
            await conn.transport.close()
        self._terminate(None)
        await self._connector.close()

    # -- connection -------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._final is not None:
            raise self._final

    async def _open(self) -> None:
        """The first connection (no retries), then start the supervisor."""
        self._check_open()
        if self._supervisor is not None:
            return
        try:
            conn = await self._connector.connect()
        except BaseException:
            await self.close()
            raise
        self._set_connected(conn)
        self._supervisor = asyncio.create_task(self._supervise(conn), name=f"hubbub-client {self.url}")

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
                return await self._connector.connect()
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
        if not await self._requests.resend(conn):
            return
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
        self._requests.lost(conn, final)
        return final

    def _terminate(self, error: HubbubError | None) -> None:
        """Nothing will connect again: fail everything still waiting and end the subscriptions."""
        if self._final is None:
            self._final = error or ClientClosed("client closed")
        final = self._final
        conn, self._conn = self._conn, None
        self._requests.fail_all(conn, final)
        for sub in [*self._subs.values(), *self._consumers.values()]:
            sub._end(error)  # type: ignore[attr-defined]  # both have _end
        self._connected.set()  # wake waiters; they see _final

    # -- requests ---------------------------------------------------------------------------------------

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
        return await self._requests.call(conn, frame, retry=retry, on_reply=on_reply, reply_op=reply_op)

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

        def build(proto: Any, entry: _Pending) -> bytes:
            data: bytes = proto.subscribe(sub.id, sub.pattern, sub.tags, sub._positions, entry)
            return data

        def on_reply(reply: dict[str, Any]) -> None:
            # Runs in the reader, before any later frame (gaps, replay) is dispatched.
            sub._active = True

        try:
            if conn is not self._conn:
                raise ConnectionLost("connection replaced")
            await self._requests.call(conn, None, build=build, on_reply=on_reply)
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

    def _forget(self, sub: Subscription) -> None:
        """``sub`` ended: drop it, and what its connection still sends for it."""
        self._subs.pop(sub.id, None)
        if sub._conn is not None:
            sub._conn.proto.forget(sub.id)

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
        proto = conn.proto
        try:
            await self._dispatch(conn, conn.early)
            conn.early = []
            while True:
                try:
                    async with asyncio.timeout(idle):
                        raw = await conn.transport.recv()
                except TimeoutError:
                    log.info("hubbub connection to %s silent for %.0fs; reconnecting", self.url, idle)
                    break
                if raw is None:
                    break
                received, events = proto.received, proto.events
                try:
                    items = proto.receive_data(raw)
                except FrameTooLarge:
                    # Over the bound: the stream cannot be resynchronised, so the connection ends.
                    log.warning("native frame over the client's max_frame; dropping the connection")
                    break
                except BadFrame:
                    log.warning("ignoring a frame that is not JSON from %s", self.url)
                    items = []
                self._stats["received"] += proto.received - received
                self._stats["events"] += proto.events - events
                await self._dispatch(conn, items)
        except (OSError, aiohttp.ClientError) as exc:
            log.debug("hubbub connection to %s failed: %s", self.url, exc)
        finally:
            await conn.transport.close()

    async def _dispatch(self, conn: _Conn, items: list[ClientEvent]) -> None:
        for item in items:
            kind = type(item)
            if kind is Replied:  # the most frequent first: publish acknowledgements
                self._requests.answered(item.token, item.frame)  # type: ignore[union-attr]
            elif isinstance(item, Delivered | GapNotice):
                sub = self._subs.get(item.sub)
                if sub is not None and sub._conn is conn:
                    await sub._put(item.event if isinstance(item, Delivered) else item.gap)
            elif isinstance(item, ConsumerFrame):
                if c := self._consumers.get(item.consumer):
                    c._on_frame(conn, item.frame)
            elif isinstance(item, Refused | ServerError):
                err = item.error
                if isinstance(item, Refused):
                    self._requests.refused(item.token, err)
                elif item.request_id is not None:
                    self._stats["unmatched"] += 1
                    self._last_error = f"{err.code} {err.message}"
                    log.warning("hubbub server error for request %s: %s %s", item.request_id, err.code, err)
                if err.fatal:
                    conn.error = err
            elif isinstance(item, BadInput):
                log.warning("ignoring a malformed frame from %s: %s", self.url, item.error)
        for data in conn.proto.take_outgoing():  # pongs
            with contextlib.suppress(HubbubError):
                await self._requests.send(conn, data)
