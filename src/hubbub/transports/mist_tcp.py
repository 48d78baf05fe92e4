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

from hubbub.core.api import Core

from .mist import DIALECT, MistService, MistWire
from .stream_driver import StreamIO, serve_stream
from .stream_listener import Accepted, StreamListener
from .tcp import WRITE_TIMEOUT_S

__all__ = ["serve_mist_tcp"]

READ_CHUNK: Final = 64 * 1024


class _MistStreams:
    """Mist's side of the byte-stream driver (:class:`~hubbub.transports.stream_driver.Opener`): a
    connection's generation from its first bytes (mist.md §1)."""

    __slots__ = ("service", "write_timeout")

    dialect: Final = DIALECT
    read_chunk: Final = READ_CHUNK

    def __init__(self, service: MistService, write_timeout: float) -> None:
        self.service = service
        self.write_timeout = write_timeout

    @property
    def node(self) -> Core:
        return self.service.node

    def open(self, first: bytes, acc: Accepted) -> MistWire | None:
        if not first:
            return None
        io = StreamIO(acc.writer, self.write_timeout)
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

    async def serve(acc: Accepted) -> None:
        await serve_stream(acc, streams)

    listener = StreamListener(
        service.node,
        DIALECT,
        serve,
        on_connection,
        first_message_timeout_s=first_message_timeout_s,
        ssl_context=ssl_context,
    )
    await listener.start(host, port)
    return listener
