"""The reader of the native asyncio client's connections.

:class:`Reader` reads one connection until it ends: each read goes to the connection's
:class:`~hubbub.client.protocol.ClientProtocol`, and the events it hands back go where they are awaited:
replies and errors to the requests in flight (:class:`~hubbub.client.requests.Requests`), events and gaps to
their :class:`~hubbub.client.subscription.Subscription` (waiting while its queue is full: the socket is not
read meanwhile, which is the client's back-pressure), consumer frames to their
:class:`~hubbub.client.consumer.Consumer`, pongs back to the server.

Concurrency contract: runs as the client supervisor's reader task, on the client's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import aiohttp

from hubbub.client._transport import _Conn
from hubbub.client.protocol import (
    BadInput,
    ClientEvent,
    ConsumerFrame,
    Delivered,
    GapNotice,
    Refused,
    Replies,
    ServerError,
)
from hubbub.errors import BadFrame, FrameTooLarge, HubbubError

if TYPE_CHECKING:
    from hubbub.client.aio import AsyncClient

__all__ = ["Reader"]

log = logging.getLogger("hubbub.client")


class Reader:
    """Reads ``client``'s connections (see the module docstring)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def run(self, conn: _Conn) -> None:
        # The server pings after ping_interval of silence; hearing nothing for much longer means the
        # connection is dead even if TCP has not noticed.
        idle = 2 * conn.ping_interval + 5
        proto = conn.proto
        try:
            await self.dispatch(conn, conn.early)
            conn.early = []
            while True:
                try:
                    async with asyncio.timeout(idle):
                        raw = await conn.transport.recv()
                except TimeoutError:
                    log.info("hubbub connection to %s silent for %.0fs; reconnecting", self._client.url, idle)
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
                    log.warning("ignoring a frame that is not JSON from %s", self._client.url)
                    items = []
                self._client._stats["received"] += proto.received - received
                self._client._stats["events"] += proto.events - events
                await self.dispatch(conn, items)
        except (OSError, aiohttp.ClientError) as exc:
            log.debug("hubbub connection to %s failed: %s", self._client.url, exc)
        finally:
            await conn.transport.close()

    async def dispatch(self, conn: _Conn, items: list[ClientEvent]) -> None:
        for item in items:
            kind = type(item)
            if kind is Replies:  # the most frequent first: publish acknowledgements
                answered = self._client._requests.answered
                for token, frame in item.answers:  # type: ignore[union-attr]
                    answered(token, frame)
            elif isinstance(item, Delivered | GapNotice):
                sub = self._client._subs.get(item.sub)
                if sub is not None and sub._conn is conn:
                    await sub._put(item.event if isinstance(item, Delivered) else item.gap)
            elif isinstance(item, ConsumerFrame):
                if c := self._client._consumers.get(item.consumer):
                    c._on_frame(conn, item.frame)
            elif isinstance(item, Refused | ServerError):
                err = item.error
                if isinstance(item, Refused):
                    self._client._requests.refused(item.token, err)
                elif item.request_id is not None:
                    self._client._stats["unmatched"] += 1
                    self._client._last_error = f"{err.code} {err.message}"
                    log.warning("hubbub server error for request %s: %s %s", item.request_id, err.code, err)
                if err.fatal:
                    conn.error = err
            elif isinstance(item, BadInput):
                log.warning("ignoring a malformed frame from %s: %s", self._client.url, item.error)
        for data in conn.proto.take_outgoing():  # pongs
            with contextlib.suppress(HubbubError):
                await self._client._requests.send(conn, data)
