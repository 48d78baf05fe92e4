"""A blocking, pipelined publisher for bulk loads: many acknowledged publishes over one native connection.

::

    with BulkPublisher("tcp://127.0.0.1:7400", window=1024) as pub:
        for row in rows:
            pub.publish(row.channel, row.payload, idem=row.key)   # returns at once (until the window is full)
        pub.flush()                                                # every publish acknowledged
    acks = pub.acks                                                # or pass on_ack=

The interactive clients (:mod:`hubbub.client.aio`, :mod:`hubbub.client.sync`) wait for each publish's reply;
a bulk load cannot afford a round trip per event. :class:`BulkPublisher` writes publish frames (msgpack,
``ack:true``) back to back, many per socket write, and reads the acknowledgements as they come, with at most
``window`` publishes unacknowledged (the bound: when it is reached, :meth:`publish` blocks reading replies).

:meth:`BulkPublisher.publish_many` (columns of rows, a bulk load's batch) sends ``publish_batch`` frames
(docs/native.md "Batched publishes"): up to a quarter of the window's rows per frame, each appended in one
commit and acknowledged with one reply, so the server decodes, commits and answers each frame once, not each
row; to a server without that op (4002) it sends ``publish`` frames per row instead, from the first refused
batch on. The window counts rows either way.

Transports (native.md §1): ``tcp://host:port`` (the native TCP listener, length-prefixed msgpack frames) or
``ws://host:port[/path]`` / ``http://…`` (the WebSocket route ``/ws/hubbub``, subprotocol
``hubbub.v1.msgpack``). TLS is not supported here (use the HTTP publisher for ``https://``).

Delivery: a publish carrying ``idem`` is safe to send twice, the server appends it once within its
idempotency window and acknowledges the repeat with ``duplicate``. So when the connection drops, the
publisher reconnects (``retries`` attempts, the delay doubling from 0.1 s up to ``retry_interval``) and
sends every unacknowledged publish again, oldest first; a temporary error (4300, 4301) resends that
publish after a delay too. Publishes without ``idem`` are never resent: their loss raises
:class:`ConnectionLost`. Any other error of a publish raises :class:`PublishRefused` (the publish, and the
server's error) from the call that read it; publishes sent after it may have been committed. Order:
acknowledged publishes were appended in the order given, except that a resent one lands after those that
were acknowledged before it.

Concurrency contract: one thread at a time (no locking); blocking socket I/O with ``timeout`` per wait.
"""

from __future__ import annotations

import base64
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import msgpack

from hubbub.client._wire import CannotConnect, ConnectionLost, PublishAck, error_from_frame
from hubbub.errors import FrameTooLarge, HubbubError, PublishRefused, UnknownOp, is_temporary

__all__ = ["BulkPublisher"]

_MSGPACK_PROTO = "hubbub.v1.msgpack"
# Frames are written when this much is queued, or a quarter of the window (or the window is full, or on
# flush): enough that one write carries many publishes, little enough that the server always has the next
# ones to commit while it acknowledges the last (a whole window per write would make it stop and go).
_FLUSH_BYTES = 64 << 10
_MAX_ID = (1 << 31) - 1
_LEN = struct.Struct(">I")


# A publish frame is packed once, without its id (a map of fewer than 15 fields: one fixmap byte), and each
# send appends the id it is sent with as the map's last field: ``"id"`` then a msgpack uint 32 (a valid
# encoding of any id, so every frame's id takes the same 5 bytes). A resend packs nothing again.
_ID_KEY = b"\xa2id\xce"
_ID = struct.Struct(">I")


#: The columns of a batch's rows, as :meth:`BulkPublisher.publish_many` takes them.
_Cols = tuple[
    Sequence[str],
    Sequence[bytes],
    Sequence["str | None"],
    Sequence[str],
    Sequence["Mapping[str, str] | None"],
    Sequence[Sequence[str]],
]


@dataclass(eq=False, slots=True)
class _Item:
    channel: str
    body: bytes  # the frame packed without ``id`` (see _ID_KEY)
    idem: str | None  # a batch: its first row's key when every row has one (it may be resent), else None
    tries: int = 0
    not_before: float = 0.0
    rows: int = 1
    cols: _Cols | None = None  # a ``publish_batch``: its rows
    counted: bool = False  # in BulkPublisher._rows


# Rows per ``publish_batch`` frame at most (the server takes up to 10000, fewer on a small max_frame): a
# quarter of the window, so several batches are in flight, and the server commits one while the next
# arrives.
_BATCH_ROWS = 2500


class _Framing:
    """Byte framing of one transport: ``wrap`` a msgpack body for sending, ``feed`` received bytes and get
    the message bodies back (any chunking). Sans-I/O; ``control`` collects frames the transport must send
    back (WebSocket pongs), ``closed`` is set once the peer said it closes."""

    def __init__(self, ws: bool, max_frame: int) -> None:
        self.ws = ws
        self.max_frame = max_frame
        self.buf = bytearray()
        self.parts = bytearray()  # a fragmented WebSocket message so far
        self.control = bytearray()
        self.closed = False

    def wrap(self, body: bytes) -> bytes:
        if not self.ws:
            return _LEN.pack(len(body)) + body
        return _ws_frame(0x2, body)

    def feed(self, data: bytes) -> list[bytes]:
        if self.closed:  # nothing after a close frame counts
            return []
        self.buf += data
        out: list[bytes] = []
        buf = self.buf
        while True:
            if not self.ws:
                if len(buf) < 4:
                    break
                (n,) = struct.unpack_from(">I", buf)
                if n > self.max_frame:
                    raise FrameTooLarge(f"server frame of {n} bytes over {self.max_frame}")
                if len(buf) < 4 + n:
                    break
                out.append(bytes(buf[4 : 4 + n]))
                del buf[: 4 + n]
                continue
            if len(buf) < 2:
                break
            fin, op, masked, n = buf[0] & 0x80, buf[0] & 0x0F, buf[1] & 0x80, buf[1] & 0x7F
            at = 2
            if n == 126:
                if len(buf) < 4:
                    break
                (n,) = struct.unpack_from(">H", buf, 2)
                at = 4
            elif n == 127:
                if len(buf) < 10:
                    break
                (n,) = struct.unpack_from(">Q", buf, 2)
                at = 10
            if n > self.max_frame:
                raise FrameTooLarge(f"server message of {n} bytes over {self.max_frame}")
            mask = b""
            if masked:
                mask = bytes(buf[at : at + 4])
                at += 4
            if len(buf) < at + n:
                break
            payload = bytes(buf[at : at + n])
            del buf[: at + n]
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if op == 0x9:  # ping
                self.control += _ws_frame(0xA, payload)
            elif op == 0x8:
                self.closed = True
                break
            elif op in (0x0, 0x1, 0x2):
                self.parts += payload
                if len(self.parts) > self.max_frame:
                    raise FrameTooLarge(f"server message over {self.max_frame}")
                if fin:
                    out.append(bytes(self.parts))
                    self.parts.clear()
        return out


def _ws_frame(op: int, body: bytes) -> bytes:
    # Client frames are masked (RFC 6455 §5.3). A random key, applied with one big-integer XOR.
    n = len(body)
    if n < 126:
        head = bytes([0x80 | op, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([0x80 | op, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x80 | op, 0x80 | 127]) + struct.pack(">Q", n)
    key = os.urandom(4)
    if not body:
        return head + key
    k = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return head + key + (int.from_bytes(body, "big") ^ k).to_bytes(n, "big")


class BulkPublisher:
    """Pipelined acknowledged publishes over one native connection (see the module docstring).

    ``window``: most publishes unacknowledged at once. ``on_ack``: called with each acknowledgement as it
    is read (in the order the server sends them); without it they collect in :attr:`acks`, unless
    ``keep_acks`` is false (a bulk load that only needs the tallies: :attr:`published`,
    :attr:`duplicates` and :attr:`tops`, kept in every case). ``timeout``:
    seconds any one wait for the server may take before the connection counts as lost. ``retries`` and
    ``retry_interval`` (seconds): reconnects after a lost connection before giving up, waiting 0.1 s, then
    twice as long each time up to ``retry_interval`` (the defaults give up after about 1.5 s; the Spark
    sink's defaults ride out a server restart of about 30 s).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        window: int = 1024,
        on_ack: Callable[[PublishAck], None] | None = None,
        keep_acks: bool = True,
        timeout: float = 30.0,
        retries: int = 4,
        retry_interval: float = 1.6,
        client_name: str = "hubbub-bulk",
    ) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("tcp", "ws", "http") or not parts.hostname:
            raise ValueError(f"bulk publisher URL must be tcp://, ws:// or http://host:port, not {url!r}")
        self.url = url
        self._ws = scheme != "tcp"
        self._host = parts.hostname
        self._port = parts.port or (80 if self._ws else 7400)
        self._path = parts.path if parts.path not in ("", "/") else "/ws/hubbub"
        self._token = token
        self._window = max(1, window)
        self._flush_frames = max(1, self._window // 4)
        self._queued = 0  # publishes queued since the last write
        self._batch_rows = max(1, min(_BATCH_ROWS, self._window // 4))
        #: Whether :meth:`publish_many` sends ``publish_batch`` frames (False once the server said it has no
        #: such op: then it sends a ``publish`` frame per row).
        self.batches = True
        self._rows = 0  # rows unacknowledged: sent, queued, or waiting to be resent
        self._on_ack = on_ack
        self._acks_wanted = on_ack is not None or keep_acks
        self.acks: list[PublishAck] = []
        #: Publishes acknowledged as appended, and as duplicates (their key was known).
        self.published = 0
        self.duplicates = 0
        #: The highest seq acknowledged per channel.
        self.tops: dict[str, int] = {}
        self._timeout = timeout
        self._retries = retries
        self._retry_interval = retry_interval
        self._client_name = client_name
        self._sock: socket.socket | None = None
        self._framing = _Framing(self._ws, 64 << 20)
        self._max_frame = 1 << 20
        self._out = bytearray()
        self._unacked: dict[int, _Item] = {}  # in the order sent (dicts keep insertion order)
        self._later: list[_Item] = []  # temporarily refused: resent after their delay
        self._next_id = 1
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.sent = 0
        self.resent = 0
        self.reconnects = 0
        self._connect()

    # -- public API -----------------------------------------------------------------------------------

    def publish(
        self,
        channel: str,
        payload: bytes,
        *,
        idem: str | None = None,
        content_type: str = "",
        headers: Mapping[str, str] | None = None,
        tags: Sequence[str] = (),
    ) -> None:
        """Queue one acknowledged publish; blocks while ``window`` publishes are unacknowledged. Raises
        :class:`PublishRefused` for a refused publish (this one or an earlier one whose reply arrived)."""
        frame: dict[str, Any] = {"op": "publish", "channel": channel, "payload": payload, "ack": True}
        if content_type:
            frame["content_type"] = content_type
        if headers:
            frame["headers"] = headers if type(headers) is dict else dict(headers)
        if tags:
            frame["tags"] = tags if type(tags) is list else list(tags)
        if idem is not None:
            frame["idem"] = idem
        self._send(_Item(channel, self._pack(frame), idem))
        self._queued += 1
        if self._queued >= self._flush_frames or len(self._out) >= _FLUSH_BYTES:
            self._write_out()
        while self._rows >= self._window:
            self._write_out()
            self._pump(block=True)

    def publish_many(
        self,
        channels: Sequence[str],
        payloads: Sequence[bytes],
        idems: Sequence[str | None],
        content_types: Sequence[str],
        headers: Sequence[Mapping[str, str] | None],
        tags: Sequence[Sequence[str]],
    ) -> None:
        """:meth:`publish` of each row of these columns (the same length each), in order, with one call for
        the lot (a bulk load's batch of rows): as ``publish_batch`` frames (docs/native.md "Batched
        publishes"), each appended in one commit and acknowledged with one reply; as ``publish`` frames per
        row to a server without that op."""
        n = len(payloads)
        if not (len(channels) == len(idems) == len(content_types) == len(headers) == len(tags) == n):
            raise ValueError("publish_many: the columns differ in length")
        step = self._batch_rows
        start = 0
        while start < n and self.batches:
            end = min(n, start + step)
            cols: _Cols = (
                channels[start:end],
                payloads[start:end],
                idems[start:end],
                content_types[start:end],
                headers[start:end],
                tags[start:end],
            )
            self._send_batch(cols)
            start = end
            if self._queued >= self._flush_frames or len(self._out) >= _FLUSH_BYTES:
                self._write_out()
            while self._rows >= self._window:
                self._write_out()
                self._pump(block=True)
        if start < n:
            self._publish_rows(
                channels[start:],
                payloads[start:],
                idems[start:],
                content_types[start:],
                headers[start:],
                tags[start:],
            )

    def _batch_body(self, cols: _Cols) -> bytes:
        """A ``publish_batch`` frame of these rows, packed without ``id``; only the columns some row uses."""
        channels, payloads, idems, ctypes, hdrs, tgs = cols
        frame: dict[str, Any] = {"op": "publish_batch", "ack": True}
        first = channels[0]
        if all(c == first for c in channels):
            frame["channel"] = first
        else:
            frame["channels"] = channels if type(channels) is list else list(channels)
        frame["payloads"] = payloads if type(payloads) is list else list(payloads)
        if any(ctypes):
            frame["content_types"] = [c or None for c in ctypes]
        if any(hdrs):
            frame["headers"] = [(h if type(h) is dict else dict(h)) if h else None for h in hdrs]
        if any(tgs):
            frame["tags"] = [list(t) if t else None for t in tgs]
        if any(k is not None for k in idems):
            frame["idems"] = idems if type(idems) is list else list(idems)
        out: bytes = self._pack(frame)
        return out

    def _send_batch(self, cols: _Cols) -> None:
        """Queue these rows as one ``publish_batch`` (halved until its frame fits the server's max_frame;
        a single row that does not fit goes as a ``publish``, refused as such)."""
        n = len(cols[1])
        body = self._batch_body(cols)
        if len(body) + len(_ID_KEY) + 4 > self._max_frame:
            if n == 1:
                self._publish_rows(*cols)
                return
            half = n // 2
            self._send_batch(tuple(c[:half] for c in cols))  # type: ignore[arg-type]
            self._send_batch(tuple(c[half:] for c in cols))  # type: ignore[arg-type]
            return
        idems = cols[2]
        keyed = idems[0] if all(idems) else None  # an empty key is no key: not safe to resend
        self._send(_Item(cols[0][0], body, keyed, rows=n, cols=cols))
        self._queued += 1

    def _publish_rows(
        self,
        channels: Sequence[str],
        payloads: Sequence[bytes],
        idems: Sequence[str | None],
        content_types: Sequence[str],
        headers: Sequence[Mapping[str, str] | None],
        tags: Sequence[Sequence[str]],
    ) -> None:
        """The rows as ``publish`` frames, one each, within the window."""
        flush_frames = self._flush_frames
        window = self._window
        send = self._send
        for item in self._row_items((channels, payloads, idems, content_types, headers, tags)):
            send(item)
            self._queued += 1
            if self._queued >= flush_frames or len(self._out) >= _FLUSH_BYTES:
                self._write_out()
            while self._rows >= window:
                self._write_out()
                self._pump(block=True)

    def _row_items(self, cols: _Cols) -> Iterator[_Item]:
        """A ``publish`` frame's item for each row of ``cols``."""
        pack = self._pack
        for channel, payload, idem, ctype, hdrs, tgs in zip(*cols, strict=True):
            frame: dict[str, Any] = {"op": "publish", "channel": channel, "payload": payload, "ack": True}
            if ctype:
                frame["content_type"] = ctype
            if hdrs:
                frame["headers"] = hdrs if type(hdrs) is dict else dict(hdrs)
            if tgs:
                frame["tags"] = tgs if type(tgs) is list else list(tgs)
            if idem is not None:
                frame["idem"] = idem
            yield _Item(channel, pack(frame), idem)

    def flush(self) -> None:
        """Send everything queued and wait until every publish is acknowledged."""
        while self._unacked or self._later or self._out:
            self._write_out()
            if self._unacked or self._later:
                self._pump(block=True)

    @property
    def pending(self) -> int:
        """Publishes (rows) sent or queued and not acknowledged yet."""
        return self._rows

    def close(self) -> None:
        """Close the connection (unacknowledged publishes are abandoned: call :meth:`flush` first)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                if self._ws:
                    sock.sendall(_ws_frame(0x8, struct.pack(">H", 1000)))
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> BulkPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- sending --------------------------------------------------------------------------------------

    def _send(self, item: _Item) -> None:
        """Give ``item`` a fresh id and queue its frame (written by :meth:`_write_out`)."""
        body = item.body
        size = len(body) + len(_ID_KEY) + 4
        if size > self._max_frame:
            raise PublishRefused(
                item.channel,
                item.idem,
                FrameTooLarge(f"frame of {size} bytes over the server's max_frame {self._max_frame}"),
            )
        i = self._next_id
        self._next_id = i + 1 if i < _MAX_ID else 1
        self._unacked[i] = item
        if not item.counted:  # a resend is counted once
            self._rows += item.rows
            item.counted = True
        out = self._out
        if self._ws:
            out += _ws_frame(0x2, b"".join((bytes((body[0] + 1,)), body[1:], _ID_KEY, _ID.pack(i))))
        else:  # appends: no concatenated copy of the frame
            out += _LEN.pack(size)
            out.append(body[0] + 1)  # one more field in the fixmap
            out += memoryview(body)[1:]
            out += _ID_KEY
            out += _ID.pack(i)
        self.sent += 1

    def _write_out(self) -> None:
        """Write the queued frames, reading replies whenever the server has some (so neither side can
        block the other with full buffers)."""
        self._resend_due()
        self._queued = 0
        while self._out:
            sock = self._sock
            if sock is None:
                self._reconnect()
                continue
            try:
                r, w, _ = select.select([sock], [sock], [], self._timeout)
                if not r and not w:
                    raise TimeoutError("server neither reads nor answers")
                if r:
                    self._read_some(sock)
                    if self._sock is not sock:
                        continue
                if w and self._out:
                    n = sock.send(self._out)
                    del self._out[:n]
            except (OSError, TimeoutError):
                self._lost()

    def _resend_due(self) -> None:
        if not self._later:
            return
        now = time.monotonic()
        due = [i for i in self._later if i.not_before <= now]
        if due:
            self._later = [i for i in self._later if i.not_before > now]
            for item in due:
                self._send(item)
                self.resent += 1

    # -- reading --------------------------------------------------------------------------------------

    def _pump(self, block: bool) -> None:
        """Read what the server sent; with ``block``, wait (up to the timeout, or a resend's delay) for it."""
        sock = self._sock
        if sock is None:
            self._reconnect()
            return
        wait = self._timeout if block else 0.0
        if self._later:
            wait = min(wait, max(0.0, min(i.not_before for i in self._later) - time.monotonic()))
            if not self._unacked:
                time.sleep(wait)
                self._resend_due()
                return
        try:
            r, _, _ = select.select([sock], [], [], wait)
            if r:
                self._read_some(sock)
            elif block and not self._later:
                raise TimeoutError(f"no reply within {self._timeout}s")
        except (OSError, TimeoutError):
            self._lost()
        self._resend_due()

    def _read_some(self, sock: socket.socket) -> None:
        data = sock.recv(1 << 18)
        if not data:
            raise ConnectionResetError("closed by the server")
        for body in self._framing.feed(data):
            self._on_frame(msgpack.unpackb(body, raw=False))
        if self._framing.control:
            sock.sendall(self._framing.control)
            self._framing.control.clear()
        if self._framing.closed:
            raise ConnectionResetError("closed by the server")

    def _on_frame(self, frame: Any) -> None:
        if not isinstance(frame, dict):
            return
        op = frame.get("op")
        if op == "batch":
            frames = frame.get("frames")
            if isinstance(frames, list):
                reply = self._reply
                for f in frames:
                    if type(f) is dict and f.get("op") == "reply":
                        reply(f)
                    else:
                        self._on_frame(f)
        elif op == "reply":
            self._reply(frame)
        elif op == "ping":
            pong: dict[str, Any] = {"op": "pong"}
            if "id" in frame:
                pong["id"] = frame["id"]
            self._out += self._framing.wrap(msgpack.packb(pong, use_bin_type=True))
        elif op == "error":
            err = error_from_frame(frame)
            item = self._unacked.pop(frame.get("id", -1), None)
            if item is None:
                if err.fatal and err.temporary:  # the server closes next (slow consumer, shutting down)
                    raise ConnectionResetError(f"server error {err.code} {err}")
                if err.fatal:  # a final one (bad token) will not get better by reconnecting
                    raise err
                return
            if item.cols is not None and err.code == UnknownOp.code:
                # A server without publish_batch (it appended nothing of it): rows one by one from now on.
                # Its rows were within the window, so they are queued at once (no wait for room here, in
                # the middle of reading replies), in order.
                self.batches = False
                self._rows -= item.rows
                for one in self._row_items(item.cols):
                    self._send(one)
                return
            if is_temporary(err.code) and item.idem is not None and item.tries < self._retries:
                item.tries += 1
                item.not_before = time.monotonic() + min(0.1 * 2**item.tries, self._retry_interval)
                self._later.append(item)
                return
            self._rows -= item.rows
            bad = frame.get("row")
            if item.cols is not None and type(bad) is int and 0 <= bad < item.rows:
                # The batch was refused for one of its rows: name that row's channel and key.
                raise PublishRefused(item.cols[0][bad], item.cols[2][bad], err)
            raise PublishRefused(item.channel, item.idem, err)

    def _reply(self, frame: dict[str, Any]) -> None:
        """A publish's acknowledgement: tallied, and passed on or kept when asked for."""
        item = self._unacked.pop(frame.get("id", -1), None)
        if item is None:
            return
        self._rows -= item.rows
        if item.cols is not None:
            self._batch_reply(frame, item.cols)
            return
        channel = frame.get("channel", item.channel)
        seq = frame.get("seq", 0)
        duplicate = bool(frame.get("duplicate", False))
        if duplicate:
            self.duplicates += 1
        else:
            self.published += 1
        if type(channel) is str and type(seq) is int and seq > self.tops.get(channel, 0):
            self.tops[channel] = seq
        if not self._acks_wanted:
            return
        ack = PublishAck(
            str(channel), int(seq), str(frame.get("epoch", "")), int(frame.get("time", 0)), duplicate
        )
        if self._on_ack is not None:
            self._on_ack(ack)
        else:
            self.acks.append(ack)

    def _batch_reply(self, frame: dict[str, Any], cols: _Cols) -> None:
        """A ``publish_batch``'s acknowledgement: a seq, epoch and time per row, and which rows were
        duplicates (answered with the original event)."""
        channels = cols[0]
        seqs = frame.get("seqs")
        if type(seqs) is not list or len(seqs) != len(channels):
            raise ConnectionResetError("a batch reply that does not answer each row")
        dups = frame.get("duplicates") or []
        self.duplicates += len(dups)
        self.published += len(seqs) - len(dups)
        tops = self.tops
        first = channels[0]
        if channels.count(first) == len(channels):  # the usual batch: one channel
            top = max(seqs)
            if top > tops.get(first, 0):
                tops[first] = top
        else:
            for ch, seq in zip(channels, seqs, strict=True):
                if seq > tops.get(ch, 0):
                    tops[ch] = seq
        if not self._acks_wanted:
            return
        dup = set(dups)
        epochs = frame.get("epochs") or [""] * len(seqs)
        times = frame.get("times") or [0] * len(seqs)
        for i, (ch, seq, epoch, t) in enumerate(zip(channels, seqs, epochs, times, strict=True)):
            ack = PublishAck(ch, int(seq), str(epoch), int(t), i in dup)
            if self._on_ack is not None:
                self._on_ack(ack)
            else:
                self.acks.append(ack)

    # -- connection -----------------------------------------------------------------------------------

    def _connect(self) -> None:
        """Open the connection and say hello (no retry here). Raises CannotConnect or the hello's error."""
        try:
            sock = socket.create_connection((self._host, self._port), timeout=self._timeout)
        except OSError as exc:
            raise CannotConnect(f"{self.url}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._timeout)
            framing = _Framing(self._ws, 64 << 20)
            rest = self._upgrade(sock) if self._ws else b""
            hello: dict[str, Any] = {"op": "hello", "id": 0, "v": 1, "client": self._client_name}
            hello.update(echo=False, batch=True)
            if self._token:
                hello["token"] = self._token
            sock.sendall(framing.wrap(msgpack.packb(hello, use_bin_type=True)))
            frames = framing.feed(rest)
            while not frames:
                data = sock.recv(1 << 16)
                if not data or framing.closed:
                    raise CannotConnect(f"{self.url}: connection closed during hello")
                frames = framing.feed(data)
            reply = msgpack.unpackb(frames[0], raw=False)
            if isinstance(reply, dict) and reply.get("op") == "batch":
                reply = (reply.get("frames") or [{}])[0]
            if not isinstance(reply, dict) or reply.get("op") not in ("reply", "error"):
                raise CannotConnect(f"{self.url}: bad hello reply")
            if reply["op"] == "error":
                raise error_from_frame(reply)
            self._max_frame = int((reply.get("limits") or {}).get("max_frame", 1 << 20))
            for body in frames[1:]:
                self._on_frame(msgpack.unpackb(body, raw=False))
        except HubbubError:
            sock.close()
            raise
        except (OSError, ValueError) as exc:  # a reset, a timeout, a reply that is not msgpack
            sock.close()
            raise CannotConnect(f"{self.url}: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        self._framing = framing
        self._sock = sock

    def _upgrade(self, sock: socket.socket) -> bytes:
        key = base64.b64encode(os.urandom(16)).decode()
        auth = f"Authorization: Bearer {self._token}\r\n" if self._token else ""
        sock.sendall(
            (
                f"GET {self._path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {_MSGPACK_PROTO}\r\n{auth}\r\n"
            ).encode()
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = sock.recv(1 << 16)
            if not data or len(buf) > 1 << 16:
                raise CannotConnect(f"{self.url}: WebSocket upgrade refused (no answer)")
            buf += data
        head, rest = buf.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if " 101 " not in status + " ":
            raise CannotConnect(f"{self.url}: WebSocket upgrade refused ({status})")
        if _MSGPACK_PROTO.encode() not in head:
            raise CannotConnect(f"{self.url}: server did not accept subprotocol {_MSGPACK_PROTO}")
        return rest

    def _lost(self) -> None:
        """The connection failed: drop it; the next write or read reconnects."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        self._reconnect()

    def _reconnect(self) -> None:
        """Connect again and queue every unacknowledged publish again, oldest first; a publish without
        ``idem`` cannot be resent safely, so its loss raises ConnectionLost."""
        lost = list(self._unacked.values())
        self._unacked.clear()
        self._out.clear()
        for item in lost:
            if item.idem is None:
                raise ConnectionLost(
                    f"{self.url}: connection lost with a publish to {item.channel} unacknowledged"
                )
        delay = min(0.1, self._retry_interval)
        for attempt in range(self._retries + 1):
            try:
                self._connect()
                break
            except CannotConnect:
                if attempt == self._retries:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, self._retry_interval)
        self.reconnects += 1
        for item in lost:
            self._send(item)
            self.resent += 1
