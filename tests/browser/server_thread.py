"""A hubbub server in the test's process, on an event loop of its own thread, for tests whose own thread is
busy with something synchronous (a browser driven over WebDriver).

It is the server ``hubbub serve`` runs (:class:`hubbub.server.Server`, every listener on a free loopback
port) without the process: it starts in some tens of milliseconds where a ``hubbub serve`` child takes
seconds on a loaded machine, and a test can reach its node (:meth:`ServerThread.call`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from hubbub.server import Server
from hubbub.server_config import KEYS, load_config

__all__ = ["ServerThread"]

T = TypeVar("T")

#: Every listener of the server on a free loopback port.
FREE_PORTS = {key: "127.0.0.1:0" for key, k in KEYS.items() if k.listen_default}


class ServerThread:
    """One :class:`~hubbub.server.Server` on its own thread and event loop. ``start`` returns once every
    listener is up (``ports`` as ``Server.ports``: ``ports["http"]`` is the HTTP and WebSocket one);
    ``stop`` closes it as the process would on SIGTERM and joins the thread. Everything but :meth:`call`
    is called from the test's thread; :meth:`call` runs a coroutine on the server's loop, where the
    server's objects live."""

    def __init__(self, data_dir: Path, options: Mapping[str, object] | None = None) -> None:
        self.config = load_config(cli={**FREE_PORTS, "data_dir": str(data_dir), **(options or {})}, env={})
        self.ports: dict[str, int] = {}
        self.server: Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hubbub-server", daemon=True)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` of the HTTP listener."""
        return f"http://127.0.0.1:{self.ports['http']}"

    def start(self, timeout: float = 20.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the server did not start within {timeout}s")
        if self._error is not None:
            raise RuntimeError("the server did not start") from self._error
        return self

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float = 10.0) -> T:
        """``await fn(*args)`` on the server's loop, from the test's thread, and return its result."""
        assert self._loop is not None, "not started"
        return asyncio.run_coroutine_threadsafe(_awaited(fn, *args), self._loop).result(timeout)

    def stop(self, timeout: float = 20.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the server did not stop within {timeout}s")
        if self._error is not None and self._ready.is_set() and self.server is not None:
            raise RuntimeError("the server failed") from self._error

    def _run(self) -> None:
        # An exception is kept for start() or stop() to raise in the test's thread: one escaping here would
        # be a warning of pytest's, an error under filterwarnings=error, with no test to blame.
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with Server(self.config) as server:
            self.server = server
            self.ports = dict(server.ports)
            self._ready.set()
            await self._stop.wait()


async def _awaited(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return await fn(*args)
