"""The connection of the native asyncio client, supervised: opened, read, lost, opened again.

:class:`ConnectionSupervisor` owns an :class:`~hubbub.client.aio.AsyncClient`'s connection, the one
resource every request and subscription of the client shares. It opens the first connection (not
retried: its failure is the caller's), then runs one task that reads the connection until it drops, fails
or parks what was in flight, reconnects with capped exponential backoff and jitter (``min_delay`` doubling
up to ``max_delay``, for at most ``timeout`` seconds) and has the client resume on the new connection
(resend parked publishes, resubscribe from the positions reached, reopen consumers). A close code or error
from the server that no reconnect can cure (a bad token, a refused identity: ``_FINAL_CODES``), or
``reconnect=False``, ends the client for good: :attr:`ConnectionSupervisor.final` is then set, and every
waiter sees it.

Concurrency contract: the client's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import TYPE_CHECKING

from hubbub.client._transport import Connector, _Conn
from hubbub.client._wire import _FINAL_CODES, ClientClosed, ConnectionLost, error_from_frame
from hubbub.errors import HubbubError

if TYPE_CHECKING:
    from hubbub.client.aio import AsyncClient

__all__ = ["ConnectionSupervisor"]

log = logging.getLogger("hubbub.client")


class ConnectionSupervisor:
    """The client's connection and its lifecycle (see the module docstring)."""

    def __init__(
        self,
        client: AsyncClient,
        connector: Connector,
        *,
        reconnect: bool,
        min_delay: float,
        max_delay: float,
        timeout: float | None,
    ) -> None:
        self._client = client
        self._connector = connector
        self._reconnect = reconnect
        self._min_delay = min_delay
        self._max_delay = max_delay
        self._timeout = timeout
        self.url = connector.url
        self.conn: _Conn | None = None
        self.connected = asyncio.Event()  # set while a connection is usable, and once terminal
        self.disconnected = asyncio.Event()  # set while no connection is usable
        self.disconnected.set()
        self.final: HubbubError | None = None  # set once the client will never connect again
        self.closing = False
        self.task: asyncio.Task[None] | None = None

    def check_open(self) -> None:
        if self.final is not None:
            raise self.final

    async def open(self) -> None:
        """The first connection (no retries), then start the supervising task."""
        self.check_open()
        if self.task is not None:
            return
        try:
            conn = await self._connector.connect()
        except BaseException:
            await self.close()
            raise
        self.set_connected(conn)
        self.task = asyncio.create_task(self._run(conn), name=f"hubbub-client {self.url}")

    def set_connected(self, conn: _Conn) -> None:
        self.conn = conn
        self._client._stats["connects"] += 1
        self.connected.set()
        self.disconnected.clear()

    async def wait_connected(self) -> _Conn:
        while True:
            self.check_open()
            if self.conn is not None:
                return self.conn
            await self.connected.wait()

    async def close(self) -> None:
        """Close the connection and end the client: everything waiting fails. Idempotent."""
        if self.closing:
            if self.task is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self.task)
            return
        self.closing = True
        if self.final is None:
            self.final = ClientClosed("client closed")
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn = self.conn
        if conn is not None:
            await conn.transport.close()
        self._terminate(None)
        await self._connector.close()

    def _terminate(self, error: HubbubError | None) -> None:
        """Nothing will connect again: the client fails everything still waiting."""
        if self.final is None:
            self.final = error or ClientClosed("client closed")
        conn, self.conn = self.conn, None
        self._client._ended(conn, self.final, error)
        self.connected.set()  # wake waiters; they see final

    async def _run(self, conn: _Conn) -> None:
        """Read until the connection drops, then reconnect and resume, until closed or final."""
        client = self._client
        first = True
        try:
            while True:
                reader = asyncio.create_task(client._reader.run(conn), name="hubbub-client reader")
                # The resume runs beside the reader (its requests need replies), and is cancelled when the
                # connection ends: whatever it had not finished is redone on the next connection.
                resume = (
                    None if first else asyncio.create_task(client._resume(conn), name="hubbub-client resume")
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
                final = self._lost(conn)
                if final is not None or self.closing:
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
        deadline = None if self._timeout is None else loop.time() + self._timeout
        attempt = 0
        while True:
            delay = min(self._max_delay, self._min_delay * (2**attempt))
            await asyncio.sleep(random.uniform(delay / 2, delay))  # jitter spreads a herd of clients
            attempt += 1
            try:
                return await self._connector.connect()
            except HubbubError as exc:
                self._client._last_error = str(exc)
                if exc.code in _FINAL_CODES:
                    self._terminate(exc)
                    return None
                log.debug("reconnect to %s failed: %s", self.url, exc)
            if deadline is not None and loop.time() >= deadline:
                msg = f"{self.url}: could not reconnect within {self._timeout}s"
                self._terminate(ConnectionLost(msg))
                return None

    def _lost(self, conn: _Conn) -> HubbubError | None:
        """Fail or park what was in flight. Returns the final error when the client must not reconnect."""
        client = self._client
        self.conn = None
        self.connected.clear()
        self.disconnected.set()
        client._stats["disconnects"] += 1
        err = conn.error
        if err is None and conn.transport.close_code in _FINAL_CODES:
            err = error_from_frame({"code": conn.transport.close_code})
        if err is not None:
            client._last_error = f"{err.code} {err.message}"
        final: HubbubError | None = None
        if err is not None and err.code in _FINAL_CODES:
            final = err
        elif not self._reconnect:
            final = ConnectionLost(f"{self.url}: connection closed")
        client._requests.lost(conn, final)
        return final
