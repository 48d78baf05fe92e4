"""MQTT retained messages (docs/dialects/mqtt.md "Retained messages"): the log holds them, this index says
where.

A retained PUBLISH is stored in the log as any other, with the pseudo-header ``:mqtt.retain``; the index
keeps, per channel, the position (``seq``, ``epoch``) of its last retained event with a payload (one with an
empty payload clears the channel's entry [MQTT-3.3.1-10]). A subscription reads each matching entry's event
back from the log (``Core.read_channel``) and sends it with the retain flag; an entry whose event is gone
(trimmed, or the channel reset) is dropped then.

:func:`read_retained` reads a SUBSCRIBE's retained messages before its filters are registered, so that they
are sent right after the SUBACK, ahead of any live message the client causes once it has the SUBACK; one
that changed meanwhile is read again.

The index survives restarts in ``<data_dir>/mqtt/retained.jsonl`` (:class:`~.mqtt_store.JsonlMap`): a
change is appended when its commit returns (a crash between the commit and the append loses that message's
retained mark, not the message).

Concurrency contract: as :class:`~.mqtt_store.JsonlMap`'s (loaded off the loop at start, then the loop's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hubbub.channels import Pattern
from hubbub.core.api import Core
from hubbub.dialects import mqtt as mq
from hubbub.events import Event

from .mqtt_store import JsonlMap

__all__ = ["RetainedIndex", "RetainedMessage", "read_retained"]


class RetainedIndex:
    """Channel → position of its retained event; see the module docstring. ``path`` None: in memory only."""

    def __init__(self, path: Path | None = None) -> None:
        self._map = JsonlMap(path)

    @classmethod
    def in_data_dir(cls, data_dir: str | os.PathLike[str]) -> RetainedIndex:
        """The index kept in ``data_dir`` (loaded and compacted; blocking: run it off the loop)."""
        index = cls(Path(data_dir) / "mqtt" / "retained.jsonl")
        index._map.load()
        return index

    def __len__(self) -> int:
        return len(self._map)

    def close(self) -> None:
        self._map.close()

    def retain(self, channel: str, seq: int, epoch: str, empty: bool) -> None:
        """A retained event was committed at ``seq``/``epoch`` of ``channel`` (``empty``: it clears)."""
        self._map.set(channel, None if empty else [seq, epoch])

    def where(self, channel: str) -> tuple[int, str] | None:
        hit = self._map.get(channel)
        return None if hit is None else (int(hit[0]), str(hit[1]))

    def drop(self, channel: str, seq: int, epoch: str) -> None:
        """The event at ``seq``/``epoch`` is gone from the log: forget it (unless a newer one replaced it)."""
        if self.where(channel) == (seq, epoch):
            self._map.set(channel, None)

    def matching(self, pattern: Pattern) -> Iterator[tuple[str, int, str]]:
        """The entries on channels ``pattern`` matches: ``(channel, seq, epoch)``, in channel order."""
        if pattern.is_exact:
            channels = ["/" + "/".join(p for p in pattern.parts if p is not None)]
        else:
            channels = sorted(c for c in self._map if pattern.matches(c))
        for channel in channels:
            hit = self.where(channel)
            if hit is not None:
                yield (channel, *hit)


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    """A channel's retained event as read, and the highest QoS granted among the filters that match it."""

    event: Event
    granted: int


async def read_retained(
    node: Core, index: RetainedIndex, filters: Sequence[mq.FilterRequest]
) -> list[RetainedMessage]:
    """The retained messages of ``filters`` (each channel once), read from the log in channel order; an
    entry whose event is gone is dropped."""
    wanted: dict[str, tuple[int, int, str]] = {}
    for f in filters:
        assert f.pattern is not None
        for channel, seq, epoch in index.matching(f.pattern):
            if mq.filter_applies(f.topic_filter, channel):
                q = max(f.qos, wanted[channel][0]) if channel in wanted else f.qos
                wanted[channel] = (q, seq, epoch)
    out: list[RetainedMessage] = []
    for channel, (granted, seq, epoch) in wanted.items():
        page = await node.read_channel(channel, since=seq - 1, limit=1, epoch=epoch)
        if not page.events or page.events[0].seq != seq:
            index.drop(channel, seq, epoch)  # trimmed, or the channel was reset
            continue
        out.append(RetainedMessage(page.events[0], granted))
    return out
