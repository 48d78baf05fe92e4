"""Read-side back-pressure, one rule for every read loop (ARCHITECTURE §6): a connection is read only while
its own replies have room in its queue.

Nearly every request a client sends queues a reply on its session: a publish's acknowledgement (owed from
submit to commit, ``Session.owed``), a pong, a subscribe reply, an error answering bad input, the result of
a read (guble fetch, mist ``who``/``listall``, a qrpc call). So the server stops reading a connection once
its frames queued and replies owed reach its queue's bound (``Session.has_room`` false) and reads it again
once they are below half (``Session.wait_room``). A client that pipelines requests faster than it reads
the replies is slowed (the kernel's buffers fill and its writes wait), never closed as a slow consumer,
whatever it sends; a client that reads eventually gets every reply, in order. Bad input gets its error
reply, or the close the dialect's rules give it, never a slow-consumer close.

Where each read loop applies the rule:

* WebSockets the server accepted (native, ivy, guble, mist 2015 and 1.x, wearscript, MQTT) are read from
  their socket's ``data_received`` by the WebSocket driver's reader (``ws_driver._Reader``), which asks
  for room before each message (a message is one request) and, without it, pauses the transport and waits
  in a task (``Session.wait_room``) before it resumes reading. A socket the server opened (the WearScript
  link up) takes its messages from :class:`Messages`, which waits for room before each message is read.
* Byte-stream loops (native TCP ``dispatch``, ``MistWire.handle`` for mist TCP, ``QrpcWire.feed``) hand a
  whole read to a sans-I/O decoder, which may return thousands of requests at once (a 64 KiB read of mist
  ``ping`` lines is some 13,000): they wait between the decoded items, with the same two calls as
  :class:`Messages` (``if not session.has_room: await session.wait_room()``), so the rest of the read waits
  with the socket while the writer drains the replies.

The publish paths of the dialects need no check of their own: a publish is one of those requests. (The
native publish path still sizes its batches with ``Session.has_room``, and every dialect waits for the
writer's room, ``Node.writable``.)

HTTP needs no rule of its own: aiohttp serves an HTTP/1.1 connection one request at a time, a response
waits for its socket to drain before the next request is handled, and the parser stops reading a
connection that holds 32 pipelined requests unanswered (``MAX_MSG_QUEUE_SIZE``). A client pipelining
requests on one connection without reading is slowed by TCP flow control; concurrent requests on many
connections are bounded by the connection limits and by the writer's room.

Concurrency contract: called from the event loop thread only; one reader per connection.
"""

from __future__ import annotations

from typing import Final, final

from aiohttp import ClientWebSocketResponse, WSMessage, WSMsgType, web

from hubbub.core.api import Session

__all__ = ["Messages", "Socket", "take_ready"]

#: What a WebSocket read loop reads: an accepted socket, or one the server opened (the WearScript link).
Socket = web.WebSocketResponse | ClientWebSocketResponse

#: The messages that end ``async for msg in ws`` (aiohttp's own rule, kept).
_END: Final = frozenset({WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED})


@final
class Messages:
    """``async for msg in Messages(ws, session)``: the messages of ``ws``, as ``async for msg in ws`` gives
    them (control messages included; a close ends the loop), each read only once ``session`` has room for
    its reply. Iteration also ends when the session ends, is kicked or closes while the loop waits for room:
    its connection is read no more.

    Costs what ``async for msg in ws`` costs (one coroutine per message) plus the room check.
    """

    __slots__ = ("_session", "_ws")

    def __init__(self, ws: Socket, session: Session) -> None:
        self._ws = ws
        self._session = session

    def __aiter__(self) -> Messages:
        return self

    async def __anext__(self) -> WSMessage:
        sess = self._session
        if not sess.has_room:
            await sess.wait_room()
            if sess.closed or sess.kicked or sess.ending:
                raise StopAsyncIteration
        msg: WSMessage = await self._ws.receive()
        if msg.type in _END:
            raise StopAsyncIteration
        return msg


async def take_ready(ws: Socket, most: int) -> list[bytes | str]:
    """The data (text or binary) of up to ``most`` messages that aiohttp's reader has parsed already, in
    order: what ``ws.receive()`` returns next without waiting. It stops at the first message of another kind
    (a close, a ping: ``receive`` handles it next) and once the socket is closing. A read loop takes them
    after one message from :class:`Messages`: the rest of the burst that arrived with it, handled at once
    (native's WebSocket decodes a burst as one, ``dialects.native.decode_messages``).

    aiohttp has no public way to ask what is queued: this looks at its reader queue's deque (a public
    attribute of its compiled reader, a plain one of the Python one) and takes each message with
    ``receive``, which keeps the queue's size and flow control; with a version that has no such deque it
    takes nothing, and the loop reads message by message.
    """
    buffer = getattr(getattr(ws, "_reader", None), "_buffer", None)
    out: list[bytes | str] = []
    while buffer and len(out) < most:
        kind = buffer[0][0].type
        if kind is not WSMsgType.TEXT and kind is not WSMsgType.BINARY:
            break
        msg = await ws.receive()  # at once: a message is queued
        if msg.type is not WSMsgType.TEXT and msg.type is not WSMsgType.BINARY:
            break  # closing or closed: a state, which the loop's next receive returns again
        out.append(msg.data)
    return out
