"""What a dialect's binding is: the node-side half of a :class:`~hubbub.dialects.spec.DialectSpec`, which
builds what the spec names from the configuration's section (ARCHITECTURE §2).

A binding is a ``mount(Wiring) -> Mounted`` coroutine function in the dialect's transport module, named by
its spec (``DialectSpec.binding``, ``"module:function"``) and found by the transports' registry,
:mod:`hubbub.transports.dialects`. ``mount`` builds the dialect's per-node state (mist's token registry,
WearScript's hub, qpubs' calls) and returns a :class:`Mounted`: its route installer (its WebSocket routes run
with the WebSocket driver, :mod:`~hubbub.transports.ws_driver`; its plain-HTTP surfaces are route modules),
the stream listeners it starts once the HTTP listener is up (run with the byte-stream driver,
:mod:`~hubbub.transports.stream_driver`), its connection tasks for a graceful stop, the links it opens to
other servers (entered last by the server's exit stack, left first), and its own closing.

Concurrency contract: called from the event loop thread, by the server, at start and stop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TypeAlias

from prometheus_client import CollectorRegistry

from hubbub.config import Config, parse_listen
from hubbub.core.api import ConsumerService, Core
from hubbub.dialects.spec import DialectSpec

from .connector import Connector
from .http import HttpSettings, RouteInstaller
from .pump import quietly
from .stream_listener import StreamListener

__all__ = ["Binding", "Mount", "Mounted", "Wiring"]

log = logging.getLogger("hubbub.server")


@dataclass(frozen=True, slots=True)
class Wiring:
    """What a binding builds its dialect from. ``track`` is given each stream connection's task (the server
    waits for them when it stops)."""

    node: Core
    consumers: ConsumerService
    config: Config
    http: HttpSettings
    ssl_context: ssl.SSLContext | None
    track: Callable[[asyncio.Task[None]], None]

    def auth(self, dialect: str) -> bool:
        """Whether ``<dialect>.auth`` resolves to tokens (``auth.mode = token`` and the dialect's own key)."""
        cfg = self.config
        return cfg.auth.mode == "token" and cfg.dialect_auth(dialect) == "token"


class Mounted:
    """One dialect wired on a node: its route installer, and what it starts and stops around the HTTP
    listener. Every step but the installer is optional: a route module needs no more."""

    def __init__(self, spec: DialectSpec, installer: RouteInstaller | None) -> None:
        self.spec = spec
        self.installer = installer
        #: Its stream listeners by name (``server.ports`` keys), once started.
        self.listeners: dict[str, StreamListener] = {}

    async def started(self, wiring: Wiring, metrics: CollectorRegistry) -> None:
        """The HTTP listener accepts connections: start what comes after it (listeners, links)."""

    def links(self) -> Iterable[AbstractAsyncContextManager[object]]:
        """The links this dialect opens to other servers: entered last by the server (they start once
        everything else is up) and left first (they must not reconnect while the node stops)."""
        return ()

    def connectors(self) -> Iterable[Connector]:
        """The push connectors this dialect delivers with (guble's FCM): shown at ``/api/v1/connectors``
        and in ``/metrics`` beside the webhooks; the dialect starts and stops them itself."""
        return ()

    def connections(self) -> Iterable[asyncio.Task[None]]:
        """Connection tasks outside the HTTP listener's, which the server waits for when it stops."""
        return ()

    def close_listeners(self) -> None:
        for listener in self.listeners.values():
            listener.close()

    async def wait_listeners(self, node: Core | None) -> None:
        for listener in self.listeners.values():
            await quietly(functools.partial(_closed, listener), node, self.spec.name, "", "listener close")
        self.listeners.clear()

    def close(self) -> None:
        """The HTTP listener is closed: release the dialect's state."""

    async def listen(
        self, name: str, key: str, wiring: Wiring, start: Callable[[str, int], Awaitable[StreamListener]]
    ) -> None:
        host, port = parse_listen(wiring.config.section(self.spec.config).value(key), key)
        listener = self.listeners[name] = await start(host, port)
        log.info("listening", extra={"listener": name, "address": f"{host}:{listener.port}"})


async def _closed(listener: StreamListener) -> None:
    await asyncio.wait_for(listener.wait_closed(), 2.0)


#: A dialect's binding: builds the dialect on a node (see the module docstring).
Mount: TypeAlias = Callable[[Wiring], Awaitable[Mounted]]


@dataclass(frozen=True, slots=True)
class Binding:
    """A dialect's spec and the function that mounts it on a node."""

    spec: DialectSpec
    mount: Mount

    def enabled(self, config: Config) -> bool:
        return config.section(self.spec.config).enabled
