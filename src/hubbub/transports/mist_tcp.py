"""The mist TCP listener (``mist.tcp_listen``, protocols/mist.md §1): one port for both generations.

The first byte of a connection picks its generation (``{`` → 1.x JSON stream, anything else → the 2015 line
protocol); every byte, that first one included, then goes to the generation's sans-I/O state machine, and its
outputs to a :class:`~hubbub.transports.mist.MistWire`. With ``ssl_context`` the listener speaks TLS
(``tls.cert``/``tls.key``, as the native listener). Admission, refusal and the first-message timeout are the
stream listener's (:class:`~hubbub.transports.stream_listener.StreamListener`): each socket is admitted at
accept (``limits.max_connections``, ``limits.max_connections_per_ip``); mist has no error for a refusal, so a
refused socket is closed; a socket whose first line (2015) or JSON value (1.x) has not come within the
first-message timeout is closed. After its first message a mist client may idle (a subscriber waits for
events): TCP keepalive then finds a vanished peer.

Concurrency contract: everything runs on the event loop thread; one task per connection (the stream
listener's) owns a :class:`~hubbub.transports.lifetime.Lifetime` holding its write loop.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry

from hubbub.auth.mist_registry import MistTokenRegistry
from hubbub.dialects import mist as md

from .binding import Mounted, Wiring
from .mist import DIALECT, MistService, MistSettings, MistWire
from .stream_driver import WRITE_TIMEOUT_S, ServiceStreams, listen_streams
from .stream_listener import Accepted, StreamListener

__all__ = ["serve_mist_tcp"]

READ_CHUNK: Final = 64 * 1024


class _MistStreams(ServiceStreams[MistService]):
    """Mist's side of the byte-stream driver (:class:`~hubbub.transports.stream_driver.Opener`): a
    connection's generation from its first bytes (mist.md §1)."""

    __slots__ = ()

    dialect = DIALECT
    read_chunk = READ_CHUNK

    def open(self, first: bytes, acc: Accepted) -> MistWire | None:
        if not first:
            return None
        io = self.io(acc)
        service = self.service
        return MistWire(
            service,
            service.tcp_proto(first),
            send=io.send,
            close=io.close,
            send_many=io.send_many,
            peer=acc.ip,
        )


async def serve_mist_tcp(
    host: str,
    port: int,
    service: MistService,
    on_connection: Callable[[asyncio.Task[None]], None],
    *,
    first_message_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
    write_timeout: float = WRITE_TIMEOUT_S,
) -> StreamListener:
    """Start the listener; ``on_connection`` is given each connection's task (the server waits for them). A
    write waits ``write_timeout`` seconds at most for a peer that reads nothing (then the connection is
    aborted and counted in ``hubbub_write_timeouts_total``)."""
    streams = _MistStreams(service, write_timeout)

    return await listen_streams(
        service.node,
        DIALECT,
        streams,
        host,
        port,
        on_connection,
        first_message_timeout_s=first_message_timeout_s,
        ssl_context=ssl_context,
    )


# -- the binding ---------------------------------------------------------------------------------------------


class MistMounted(Mounted):
    """Mist on a node: the token registry, the routes of both generations, and the TCP listener
    (``mist.tcp_listen``) once the HTTP listener is up."""

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


async def mount(w: Wiring) -> Mounted:
    """Mist's binding (``mist.SPEC``): the token registry in the data directory, the ``mist`` section."""
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
