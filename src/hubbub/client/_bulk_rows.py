"""What :class:`~hubbub.client.bulk.BulkPublisher` sends and what it counts: its publishes' frames (one per
row, or a ``publish_batch`` of many rows) and the tally of their acknowledgements.

Concurrency contract: no I/O and no locking; each object belongs to the one publisher (one thread) that
made it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hubbub.client._wire import PublishAck

__all__ = ["AckTally", "Cols", "Item", "batch_body", "row_items"]

#: The columns of a batch's rows, as :meth:`BulkPublisher.publish_many` takes them.
Cols = tuple[
    Sequence[str],
    Sequence[bytes],
    Sequence["str | None"],
    Sequence[str],
    Sequence["Mapping[str, str] | None"],
    Sequence[Sequence[str]],
]

#: A msgpack packer's ``pack`` (one per publisher: msgpack.Packer is not thread-safe).
Pack = Callable[[Any], bytes]


@dataclass(eq=False, slots=True)
class Item:
    """One frame to the server: a ``publish``, or a ``publish_batch`` of ``rows`` rows (``cols``)."""

    channel: str
    body: bytes  # the frame packed without ``id`` (ClientProtocol.request_packed adds it)
    idem: str | None  # a batch: its first row's key when every row has one (it may be resent), else None
    tries: int = 0
    not_before: float = 0.0
    rows: int = 1
    cols: Cols | None = None  # a ``publish_batch``: its rows
    counted: bool = False  # in BulkPublisher's count of unacknowledged rows


def publish_body(
    pack: Pack,
    channel: str,
    payload: bytes,
    idem: str | None,
    content_type: str,
    headers: Mapping[str, str] | None,
    tags: Sequence[str],
) -> bytes:
    """A ``publish`` frame (``ack:true``), packed without ``id``; only the fields this publish uses."""
    frame: dict[str, Any] = {"op": "publish", "channel": channel, "payload": payload, "ack": True}
    if content_type:
        frame["content_type"] = content_type
    if headers:
        frame["headers"] = headers if type(headers) is dict else dict(headers)
    if tags:
        frame["tags"] = tags if type(tags) is list else list(tags)
    if idem is not None:
        frame["idem"] = idem
    return pack(frame)


def row_items(pack: Pack, cols: Cols) -> Iterator[Item]:
    """A ``publish`` frame's item for each row of ``cols``."""
    for channel, payload, idem, ctype, hdrs, tgs in zip(*cols, strict=True):
        yield Item(channel, publish_body(pack, channel, payload, idem, ctype, hdrs, tgs), idem)


def batch_body(pack: Pack, cols: Cols) -> bytes:
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
    return pack(frame)


class AckTally:
    """The acknowledgements read so far: counts, the highest seq per channel, and each :class:`PublishAck`
    passed to ``on_ack`` or kept in :attr:`acks` when either is wanted (``keep``)."""

    def __init__(self, on_ack: Callable[[PublishAck], None] | None, keep: bool) -> None:
        self.on_ack = on_ack
        self.wanted = on_ack is not None or keep
        self.acks: list[PublishAck] = []
        #: Publishes acknowledged as appended, and as duplicates (their key was known).
        self.published = 0
        self.duplicates = 0
        #: The highest seq acknowledged per channel.
        self.tops: dict[str, int] = {}

    def reply(self, item: Item, frame: dict[str, Any]) -> None:
        """The reply to ``item``: tallied, and passed on or kept when asked for. Raises
        ConnectionResetError for a batch reply that does not answer each row (a broken server)."""
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
        if not self.wanted:
            return
        ack = PublishAck(
            str(channel), int(seq), str(frame.get("epoch", "")), int(frame.get("time", 0)), duplicate
        )
        if self.on_ack is not None:
            self.on_ack(ack)
        else:
            self.acks.append(ack)

    def _batch_reply(self, frame: dict[str, Any], cols: Cols) -> None:
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
        if not self.wanted:
            return
        dup = set(dups)
        epochs = frame.get("epochs") or [""] * len(seqs)
        times = frame.get("times") or [0] * len(seqs)
        for i, (ch, seq, epoch, t) in enumerate(zip(channels, seqs, epochs, times, strict=True)):
            ack = PublishAck(ch, int(seq), str(epoch), int(t), i in dup)
            if self.on_ack is not None:
                self.on_ack(ack)
            else:
                self.acks.append(ack)
