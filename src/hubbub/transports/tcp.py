"""The native dialect's byte streams (protocols/native.md §1): JSON lines or length-prefixed msgpack, by the
first byte, on the byte-stream driver (:mod:`~hubbub.transports.stream_driver`).

Admission, refusal and the first-message timeout are the stream listener's
(:class:`~hubbub.transports.stream_listener.StreamListener`), the read loop, the close and the socket's end
the driver's, as for every TCP dialect; here is what is native's: :class:`NativeStreams` (the listener's
codecs and encoders, one per encoding, and each socket's :class:`NativeStreamWire`, a
:class:`~hubbub.dialects.native.NativeStreamDecoder` feeding a
:class:`~hubbub.transports.native.NativeConnection`), :func:`dispatch` (one read's publishes handed over as
runs, with read-side back-pressure) and the error 4009 of a refused socket.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry

from hubbub.core.api import Core, Session
from hubbub.dialects import native as nc
from hubbub.disconnect import Disconnect

from .binding import Mounted, Wiring
from .http import HttpSettings, native_codec, native_connection
from .lifetime import Lifetime
from .native import NativeConnection, NativeEncoder, dispatch
from .stream_driver import (
    CLOSE_WAIT_S,
    WRITE_TIMEOUT_S,
    StreamDirect,
    close_stream,
    drain,
    end_stream,
    listen_streams,
)
from .stream_listener import KEEPALIVE, Accepted, StreamListener, keep_alive, peer_ip

__all__ = [
    "CLOSE_WAIT_S",
    "KEEPALIVE",
    "WRITE_TIMEOUT_S",
    "NativeStreamWire",
    "NativeStreams",
    "close_stream",
    "dispatch",
    "drain",
    "keep_alive",
    "mount",
    "peer_ip",
    "serve_native_tcp",
]

READ_CHUNK: Final = 256 * 1024


class NativeStreams:
    """The native TCP listener's side of the byte-stream driver (its ``Opener``): the codecs of the
    listener's connections, one per encoding, shared by all (a codec keeps no state of a connection: its
    channel cache only maps raw channel text to canonical form, and its msgpack packer alone holds a 256 KiB
    buffer), their session encoders (so their fan-out shares one rendering per encoding), and each socket's
    wire once its first byte picks the framing. A write waits ``write_timeout`` seconds at most for a peer
    that reads nothing."""

    dialect: Final = "native"
    read_chunk: Final = READ_CHUNK

    def __init__(self, node: Core, settings: HttpSettings, write_timeout: float = WRITE_TIMEOUT_S) -> None:
        self.node = node
        self.settings = settings
        self.write_timeout = write_timeout
        self.codecs: dict[nc.Encoding, nc.NativeCodec] = {
            enc: native_codec(enc, settings.max_frame, settings.codec_limits) for enc in ("json", "msgpack")
        }
        self.encoders = {enc: NativeEncoder(codec) for enc, codec in self.codecs.items()}

    def refusal(self, first: bytes) -> bytes:
        """Error 4009 in the framing the socket's first byte picks (none for another byte)."""
        head = first[:1]
        if head not in (b"{", b"\x00"):
            return b""
        codec = self.codecs["json" if head == b"{" else "msgpack"]
        return codec.frame_for_stream(codec.encode_error(Disconnect.TOO_MANY_CONNECTIONS, None))

    def open(self, first: bytes, acc: Accepted) -> NativeStreamWire | None:
        """The wire of ``acc``, once its first byte is read: ``{`` JSON lines, ``0x00`` msgpack; another byte
        gives a wire that closes at its first read without an answer (no framing to answer in)."""
        if not first:
            return None
        head = first[:1]
        enc: nc.Encoding | None = "json" if head == b"{" else "msgpack" if head == b"\x00" else None
        s = self.settings
        decoder = nc.NativeStreamDecoder(max_frame=s.max_frame, codecs=self.codecs, **s.codec_limits)
        conn = self.connection(self.codecs[enc or "json"], acc.writer)
        return NativeStreamWire(decoder, conn, live=enc is not None)

    def connection(self, codec: nc.NativeCodec, writer: asyncio.StreamWriter) -> NativeConnection:
        """One connection over ``writer`` in ``codec``'s framing."""
        timeout = self.write_timeout

        async def send(data: bytes) -> None:
            # The prefix and the frame as two buffers: a batch frame can be a megabyte, not copied.
            writer.writelines(codec.stream_parts(data))
            await drain(writer, timeout)

        async def send_many(frames: list[bytes]) -> None:
            writer.write(codec.frames_for_stream(frames))
            await drain(writer, timeout)

        async def close(code: Disconnect) -> None:
            end_stream(writer, code)

        encoder = self.encoders[codec.encoding]
        direct = StreamDirect(writer, codec.streams_parts)
        conn = native_connection(
            self.node, codec, self.settings, send, close, send_many, encoder, direct=direct
        )
        conn.peer = peer_ip(writer)
        return conn


class NativeStreamWire:
    """One native TCP connection on the byte-stream driver (its ``StreamWire``): each read decoded whole by
    the connection's :class:`~hubbub.dialects.native.NativeStreamDecoder` and handed over by :func:`dispatch`.
    A wire that is not ``live`` (its first byte picked no framing) starts nothing and ends at its first
    read. The connection ends on a fatal error (the decoder's or the connection's) or its session's end."""

    __slots__ = ("_stop", "conn", "decoder", "live", "messages")

    def __init__(self, decoder: nc.NativeStreamDecoder, conn: NativeConnection, *, live: bool) -> None:
        self.decoder = decoder
        self.conn = conn
        self.live = live
        #: Items decoded so far (frames and errors): the listener's first-message deadline ends at one.
        self.messages = 0
        self._stop = False

    @property
    def session(self) -> Session:
        return self.conn.session

    @property
    def done(self) -> bool:
        return self._stop or self.decoder.failed

    def start(self, group: Lifetime) -> None:
        if self.live:
            self.conn.start(group)

    async def feed(self, data: bytes) -> None:
        items = self.decoder.feed_runs(data)
        if items:
            self.messages += len(items)
        if await dispatch(self.conn if self.live else None, items):
            self._stop = True

    async def finish(self) -> None:
        if self.live:
            await self.conn.finish(CLOSE_WAIT_S)


async def serve_native_tcp(
    host: str,
    port: int,
    streams: NativeStreams,
    on_connection: Callable[[asyncio.Task[None]], None],
    *,
    first_message_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
) -> StreamListener:
    """Start the listener; each socket runs on the byte-stream driver with ``streams``.

    With ``ssl_context`` the listener speaks TLS. Every socket is admitted by the node's limiter at accept
    (``limits.max_connections``, ``limits.max_connections_per_ip``): a refused one gets error 4009 in the
    framing its first byte picks (on a TLS listener, a close), and one that has not sent its first frame
    within ``first_message_timeout_s`` is closed (the stream listener's rules).
    """

    return await listen_streams(
        streams.node,
        "native",
        streams,
        host,
        port,
        on_connection,
        first_message_timeout_s=first_message_timeout_s,
        ssl_context=ssl_context,
        refusal=streams.refusal,
        reader_limit=streams.settings.max_frame + 1024,
    )


class NativeMounted(Mounted):
    """The native dialect's binding on a node: its TCP listener (``native.tcp_listen``), started once the
    HTTP listener is up. Its WebSocket route, HTTP API and SSE stream are the node's base, installed with
    ``/healthz`` and ``/metrics`` by :func:`~hubbub.transports.http.build_app` whatever ``native.enabled``
    says (federation links from below speak native over the WebSocket)."""

    async def started(self, wiring: Wiring, metrics: CollectorRegistry) -> None:
        cfg = wiring.config
        streams = NativeStreams(wiring.node, wiring.http, cfg.limits.write_timeout_s)

        async def start(host: str, port: int) -> StreamListener:
            return await serve_native_tcp(
                host,
                port,
                streams,
                wiring.track,
                first_message_timeout_s=cfg.tcp.first_message_timeout_s,
                ssl_context=wiring.ssl_context,
            )

        await self.listen("native", "native.tcp_listen", wiring, start)


async def mount(w: Wiring) -> Mounted:
    """The native dialect's binding (``native.SPEC``): its TCP listener, from the ``native`` section."""
    return NativeMounted(nc.SPEC, None)
