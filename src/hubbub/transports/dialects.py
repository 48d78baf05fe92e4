"""The dialects the server wires, as one registry: each :class:`~hubbub.dialects.spec.DialectSpec` with its
binding, the node-side half that builds what the spec names from the configuration's section.

``Server.start`` iterates :data:`BINDINGS`: for each dialect whose ``<section>.enabled`` is on it calls
``mount``, which builds the dialect's per-node state (mist's token registry, WearScript's hub, qpubs' calls)
and returns a :class:`Mounted`: its route installer (its WebSocket routes run with the WebSocket driver,
:mod:`~hubbub.transports.ws_driver`; its plain-HTTP surfaces are route modules), the stream listeners it
starts once the HTTP listener is up (run with the byte-stream driver,
:mod:`~hubbub.transports.stream_driver`), its connection tasks for a graceful stop, the links it opens
to other servers (entered last by the server's exit stack, left first), and its own closing.

The native dialect is the node's base (its WebSocket, HTTP API, SSE and TCP listener, and the federation
links that speak it) and is wired by the server itself.

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
from typing import Final

from prometheus_client import CollectorRegistry

from hubbub.auth.mist_registry import MistTokenRegistry
from hubbub.config import Config, parse_listen
from hubbub.core.api import ConsumerService, Core
from hubbub.dialects import guble as gd
from hubbub.dialects import ivy as ivd
from hubbub.dialects import mist as md
from hubbub.dialects import qpubs as qpd
from hubbub.dialects import wearscript as wsd
from hubbub.dialects.spec import DialectSpec

from .guble import GubleSettings
from .guble import install as install_guble
from .http import HttpSettings, RouteInstaller
from .ivy import IvySettings, ivy_installer
from .mist import MistService, MistSettings
from .mist_tcp import serve_mist_tcp
from .pump import quietly
from .qpubs_common import QpubsSettings
from .qpubs_http import QpubsHttp
from .qrpc import QrpcService, serve_qrpc
from .stream_listener import StreamListener
from .wearscript import WearscriptService, WearscriptSettings
from .wearscript_link import WearscriptLinkCollector, WearscriptUpstream

__all__ = ["BINDINGS", "Binding", "Mounted", "Wiring"]

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


@dataclass(frozen=True, slots=True)
class Binding:
    """A dialect's spec and the function that mounts it on a node."""

    spec: DialectSpec
    mount: Callable[[Wiring], Awaitable[Mounted]]

    def enabled(self, config: Config) -> bool:
        return config.section(self.spec.config).enabled


# -- ivy, guble: route modules -------------------------------------------------------------------------------


async def _mount_ivy(w: Wiring) -> Mounted:
    cfg = w.config.section(ivd.IvyConfig)
    settings = IvySettings(
        large_event_bytes=cfg.large_event_bytes,
        ping_interval_s=cfg.ping_interval_s,
        read_timeout_s=cfg.read_timeout_s,
        max_log_bytes=cfg.max_log_bytes,
        auth=w.auth("ivy"),
    )
    return Mounted(ivd.SPEC, ivy_installer(settings))


async def _mount_guble(w: Wiring) -> Mounted:
    cfg = w.config.section(gd.GubleConfig)
    settings = GubleSettings(cfg.node_id, cfg.health_endpoint, cfg.metrics_endpoint, auth=w.auth("guble"))
    return Mounted(gd.SPEC, functools.partial(install_guble, settings=settings))


# -- wearscript: the hub, and its link up --------------------------------------------------------------------


class WearscriptMounted(Mounted):
    def __init__(self, service: WearscriptService) -> None:
        super().__init__(wsd.SPEC, service.install)
        self.service = service
        #: The link up to a WearScript hub (``wearscript.upstream``).
        self.upstream: WearscriptUpstream | None = None

    async def started(self, wiring: Wiring, metrics: CollectorRegistry) -> None:
        cfg = wiring.config.section(wsd.WearscriptConfig)
        if not cfg.upstream:
            return
        if cfg.group_device == wsd.WearscriptConfig().group_device:
            log.warning("linked WearScript hubs should each have their own wearscript.group_device")
        self.upstream = WearscriptUpstream(self.service, str(cfg.upstream))
        metrics.register(WearscriptLinkCollector(self.upstream))

    def links(self) -> Iterable[AbstractAsyncContextManager[object]]:
        return () if self.upstream is None else (self.upstream,)

    def close(self) -> None:
        self.service.close()


async def _mount_wearscript(w: Wiring) -> Mounted:
    cfg = w.config.section(wsd.WearscriptConfig)
    settings = WearscriptSettings(
        group_device=cfg.group_device,
        test_handler=cfg.test_handler,
        hub_channels=tuple(str(c) for c in cfg.hub_channels),
        advertise_foreign=cfg.advertise_foreign,
        auth=w.auth("wearscript"),
    )
    return WearscriptMounted(WearscriptService(w.node, settings, w.http))


# -- mist: the token registry, the routes of both generations, the TCP listener ------------------------------


class MistMounted(Mounted):
    def __init__(self, service: MistService) -> None:
        super().__init__(md.SPEC, service.install)
        self.service = service

    async def started(self, wiring: Wiring, metrics: CollectorRegistry) -> None:
        cfg, service = wiring.config, self.service

        async def start(host: str, port: int) -> StreamListener:
            return await serve_mist_tcp(
                host,
                port,
                service,
                wiring.track,
                first_message_timeout_s=cfg.tcp.first_message_timeout_s,
                ssl_context=wiring.ssl_context,
                write_timeout=cfg.limits.write_timeout_s,
            )

        await self.listen("mist", "mist.tcp_listen", wiring, start)


async def _mount_mist(w: Wiring) -> Mounted:
    cfg, lim, node = w.config, w.config.limits, w.node
    registry = await asyncio.get_running_loop().run_in_executor(
        None, MistTokenRegistry.in_data_dir, cfg.storage.data_dir
    )
    mist = cfg.section(md.MistConfig)
    settings = MistSettings(
        channel=mist.channel,
        auth=w.auth("mist"),
        token=str(mist.token),
        max_tags=lim.max_tags,
        max_tag_bytes=lim.max_tag_bytes,
    )
    return MistMounted(MistService(node, settings, w.http, registry, lambda: node.access.authenticator))


# -- qpubs: its HTTP routes (a route module) and the qrpc TCP listener ---------------------------------------


class QpubsMounted(Mounted):
    def __init__(self, http: QpubsHttp, settings: QpubsSettings) -> None:
        super().__init__(qpd.SPEC, http.install)
        self.http = http
        self.settings = settings
        self.qrpc: QrpcService | None = None

    async def started(self, wiring: Wiring, metrics: CollectorRegistry) -> None:
        cfg = wiring.config
        qrpc = self.qrpc = QrpcService(wiring.node, wiring.consumers, self.settings, wiring.http)

        async def start(host: str, port: int) -> StreamListener:
            return await serve_qrpc(
                host,
                port,
                qrpc,
                first_message_timeout_s=cfg.tcp.first_message_timeout_s,
                ssl_context=wiring.ssl_context,
                write_timeout=cfg.limits.write_timeout_s,
            )

        await self.listen("qrpc", "qpubs.qrpc_listen", wiring, start)

    def connections(self) -> Iterable[asyncio.Task[None]]:
        qrpc = list(self.qrpc.connections) if self.qrpc is not None else []
        return qrpc + list(self.http.connections)


async def _mount_qpubs(w: Wiring) -> Mounted:
    cfg = w.config.section(qpd.QpubsConfig)
    settings = QpubsSettings(
        separator=cfg.separator,
        heartbeat_s=cfg.heartbeat_s,
        batch_bytes=cfg.batch_bytes,
        batch_wait_ms=cfg.batch_wait_ms,
        auth=w.auth("qpubs"),
    )
    return QpubsMounted(QpubsHttp(w.node, w.consumers, settings, w.http), settings)


#: Every dialect but native, in the order the server wires them.
BINDINGS: Final[tuple[Binding, ...]] = (
    Binding(ivd.SPEC, _mount_ivy),
    Binding(gd.SPEC, _mount_guble),
    Binding(wsd.SPEC, _mount_wearscript),
    Binding(md.SPEC, _mount_mist),
    Binding(qpd.SPEC, _mount_qpubs),
)
