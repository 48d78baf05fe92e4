"""A connector's routes kept with the log (``Core.routes``, ``hubbub.log.routes``): what a webhook made over
REST or a device subscribed through guble's FCM or APNs connector is, stored where every process of the log
reads it (a node's workers, a cluster's nodes), so that any of them lists, serves and deletes it.

:class:`SharedRoutes` mirrors one connector's records by name and keeps the connector's running routes
equal to them (and to the routes given as ``fixed``, a configuration file's hooks, which win over a record
of their name): a route recorded elsewhere starts here too, one deleted elsewhere stops here (its consumer
is the deleter's to delete), one changed elsewhere starts again with its new target. On a log other
processes write (``RouteBook.shared``) it reads the records again every ``poll_s``; each request that
answers from them reads them first. One node at a time delivers each route: its consumer's hold
(``transports/connector.py``).

Concurrency contract: event loop thread only. :attr:`SharedRoutes.changing` is held by every change made
here (a REST request's, the follower's): a request holds it over its checks, its writes and the connector's
routes, so that the follower never sees half of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from hubbub.core.api import Core, RouteRecord, Supervisor
from hubbub.errors import HubbubError

from .connector import Connector, Route

__all__ = ["SharedRoutes", "retire_file"]

log = logging.getLogger("hubbub.connectors")


class SharedRoutes:
    """One connector's routes in the log (module docstring). ``to_route`` makes a record's route (None: a
    record this connector leaves out, logged by it)."""

    def __init__(
        self,
        node: Core,
        connector: Connector,
        to_route: Callable[[RouteRecord], Route | None],
        *,
        poll_s: float,
        fixed: Mapping[str, Route] = MappingProxyType({}),
    ) -> None:
        self._book = node.routes
        self.connector = connector
        self._to_route = to_route
        self._poll_s = max(poll_s, 0.01)
        self._fixed = fixed
        #: The records as last read or written here, by name.
        self.records: dict[str, RouteRecord] = {}
        self.changing = asyncio.Lock()
        self._tasks = Supervisor("connectors", node.supervision)

    async def __aenter__(self) -> SharedRoutes:
        await self.refresh()
        self._tasks.open()
        if self._book.shared:
            self._tasks.run(f"connector-{self.connector.name}-follow", self._follow)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._tasks.aclose()

    def find_key(self, key: str) -> RouteRecord | None:
        return next((r for r in self.records.values() if r.key == key), None)

    async def put(self, record: RouteRecord, *, replace: bool = False) -> bool:
        """Store ``record`` (``RouteBook.put``), and mirror it when stored. Hold :attr:`changing`."""
        stored = await self._book.put(record, replace=replace)
        if stored:
            self.records[record.name] = record
        return stored

    async def delete(self, name: str) -> bool:
        """Delete the record ``name``; whether it was there. Hold :attr:`changing`."""
        self.records.pop(name, None)
        return await self._book.delete(self.connector.name, name)

    async def refresh(self) -> None:
        """Read the records and make the connector's routes theirs (taking :attr:`changing`)."""
        async with self.changing:
            await self.read()
            await self._reconcile()

    async def read(self) -> None:
        """Read the records (the caller holds :attr:`changing`; the routes are left as they are)."""
        self.records = {r.name: r for r in await self._book.records(self.connector.name)}

    async def _reconcile(self) -> None:
        wanted: dict[str, Route] = {}
        for name, record in self.records.items():
            if name not in self._fixed and (route := self._to_route(record)) is not None:
                wanted[name] = route
        wanted.update(self._fixed)
        running = {r.name: r for r in self.connector.routes()}
        for name, route in running.items():
            want = wanted.get(name)
            if want is None or _changed(route, want):
                await self.connector.remove(name, delete=False)  # the consumer is its deleter's
        running = {r.name: r for r in self.connector.routes()}
        for name, route in wanted.items():
            if name not in running:
                self.connector.add(route)

    async def _follow(self) -> None:
        """Every ``poll_s``: what other processes of the log changed."""
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                await self.refresh()
            except HubbubError as exc:  # the log away: the next interval tries again
                log.debug("connector %s: reading its routes failed: %s", self.connector.name, exc)


def _changed(a: Route, b: Route) -> bool:
    return (a.consumer, a.pattern, a.tags, dict(a.target)) != (b.consumer, b.pattern, b.tags, dict(b.target))


async def retire_file(path: Path) -> None:
    """Rename a registry file of an older hubbub, taken into the log, to ``<name>.migrated`` (kept for the
    operator; never read again)."""
    with contextlib.suppress(FileNotFoundError):  # another worker took it in at the same time
        await asyncio.to_thread(os.replace, path, path.with_name(path.name + ".migrated"))
