"""The composition root: builds the store, the node and every listener from one :class:`Config`.

``Server`` is an async context manager: entering starts every listener and returns once they accept
connections (``server.ports`` then holds the bound ports); leaving shuts down gracefully: listeners stop,
connections are closed with 1001, everything queued for the log is committed, and the store is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import signal
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

from aiohttp import web

from hubbub import __version__
from hubbub.auth import Authenticator, TokenAuthorizer, load_keys, parse_static_tokens
from hubbub.cluster.delivery import OrderedDelivery
from hubbub.cluster.view import ClusterView
from hubbub.config import Config, ConfigError, parse_cors_origin, parse_listen
from hubbub.core import ConsumerService, Node, NodeSettings
from hubbub.core.limits import LimitSettings, SharedCounts
from hubbub.core.peer_presence import PeerPresence
from hubbub.core.supervisor import Supervision
from hubbub.disconnect import Disconnect
from hubbub.errors import StorageError
from hubbub.log import LogStore, open_store
from hubbub.log.base import RetentionPolicy
from hubbub.transports.admin_api import NodeInfo
from hubbub.transports.admin_ui import Dashboard
from hubbub.transports.connectors import ConnectorCollector, Connectors
from hubbub.transports.dialects import BINDINGS, Mounted, Wiring
from hubbub.transports.federation_link import FederationLinkCollector, FederationUpstream
from hubbub.transports.federation_peer import FederationHub, FederationHubCollector
from hubbub.transports.http import HttpSettings, NativeHttp, build_app
from hubbub.transports.http_listener import HttpListener
from hubbub.transports.mist import MistService
from hubbub.transports.mist_tcp import MistMounted
from hubbub.transports.qpubs_http import QpubsHttp
from hubbub.transports.qrpc import QpubsMounted, QrpcService
from hubbub.transports.stream_driver import CLOSE_WAIT_S
from hubbub.transports.tls import reload_context, server_context
from hubbub.transports.wearscript import WearscriptService
from hubbub.transports.wearscript_link import WearscriptMounted, WearscriptUpstream
from hubbub.workers.relay import WorkerRelay
from hubbub.workers.remote import RemoteLogStore

if TYPE_CHECKING:
    from hubbub.cluster.broker import RedisBroker
    from hubbub.cluster.presence import RedisPresence

__all__ = [
    "GC_THRESHOLDS",
    "Server",
    "build_broker",
    "build_presence",
    "lock_data_dir",
    "run",
    "store_place",
    "tune_gc",
]

log = logging.getLogger("hubbub.server")


#: Seconds a native TCP write may wait for a peer that stopped reading before the connection is aborted.
#: A slow consumer is closed when its queue overflows, but its error frame and close wait behind what it
#: never read: without a bound it would keep its socket and connection slot for as long as it likes.
class Server:
    """One hubbub node with all its listeners. See the module docstring."""

    def __init__(
        self,
        config: Config,
        reload_config: Callable[[], Config] | None = None,
        *,
        worker: RemoteLogStore | None = None,
        member: int | None = None,
        admission: SharedCounts | None = None,
    ) -> None:
        self.config = config
        #: This server as one worker of a multi-worker node (``server.workers``, ``server_workers.py``): its
        #: log is the owner's, through this store, and its relay brings the other workers' events.
        self._worker = worker
        #: This server as worker ``member`` of a multi-worker cluster node (``server_workers.py``): a cluster
        #: member of its own (its store, its broker), whose parent holds the data directory and the ports.
        self._member = member
        #: A worker's connection counts shared with the others (``workers/admission.py``): the node's limits.
        self._admission = admission
        #: Re-reads the configuration on :meth:`reload` (the CLI's flags, environment and file).
        self._reload_config = reload_config
        self._ssl: ssl.SSLContext | None = None
        self.ports: dict[str, int] = {}
        self.node: Node | None = None
        #: Durable consumers (docs/consumers.md): started with the node, before any listener.
        self.consumers: ConsumerService | None = None
        self.connectors: Connectors | None = None
        #: The operators' page and its admin API (``dashboard.enabled``), else None.
        self.dashboard: Dashboard | None = None
        self._runner: web.AppRunner | None = None
        self._native_http: NativeHttp | None = None
        self._tcp_conns: set[asyncio.Task[None]] = set()
        self._broker: RedisBroker | None = None
        self._presence: RedisPresence | None = None
        #: Every enabled dialect, as wired (``transports/dialects.py``), by name.
        self.dialects: dict[str, Mounted] = {}
        #: This node in the federation (docs/federation.md), and its links up to other hubbub nodes.
        self.federation: FederationHub | None = None
        self.upstreams: list[FederationUpstream] = []
        self._dir_lock = -1
        #: The components :meth:`start` entered (node, broker, presence, consumers, listeners, links up), left
        #: in reverse order by :meth:`stop`.
        self._components = contextlib.AsyncExitStack()

    @property
    def wearscript(self) -> WearscriptService | None:
        m = self.dialects.get("wearscript")
        return m.service if isinstance(m, WearscriptMounted) else None

    @property
    def wearscript_upstream(self) -> WearscriptUpstream | None:
        """The link up to a WearScript hub (``wearscript.upstream``)."""
        m = self.dialects.get("wearscript")
        return m.upstream if isinstance(m, WearscriptMounted) else None

    @property
    def mist(self) -> MistService | None:
        """Mist, both generations (protocols/mist.md): its service."""
        m = self.dialects.get("mist")
        return m.service if isinstance(m, MistMounted) else None

    @property
    def qpubs_http(self) -> QpubsHttp | None:
        m = self.dialects.get("qpubs")
        return m.http if isinstance(m, QpubsMounted) else None

    @property
    def qrpc(self) -> QrpcService | None:
        m = self.dialects.get("qpubs")
        return m.qrpc if isinstance(m, QpubsMounted) else None

    async def __aenter__(self) -> Server:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        cfg = self.config
        r = cfg.retention
        retention = RetentionPolicy(r.max_age_s, r.max_events, r.max_bytes, r.max_total_bytes)
        loop = asyncio.get_running_loop()
        if self._worker is not None:  # the parent holds the data directory and the store
            relay = WorkerRelay(self._worker, gap_wait_s=cfg.cluster.gap_wait_s)
            await self._start(self._worker, relay)
            return
        if cfg.storage.store != "memory" and self._member is None:  # a member's parent holds it
            self._dir_lock = lock_data_dir(cfg.storage.data_dir)
        try:
            store = await loop.run_in_executor(
                None,
                open_store,
                cfg.storage.store,
                cfg.storage.data_dir,
                cfg.storage.durability,
                retention,
                cfg.native.idempotency_window_s,
            )
        except StorageError as exc:
            # Said where: the operator's next step depends on which directory or database it is.
            raise StorageError(f"cannot open the log ({store_place(cfg)}): {exc}") from None
        await self._start(store, None)

    async def _start(self, store: LogStore, relay: WorkerRelay | None) -> None:
        """:meth:`start` on an open ``store``; ``relay``: a worker's (its store is the owner's)."""
        cfg = self.config
        r = cfg.retention
        retention = RetentionPolicy(r.max_age_s, r.max_events, r.max_bytes, r.max_total_bytes)
        broker = self._broker = build_broker(cfg, store) if cfg.cluster.broker else None
        delivery: OrderedDelivery | None = broker or relay
        lim = cfg.limits
        if cfg.native.max_recovery:
            log.warning("native.max_recovery is deprecated and ignored: recovery from the log has no limit")
        settings = NodeSettings(
            max_subscriptions=lim.max_subscriptions,
            commit_batch=cfg.storage.commit_batch,
            retention=retention,
        )
        lim_settings = LimitSettings(
            lim.publish_rate, lim.publish_burst, lim.max_connections, lim.max_connections_per_ip
        )
        token = cfg.auth.mode == "token"
        self.node = node = Node(
            store,
            settings,
            TokenAuthorizer() if token else None,
            # A worker's parent started them, once for the node: a worker restarted lost no commit.
            new_epochs=cfg.storage.durability == "none" and relay is None and self._member is None,
            authenticator=build_authenticator(cfg) if token else None,
            limits=lim_settings,
            view=None if delivery is None else ClusterView(store, delivery),
        )
        if cfg.tls.cert:
            self._ssl = server_context(cfg.tls.cert, cfg.tls.key)
        # Every long-lived component is entered here, and left in the reverse order by stop().
        stack = self._components
        if broker is not None:
            # Left after the node: its last commits go to the other nodes too.
            stack.push_async_callback(broker.close)
        if relay is not None:
            stack.push_async_callback(relay.close)  # left after the node, as the broker
        await stack.enter_async_context(node)
        node.limiter.shared = self._admission  # a worker's: the node's connection limits (None: this process)
        if relay is not None:
            await relay.start(node)  # before any listener, as the broker
            node.presence = PeerPresence(node.notices)  # rosters (guble subscribers, mist who) node-wide
        if broker is not None:
            await broker.start(node)  # before any listener: the node delivers from the log's heads on
            stack.push_async_callback(broker.sequencer.close)  # no more fills: the store closes with the node
            presence = self._presence = build_presence(cfg, broker.node_id, node.supervision)
            presence.follow(broker.up)  # one view of Redis in /healthz: the broker's, which sees it first
            broker.watch_state(presence.follow)
            await stack.enter_async_context(presence)  # left after the listeners: members leave the rosters
            node.presence = presence  # rosters (guble subscribers, mist who) cluster-wide
        self.consumers = await stack.enter_async_context(
            ConsumerService(
                node,
                poll_s=cfg.cluster.poll_interval_s,
                max_consumers=lim.max_consumers,
                held_bytes_max=lim.consumer_memory,
            )
        )
        # The connectors push what their consumers journal: stopped before the consumer service, which
        # takes their outstanding batches back.
        self.connectors = await stack.enter_async_context(Connectors(node, self.consumers, cfg))
        # The listeners and their connections end before the components above.
        stack.push_async_callback(self._close_listeners)
        codec_limits = {
            "max_channel_bytes": lim.max_channel_bytes,
            "max_tags": lim.max_tags,
            "max_tag_bytes": lim.max_tag_bytes,
            "max_headers": lim.max_headers,
            "max_header_bytes": lim.max_header_bytes,
        }
        http_settings = HttpSettings(
            max_frame=lim.max_frame,
            max_channel_bytes=lim.max_channel_bytes,
            max_subscriptions=lim.max_subscriptions,
            send_queue=lim.send_queue,
            send_queue_bytes=lim.send_queue_bytes,
            ping_interval=cfg.native.ping_interval_s,
            codec_limits=codec_limits,
            cors_origins=parse_cors_origin(cfg.http.cors_origin),
        )

        def track(task: asyncio.Task[None]) -> None:
            self._tcp_conns.add(task)
            task.add_done_callback(self._tcp_conns.discard)

        wiring = Wiring(node, self.consumers, cfg, http_settings, self._ssl, track)
        for binding in BINDINGS:
            if binding.enabled(cfg):
                self.dialects[binding.spec.name] = await binding.mount(wiring)
        for mounted in self.dialects.values():
            for connector in mounted.connectors():
                self.connectors.show(connector)
        installers = [m.installer for m in self.dialects.values() if m.installer is not None]
        installers.append(self.connectors.installer)
        if cfg.dashboard.serves(cfg):
            info = NodeInfo(cfg.storage.durability, store_place(cfg), cfg.server.workers)
            dash = self.dashboard = Dashboard(node, info, lim.max_channel_bytes)
            await stack.enter_async_context(dash.history)
            installers.append(dash.installer)
        elif cfg.dashboard.enabled == "auto":
            log.warning(
                "dashboard off: http.listen is not a loopback address and auth is off (dashboard.enabled)"
            )
        app, self._native_http = build_app(node, http_settings, installers)
        self._native_http.registry.register(ConnectorCollector(self.connectors))
        if cfg.federation.accept or cfg.federation.upstream:
            self._federate(node, cfg, store.engine, self._native_http)
            if self.dashboard is not None:
                self.dashboard.api.federation = self.federation
                self.dashboard.api.upstreams = self.upstreams
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
        await self._runner.setup()
        host, port = parse_listen(cfg.http.listen, "http.listen")
        site = HttpListener(
            self._runner, host, port, node, head_timeout_s=cfg.http.head_timeout_s, ssl_context=self._ssl
        )
        await site.start()
        self.ports["http"] = site.port
        log.info("listening", extra={"listener": "http", "address": f"{host}:{self.ports['http']}"})

        for mounted in self.dialects.values():
            await mounted.started(wiring, self._native_http.registry)
            self.ports.update({name: listener.port for name, listener in mounted.listeners.items()})
        # The links up start last and stop first: they must not reconnect while the node stops, and they save
        # their cursors once no more events move.
        for mounted in self.dialects.values():
            for dialect_link in mounted.links():
                await stack.enter_async_context(dialect_link)
        for link in self.upstreams:
            await stack.enter_async_context(link)
        index = relay.worker if relay is not None else self._member
        if index is not None:  # the parent says when the node started, once every worker did
            log.info("worker %d started", index, extra={"worker": index})
            return
        log.info(
            "hubbub %s started",
            __version__,
            extra={
                "store": store.engine,
                "durability": cfg.storage.durability,
                "data_dir": cfg.storage.data_dir,
            },
        )

    def _federate(self, node: Node, cfg: Config, engine: str, http: NativeHttp) -> None:
        """This node's federation id, the links of nodes below (``federation.accept``), and the links up
        (``upstream``), created before any listener so that no publish precedes their cursors."""
        state_dir = None if engine == "memory" else Path(cfg.storage.data_dir) / "federation"
        hub = self.federation = FederationHub(node, federation_node_id(cfg), state_dir)
        if cfg.federation.accept:
            http.federation = hub
        http.registry.register(FederationHubCollector(hub))
        lim = cfg.limits
        for url in cfg.federation.upstream:
            self.upstreams.append(
                FederationUpstream(
                    node,
                    hub,
                    str(url),
                    token=str(cfg.federation.token),
                    token_file=Path(cfg.federation.token_file) if cfg.federation.token_file else None,
                    state_dir=state_dir,
                    max_frame=lim.max_frame,
                    send_queue=lim.send_queue,
                    send_queue_bytes=lim.send_queue_bytes,
                )
            )
        if self.upstreams:
            http.registry.register(FederationLinkCollector(self.upstreams))
        log.info("federation node id %s", hub.node_id, extra={"upstreams": len(self.upstreams)})

    def reload(self) -> None:
        """Re-read the JWT keys (``auth.jwt_keys``, ``auth.jwks_file``), the static tokens and the TLS
        certificate (SIGHUP). Open connections keep their identity, their expiry and their TLS session. A
        reload that fails is logged and changes nothing."""
        node = self.node
        if node is None:
            return
        try:
            cfg = self._reload_config() if self._reload_config is not None else self.config
            if cfg.auth.mode == "token" and node.access.authenticator is not None:
                node.access.authenticator = build_authenticator(cfg)
            if self._ssl is not None and cfg.tls.cert:
                reload_context(self._ssl, cfg.tls.cert, cfg.tls.key)
        except (ConfigError, ValueError, OSError, ssl.SSLError) as exc:
            log.error("reload failed, keeping the current keys: %s", exc)
            return
        self.config = cfg
        log.info("reloaded keys and certificates")

    async def stop(self) -> None:
        """Graceful shutdown: the components entered by :meth:`start`, left in reverse order (the links up,
        then the listeners and connections, consumers, presence, the sequencer, the node, the broker), then
        the data directory's lock. Idempotent."""
        node = self.node
        try:
            await self._components.aclose()
        finally:
            self.node = None
            self.consumers = self._broker = self._presence = None
            self.upstreams = []
            if self._dir_lock >= 0:
                os.close(self._dir_lock)  # last: everything that wrote in the data directory has stopped
                self._dir_lock = -1
        if node is not None:
            log.info("hubbub stopped")

    async def wait(self, stop: asyncio.Event) -> str | None:
        """Wait until ``stop`` is set (a signal) or a component's failure asks the node to stop
        (``core/supervisor.py``, ``Policy.STOP``); return that failure (``"<component>: <task>"``), or
        ``None``."""
        assert self.node is not None
        sup = self.node.supervision
        waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(sup.stop_requested.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.wait(waits)
        return sup.stop_reason

    async def _close_listeners(self) -> None:
        """Stop the listeners and close the connections with 1001 (the first step of :meth:`stop` past the
        links up)."""
        for mounted in self.dialects.values():
            mounted.close_listeners()
        node = self.node
        if node is not None:
            for sess in node.sessions:
                sess.kick(Disconnect.GOING_AWAY)
        # Give write loops a moment to send their close frames.
        tasks = list(self._tcp_conns) + (list(self._native_http.connections) if self._native_http else [])
        for mounted in self.dialects.values():
            tasks += mounted.connections()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for t in pending:
                t.cancel()
            if pending:
                # Then wait for them to end: a cancelled handler still detaches its session and closes its
                # socket (transports/tcp.py close_stream), which must happen before the node closes and
                # before the caller's event loop ends, or the socket is left to the garbage collector.
                await asyncio.wait(pending, timeout=CLOSE_WAIT_S + 1.0)
        for mounted in self.dialects.values():
            await mounted.wait_listeners(node)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for mounted in self.dialects.values():
            mounted.close()
        self.dialects = {}


#: The lock file in a data directory: held by the server using the directory.
DATA_DIR_LOCK: Final = "hubbub.lock"


def lock_data_dir(data_dir: str) -> int:
    """Create ``data_dir`` if needed and lock it for this process (an open descriptor, released by closing
    it or by the process's end, kill -9 included). Raises :class:`StorageError` when another server holds it:
    what it keeps there (the federation node id, mist's token registry, qpubs' durable subscriptions, a SQLite
    log) is one node's, so two nodes started in one directory (both on ``./hubbub-data``) would share their
    federation id and write each other's files. Blocking (a directory and a file): call it at start."""
    try:
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(os.path.join(data_dir, DATA_DIR_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StorageError(f"cannot use data_dir {data_dir}: {exc.strerror}") from None
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StorageError(
                f"data_dir {data_dir} is in use by another hubbub serve (every node needs its own data_dir)"
            ) from None
    return fd


def store_place(cfg: Config) -> str:
    """Where ``cfg``'s log lives, for an operator's error message: the data directory or file of a SQLite log,
    the host and database of a PostgreSQL one (never its user or password)."""
    url = cfg.storage.store
    if url == "sqlite":
        return f"data_dir {cfg.storage.data_dir}"
    if url.startswith("sqlite:"):
        return f"file {url[len('sqlite://') :]}"
    if url.lower().startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        return f"postgresql://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"
    return url


def federation_node_id(cfg: Config) -> str:
    """``federation.node_id``, else the id kept in ``<data_dir>/federation/node-id`` (made on first start),
    else (no writable data directory) a random one for this process."""
    if cfg.federation.node_id:
        return cfg.federation.node_id
    path = Path(cfg.storage.data_dir) / "federation" / "node-id"
    try:
        text = path.read_text().strip()
        if text:
            return text
    except OSError:
        pass
    node_id = "n-" + secrets.token_hex(6)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(node_id + "\n")
    except OSError as exc:
        log.warning("cannot keep the federation node id in %s (%s): it changes on restart", path, exc)
    return node_id


def build_broker(cfg: Config, store: LogStore) -> RedisBroker:
    """The Redis broker of ``broker = redis://…`` (docs/cluster.md). Its module is imported here, as is
    the presence's: they import the Redis client, a fifth of the start-up of a node that needs none."""
    from hubbub.cluster.broker import BrokerSettings, RedisBroker, default_node_id

    settings = BrokerSettings(
        url=cfg.cluster.broker,
        node_id=cfg.cluster.node_id or default_node_id(),
        redis_channel=cfg.cluster.redis_channel,
        gap_wait_s=cfg.cluster.gap_wait_s,
        poll_interval_s=cfg.cluster.poll_interval_s,
    )
    return RedisBroker(settings, store)


def build_presence(cfg: Config, node_id: str, supervision: Supervision | None = None) -> RedisPresence:
    """The cluster-wide rosters of a cluster node (docs/cluster.md "Presence"), in the broker's Redis."""
    from hubbub.cluster.presence import RedisPresence

    c = cfg.cluster
    return RedisPresence(c.broker, node_id, c.redis_channel, c.presence_ttl_s, supervision=supervision)


def build_authenticator(cfg: Config) -> Authenticator:
    """The authenticator of ``auth.mode = token``: reads the key files. Raises :class:`ValueError` (naming the
    entry, never a secret) when a token or key cannot be used."""
    return Authenticator(
        parse_static_tokens(cfg.auth.tokens),
        load_keys(cfg.auth.jwt_keys, cfg.auth.jwks_file),
        leeway=cfg.auth.jwt_leeway_s,
        audience=cfg.auth.jwt_audience,
        issuer=cfg.auth.jwt_issuer,
    )


#: The cyclic garbage collector's thresholds (generations 0, 1, 2) while a server process runs.
GC_THRESHOLDS: Final = (50_000, 10, 10)


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a server process; called once startup is done.

    hubbub's own objects (events, requests, frames, commands) hold no reference cycles and are freed by
    reference counting, yet every allocation of a container counts towards a young-generation collection
    (by default every 700), which walks every young object still alive, such as the thousands of publishes
    of a pipelined burst in flight, and promotes them, so that full collections, which walk everything a
    memory store retains, come sooner. Two changes, together worth a fifth to a third of the CPU time of a
    publish (bench/core_path.py against --default-gc, memory 1→1: 8.6 → 6.0 µs per event; sqlite, acks: 13.7 →
    11.2):

    * ``gc.freeze()``: what startup allocated (modules, classes, the store's and listeners' state) moves to
      a permanent generation that collections no longer walk.
    * A young-generation threshold of 50,000: objects of a burst are mostly freed before a collection sees
      them. Cycles are still collected, only after 50,000 rather than 700 net allocations, so the garbage
      cycles waiting for a collection (of exceptions and their tracebacks, say) stay bounded, at some
      megabytes.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _serve(
    config: Config,
    reload_config: Callable[[], Config] | None = None,
    *,
    worker: RemoteLogStore | None = None,
    member: int | None = None,
    started: Callable[[], None] | None = None,
    admission: SharedCounts | None = None,
) -> str | None:
    """Serve until a signal (``None``) or until a component's failure stops the node (that failure).
    ``worker`` and ``member``: as one worker of a multi-worker node (:class:`Server`); ``started`` is called
    once every listener accepts."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with Server(config, reload_config, worker=worker, member=member, admission=admission) as server:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, server.reload)
        tune_gc()
        if started is not None:
            started()
        failed = await server.wait(stop)
        log.info("shutting down" if failed is None else f"shutting down: {failed} failed")
    return failed


def run(
    config: Config,
    reload_config: Callable[[], Config] | None = None,
    *,
    worker: RemoteLogStore | None = None,
    member: int | None = None,
    started: Callable[[], None] | None = None,
    admission: SharedCounts | None = None,
) -> None:
    """Run a server until SIGTERM or SIGINT (the ``hubbub serve`` command); SIGHUP reloads keys and
    certificates, through ``reload_config`` when given. A component's failure that stops the node
    (``core/supervisor.py``) shuts it down the same way, then exits with status 1. ``worker``, ``member``
    and ``started``: as :func:`_serve` (a worker process, ``hubbub/server_workers.py``)."""
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a default dependency on POSIX
        runner = asyncio.run
    serving = _serve(
        config, reload_config, worker=worker, member=member, started=started, admission=admission
    )
    if runner(serving) is not None:
        raise SystemExit(1)
