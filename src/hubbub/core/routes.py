"""The push connectors' routes (``hubbub.log.routes``: records in the log's state maps) as the core API
offers them: ``Core.routes``, a :class:`RouteBook`. Writes run on the writer thread, in order with the
appends (so a route answered to its maker is durable, as an acknowledged publish is); reads on the reader
threads. Every process sharing the log (a node's workers, a cluster's nodes) reads the same records; what
another one changed is seen by reading again (``shared`` says whether that can happen).

Concurrency contract: the coroutines are called from the event loop thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, final

from hubbub.log.base import LogStore
from hubbub.log.routes import RouteRecord, delete_route, put_route, route_records

from .reads import LogReads

__all__ = ["RouteBook", "RouteRecord"]


@final
class RouteBook:
    """See the module docstring. ``control`` runs a function over the store on the writer thread."""

    def __init__(
        self, control: Callable[[Callable[[LogStore], Any]], Awaitable[Any]], reads: LogReads, shared: bool
    ) -> None:
        self._control = control
        self._reads = reads
        #: Whether other processes write the log too (their changes are seen by reading again).
        self.shared = shared

    async def put(self, record: RouteRecord, *, replace: bool = False) -> bool:
        """Store ``record`` (``hubbub.log.routes.put_route``: False when its name exists and not ``replace``,
        or another record of its connector has its key); durable when True is returned."""
        stored: bool = await self._control(lambda st: put_route(st, record, replace=replace))
        return stored

    async def delete(self, connector: str, name: str) -> bool:
        """Delete a record; whether it existed."""
        found: bool = await self._control(lambda st: delete_route(st, connector, name))
        return found

    async def records(self, connector: str) -> list[RouteRecord]:
        """Every record of ``connector`` as the log has it now, by name."""
        return await self._reads.call_state(route_records, connector)
