"""Raw TCP listener for the native protocol (JSON lines or length-prefixed msgpack, by first byte), and what
every TCP listener's connections share once accepted (:func:`drain`, :func:`close_stream`).

Admission, refusal and the first-message timeout are the stream listener's
(:class:`~hubbub.transports.stream_listener.StreamListener`), as for every TCP dialect; here is what is
native's: the framing picked by the first byte, the connection glue, the error 4009 of a refused socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Final

from hubbub.core.api import Core
from hubbub.dialects import native as nc
from hubbub.disconnect import Disconnect
from hubbub.errors import HubbubError

from .lifetime import Lifetime
from .native import NativeConnection
from .pump import WriteTimeout, grace_left, io_failed
from .stream_listener import KEEPALIVE, Accepted, StreamListener, keep_alive, peer_ip

__all__ = [
    "CLOSE_WAIT_S",
    "KEEPALIVE",
    "WRITE_TIMEOUT_S",
    "close_stream",
    "dispatch",
    "drain",
    "keep_alive",
    "peer_ip",
    "serve_native_tcp",
]

log = logging.getLogger("hubbub.tcp")

READ_CHUNK: Final = 256 * 1024
#: Seconds a closing connection may take to send what it still has (the last frames, a slow consumer's
#: error) before its socket is aborted: a peer that stopped reading must not hold the socket, nor keep the
#: server from shutting down.
CLOSE_WAIT_S = 5.0
#: Seconds a write may wait for a peer that stopped reading before the connection is aborted: the default of
#: ``limits.write_timeout_s``, which the server gives every TCP listener.
WRITE_TIMEOUT_S: float = 30.0


async def drain(writer: asyncio.StreamWriter, limit_s: float = WRITE_TIMEOUT_S) -> None:
    """``writer.drain()``, aborting the connection when the peer has not read for ``limit_s`` seconds
    (:class:`~hubbub.transports.pump.WriteTimeout`, which the write loop counts). The timer is set only when
    the transport's buffer is over its high-water mark (a drain that would wait): the common write costs
    nothing more. Every TCP listener's writes (native, mist, qrpc) go through it."""
    transport = writer.transport
    if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
        await writer.drain()
        return
    try:
        await asyncio.wait_for(writer.drain(), limit_s)
    except TimeoutError:
        transport.abort()
        raise WriteTimeout("the peer read nothing within the write timeout") from None


async def close_stream(
    writer: asyncio.StreamWriter, node: Core | None, dialect: str, session_id: str, what: str = "close"
) -> None:
    """Close a TCP connection's socket, on every path: ``close()`` (what is buffered still goes out), up to
    :data:`CLOSE_WAIT_S` for the peer to take it, else ``abort()``. A connection whose task is being cancelled
    (a stopping server cancels those that outlast its grace period) is aborted at once, and so is one whose
    wait is cancelled. Every TCP listener's connection (native, mist, qrpc) ends through it, last in its
    handler's ``finally``, so no socket outlives its handler's task: an unclosed one would only be found by
    the garbage collector, as a ``ResourceWarning``, or never while its event loop runs."""
    writer.close()
    if not grace_left():
        writer.transport.abort()
        return
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_WAIT_S)
    except BaseException as exc:
        # Not closed yet (timed out, cancelled) or ended by an error (then a no-op). Only then: after a close
        # that went through, CPython 3.11's abort() fails on the spent transport.
        writer.transport.abort()
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        if isinstance(exc, Exception):
            io_failed(node, dialect, session_id, what, exc)
            return
        raise


async def serve_native_tcp(
    host: str,
    port: int,
    make_connection: Callable[[nc.NativeCodec, asyncio.StreamWriter], NativeConnection],
    max_frame: int,
    on_connection: Callable[[asyncio.Task[None]], None],
    limits: dict[str, int],
    *,
    node: Core,
    first_message_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
) -> StreamListener:
    """Start the listener. ``make_connection`` builds the connection glue once the framing is known.

    With ``ssl_context`` the listener speaks TLS. Every socket is admitted by the node's limiter at accept
    (``limits.max_connections``, ``limits.max_connections_per_ip``): a refused one gets error 4009 in the
    framing its first byte picks (on a TLS listener, a close), and one that has not sent its first frame
    within ``first_message_timeout_s`` is closed (the stream listener's rules).

    Every connection of the listener shares one codec per encoding: a codec keeps no state of a connection
    (its channel cache only maps raw channel text to canonical form), and its msgpack packer alone holds a
    256 KiB buffer.
    """
    codecs: dict[nc.Encoding, nc.NativeCodec] = {
        enc: nc.NativeCodec(
            enc,
            max_frame=max_frame,
            max_channel_bytes=limits["max_channel_bytes"],
            max_tags=limits["max_tags"],
            max_tag_bytes=limits["max_tag_bytes"],
            max_headers=limits["max_headers"],
            max_header_bytes=limits["max_header_bytes"],
        )
        for enc in ("json", "msgpack")
    }

    def refusal(first: bytes) -> bytes:
        """Error 4009 in the framing the socket's first byte picks (none for another byte)."""
        head = first[:1]
        if head not in (b"{", b"\x00"):
            return b""
        codec = codecs["json" if head == b"{" else "msgpack"]
        return codec.frame_for_stream(codec.encode_error(Disconnect.TOO_MANY_CONNECTIONS, None))

    async def serve(acc: Accepted) -> None:
        async with Lifetime() as group:
            await _serve(acc, group)

    async def _serve(acc: Accepted, group: Lifetime) -> None:
        """One connection, its writer a task of ``group`` (the connection's lifetime)."""
        reader, writer = acc.reader, acc.writer
        decoder = nc.NativeStreamDecoder(max_frame=max_frame, codecs=codecs, **limits)
        conn: NativeConnection | None = None
        try:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                items = decoder.feed_runs(data)
                if items:
                    acc.heard()
                if conn is None and decoder.encoding is not None:
                    conn = make_connection(decoder.codec, writer)
                    conn.start(group)
                if await dispatch(conn, items) or decoder.failed:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("native TCP connection failed")
        finally:
            # Each step in a finally of its own: a cancellation (a stopping server) must not skip the
            # session's detach nor the socket's close.
            try:
                if conn is not None:
                    try:
                        if (conn.session.ending or conn.session.kicked) and grace_left():
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(conn.wait_written(), CLOSE_WAIT_S)
                    finally:
                        await conn.finish()
            finally:
                await close_stream(
                    writer, conn.node if conn else None, "native", conn.session.id if conn else ""
                )

    listener = StreamListener(
        node,
        "native",
        serve,
        on_connection,
        first_message_timeout_s=first_message_timeout_s,
        ssl_context=ssl_context,
        refusal=refusal,
        reader_limit=max_frame + 1024,
    )
    await listener.start(host, port)
    return listener


async def dispatch(conn: NativeConnection | None, items: Sequence[nc.RunItem]) -> bool:
    """Hand one read's decoded items to the connection, in order; True when the connection must close.

    A run of common publishes (the usual read: a client's pipelined burst) goes to the connection at once,
    and so do consecutive other publishes, so the node takes them in one call each
    (:meth:`NativeConnection.publish_run`, :meth:`NativeConnection.publish_many`).

    Read-side back-pressure (:mod:`~hubbub.transports.backpressure`): one read may hold thousands of requests
    (pings, bad frames, ...), each answered; after each item, the rest of the read waits while the
    connection's replies fill its queue.
    """
    n = len(items)
    i = 0
    while i < n:
        item = items[i]
        if conn is None:
            if isinstance(item, HubbubError):
                return True
            i += 1
            continue
        if isinstance(item, HubbubError):
            conn.bad_input(item)
            if item.fatal:
                return True
            i += 1
        elif isinstance(item, nc.PublishRun):
            await conn.publish_run(item)
            i += 1
            if len(item) >= nc.RUN_MAX and i < n:
                # A burst (runs are cut at RUN_MAX publishes): the other connections' turn before the next
                # run, and this one's commit (see RUN_MAX).
                await asyncio.sleep(0)
        elif type(item) is nc.Publish:
            j = i + 1
            while j < n and type(items[j]) is nc.Publish:
                j += 1
            run: list[nc.Publish] = items[i:j]  # type: ignore[assignment]  # all Publish, checked above
            await conn.publish_many(run)
            i = j
        else:
            await conn.handle(item)
            i += 1
        sess = conn.session
        if sess.ending or sess.kicked:
            return True
        if not sess.has_room:
            await sess.wait_room()
            if sess.ending or sess.kicked or sess.closed:
                return True
    return False
