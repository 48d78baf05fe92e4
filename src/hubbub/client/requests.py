"""The native asyncio client's requests in flight, across reconnects.

:class:`Requests` sends a request on a connection and waits for its answer: the connection's
:class:`~hubbub.client.protocol.ClientProtocol` numbers it and hands its reply or error back (as events the
client's reader passes to :meth:`Requests.answered` and :meth:`Requests.refused`). When a connection drops,
what was in flight is failed with :class:`ConnectionLost`, except publishes carrying an idempotency key:
those are parked and sent again first on the next connection (:meth:`Requests.resend`), where the server
deduplicates them.

Concurrency contract: the client's event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from hubbub.client._transport import _Conn
from hubbub.client._wire import ConnectionLost
from hubbub.client.protocol import ClientProtocol
from hubbub.errors import BadFrame, HubbubError

__all__ = ["Build", "Requests"]


@dataclass(eq=False)
class _Pending:
    frame: dict[str, Any] | None  # None: built by the protocol (a subscribe)
    future: asyncio.Future[dict[str, Any]]
    on_reply: Callable[[dict[str, Any]], None] | None = None
    retry: bool = False  # publish with an idempotency key: resend after a reconnect
    id: int = 0


#: How a request's bytes are made on a connection: its protocol and the request's token in, bytes out.
Build = Callable[[ClientProtocol[Any], _Pending], bytes]


class Requests:
    """Requests in flight and the retry queue (see the module docstring). ``stats`` is the client's
    counter dict (``sent``)."""

    def __init__(self, url: str, stats: dict[str, int]) -> None:
        self.url = url
        self._stats = stats
        self.retry: list[_Pending] = []

    async def send(self, conn: _Conn, data: bytes) -> None:
        """Write ``data``; a failed write closes the transport (the reader sees the end) and raises
        ConnectionLost."""
        try:
            await conn.transport.send(data)
        except (OSError, aiohttp.ClientError, RuntimeError) as exc:
            await conn.transport.close()
            raise ConnectionLost(f"{self.url}: {exc}") from exc
        self._stats["sent"] += 1

    async def call(
        self,
        conn: _Conn,
        frame: dict[str, Any] | None,
        *,
        build: Build | None = None,
        retry: bool = False,
        on_reply: Callable[[dict[str, Any]], None] | None = None,
        reply_op: str = "reply",
    ) -> dict[str, Any]:
        """Send a request on ``conn`` (``frame``, or what ``build`` makes) and return its reply; raises the
        server's error, FrameTooLarge (nothing sent), or ConnectionLost."""
        entry = _Pending(frame, asyncio.get_running_loop().create_future(), on_reply, retry)
        proto = conn.proto
        data = build(proto, entry) if build is not None else proto.request(frame or {}, entry)
        entry.id = proto.last_id
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
            proto.discard(entry.id, entry)
            if entry in self.retry:
                self.retry.remove(entry)
        if reply.get("op", "reply") != reply_op:
            raise BadFrame(f"expected {reply_op}, got {reply.get('op')}")
        return reply

    @staticmethod
    def answered(entry: _Pending, frame: dict[str, Any]) -> None:
        if not entry.future.done():
            if entry.on_reply is not None:
                entry.on_reply(frame)
            entry.future.set_result(frame)

    @staticmethod
    def refused(entry: _Pending, error: HubbubError) -> None:
        if not entry.future.done():
            entry.future.set_exception(error)

    def lost(self, conn: _Conn, final: HubbubError | None) -> None:
        """``conn`` dropped: park what may be resent (unless ``final``), fail the rest."""
        for entry in conn.proto.abandon():
            if entry.future.done():
                continue
            if entry.retry and final is None:
                self.retry.append(entry)
            else:
                entry.future.set_exception(final or ConnectionLost(f"{self.url}: connection lost"))
        self.retry.sort(key=lambda e: e.id)

    def fail_all(self, conn: _Conn | None, error: HubbubError) -> None:
        """Nothing will connect again: every request waiting fails with ``error``."""
        waiting = conn.proto.abandon() if conn is not None else []
        for entry in [*waiting, *self.retry]:
            if not entry.future.done():
                entry.future.set_exception(error)
        self.retry.clear()

    async def resend(self, conn: _Conn) -> bool:
        """After a reconnect: send the parked publishes again, oldest first, before anything new. False when
        the connection dropped meanwhile."""
        retry = [e for e in self.retry if not e.future.done()]
        self.retry = []
        # Register all first: if the connection drops midway, lost() parks them all again.
        out: list[bytes] = []
        for entry in retry:
            assert entry.frame is not None  # parked requests are publishes
            try:
                out.append(conn.proto.request(entry.frame, entry))
            except HubbubError as exc:  # e.g. the new server's max_frame is smaller
                entry.future.set_exception(exc)
                continue
            entry.id = conn.proto.last_id
        for data in out:
            try:
                await self.send(conn, data)
            except ConnectionLost:
                return False
        return True
