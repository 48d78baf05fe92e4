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
import logging
import ssl
from collections.abc import Callable
from typing import Final

from hubbub.dialects import mist as md
from hubbub.disconnect import Disconnect

from .lifetime import Lifetime
from .mist import DIALECT, MistService, MistWire
from .stream_listener import Accepted, StreamListener
from .tcp import WRITE_TIMEOUT_S, close_stream, drain

__all__ = ["serve_mist_tcp"]

log = logging.getLogger("hubbub.mist")

READ_CHUNK: Final = 64 * 1024


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

    async def serve(acc: Accepted) -> None:
        async with Lifetime() as group:
            await _serve(acc, group)

    async def _serve(acc: Accepted, group: Lifetime) -> None:
        reader, writer, ip = acc.reader, acc.writer, acc.ip

        async def send(data: bytes) -> None:
            writer.write(data)
            await drain(writer, write_timeout)

        async def send_many(frames: list[bytes]) -> None:
            writer.write(b"".join(frames))  # a stream: a burst of events goes out in one write
            await drain(writer, write_timeout)

        async def close(code: Disconnect) -> None:
            writer.close()

        wire: MistWire | None = None
        try:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                if wire is None:
                    wire = MistWire(
                        service, service.tcp_proto(data), send=send, close=close, send_many=send_many, peer=ip
                    )
                    wire.start(group, service.first_identity())
                proto = wire.proto
                assert isinstance(proto, md.Mist2015Connection | md.Mist1Connection)
                await wire.handle(proto.receive_data(data))  # waits for room between requests
                if proto.messages:
                    acc.heard()
                if wire.done:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("mist TCP connection failed")
        finally:
            try:
                if wire is not None:
                    await wire.finish()
            finally:  # also when cancelled (a stopping server): no socket outlives the connection
                sid = wire.session.id if wire is not None else ""
                await close_stream(writer, service.node, DIALECT, sid)

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
