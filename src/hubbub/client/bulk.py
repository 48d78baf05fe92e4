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

from hubbub.client._wire import CannotConnect, ConnectionLost, PublishAck
from hubbub.client.framing import Framing, ws_frame
from hubbub.client.protocol import (
    PACKED_ID_SIZE,
    ClientEvent,
    ClientProtocol,
    HelloRefused,
    Refused,
    Replies,
    ServerError,
    Welcome,
)
from hubbub.errors import BadFrame, FrameTooLarge, HubbubError, PublishRefused, UnknownOp, is_temporary

__all__ = ["BulkPublisher"]

_MSGPACK_PROTO = "hubbub.v1.msgpack"
# Frames are written when this much is queued, or a quarter of the window (or the window is full, or on
# flush): enough that one write carries many publishes, little enough that the server always has the next
# ones to commit while it acknowledges the last (a whole window per write would make it stop and go).
_FLUSH_BYTES = 64 << 10
#: The longest message the publisher reads from the server.
_READ_MAX = 64 << 20


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
    body: bytes  # the frame packed without ``id`` (ClientProtocol.request_packed adds it)
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
        #: The connection's protocol (a new one per connection): request ids, replies, framing.
        self._proto = self._new_protocol()
        self._out = bytearray()
        self._later: list[_Item] = []  # temporarily refused: resent after their delay
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
        if len(body) + PACKED_ID_SIZE > self._proto.max_frame:
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
        while self._proto.pending or self._later or self._out:
            self._write_out()
            if self._proto.pending or self._later:
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
                    sock.sendall(ws_frame(0x8, struct.pack(">H", 1000)))
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
        try:
            self._proto.request_packed(item.body, item, self._out)
        except FrameTooLarge as exc:
            raise PublishRefused(item.channel, item.idem, exc) from None
        if not item.counted:  # a resend is counted once
            self._rows += item.rows
            item.counted = True
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
            if not self._proto.pending:
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
        proto = self._proto
        for event in proto.receive_data(data):
            self._on_event(event)
        for out in proto.take_outgoing():  # pongs
            sock.sendall(out)
        if proto.peer_closed:
            raise ConnectionResetError("closed by the server")

    def _on_event(self, event: ClientEvent) -> None:
        if type(event) is Replies:
            reply = self._reply
            for item, frame in event.answers:
                reply(item, frame)
        elif isinstance(event, Refused):
            self._refused(event.token, event.error, event.frame)
        elif isinstance(event, ServerError):
            err = event.error
            if err.fatal and err.temporary:  # the server closes next (slow consumer, shutting down)
                raise ConnectionResetError(f"server error {err.code} {err}")
            if err.fatal:  # a final one (bad token) will not get better by reconnecting
                raise err

    def _refused(self, item: _Item, err: HubbubError, frame: dict[str, Any]) -> None:
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

    def _reply(self, item: _Item, frame: dict[str, Any]) -> None:
        """A publish's acknowledgement: tallied, and passed on or kept when asked for."""
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
            rest = self._upgrade(sock) if self._ws else b""
            proto = self._new_protocol()
            sock.sendall(proto.hello())
            events = proto.receive_data(rest)
            while not any(isinstance(e, Welcome | HelloRefused) for e in events):
                data = sock.recv(1 << 16)
                if not data or proto.peer_closed:
                    raise CannotConnect(f"{self.url}: connection closed during hello")
                events += proto.receive_data(data)
            at = next(i for i, e in enumerate(events) if isinstance(e, Welcome | HelloRefused))
            answer = events[at]
            if isinstance(answer, HelloRefused):
                if answer.malformed:
                    raise CannotConnect(f"{self.url}: bad hello reply")
                raise answer.error
            for event in events[at + 1 :]:
                self._on_event(event)
        except BadFrame as exc:  # a reply that is not msgpack
            sock.close()
            raise CannotConnect(f"{self.url}: bad hello reply") from exc
        except HubbubError:
            sock.close()
            raise
        except (OSError, ValueError) as exc:  # a reset, a timeout, a reply that is not msgpack
            sock.close()
            raise CannotConnect(f"{self.url}: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        self._proto = proto
        self._sock = sock

    def _new_protocol(self) -> ClientProtocol[_Item]:
        framing = Framing("ws" if self._ws else "length", _READ_MAX)
        return ClientProtocol(
            "msgpack", framing, client=self._client_name, token=self._token, echo=False, batch=True
        )

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
        lost = self._proto.abandon()
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
