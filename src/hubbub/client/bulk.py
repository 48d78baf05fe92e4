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

import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import msgpack

from hubbub.client._bulk_link import BulkLink
from hubbub.client._bulk_rows import AckTally, Cols, Item, batch_body, row_items
from hubbub.client._wire import ConnectionLost, PublishAck
from hubbub.client.protocol import PACKED_ID_SIZE, ClientEvent, Refused, Replies, ServerError
from hubbub.errors import FrameTooLarge, HubbubError, PublishRefused, UnknownOp, is_temporary

__all__ = ["BulkPublisher"]

# Frames are written when this much is queued, or a quarter of the window (or the window is full, or on
# flush): enough that one write carries many publishes, little enough that the server always has the next
# ones to commit while it acknowledges the last (a whole window per write would make it stop and go).
_FLUSH_BYTES = 64 << 10

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
        #: The connection (socket, protocol, frames queued to write); the window and resends are ours.
        self._link = BulkLink(url, token, timeout, client_name, self._on_event, self._reconnect)
        self.url = url
        self._out = self._link.out
        self._window = max(1, window)
        self._flush_frames = max(1, self._window // 4)
        self._queued = 0  # publishes queued since the last write
        self._batch_rows = max(1, min(_BATCH_ROWS, self._window // 4))
        #: Whether :meth:`publish_many` sends ``publish_batch`` frames (False once the server said it has no
        #: such op: then it sends a ``publish`` frame per row).
        self.batches = True
        self._rows = 0  # rows unacknowledged: sent, queued, or waiting to be resent
        self._tally = AckTally(on_ack, keep_acks)
        self.acks: list[PublishAck] = self._tally.acks
        #: The highest seq acknowledged per channel.
        self.tops: dict[str, int] = self._tally.tops
        self._retries = retries
        self._retry_interval = retry_interval
        self._later: list[Item] = []  # temporarily refused: resent after their delay
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.sent = 0
        self.resent = 0
        self.reconnects = 0
        self._link.connect()

    @property
    def published(self) -> int:
        """Publishes (rows) acknowledged as appended."""
        return self._tally.published

    @property
    def duplicates(self) -> int:
        """Publishes (rows) acknowledged as duplicates (their key was known)."""
        return self._tally.duplicates

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
        self._send(Item(channel, self._pack(frame), idem))
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
            cols: Cols = (
                channels[start:end],
                payloads[start:end],
                idems[start:end],
                content_types[start:end],
                headers[start:end],
                tags[start:end],
            )
            self._send_batch(cols)
            start = end
            self._make_room()
        if start < n:
            rest = (channels, payloads, idems, content_types, headers, tags)
            self._publish_rows(tuple(c[start:] for c in rest))  # type: ignore[arg-type]

    def _send_batch(self, cols: Cols) -> None:
        """Queue these rows as one ``publish_batch`` (halved until its frame fits the server's max_frame;
        a single row that does not fit goes as a ``publish``, refused as such)."""
        n = len(cols[1])
        body = batch_body(self._pack, cols)
        if len(body) + PACKED_ID_SIZE > self._link.proto.max_frame:
            if n == 1:
                self._publish_rows(cols)
                return
            half = n // 2
            self._send_batch(tuple(c[:half] for c in cols))  # type: ignore[arg-type]
            self._send_batch(tuple(c[half:] for c in cols))  # type: ignore[arg-type]
            return
        idems = cols[2]
        keyed = idems[0] if all(idems) else None  # an empty key is no key: not safe to resend
        self._send(Item(cols[0][0], body, keyed, rows=n, cols=cols))
        self._queued += 1

    def _publish_rows(self, cols: Cols) -> None:
        """The rows as ``publish`` frames, one each, within the window."""
        for item in row_items(self._pack, cols):
            self._send(item)
            self._queued += 1
            self._make_room()

    def _make_room(self) -> None:
        """Write what is queued once there is enough of it; block reading replies while the window is full
        (:meth:`publish` has this inline: it is the hot path)."""
        if self._queued >= self._flush_frames or len(self._out) >= _FLUSH_BYTES:
            self._write_out()
        while self._rows >= self._window:
            self._write_out()
            self._pump(block=True)

    def flush(self) -> None:
        """Send everything queued and wait until every publish is acknowledged."""
        while self._link.proto.pending or self._later or self._out:
            self._write_out()
            if self._link.proto.pending or self._later:
                self._pump(block=True)

    @property
    def pending(self) -> int:
        """Publishes (rows) sent or queued and not acknowledged yet."""
        return self._rows

    def close(self) -> None:
        """Close the connection (unacknowledged publishes are abandoned: call :meth:`flush` first)."""
        self._link.close()

    def __enter__(self) -> BulkPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- sending --------------------------------------------------------------------------------------

    def _send(self, item: Item) -> None:
        """Give ``item`` a fresh id and queue its frame (written by :meth:`_write_out`)."""
        try:
            self._link.proto.request_packed(item.body, item, self._out)
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
        self._link.write_out()

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
        sock = self._link.sock
        if sock is None:
            self._reconnect()
            return
        wait = self._link.timeout if block else 0.0
        if self._later:
            wait = min(wait, max(0.0, min(i.not_before for i in self._later) - time.monotonic()))
            if not self._link.proto.pending:
                time.sleep(wait)
                self._resend_due()
                return
        try:
            if not self._link.wait_read(sock, wait) and block and not self._later:
                raise TimeoutError(f"no reply within {self._link.timeout}s")
        except (OSError, TimeoutError):
            self._link.drop()
            self._reconnect()
        self._resend_due()

    def _on_event(self, event: ClientEvent) -> None:
        if type(event) is Replies:
            reply = self._tally.reply
            for item, frame in event.answers:
                self._rows -= item.rows
                reply(item, frame)
        elif isinstance(event, Refused):
            self._refused(event.token, event.error, event.frame)
        elif isinstance(event, ServerError):
            err = event.error
            if err.fatal and err.temporary:  # the server closes next (slow consumer, shutting down)
                raise ConnectionResetError(f"server error {err.code} {err}")
            if err.fatal:  # a final one (bad token) will not get better by reconnecting
                raise err

    def _refused(self, item: Item, err: HubbubError, frame: dict[str, Any]) -> None:
        if item.cols is not None and err.code == UnknownOp.code:
            # A server without publish_batch (it appended nothing of it): rows one by one from now on.
            # Its rows were within the window, so they are queued at once (no wait for room here, in
            # the middle of reading replies), in order.
            self.batches = False
            self._rows -= item.rows
            for one in row_items(self._pack, item.cols):
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

    def _reconnect(self) -> None:
        """The connection was lost (and dropped): connect again and queue every unacknowledged publish
        again, oldest first; a publish without ``idem`` cannot be resent safely, so its loss raises
        ConnectionLost."""
        lost = self._link.proto.abandon()
        self._out.clear()
        for item in lost:
            if item.idem is None:
                raise ConnectionLost(
                    f"{self.url}: connection lost with a publish to {item.channel} unacknowledged"
                )
        self._link.reconnect(self._retries, self._retry_interval)
        self.reconnects += 1
        for item in lost:
            self._send(item)
            self.resent += 1
