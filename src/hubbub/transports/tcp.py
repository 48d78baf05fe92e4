"""Raw TCP listener for the native protocol (JSON lines or length-prefixed msgpack, by first byte)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from hubbub.dialects import native as nc
from hubbub.errors import HubbubError

from .native import NativeConnection

__all__ = ["serve_native_tcp"]

log = logging.getLogger("hubbub.tcp")

READ_CHUNK = 256 * 1024


async def serve_native_tcp(
    host: str,
    port: int,
    make_connection: Callable[[nc.NativeCodec, asyncio.StreamWriter], NativeConnection],
    max_frame: int,
    on_connection: Callable[[asyncio.Task[None]], None],
    limits: dict[str, int],
) -> asyncio.Server:
    """Start the listener. ``make_connection`` builds the connection glue once the framing is known."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        on_connection(task)
        decoder = nc.NativeStreamDecoder(max_frame=max_frame, **limits)
        conn: NativeConnection | None = None
        try:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                items = decoder.feed(data)
                if conn is None and decoder.encoding is not None:
                    conn = make_connection(decoder.codec, writer)
                    conn.start()
                fatal = False
                for item in items:
                    if isinstance(item, HubbubError):
                        if conn is None:
                            fatal = True
                            break
                        conn.bad_input(item)
                        if item.fatal:
                            fatal = True
                            break
                    elif conn is not None:
                        if not (type(item) is nc.Publish and conn.publish_nowait(item)):
                            await conn.handle(item)
                        if conn.session.ending or conn.session.kicked:
                            fatal = True
                            break
                if fatal or decoder.failed:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("native TCP connection failed")
        finally:
            if conn is not None:
                if conn.session.ending or conn.session.kicked:
                    await conn.wait_written()
                await conn.finish()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port, limit=max_frame + 1024)
