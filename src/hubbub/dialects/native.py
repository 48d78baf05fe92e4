"""The native protocol, v1 (protocols/native.md): a sans-I/O codec, and the names a transport needs from it.

:class:`NativeCodec` (:mod:`.native_codec`) turns one WebSocket message (or one TCP frame) into a
:data:`Command` and turns replies, pushes and events into bytes, in JSON or msgpack.
:class:`NativeStreamDecoder` (:mod:`.native_stream`) splits a raw TCP byte stream into frames, picking the
framing from the first byte, and decodes each read in one loop (the common publishes as a
:class:`PublishRun`). The command values and their field readers live in :mod:`.native_commands`, the HTTP
renderings in :mod:`.native_http` and the shared event rendering in :mod:`.native_common`; everything a
transport needs is re-exported here, so transports, tests and tools use ``from hubbub.dialects import
native as nc``. Each module states its own invariants and concurrency contract.
"""

from __future__ import annotations

from typing import Final

from hubbub.config import NativeConfig

from .native_batch import MAX_BATCH_ROWS
from .native_codec import (
    CHANNEL_CACHE_SIZE,
    PROTOCOL_VERSION,
    PUSH_FIELDS,
    SUBPROTOCOLS,
    NativeCodec,
    error_message,
)
from .native_columns import event_batches, run_batches, run_frames
from .native_commands import (
    Ack,
    Auth,
    Command,
    Consume,
    ConsumerCreate,
    ConsumerDelete,
    Hello,
    Nack,
    Ping,
    Pong,
    Publish,
    PublishBatch,
    Subscribe,
    Unconsume,
    Unsubscribe,
)
from .native_common import Encoding, Limits, event_frames, pack_batches
from .native_consumers import ConsumerTable, deliver_frame
from .native_http import (
    event_object,
    http_publish_fields,
    http_stream_tags,
    parse_sse_last_event_id,
    render_http_error,
    render_http_publish,
    render_log,
    render_sse_event,
    render_sse_gap,
    render_sse_recovered,
)
from .native_pages import page_frames
from .native_protocol import Admit, NativeProtocol, Phase
from .native_shapes import TAKE_MAX_CHARS, JsonLayouts
from .native_stream import (
    MAX_STREAM_FRAME,
    RUN_MAX,
    NativeStreamDecoder,
    PublishRun,
    RunItem,
    StreamItem,
    decode_messages,
)
from .spec import DialectSpec

__all__ = [
    "CHANNEL_CACHE_SIZE",
    "MAX_BATCH_ROWS",
    "MAX_STREAM_FRAME",
    "PROTOCOL_VERSION",
    "PUSH_FIELDS",
    "RUN_MAX",
    "SPEC",
    "SUBPROTOCOLS",
    "TAKE_MAX_CHARS",
    "Ack",
    "Admit",
    "Auth",
    "Command",
    "Consume",
    "ConsumerCreate",
    "ConsumerDelete",
    "ConsumerTable",
    "Encoding",
    "Hello",
    "JsonLayouts",
    "Limits",
    "Nack",
    "NativeCodec",
    "NativeProtocol",
    "NativeStreamDecoder",
    "Phase",
    "Ping",
    "Pong",
    "Publish",
    "PublishBatch",
    "PublishRun",
    "RunItem",
    "StreamItem",
    "Subscribe",
    "Unconsume",
    "Unsubscribe",
    "decode_messages",
    "deliver_frame",
    "error_message",
    "event_batches",
    "event_frames",
    "event_object",
    "http_publish_fields",
    "http_stream_tags",
    "pack_batches",
    "page_frames",
    "parse_sse_last_event_id",
    "render_http_error",
    "render_http_publish",
    "render_log",
    "render_sse_event",
    "render_sse_gap",
    "render_sse_recovered",
    "run_batches",
    "run_frames",
]


#: The native dialect as the server wires it (protocols/native.md): its WebSocket at ``/ws/hubbub`` (JSON or
#: msgpack frames by subprotocol, text or binary accordingly), its TCP listener (``native.tcp_listen``: JSON
#: lines or length-prefixed msgpack), a slow consumer closed with 4008 (README §4: recovery from the log
#: with ``since`` is the native client's way back), every close reason as it is, and its own keepalive
#: (``ping`` frames and 4304, not WebSocket pings). Its HTTP API and SSE stream are a route module.
SPEC: Final = DialectSpec(
    name="native",
    section="native",
    config=NativeConfig,
    ws_routes=("/ws/hubbub",),
    stream_listeners=("native.tcp_listen",),
    overflow="disconnect",
    keepalive=False,
    binding="hubbub.transports.tcp:mount",
)
