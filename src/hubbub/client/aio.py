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
import logging
from collections.abc import Callable, Generator, Iterable, Mapping
from types import TracebackType
from typing import Any

from hubbub.client._transport import (
    DEFAULT_CLIENT_NAME,
    SUBPROTOCOL,  # noqa: F401 - still importable from here
    WS_PATH,  # noqa: F401 - still importable from here
    Connector,
    _Conn,
)
from hubbub.client._wire import (
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
    publish_frame,
)
from hubbub.client.reader import Reader
from hubbub.client.requests import Requests
from hubbub.client.subscription import Subscription
from hubbub.client.supervisor import ConnectionSupervisor
from hubbub.errors import HubbubError
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
        self._max_queue = max_queue
        self._subs: dict[str, Subscription] = {}
        self._consumers: dict[str, Consumer] = {}
        self._next_sub = 0
        self._stats = {"connects": 0, "disconnects": 0, "sent": 0, "received": 0, "events": 0, "unmatched": 0}
        self._requests = Requests(url, self._stats)
        self._reader = Reader(self)
        self._last_error = ""
        self._sup = ConnectionSupervisor(
            self,
            Connector(
                url,
                token=token,
                client_name=client_name,
                echo=echo,
                batch=batch,
                max_frame=max_frame,
                timeout=connect_timeout,
            ),
            reconnect=reconnect,
            min_delay=reconnect_min_delay,
            max_delay=reconnect_max_delay,
            timeout=reconnect_timeout,
        )

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
        if self._sup.task is None and self._final is None:
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
        await self._sup.disconnected.wait()

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
        await self._sup.close()

    # -- the connection (owned by the supervisor) ------------------------------------------------------

    @property
    def _conn(self) -> _Conn | None:
        return self._sup.conn

    @property
    def _final(self) -> HubbubError | None:
        return self._sup.final

    def _check_open(self) -> None:
        self._sup.check_open()

    async def _wait_connected(self) -> _Conn:
        return await self._sup.wait_connected()

    async def _open(self) -> None:
        await self._sup.open()

    async def _resume(self, conn: _Conn) -> None:
        """After a reconnect: resend idempotent publishes (before anything new), then resubscribe."""
        if not await self._requests.resend(conn):
            return
        self._sup.set_connected(conn)
        await asyncio.gather(
            *(sub._subscribe_on(conn) for sub in list(self._subs.values())),
            *(c._open_on(conn) for c in list(self._consumers.values())),
        )

    def _ended(self, conn: _Conn | None, final: HubbubError, error: HubbubError | None) -> None:
        """Nothing will connect again: fail everything still waiting and end the subscriptions."""
        self._requests.fail_all(conn, final)
        for sub in [*self._subs.values(), *self._consumers.values()]:
            sub._end(error)  # type: ignore[attr-defined]  # both have _end

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
